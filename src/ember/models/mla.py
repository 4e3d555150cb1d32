"""Multi-head latent attention (DeepSeek-V2/V3), as llama.cpp's deepseek2 graph reads a GGUF file.

Per layer, from the normalised input x:

    q        = attn_q_b(RMSNorm(attn_q_a(x)))      (low-rank Q; Lite models: attn_q(x))
             -> per head [q_nope (nope dims) | q_pe (rope dims)], q_pe rotated
    c | k_pe = attn_kv_a_mqa(x)                      the latent (kv_lora_rank) and one shared key
    c        = RMSNorm(c) (attn_kv_a_norm),  k_pe rotated
    out      = attn_output(MLA(q, c, k_pe))

The core's mla_attention op caches [c | k_pe] per token and computes in the absorbed form with
the per-head up-projections attn_k_b (W_UK) and attn_v_b (W_UV), as newer GGUF files store them;
older files store them as one attn_kv_b, split here (values as F32). RoPE rotates adjacent pairs;
YaRN's frequencies are every architecture's (models/rope.py), its magnitude and the score scale
follow llama.cpp's reading of DeepSeek's metadata, rope.scaling.yarn_log_multiplier (0.1 *
mscale_all_dim).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ember.errors import GGUFError
from ember.gguf.metadata import float_key, int_key
from ember.gguf.types import GGMLType
from ember.models.blocks import Builder, HParams
from ember.models.rope import yarn_divisors


@dataclass
class MLAParams:
    q_lora_rank: int  # 0: plain Q (attn_q)
    kv_lora_rank: int
    nope: int  # per-head query/key dimensions without rotation
    rope: int  # rotated dimensions (of each query head and of the shared key)
    value: int  # per-head value dimensions
    split: bool  # attn_k_b / attn_v_b (newer files) rather than attn_kv_b
    rope_magnitude: float  # of cos and sin (YaRN's mscale as llama.cpp reads DeepSeek's metadata)
    scale: float  # on q . k

    @property
    def key(self) -> int:
        return self.nope + self.rope


def mla_params(f, hp: HParams) -> MLAParams:
    """The MLA dimensions of a deepseek2 file, each checked; llama.cpp's key names."""
    meta, arch = f.metadata, hp.arch

    def key(name: str) -> str:
        return f"{arch}.{name}"

    split = key("attention.key_length_mla") in meta and key("attention.value_length_mla") in meta
    k_dim = hp.head_dim  # key_length_mla, or key_length in older files (HParams reads the right one)
    value = int_key(meta, key("attention.value_length_mla" if split else "attention.value_length"))
    rope = hp.rope_dims
    if rope >= k_dim:
        raise GGUFError(f"metadata key {key('rope.dimension_count')} ({rope}) leaves no unrotated key dimensions "
                        f"(the key has {k_dim})")
    kv_lora_rank = int_key(meta, key("attention.kv_lora_rank"))
    if split and int_key(meta, key("attention.key_length")) != kv_lora_rank + rope:
        raise GGUFError(f"metadata key {key('attention.key_length')} must be kv_lora_rank + rope dimensions "
                        f"({kv_lora_rank + rope}) in a file with {key('attention.key_length_mla')}")
    q_lora_rank = int_key(meta, key("attention.q_lora_rank"), 0, minimum=0)
    magnitude, scale = _yarn_scales(meta, arch, hp, k_dim)
    return MLAParams(q_lora_rank, kv_lora_rank, k_dim - rope, rope, value, split, magnitude, scale)


def _yarn_scales(meta, arch: str, hp: HParams, k_dim: int) -> tuple[float, float]:
    """The magnitude of the rotation's cos and sin and the score scale (llama.cpp: llama_context's
    yarn_attn_factor and the deepseek2 graph's kq_scale). Without YaRN: 1 and 1 / sqrt(key dims).
    The rotation's frequencies are YaRN's as for every architecture (models/rope.py)."""
    s = hp.rope_scaling
    if s.kind != "yarn":
        return s.attn_factor, s.attn_factor * s.attn_factor / math.sqrt(k_dim)
    log_mul = float_key(meta, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0, non_negative=True) / 0.1

    def mscale(m: float) -> float:
        return 1.0 if s.factor <= 1.0 else 0.1 * m * math.log(s.factor) + 1.0

    # llama.cpp: mscale(factor, mscale) / mscale(factor, mscale_all_dim), which is 1 since it takes
    # DeepSeek's mscale equal to mscale_all_dim (their configs have them equal); mscale(factor) without
    magnitude = (1.0 if log_mul else mscale(1.0)) * s.attn_factor
    kq_mscale = magnitude * (1.0 + 0.1 * log_mul * math.log(s.factor))
    return magnitude, kq_mscale * kq_mscale / math.sqrt(k_dim)


