"""Qwen2 against transformers: Q/K/V biases, GQA, tied LM head, NeoX rotation."""

import transformers
from parity import TransformersParity


class TestQwen2(TransformersParity):
    model_class = "Qwen2ForCausalLM"
    configs = {
        "qwen2": lambda: transformers.Qwen2Config(
            vocab_size=384, hidden_size=128, intermediate_size=320, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True),
    }
