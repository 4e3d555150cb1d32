"""Phi-3 / Phi-4-mini: a pre-norm RMSNorm decoder with a fused QKV projection (attn_qkv: queries,
then keys, then values) and a fused gate-up projection (ffn_up: the gate's n_ff rows, then the
up's) into SwiGLU; NeoX-layout RoPE over the first rope.dimension_count dimensions of each head
(Phi-4-mini: 3/4) with LongRoPE's long or short factors (rope_factors_long / _short, chosen by
the context as llama.cpp does) and their attention factor; a sliding window where the file gives
one (transformers applies it; llama.cpp leaves it off)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.gguf.metadata import float_key, int_key
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, DecoderConverter, get, require

HF_ARCHITECTURES = ("Phi3ForCausalLM",)
FEATURES = ("fused QKV and gate-up",)


def build(b: Builder) -> int:
    hp, g = b.hp, b.g
    n_q, n_kv = hp.n_head * hp.head_dim, hp.n_kv_head * hp.head_dim
    x = g.get_rows(b.weight("token_embd.weight"))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        h = b.rms_norm(x, f"{p}.attn_norm.weight")
        if b.has(f"{p}.attn_qkv.weight"):
            qkv = b.linear(h, f"{p}.attn_qkv")
            q, k, v = g.view(qkv, 0, n_q), g.view(qkv, n_q, n_kv), g.view(qkv, n_q + n_kv, n_kv)
        else:
            q, k, v = (b.linear(h, f"{p}.attn_{name}") for name in "qkv")
        q, k = b.rope_qk(q, k, True)
        x = g.add(x, b.linear(b.attention(q, k, v, window=hp.sliding_window), f"{p}.attn_output"))
        up = b.linear(b.rms_norm(x, f"{p}.ffn_norm.weight"), f"{p}.ffn_up")
        gated = g.swiglu(g.view(up, 0, hp.n_ff), g.view(up, hp.n_ff, hp.n_ff))
        x = g.add(x, b.linear(gated, f"{p}.ffn_down"))
    x = b.rms_norm(g.select_outputs(x), "output_norm.weight")
    return b.lm_head(x)


def features(metadata: dict) -> list[str]:
    """LongRoPE: the converter writes its attention factor with the factors."""
    factor = float_key(metadata, "phi3.rope.scaling.attn_factor", 0.0, non_negative=True)
    if not factor:
        return []
    original = int_key(metadata, "phi3.rope.scaling.original_context_length", None)
    return [f"RoPE scaling longrope (attention factor {factor:.4g}" + (f", from {original})" if original else ")")]


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    """ffn_up holds the gate and the up projection: 2 n_ff rows."""
    return {"ffn_up.weight": (hp.n_embd, 2 * hp.n_ff), "ffn_up.bias": (2 * hp.n_ff,)}


HF_LAYER = {**DECODER_LAYER, "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}


class Converter(DecoderConverter):
    """The keys llama.cpp's converter writes for Phi-3 (no scaling type: the LongRoPE factors are tensors)."""

    arch = "phi3"
    layer_names = HF_LAYER

    def __init__(self, config: dict):
        super().__init__(config)
        kind = self.rope.get("rope_type", "default")
        if kind not in ("default", "longrope", "su"):
            raise EmberError(f"Phi-3 with RoPE scaling {kind!r} is not supported (ember converts longrope)")
        if self.n_head * self.head_dim != self.n_embd:
            raise EmberError("Phi-3 with head_dim * num_attention_heads != hidden_size is not supported")
        self.original_context = int(get(self.rope, "original_max_position_embeddings",
                                        default=require(config, "original_max_position_embeddings")))
        partial = float(get(self.rope, "partial_rotary_factor", default=config.get("partial_rotary_factor", 1.0)))
        self.rope_dims = int(partial * self.n_embd) // self.n_head

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        n_ctx = int(require(c, "max_position_embeddings"))
        meta = {
            f"{a}.context_length": n_ctx,
            f"{a}.rope.scaling.original_context_length": self.original_context,
            f"{a}.embedding_length": self.n_embd,
            f"{a}.feed_forward_length": int(require(c, "intermediate_size")),
            f"{a}.block_count": self.n_layer,
            f"{a}.attention.head_count": self.n_head,
            f"{a}.attention.head_count_kv": self.n_kv_head,
            f"{a}.attention.layer_norm_rms_epsilon": float(require(c, "rms_norm_eps")),
            f"{a}.rope.dimension_count": self.rope_dims,
            f"{a}.rope.freq_base": float(require(self.rope, "rope_theta")),
            # 0 marks a file without one (Phi-4), as llama.cpp's converter writes it
            f"{a}.attention.sliding_window": int(c.get("sliding_window") or 0),
        }
        if self.rope.get("long_factor"):
            # LongRoPE's attention factor, from the scale of the context (llama.cpp's converter)
            scale = n_ctx / self.original_context
            factor = math.sqrt(1 + math.log(scale) / math.log(self.original_context)) if scale > 1.0 else 1.0
            meta[f"{a}.rope.scaling.attn_factor"] = factor
        return meta

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        long_factors, short_factors = self.rope.get("long_factor"), self.rope.get("short_factor")
        if not long_factors:
            return []
        if not short_factors or len(long_factors) != len(short_factors) or len(long_factors) != self.rope_dims // 2:
            raise EmberError(f"config.json's rope long_factor and short_factor must have {self.rope_dims // 2} "
                             "values each (half the rotated dimensions)")
        return [("rope_factors_long.weight", np.asarray(long_factors, dtype=np.float32)),
                ("rope_factors_short.weight", np.asarray(short_factors, dtype=np.float32))]
