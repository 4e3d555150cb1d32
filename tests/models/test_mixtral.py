"""Mixtral (GGUF arch llama with expert tensors) against transformers: 4 experts, 2 per token,
normalised softmax weights, GQA; experts stacked into blk.N.ffn_*_exps by `ember convert`."""

import transformers
from parity import TransformersParity


class TestMixtral(TransformersParity):
    model_class = "MixtralForCausalLM"
    mixture_of_experts = True
    configs = {
        "mixtral": lambda: transformers.MixtralConfig(
            vocab_size=384, hidden_size=256, intermediate_size=256, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
            num_local_experts=4, num_experts_per_tok=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            tie_word_embeddings=False),
    }
