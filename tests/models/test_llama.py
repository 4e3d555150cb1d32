"""LLaMA family against transformers: GQA, tied and untied LM heads, attention and MLP biases,
linear, Llama 3 and YaRN RoPE scaling (Llama 3 and YaRN past an original context of 16 < 40
tokens), head_dim != hidden/heads; Mistral's sliding window."""

import transformers
from parity import TransformersParity

from ember.models import features


def info_features(tiny) -> list[str]:
    f = tiny[0].gguf
    return features(f.metadata, f.tensors)


class TestLlama(TransformersParity):
    model_class = "LlamaForCausalLM"
    configs = {
        # GQA, untied LM head, linear RoPE scaling
        "llama": lambda: transformers.LlamaConfig(
            vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            tie_word_embeddings=False),
        # tied LM head, biases on attention and MLP, Llama 3 RoPE scaling, head_dim != hidden/heads
        "llama-bias-llama3-rope": lambda: transformers.LlamaConfig(
            vocab_size=320, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
            attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16}),
    }

    def test_info_names_the_rope_scaling(self, tiny, config_name):
        # Llama 3's divisors: the factor 8 at low frequencies; at the highest (wavelength 2 pi, between
        # 16 / high_freq_factor and 16 / low_freq_factor) 1 / ((1 - s) / 8 + s), s = (16 / 2 pi - 1) / 3
        expected = {"llama": "RoPE scaling linear x2",
                    "llama-bias-llama3-rope": "RoPE scaling llama3 (rope_freqs.weight: factors 1.736 to 8)"}
        assert info_features(tiny) == [expected[config_name]]


class TestMistral(TransformersParity):
    """Mistral: the LLaMA graph with a sliding window (6 < 40 tokens), and YaRN past its original context."""

    model_class = "MistralForCausalLM"
    # llama.cpp's converter drops Mistral's window (and llama.cpp attends to every position)
    llama_cpp_leaves_out = {"mistral-window": ("llama.attention.sliding_window",)}
    configs = {
        "mistral-window": lambda: transformers.MistralConfig(
            vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256, sliding_window=6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False),
        "mistral-yarn": lambda: transformers.MistralConfig(
            vocab_size=320, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=128,
            sliding_window=None, tie_word_embeddings=True,
            rope_parameters={"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0,
                             "original_max_position_embeddings": 16, "beta_fast": 16.0, "beta_slow": 2.0}),
    }

    def test_info_names_the_window_and_the_rope_scaling(self, tiny, config_name):
        expected = {"mistral-window": "sliding window 6",
                    "mistral-yarn": "RoPE scaling yarn x8 (from 16, beta fast 16, beta slow 2)"}
        assert info_features(tiny) == [expected[config_name]]
