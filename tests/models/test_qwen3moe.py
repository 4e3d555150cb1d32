"""Qwen3-MoE against transformers: 8 experts, 2 per token, weights normalised (as Qwen3-30B-A3B),
per-head RMSNorm of queries and keys, head_dim != hidden / heads, GQA, NeoX rotation; quantized."""

import transformers
from parity import TransformersParity


class TestQwen3Moe(TransformersParity):
    model_class = "Qwen3MoeForCausalLM"
    mixture_of_experts = True
    configs = {
        "qwen3moe": lambda: transformers.Qwen3MoeConfig(
            vocab_size=384, hidden_size=256, intermediate_size=160, moe_intermediate_size=256, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=128, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False),
    }
