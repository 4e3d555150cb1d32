"""Which tensor gets which type: the quantization presets of llama.cpp's llama-quantize.

A preset (Q4_K_M, ...) names a default type and a file type id (`general.file_type`); the rules
of llama.cpp's `llama_tensor_get_type` then give some tensors more bits (attn_v and ffn_down in
the first, last and every third layer for the *_K_M presets; output.weight, or token_embd.weight
when the output shares it, Q6_K) and fall back to a 32-block type where a row does not divide
into 256-value super-blocks. Tensors with one dimension, norms and a few small tables keep their
type. Only what matters for the presets below is reproduced: no importance matrix, and of the IQ
types the two that need none, IQ4_NL and IQ4_XS (with the rules llama.cpp applies when it has no
importance matrix).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ember.errors import EmberError
from ember.gguf.types import TYPES, GGMLType

T = GGMLType


@dataclass(frozen=True)
class Preset:
    name: str
    file_type: int  # llama.h llama_ftype, written to general.file_type
    default: GGMLType


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("Q4_0", 2, T.Q4_0), Preset("Q4_1", 3, T.Q4_1), Preset("Q8_0", 7, T.Q8_0),
    Preset("Q5_0", 8, T.Q5_0), Preset("Q5_1", 9, T.Q5_1), Preset("Q2_K", 10, T.Q2_K),
    Preset("Q3_K_S", 11, T.Q3_K), Preset("Q3_K_M", 12, T.Q3_K), Preset("Q3_K_L", 13, T.Q3_K),
    Preset("Q4_K_S", 14, T.Q4_K), Preset("Q4_K_M", 15, T.Q4_K), Preset("Q5_K_S", 16, T.Q5_K),
    Preset("Q5_K_M", 17, T.Q5_K), Preset("Q6_K", 18, T.Q6_K), Preset("IQ4_NL", 25, T.IQ4_NL),
    Preset("IQ4_XS", 30, T.IQ4_XS),
]}
_IQ4 = ("IQ4_NL", "IQ4_XS")


def preset_by_name(name: str) -> Preset:
    preset = PRESETS.get(name.upper())
    if preset is None:
        raise EmberError(f"unknown quantization type {name!r} (choose from {', '.join(PRESETS)})")
    return preset


# Substrings of 2-D weights that stay as they are (llama.cpp's tensor_allows_quantization).
_KEEP = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
         "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
         "indexer.q_proj.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
         "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
_KEEP_EXACT = ("position_embd.weight", "token_types.weight")
_TIME_MIX = re.compile(r"time_mix_(first|w0|w1|w2|v0|v1|v2|a0|a1|a2|g1|g2|decay_w1|decay_w2|lerp_fused)\.weight")
# Which layer count makes llama.cpp call a model "70B" (its attn_v then gets Q5_K over Q3_K/Q4_K).
_70B_LAYERS = {"llama": 80, "qwen2": 80, "olmo": 80, "deci": 80, "jais2": 68}
_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelShape:
    """The hyperparameters the rules look at."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        if _70B_LAYERS.get(self.arch) != self.n_layer:
            return False
        return self.arch != "llama" or self.n_head != self.n_head_kv


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    n_dims = len(shape)
    while n_dims > 1 and shape[n_dims - 1] == 1:
        n_dims -= 1
    if n_dims < 2 or not name.endswith("weight") or name in _KEEP_EXACT:
        return False
    return not any(part in name for part in _KEEP) and not _TIME_MIX.search(name)


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    # fused q/k/v and MLA's kv_b weights follow the attn_v rules (llama.cpp's category_is_attn_v)
    for part, category in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"),
                           ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                           ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                           ("ffn_down", "ffn_down")):
        if part in name:
            return category
    return "other"


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The first and last eighth of the layers and every third one between them."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def llama_order(names: Iterable[str]) -> list[str]:
    """Tensor names in the order llama.cpp visits them (by layer number, then by name); the
    per-layer counters of the rules count in this order."""
    def key(name: str) -> tuple[int, bytes]:
        found = _LAYER.match(name)
        return (int(found.group(1)) if found else -1, name.encode())
    return sorted(names, key=key)


