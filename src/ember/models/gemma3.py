"""Gemma 3 (text): embeddings scaled by sqrt(n_embd); RMSNorm before and after both attention
and MLP; per-head RMSNorm on Q and K; GeGLU MLP; sliding-window layers (local RoPE base, no
scaling) and global ones (the file's RoPE base and scaling). Which layers slide comes from
gemma3.attention.sliding_window_pattern: a bool per layer, or a period n (layer il is global
when il % n == n - 1); without it five of every six, as in llama.cpp. Norm weights in GGUF files
already include Gemma's +1."""

from __future__ import annotations

import math

import numpy as np

from ember.models.blocks import Builder, HParams

LOCAL_ROPE_BASE = 10000.0
SLIDING_PATTERN = 6


def sliding_layers(metadata: dict, n_layer: int) -> list[bool]:
    pattern = metadata.get("gemma3.attention.sliding_window_pattern", SLIDING_PATTERN)
    if isinstance(pattern, (list, tuple, np.ndarray)):
        flags = [bool(v) for v in pattern]
        return flags[:n_layer] + [False] * (n_layer - len(flags))
    n = int(pattern)
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


def attention_scale(b: Builder) -> float:
    """1/sqrt(head_dim), or the file's attention.scale (query_pre_attn_scalar^-1/2 when they differ);
    llama.cpp's rule for the 62-layer 27B model, whose files carry no scale, is 1/sqrt(n_embd/n_head)."""
    hp = b.hp
    scale = b.f.metadata.get("gemma3.attention.scale")
    if scale:
        return float(scale)
    if hp.n_layer == 62:
        return 1.0 / math.sqrt(hp.n_embd / hp.n_head)
    return 1.0 / math.sqrt(hp.head_dim)


def build(b: Builder) -> int:
    hp, g = b.hp, b.g
    sliding = sliding_layers(b.f.metadata, hp.n_layer) if hp.sliding_window > 0 else [False] * hp.n_layer
    local_base = float(b.f.metadata.get("gemma3.rope.freq_base_swa", LOCAL_ROPE_BASE))
    scale = attention_scale(b)
    x = g.scale(g.get_rows(b.weight("token_embd.weight")), math.sqrt(hp.n_embd))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        local = sliding[il]
        h = b.rms_norm(x, f"{p}.attn_norm.weight")
        q = b.rms_norm(b.linear(h, f"{p}.attn_q"), f"{p}.attn_q_norm.weight", group=hp.head_dim)
        k = b.rms_norm(b.linear(h, f"{p}.attn_k"), f"{p}.attn_k_norm.weight", group=hp.head_dim)
        v = b.linear(h, f"{p}.attn_v")
        base = local_base if local else hp.rope_base
        freq_scale = 1.0 if local else hp.rope_freq_scale
        q, k = b.rope(q, True, base, freq_scale), b.rope(k, True, base, freq_scale)
        a = b.attention(q, k, v, window=hp.sliding_window if local else 0, scale=scale)
        a = b.rms_norm(b.linear(a, f"{p}.attn_output"), f"{p}.post_attention_norm.weight")
        x = g.add(x, a)
        h = b.rms_norm(x, f"{p}.ffn_norm.weight")
        m = b.rms_norm(b.gated_mlp(h, p, act="gelu"), f"{p}.post_ffw_norm.weight")
        x = g.add(x, m)
    x = b.rms_norm(g.select_outputs(x), "output_norm.weight")
    logits = g.matmul(b.output_weight(), x)
    cap = float(b.f.metadata.get(f"{hp.arch}.final_logit_softcapping", 0.0) or 0.0)
    return g.softcap(logits, cap) if cap > 0 else logits


def hparams(f) -> HParams:
    return HParams.from_gguf(f)
