"""Gemma 3 (text): embeddings scaled by sqrt(n_embd); RMSNorm before and after both attention
and MLP; per-head RMSNorm on Q and K; GeGLU MLP; five sliding-window layers (local RoPE base
10000) for every global one (the file's RoPE base and scaling). Norm weights in GGUF files
already include Gemma's +1."""

from __future__ import annotations

import math

from ember.models.blocks import Builder, HParams

LOCAL_ROPE_BASE = 10000.0
SLIDING_PATTERN = 6  # layer il is global when il % 6 == 5


def is_global(il: int) -> bool:
    return il % SLIDING_PATTERN == SLIDING_PATTERN - 1


def build(b: Builder) -> int:
    hp, g = b.hp, b.g
    x = g.scale(g.get_rows(b.weight("token_embd.weight")), math.sqrt(hp.n_embd))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        local = not is_global(il)
        h = b.rms_norm(x, f"{p}.attn_norm.weight")
        q = b.rms_norm(b.linear(h, f"{p}.attn_q"), f"{p}.attn_q_norm.weight", group=hp.head_dim)
        k = b.rms_norm(b.linear(h, f"{p}.attn_k"), f"{p}.attn_k_norm.weight", group=hp.head_dim)
        v = b.linear(h, f"{p}.attn_v")
        base = LOCAL_ROPE_BASE if local else hp.rope_base
        scale = 1.0 if local else hp.rope_freq_scale
        q, k = b.rope(q, True, base, scale), b.rope(k, True, base, scale)
        a = b.attention(q, k, v, window=hp.sliding_window if local else 0)
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