def tensor_shapes(hp: HParams, mp: MLAParams) -> dict[str, tuple[int, ...]]:
    """llama.cpp's shapes (ggml order) of the MLA tensors."""
    e, h, r = hp.n_embd, hp.n_head, mp.kv_lora_rank
    shapes = {
        "attn_q.weight": (e, h * mp.key),
        "attn_kv_a_mqa.weight": (e, r + mp.rope),
        "attn_kv_a_norm.weight": (r,),
        "attn_k_b.weight": (mp.nope, r, h),
        "attn_v_b.weight": (r, mp.value, h),
        "attn_kv_b.weight": (r, h * (mp.nope + mp.value)),
        "attn_output.weight": (h * mp.value, e),
    }
    if mp.q_lora_rank:
        shapes.update({"attn_q_a.weight": (e, mp.q_lora_rank), "attn_q_a_norm.weight": (mp.q_lora_rank,),
                       "attn_q_b.weight": (mp.q_lora_rank, h * mp.key)})
    return shapes


def _rope(b: Builder, x: int, head_dim: int, offset: int, mp: MLAParams) -> int:
    """RoPE over dimensions [offset, offset + rope) of each head, adjacent pairs, the file's scaling."""
    hp = b.hp
    factors = -1
    if hp.rope_scaling.kind == "yarn":
        factors = b.constant(f"rope_yarn.{hp.rope_base:g}", yarn_divisors(hp.rope_scaling, mp.rope, hp.rope_base))
    return b.g.rope(x, head_dim, mp.rope, False, hp.rope_base, hp.rope_freq_scale, factors, offset)


def attention(b: Builder, x: int, prefix: str, mp: MLAParams) -> int:
    """attn_output(MLA(x)) for the layer whose tensors are prefix.attn_*."""
    g, hp = b.g, b.hp
    if mp.q_lora_rank:
        q = b.linear(b.rms_norm(b.linear(x, f"{prefix}.attn_q_a"), f"{prefix}.attn_q_a_norm.weight"),
                     f"{prefix}.attn_q_b")
    else:
        q = b.linear(x, f"{prefix}.attn_q")
    q = _rope(b, q, mp.key, mp.nope, mp)  # each head's last rope dimensions
    kv = b.linear(x, f"{prefix}.attn_kv_a_mqa")
    c = b.rms_norm(g.view(kv, 0, mp.kv_lora_rank), f"{prefix}.attn_kv_a_norm.weight")
    k_pe = _rope(b, g.view(kv, mp.kv_lora_rank, mp.rope), mp.rope, 0, mp)
    if mp.rope_magnitude != 1.0:  # q_pe . k_pe scales with both magnitudes; k_pe enters nothing else
        k_pe = g.scale(k_pe, mp.rope_magnitude * mp.rope_magnitude)
    k_b, v_b = _up_projections(b, prefix, mp)
    out = g.mla_attention(q, c, k_pe, k_b, v_b, hp.n_head, mp.kv_lora_rank, mp.rope, mp.nope, mp.value, mp.scale)
    return b.linear(out, f"{prefix}.attn_output")


def _up_projections(b: Builder, prefix: str, mp: MLAParams) -> tuple[int, int]:
    """attn_k_b [n_head * rank rows of nope] and attn_v_b [n_head * value rows of rank]: the file's,
    or those of an older file's attn_kv_b [n_head * (nope + value) rows of rank], as F32."""
    if mp.split:
        return b.weight(f"{prefix}.attn_k_b.weight"), b.weight(f"{prefix}.attn_v_b.weight")
    from ember.quant.reference import dequantize_tensor

    name = f"{prefix}.attn_kv_b.weight"
    b._tensor(name)  # shape checked
    h, r = b.hp.n_head, mp.kv_lora_rank
    kv_b = dequantize_tensor(b.f.tensors[name]).reshape(h, mp.nope + mp.value, r)
    k_b = np.ascontiguousarray(kv_b[:, :mp.nope, :].transpose(0, 2, 1), dtype=np.float32)  # [h, rank, nope]
    v_b = np.ascontiguousarray(kv_b[:, mp.nope:, :], dtype=np.float32)  # [h, value, rank]
    ids = []
    for part, values in (("k_b", k_b), ("v_b", v_b)):
        data = values.reshape(-1).view(np.uint8)
        b._keep.append(data)
        ids.append(b.g.named_weight(name, int(GGMLType.F32), values.shape[2], h * values.shape[1], data))
    return ids[0], ids[1]
