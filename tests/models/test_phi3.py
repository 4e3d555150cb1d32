"""Phi-3 / Phi-4-mini against transformers: fused QKV and gate-up projections, LongRoPE with its
attention factor (long factors past an original context of 16 < 40 tokens, short factors within
one of 64), partial rotary (3/4 of each head, as Phi-4-mini), GQA and MHA, tied and untied LM
heads, a sliding window of 8 < 40 tokens."""

import numpy as np
import transformers
from parity import TransformersParity


def longrope(original: int, n_pairs: int) -> dict:
    return {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": original,
            "long_factor": np.linspace(1.0, 9.0, n_pairs).round(3).tolist(),
            "short_factor": np.linspace(1.0, 1.6, n_pairs).round(3).tolist()}


class TestPhi3(TransformersParity):
    model_class = "Phi3ForCausalLM"
    tokenizer = "sentencepiece"  # llama.cpp's converter reads only tokenizer.model for Phi-3
    configs = {
        # Phi-4-mini's shape: GQA, tied head, 12 of 16 dimensions rotated, long factors (context 64 > 16)
        "phi4-mini": lambda: transformers.Phi3Config(
            vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
            original_max_position_embeddings=16, tie_word_embeddings=True,
            pad_token_id=0, bos_token_id=1, eos_token_id=2,
            rope_parameters={**longrope(16, 6), "partial_rotary_factor": 0.75}),
        # Phi-3-mini's shape: MHA, untied head, sliding window, short factors (context 64 <= 64)
        "phi3-window": lambda: transformers.Phi3Config(
            vocab_size=320, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
            original_max_position_embeddings=64, sliding_window=8, tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, rope_parameters=longrope(64, 12)),
    }
