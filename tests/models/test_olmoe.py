"""OLMoE against transformers: 8 experts, 2 per token, weights not normalised, RMSNorm of the whole
query and key rows, NeoX rotation (as OLMoE-1B-7B: as many KV heads as heads)."""

import transformers
from parity import TransformersParity


class TestOlmoe(TransformersParity):
    model_class = "OlmoeForCausalLM"
    mixture_of_experts = True
    configs = {
        "olmoe": lambda: transformers.OlmoeConfig(
            vocab_size=384, hidden_size=256, intermediate_size=256, num_experts=8, num_experts_per_tok=2,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
            pad_token_id=0, eos_token_id=1, bos_token_id=2),
    }
