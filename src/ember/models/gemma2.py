"""Gemma 2: the Gemma decoder (embeddings scaled by sqrt(n_embd), RMSNorm before and after
attention and MLP, GeGLU, tied LM head) with soft-capped attention scores and logits
(c * tanh(x / c): attn_logit_softcapping, final_logit_softcapping) and sliding-window layers
alternating with global ones (even layers slide unless attention.sliding_window_pattern says
otherwise). No Q/K norms; every layer rotates with the file's RoPE base."""

from __future__ import annotations

import math
from typing import Any

from ember.errors import EmberError
from ember.gguf.metadata import float_key
from ember.models import gemma3
from ember.models.blocks import Builder, HParams
from ember.models.hf import require

HF_ARCHITECTURES = ("Gemma2ForCausalLM",)
FEATURES = ("post-norms",)
SLIDING_PATTERN = 2
WIDE_N_LAYER = 46  # the 27B model: llama.cpp scales its queries by 1/sqrt(n_embd / n_head)


def build(b: Builder) -> int:
    return gemma3.build_gemma(b, SLIDING_PATTERN, WIDE_N_LAYER, local_base=None)


def features(metadata: dict) -> list[str]:
    cap = float_key(metadata, "gemma2.attn_logit_softcapping", 0.0, non_negative=True)
    return ([f"attention soft-cap {cap:g}"] if cap else []) + gemma3.gemma_features(metadata, "gemma2")


def sliding_layer_count(metadata: dict) -> tuple[int, int] | None:
    return gemma3.sliding_count(metadata, "gemma2", SLIDING_PATTERN)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


class Converter(gemma3.Converter):
    """The keys llama.cpp's converter writes for Gemma 2; norms stored as 1 + w."""

    arch = "gemma2"

    def __init__(self, config: dict):
        config = {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                  "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                  **{k: v for k, v in config.items() if v is not None}}
        gemma3.DecoderConverter.__init__(self, config)
        if self.rope.get("rope_type", "default") != "default":
            raise EmberError(f"Gemma 2 with RoPE scaling {self.rope.get('rope_type')!r} is not supported")
        self.sliding = gemma3.hf_sliding_layers(config, self.n_layer, SLIDING_PATTERN)

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = {
            f"{a}.context_length": int(require(c, "max_position_embeddings")),
            f"{a}.embedding_length": self.n_embd,
            f"{a}.block_count": self.n_layer,
            f"{a}.feed_forward_length": int(require(c, "intermediate_size")),
            f"{a}.attention.head_count": self.n_head,
            f"{a}.attention.head_count_kv": self.n_kv_head,
            f"{a}.attention.layer_norm_rms_epsilon": float(c.get("rms_norm_eps", 1e-6)),
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.attn_logit_softcapping": float(c["attn_logit_softcapping"]),
            f"{a}.final_logit_softcapping": float(c["final_logit_softcapping"]),
            f"{a}.attention.sliding_window": int(c["sliding_window"]),
        }
        if self.rope.get("rope_theta") not in (None, 10000.0):
            meta[f"{a}.rope.freq_base"] = float(self.rope["rope_theta"])
        if self.sliding != gemma3.periodic_sliding(SLIDING_PATTERN, self.n_layer):
            meta[f"{a}.attention.sliding_window_pattern"] = self.sliding
        # llama.cpp scales the queries by 1/sqrt(head_dim) (the 27B: 1/sqrt(n_embd / n_head))
        expected = self.n_embd // self.n_head if self.n_layer == WIDE_N_LAYER else self.head_dim
        scalar = float(c["query_pre_attn_scalar"])
        if scalar != expected:
            meta[f"{a}.attention.scale"] = 1.0 / math.sqrt(scalar)
        return meta
