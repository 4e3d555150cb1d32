"""StarCoder 2 against transformers: LayerNorm with bias, biases on every projection and the
MLP, GELU MLP, GQA, NeoX rotation; tied and untied LM heads."""

import transformers
from parity import TransformersParity

from ember.models import features


def config(**changes):
    return transformers.Starcoder2Config(**{
        "vocab_size": 384, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "norm_epsilon": 1e-5, "sliding_window": None, "bos_token_id": 0, "eos_token_id": 0, **changes})


class TestStarcoder2(TransformersParity):
    model_class = "Starcoder2ForCausalLM"
    configs = {
        "starcoder2-tied": lambda: config(tie_word_embeddings=True),
        "starcoder2-untied": lambda: config(tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    }

    def test_info_names_layer_norm_gelu_and_biases(self, tiny):
        assert features(tiny[0].gguf.metadata) == ["LayerNorm with bias", "GELU MLP", "biases"]
