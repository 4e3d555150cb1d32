"""GLM-4 against transformers: RMSNorm before and after attention and the MLP, Q/K/V biases,
GQA with head_dim != hidden/heads, partial rotary (16 of 32 dimensions, adjacent pairs), the
fused gate and up projection; tied and untied LM heads."""

import numpy as np
import pytest
import transformers
from parity import TransformersParity, rewritten

from ember.engine.runtime import Model
from ember.errors import GGUFError
from ember.models import features


def config(**changes):
    return transformers.Glm4Config(**{
        "vocab_size": 384, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None, **changes})


class TestGlm4(TransformersParity):
    model_class = "Glm4ForCausalLM"
    configs = {
        "glm4": lambda: config(),
        "glm4-tied": lambda: config(tie_word_embeddings=True, rope_parameters={
            "rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5}),
    }

    def test_info_names_the_post_norms_and_the_partial_rotary(self, tiny):
        assert features(tiny[0].gguf.metadata) == [
            "post-norms", "fused gate and up projection", "partial rotary (16 of 32 dimensions)"]

    def test_an_unfused_up_projection_is_refused_naming_it(self, tiny, tmp_path):
        model = tiny[0]
        bad = rewritten(model.gguf.path, tmp_path / "bad.gguf",
                        tensors={"blk.0.ffn_up.weight": np.zeros((model.hp.n_ff, model.hp.n_embd))})
        with pytest.raises(GGUFError, match=r"blk\.0\.ffn_up\.weight has shape \[256, 512\].*\[256, 1024\]"):
            Model(bad, n_ctx=16)
