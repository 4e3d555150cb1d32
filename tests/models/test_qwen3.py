"""Qwen3 against transformers: per-head Q/K RMSNorm, GQA, head_dim != hidden/heads, tied and
untied LM heads, attention biases, YaRN RoPE scaling past its original context (16 < 40 tokens)."""

import transformers
from parity import TransformersParity


class TestQwen3(TransformersParity):
    model_class = "Qwen3ForCausalLM"
    configs = {
        # GQA, tied LM head, head_dim 48 with hidden 128 / 4 heads
        "qwen3": lambda: transformers.Qwen3Config(
            vocab_size=384, hidden_size=128, intermediate_size=320, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=48, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True),
        # untied LM head, Q/K/V/O biases, YaRN x4 from an original context of 16
        "qwen3-bias-yarn": lambda: transformers.Qwen3Config(
            vocab_size=320, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
            attention_bias=True, tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                             "original_max_position_embeddings": 16}),
    }
