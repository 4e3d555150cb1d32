"""Gemma 3 against transformers: sliding window 8 < 40 tokens on layers 0, 1, 3 mixed with a
global layer 2 that has linear RoPE scaling; query_pre_attn_scalar != head_dim; Q/K norms."""

import transformers
from parity import TransformersParity

from ember.models import features


class TestGemma3(TransformersParity):
    model_class = "Gemma3ForCausalLM"
    norm_offset = 0.0  # Gemma3RMSNorm scales by (1 + w)
    # llama.cpp's converter writes neither the layer pattern nor the query scale (its 270M..12B rule is head_dim)
    llama_cpp_leaves_out = {"gemma3": ("gemma3.attention.sliding_window_pattern", "gemma3.attention.scale")}
    configs = {
        "gemma3": lambda: transformers.Gemma3TextConfig(
            vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=48, query_pre_attn_scalar=64,
            max_position_embeddings=256, sliding_window=8,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    }

    def test_info_names_the_layer_pattern_and_the_query_scale(self, tiny):
        # layers 0, 1 and 3 slide; 64 ** -0.5; the global layer's linear scaling
        f = tiny[0].gguf
        assert features(f.metadata, f.tensors) == [
            "post-norms", "per-head Q/K RMSNorm", "attention scale 0.125", "sliding layers' RoPE base 10000",
            "sliding window 8 (3 of 4 layers)", "RoPE scaling linear x4"]
