"""Granite against transformers: embedding, residual, attention and logit multipliers (none of
them 1), GQA, tied and untied LM heads, attention and MLP biases."""

import transformers
from parity import TransformersParity


class TestGranite(TransformersParity):
    model_class = "GraniteForCausalLM"
    configs = {
        "granite": lambda: transformers.GraniteConfig(
            vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
            embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
            logits_scaling=8.0, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "granite-bias-untied": lambda: transformers.GraniteConfig(
            vocab_size=320, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
            embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.2,
            logits_scaling=2.5, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
    }
