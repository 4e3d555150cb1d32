"""SmolLM3 against transformers: the LLaMA decoder with NoPE layers (layer 3 of 4 has no
rotary embedding), GQA, tied and untied LM heads."""

import pytest
import transformers
from parity import TransformersParity

from ember.convert import convert
from ember.errors import EmberError
from ember.models import features


def config(**changes):
    return transformers.SmolLM3Config(**{
        "vocab_size": 384, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None, **changes})


class TestSmolLM3(TransformersParity):
    model_class = "SmolLM3ForCausalLM"
    configs = {
        "smollm3-tied": lambda: config(tie_word_embeddings=True),
        "smollm3-untied": lambda: config(tie_word_embeddings=False, rope_parameters={
            "rope_type": "default", "rope_theta": 5000000.0}),
    }

    def test_info_names_the_nope_layers(self, tiny):
        assert features(tiny[0].gguf.metadata) == ["NoPE (no rotary embedding) in every 4th layer"]


def test_other_nope_layers_are_refused(tmp_path):
    model = transformers.SmolLM3ForCausalLM(config(num_hidden_layers=4, no_rope_layers=[1, 0, 1, 1]))
    model.save_pretrained(tmp_path / "hf")
    with pytest.raises(EmberError, match="no_rope_layers"):
        convert(tmp_path / "hf", tmp_path / "out.gguf", "f32")
