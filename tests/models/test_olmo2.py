"""OLMo 2 against transformers: post-norms only, Q/K RMSNorm over all heads (GQA: K's over the
KV heads), NeoX rotation, untied LM head; a second configuration with a tied head, biases-free
as the family is, and linear RoPE scaling."""

import numpy as np
import pytest
import transformers
from parity import TransformersParity, rewritten

from ember.engine.runtime import Model
from ember.errors import GGUFError
from ember.models import features


class TestOlmo2(TransformersParity):
    model_class = "Olmo2ForCausalLM"
    configs = {
        "olmo2": lambda: transformers.Olmo2Config(
            vocab_size=384, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=None, bos_token_id=0, eos_token_id=0),
    }

    def test_info_names_the_post_norms_and_the_qk_norm(self, tiny):
        assert features(tiny[0].gguf.metadata) == ["post-norms", "Q/K RMSNorm over all heads"]

    def test_a_per_head_q_norm_is_refused_naming_it(self, tiny, tmp_path):
        bad = rewritten(tiny[0].gguf.path, tmp_path / "bad.gguf",
                        tensors={"blk.1.attn_q_norm.weight": np.ones(tiny[0].hp.head_dim)})
        with pytest.raises(GGUFError, match=r"blk\.1\.attn_q_norm\.weight has shape \[32\].*\[256\]"):
            Model(bad, n_ctx=16)

    def test_sliding_window_files_are_refused(self, tiny, tmp_path):
        bad = rewritten(tiny[0].gguf.path, tmp_path / "swa.gguf", metadata={"olmo2.attention.sliding_window": 8})
        with pytest.raises(GGUFError, match="sliding-window"):
            Model(bad, n_ctx=16)
