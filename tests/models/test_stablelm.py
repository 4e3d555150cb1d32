"""StableLM against transformers: partial rotary (4 of 16 dimensions), LayerNorm with bias, GQA;
sequential blocks with Q/K/V biases, and parallel blocks with StableLM 2 12B's per-head Q/K
LayerNorms (llama.cpp's converter cannot write those: it drops them and fails)."""

import numpy as np
import pytest
import transformers
from parity import TransformersParity, rewritten

from ember.engine.runtime import Model
from ember.errors import GGUFError
from ember.models import features


def config(**changes):
    return transformers.StableLmConfig(**{
        "vocab_size": 384, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "partial_rotary_factor": 0.125, "layer_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 0, **changes})


class TestStableLM(TransformersParity):
    model_class = "StableLmForCausalLM"
    # llama.cpp's converter drops StableLM 2 12B's per-head norms from its generator and then fails
    llama_cpp_fails = {"stablelm-parallel-qk-norm": "Unprocessed norms"}
    configs = {
        "stablelm-sequential": lambda: config(use_qkv_bias=True, use_parallel_residual=False),
        "stablelm-parallel-qk-norm": lambda: config(use_parallel_residual=True, qk_layernorm=True),
    }

    def test_info_names_the_block_layout(self, tiny):
        parallel = "parallel attention and MLP" in features(tiny[0].gguf.metadata)
        assert parallel == ("blk.0.ffn_norm.weight" not in tiny[0].gguf.tensors)
        assert features(tiny[0].gguf.metadata)[0] == "LayerNorm with bias"
        assert "partial rotary (4 of 32 dimensions)" in features(tiny[0].gguf.metadata)

    def test_a_block_layout_the_tensors_contradict_is_refused(self, tiny, tmp_path):
        model = tiny[0]
        sequential = "blk.0.ffn_norm.weight" in model.gguf.tensors
        bad = rewritten(model.gguf.path, tmp_path / "bad.gguf", metadata={"stablelm.use_parallel_residual": sequential})
        message = "use_parallel_residual is true, but the blocks have an ffn_norm" if sequential else \
            "tensor blk.0.ffn_norm.weight is missing"
        with pytest.raises(GGUFError, match=message):
            Model(bad, n_ctx=16)

    def test_per_head_norms_of_the_wrong_shape_are_refused(self, tiny, tmp_path):
        hp = tiny[0].hp
        bad = rewritten(tiny[0].gguf.path, tmp_path / "bad.gguf", tensors={
            "blk.0.attn_q_norm.weight": np.ones((hp.n_head, hp.head_dim)),
            "blk.0.attn_k_norm.weight": np.ones((hp.n_head, hp.head_dim))})
        with pytest.raises(GGUFError, match=r"blk\.0\.attn_k_norm\.weight has shape \[32, 8\].*\[32, 2\]"):
            Model(bad, n_ctx=16)
