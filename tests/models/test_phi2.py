"""Phi-2 against transformers: attention and MLP in parallel off one LayerNorm with bias,
partial rotary (6 of 16 dimensions), biases everywhere, an LM head with a bias; the MLP 4x wide
as Phi-2's (llama.cpp's converter writes 4 * n_embd for it)."""

import transformers
from parity import TransformersParity

from ember.models import features


class TestPhi2(TransformersParity):
    model_class = "PhiForCausalLM"
    configs = {
        "phi2": lambda: transformers.PhiConfig(
            vocab_size=384, hidden_size=128, intermediate_size=512, num_hidden_layers=3,
            num_attention_heads=8, max_position_embeddings=256, partial_rotary_factor=0.4,
            layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=0),
    }

    def test_info_names_the_parallel_block_and_the_partial_rotary(self, tiny):
        assert features(tiny[0].gguf.metadata) == [
            "parallel attention and MLP", "LayerNorm with bias", "biases", "GELU MLP",
            "partial rotary (6 of 16 dimensions)"]
