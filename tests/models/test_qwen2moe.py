"""Qwen2-MoE against transformers: 8 experts, 2 per token, weights not normalised, a shared expert
gated by sigmoid, Q/K/V biases, GQA, NeoX rotation."""

import transformers
from parity import TransformersParity


class TestQwen2Moe(TransformersParity):
    model_class = "Qwen2MoeForCausalLM"
    mixture_of_experts = True
    configs = {
        "qwen2moe": lambda: transformers.Qwen2MoeConfig(
            vocab_size=384, hidden_size=256, intermediate_size=160, moe_intermediate_size=256,
            shared_expert_intermediate_size=512, num_experts=8, num_experts_per_tok=2, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False),
    }
