"""Gemma 2 against transformers: attention and final-logit soft-capping, sliding window 8 < 40
tokens on alternating layers (even ones slide), post-norms, GQA and MHA, tied LM head."""

import transformers
from parity import TransformersParity

from ember.models import features


class TestGemma2(TransformersParity):
    model_class = "Gemma2ForCausalLM"
    norm_offset = 0.0  # Gemma2RMSNorm scales by (1 + w)
    attention = "eager"  # sdpa does not soft-cap
    tokenizer = "sentencepiece"  # llama.cpp's converter reads only tokenizer.model for Gemma 2
    configs = {
        # caps low enough that they bite: random scores reach ~2, logits ~5
        "gemma2": lambda: transformers.Gemma2Config(
            vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=48, query_pre_attn_scalar=48,
            max_position_embeddings=256, sliding_window=8, attn_logit_softcapping=1.5,
            final_logit_softcapping=3.0),
        # multi-head attention, an odd number of layers (the last one slides), window 6
        "gemma2-mha": lambda: transformers.Gemma2Config(
            vocab_size=320, hidden_size=96, intermediate_size=192, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, head_dim=32, query_pre_attn_scalar=32,
            max_position_embeddings=128, sliding_window=6, attn_logit_softcapping=2.0,
            final_logit_softcapping=4.0),
    }

    def test_info_names_the_caps_and_the_sliding_layers(self, tiny, config_name):
        f = tiny[0].gguf
        expected = {"gemma2": ["post-norms", "attention soft-cap 1.5", "sliding window 8 (2 of 4 layers)",
                               "logit soft-cap 3"],
                    "gemma2-mha": ["post-norms", "attention soft-cap 2", "sliding window 6 (2 of 3 layers)",
                                   "logit soft-cap 4"]}
        assert features(f.metadata, f.tensors) == expected[config_name]
