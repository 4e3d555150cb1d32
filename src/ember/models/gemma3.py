"""Gemma 3 (text): embeddings scaled by sqrt(n_embd); RMSNorm before and after both attention
and MLP; per-head RMSNorm on Q and K; GeGLU MLP; sliding-window layers (local RoPE base, no
scaling) and global ones (the file's RoPE base and scaling). Which layers slide comes from
gemma3.attention.sliding_window_pattern: a bool per layer, or a period n (layer il is global
when il % n == n - 1); without it five of every six, as in llama.cpp. Norm weights in GGUF files
already include Gemma's +1."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.gguf.metadata import float_key, int_key
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, DecoderConverter, get, require
from ember.models.llama import qk_norm

HF_ARCHITECTURES = ("Gemma3ForCausalLM",)

FEATURES = ("post-norms", "per-head Q/K RMSNorm")
LOCAL_ROPE_BASE = 10000.0
SLIDING_PATTERN = 6


def periodic_sliding(period: int, n_layer: int) -> list[bool]:
    """Per layer, whether it slides: layer il is global when il % period == period - 1 (0: all slide)."""
    return [period == 0 or il % period < period - 1 for il in range(n_layer)]


def sliding_layers(metadata: dict, arch: str, n_layer: int, period: int = SLIDING_PATTERN) -> list[bool]:
    """Per layer, whether it slides: {arch}.attention.sliding_window_pattern as a bool per layer or
    a period, else `period`."""
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = metadata.get(key)
    if isinstance(pattern, (list, tuple)):
        pattern = np.asarray(pattern)
    if isinstance(pattern, np.ndarray) and pattern.ndim == 1 and pattern.dtype.kind in "biu":
        flags = [bool(v) for v in pattern]
        return flags[:n_layer] + [False] * (n_layer - len(flags))
    return periodic_sliding(int_key(metadata, key, period, minimum=0), n_layer)


def sliding_count(metadata: dict, arch: str, period: int) -> tuple[int, int] | None:
    """(layers that slide, layers) as `ember info` names them; None without a layer count."""
    n_layer = int_key(metadata, f"{arch}.block_count", 0, minimum=0)
    return (sum(sliding_layers(metadata, arch, n_layer, period)), n_layer) if n_layer else None


def gemma_features(metadata: dict, arch: str) -> list[str]:
    """The query scale where the file gives one (query_pre_attn_scalar other than head_dim)."""
    scale = float_key(metadata, f"{arch}.attention.scale", 0.0, non_negative=True)
    return [f"attention scale {scale:.4g}"] if scale else []


def features(metadata: dict) -> list[str]:
    local_base = float_key(metadata, "gemma3.rope.freq_base_swa", LOCAL_ROPE_BASE, positive=True)
    return gemma_features(metadata, "gemma3") + [f"sliding layers' RoPE base {local_base:g}"]


def sliding_layer_count(metadata: dict) -> tuple[int, int] | None:
    return sliding_count(metadata, "gemma3", SLIDING_PATTERN)


def attention_scale(b: Builder, wide_n_layer: int) -> float:
    """1/sqrt(head_dim), or the file's attention.scale (query_pre_attn_scalar^-1/2 when they differ);
    llama.cpp's rule for the largest model (27B: wide_n_layer layers), whose files carry no scale,
    is 1/sqrt(n_embd/n_head)."""
    hp = b.hp
    scale = float_key(b.f.metadata, f"{hp.arch}.attention.scale", 0.0, non_negative=True)
    if scale:
        return scale
    if hp.n_layer == wide_n_layer:
        return 1.0 / math.sqrt(hp.n_embd / hp.n_head)
    return 1.0 / math.sqrt(hp.head_dim)


def build_gemma(b: Builder, period: int, wide_n_layer: int, local_base: float | None) -> int:
    """The Gemma 2 / 3 decoder. period: the default sliding-window pattern; local_base: the RoPE
    base of sliding layers without {arch}.rope.freq_base_swa (None: they rotate as the global ones,
    scaling included; otherwise unscaled)."""
    hp, g, meta = b.hp, b.g, b.f.metadata
    sliding = sliding_layers(meta, hp.arch, hp.n_layer, period) if hp.sliding_window > 0 else [False] * hp.n_layer
    swa_key = f"{hp.arch}.rope.freq_base_swa"
    separate_local = local_base is not None or swa_key in meta
    local_base = float_key(meta, swa_key, local_base or hp.rope_base, positive=True)
    scale = attention_scale(b, wide_n_layer)
    attn_cap = float_key(meta, f"{hp.arch}.attn_logit_softcapping", 0.0, non_negative=True)
    x = g.scale(g.get_rows(b.weight("token_embd.weight")), math.sqrt(hp.n_embd))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        local = sliding[il]
        h = b.rms_norm(x, f"{p}.attn_norm.weight")
        q, k = qk_norm(b, p, b.linear(h, f"{p}.attn_q"), b.linear(h, f"{p}.attn_k"))
        v = b.linear(h, f"{p}.attn_v")
        if local and separate_local:
            q, k = b.rope_qk(q, k, True, local_base, scaled=False)
        else:
            q, k = b.rope_qk(q, k, True)
        a = b.attention(q, k, v, window=hp.sliding_window if local else 0, scale=scale, softcap=attn_cap)
        a = b.rms_norm(b.linear(a, f"{p}.attn_output"), f"{p}.post_attention_norm.weight")
        x = g.add(x, a)
        h = b.rms_norm(x, f"{p}.ffn_norm.weight")
        m = b.rms_norm(b.gated_mlp(h, p, act="gelu"), f"{p}.post_ffw_norm.weight")
        x = g.add(x, m)
    x = b.rms_norm(g.select_outputs(x), "output_norm.weight")
    logits = b.lm_head(x)
    cap = float_key(meta, f"{hp.arch}.final_logit_softcapping", 0.0, non_negative=True)
    return g.softcap(logits, cap) if cap > 0 and not b.embeddings else logits


def build(b: Builder) -> int:
    return build_gemma(b, SLIDING_PATTERN, wide_n_layer=62, local_base=LOCAL_ROPE_BASE)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


HF_LAYER = {
    **DECODER_LAYER,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}


class Converter(DecoderConverter):
    """Norms scaled by (1 + w) stored as 1 + w; sliding-window and global layers."""

    arch = "gemma3"
    layer_names = HF_LAYER

    def __init__(self, config: dict):
        config = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                  "max_position_embeddings": 131072, **{k: v for k, v in config.items() if v is not None}}
        super().__init__(config)
        if config.get("attn_logit_softcapping") is not None:
            raise EmberError("Gemma 3 with attn_logit_softcapping is not supported")
        self.sliding = hf_sliding_layers(config, self.n_layer)

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = super().metadata()
        del meta[f"{a}.rope.dimension_count"], meta[f"{a}.vocab_size"]  # as llama.cpp's converter
        meta[f"{a}.attention.key_length"] = self.head_dim
        meta[f"{a}.attention.value_length"] = self.head_dim
        meta.setdefault(f"{a}.rope.freq_base", 1_000_000.0)
        local = self.rope.get("sliding_attention", {})
        local_base = get(local, "rope_theta", default=get(c, "rope_local_base_freq"))
        if local_base is not None:
            meta[f"{a}.rope.freq_base_swa"] = float(local_base)
        if c.get("final_logit_softcapping"):
            meta[f"{a}.final_logit_softcapping"] = float(c["final_logit_softcapping"])
        if any(self.sliding):
            meta[f"{a}.attention.sliding_window"] = int(require(c, "sliding_window"))
            meta[f"{a}.attention.sliding_window_pattern"] = self.sliding
        scalar = c.get("query_pre_attn_scalar")
        if scalar is not None and int(scalar) != self.head_dim:
            meta[f"{a}.attention.scale"] = 1.0 / math.sqrt(float(scalar))
        return meta

    def gguf_name(self, hf_name: str) -> str | None:
        if hf_name == "lm_head.weight":
            return None  # Gemma ties the LM head to the embedding
        return super().gguf_name(hf_name)

    def transform(self, hf_name: str, values: np.ndarray) -> np.ndarray:
        # Gemma3RMSNorm computes x * (1 + w); GGUF stores 1 + w so the norm is the plain x * w.
        return values + np.float32(1.0) if hf_name.endswith("norm.weight") else values

    def transforms(self, hf_name: str) -> bool:
        return hf_name.endswith("norm.weight")


def hf_sliding_layers(config: dict, n_layer: int, period: int = SLIDING_PATTERN) -> list[bool]:
    """Per layer: True for sliding-window attention (config layer_types, else every period-th is global)."""
    layer_types = config.get("layer_types")
    if layer_types:
        if len(layer_types) != n_layer:
            raise EmberError(f"config.json layer_types has {len(layer_types)} entries for {n_layer} layers")
        return [t == "sliding_attention" for t in layer_types]
    pattern = int(get(config, "sliding_window_pattern", "_sliding_window_pattern", default=period))
    return periodic_sliding(pattern, n_layer)