class _Rules:
    def __init__(self, preset: Preset, model: ModelShape, tied_embeddings: bool, n_attn_v: int):
        self.preset, self.model, self.tied = preset.name, model, tied_embeddings
        self.n_attn_v = n_attn_v
        self.i_attn_v = self.i_ffn_down = 0

    def choose(self, name: str, ne0: int, new: GGMLType) -> GGMLType:
        category, p, m = _category(name), self.preset, self.model
        falcon = m.arch == "falcon"
        if category == "output" or (self.tied and category == "token_embd"):
            if falcon or ne0 % TYPES[new].block_size:
                return T.Q8_0
            return new if new == T.Q8_0 else T.Q6_K
        if category == "attn_v":
            return self._attn_v(new)
        if category == "attn_k":
            return T.Q8_0 if m.n_expert == 8 else new
        if category == "ffn_down":
            return self._ffn_down(name, new)
        if category == "attn_output":
            if falcon:
                return T.Q4_K if p == "Q3_K_L" else new
            if m.n_expert == 8:
                return T.Q5_K if p in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", *_IQ4) else new
            return {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K}.get(p, new)
        return new

    def _attn_v(self, new: GGMLType) -> GGMLType:
        p, m, i = self.preset, self.model, self.i_attn_v
        self.i_attn_v += 1
        if p == "Q2_K":
            new = T.Q4_K if m.n_gqa >= 4 else T.Q3_K
        elif p == "Q3_K_M":
            new = T.Q5_K if i < 2 else T.Q4_K
        elif p == "Q3_K_L":
            new = T.Q5_K
        elif p in _IQ4 and m.n_gqa >= 4:
            new = T.Q5_K
        elif p in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, self.n_attn_v):
            new = T.Q6_K
        elif p == "Q4_K_S" and i < 4:
            new = T.Q5_K
        if m.is_70b and new in (T.Q3_K, T.Q4_K):
            new = T.Q5_K
        return T.Q8_0 if m.n_expert == 8 else new

    def _ffn_down(self, name: str, new: GGMLType) -> GGMLType:
        p, m = self.preset, self.model
        i, n = self.i_ffn_down, m.n_layer
        self.i_ffn_down += 1
        if m.n_expert > 1:
            found = _LAYER.match(name)
            if found is None:
                raise EmberError(f"cannot tell the layer of tensor {name!r}")
            i = int(found.group(1))
        falcon = m.arch == "falcon"
        if p == "Q2_K":
            return T.Q3_K
        if p == "Q3_K_M":
            return T.Q5_K if i < n // 16 else T.Q4_K if not falcon or _use_more_bits(i, n) else T.Q3_K
        if p == "Q3_K_L":
            return T.Q4_K if falcon else T.Q5_K
        if p == "Q4_K_M":
            if falcon:
                return T.Q6_K if i < n // 16 else T.Q5_K if _use_more_bits(i, n) else T.Q4_K
            return T.Q6_K if _use_more_bits(i, n) else new
        if p in _IQ4 and i < n // 8:  # llama.cpp's rule without an importance matrix
            return T.Q5_K
        if p == "Q5_K_M" and _use_more_bits(i, n):
            return T.Q6_K
        if p == "Q4_K_S" and not falcon and i < n // 8:
            return T.Q5_K
        return new


# Where a row does not divide into the chosen type's blocks (llama.cpp's tensor_type_fallback).
_FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ4_XS: T.IQ4_NL}


def _fit_rows(ne0: int, new: GGMLType) -> GGMLType:
    if ne0 % TYPES[new].block_size == 0:
        return new
    new = _FALLBACK.get(new, new)
    return new if ne0 % TYPES[new].block_size == 0 else T.F16


def tensor_types(tensors: dict[str, tuple[GGMLType, tuple[int, ...]]], preset: Preset,
                 model: ModelShape) -> dict[str, GGMLType]:
    """{name: (type, ggml shape)} -> {name: output type} under `preset`."""
    names = llama_order(tensors)
    n_attn_v = sum(_category(n) == "attn_v" for n in names)
    rules = _Rules(preset, model, "output.weight" not in tensors, n_attn_v)
    chosen = {}
    for name in names:
        source_type, shape = tensors[name]
        if not allows_quantization(name, shape):
            chosen[name] = source_type
        else:
            chosen[name] = _fit_rows(shape[0], rules.choose(name, shape[0], preset.default))
    return chosen
