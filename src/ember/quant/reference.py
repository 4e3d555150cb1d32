"""numpy reference (de)quantizers: the oracle for the C++ kernels.

The dequantizers reproduce the `gguf` package's `gguf.quants.dequantize` bit for bit (same
float32 operations in the same order), and the quantizers reproduce `gguf.quants.quantize`
(itself bit-exact with ggml's reference C code). Everything is vectorized over blocks; large
tensors are processed a slab of blocks at a time so the temporaries stay small.

Shapes: `shape` arguments are in ggml order (ne0 = row length first, as `TensorInfo.shape`);
arrays are returned in numpy order (the reverse).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ember.errors import GGUFError
from ember.gguf.types import QK_K, TYPES, GGMLType, tensor_bytes

_T = GGMLType

# ---------------------------------------------------------------- dequantize, one function per type
# Each takes blocks as a (n_blocks, type_size) uint8 array and returns (n_blocks, block_size) float32.

def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian f16 bytes (..., 2) -> float32 (..., 1)."""
    return raw.view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray, n_groups: int, width: int) -> np.ndarray:
    """Bytes (n, n_groups*width) -> (n, n_groups, 2, width): low nibbles first, then high nibbles."""
    packed = qs.reshape(len(qs), n_groups, 1, width)
    return (packed >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)


def _bits(packed: np.ndarray, width: int, n_fields: int, bits_per_field: int) -> np.ndarray:
    """Bytes (n, k*width) -> (n, k, n_fields, width): field j of byte b is (b >> j*bits) & mask."""
    shifts = np.arange(0, n_fields * bits_per_field, bits_per_field, dtype=np.uint8)
    grouped = packed.reshape(len(packed), -1, 1, width)
    return (grouped >> shifts.reshape(1, 1, n_fields, 1)) & np.uint8((1 << bits_per_field) - 1)


def _qh_bits32(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 high bits: 4 bytes = little-endian u32, bit j belongs to value j."""
    word = qh.copy().view("<u4").reshape(-1, 1)
    return ((word >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)


def _dequant_q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:], 1, 16).reshape(len(b), 32).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _dequant_q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 4:], 1, 16).reshape(len(b), 32).astype(np.float32)
    return d * q + m


def _q5_values(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    low = _nibbles(qs, 1, 16).reshape(len(qs), 32)
    return low | (_qh_bits32(qh) << np.uint8(4))


def _dequant_q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, :2])
    q = _q5_values(b[:, 2:6], b[:, 6:]).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _dequant_q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _q5_values(b[:, 4:8], b[:, 8:]).astype(np.float32)
    return d * q + m


def _dequant_q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, :2])
    return b[:, 2:].view(np.int8).astype(np.float32) * d


def _dequant_q2_k(b: np.ndarray) -> np.ndarray:
    # block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    n = len(b)
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & np.uint8(0xF)).astype(np.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> np.uint8(4)).astype(np.float32)).reshape(n, 16, 1)
    q = _bits(qs, 32, 4, 2).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _dequant_q3_k(b: np.ndarray) -> np.ndarray:
    # block_q3_K: hmask[32], qs[64], scales[12] (16 six-bit signed scales), d
    n = len(b)
    hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = _bits(packed[:, :8], 8, 2, 4).reshape(n, 16)  # bytes 0-7: low 4 bits of scales 0-7, then 8-15
    high = _bits(packed[:, 8:], 4, 4, 2).reshape(n, 16)  # bytes 8-11: high 2 bits, 4 scales per byte
    scales = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)
    dl = (d * scales).reshape(n, 16, 1)
    ql = _bits(qs, 32, 4, 2).reshape(n, 16, 16)
    hbit = _bits(hmask, 32, 8, 1).reshape(n, 16, 16) ^ np.uint8(1)  # a set bit means "no -4 offset"
    q = (ql.astype(np.int8) - (hbit << np.uint8(2)).astype(np.int8)).astype(np.float32)
    return (dl * q).reshape(n, QK_K)


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (get_scale_min_k4)."""
    n = len(packed)
    rows = packed.reshape(n, 3, 4)
    d, m, md = rows[:, 0], rows[:, 1], rows[:, 2]
    low6, high2 = np.uint8(0x3F), np.uint8(0x30)
    scales = np.concatenate([d & low6, (md & np.uint8(0x0F)) | ((d >> np.uint8(2)) & high2)], axis=-1)
    mins = np.concatenate([m & low6, (md >> np.uint8(4)) | ((m >> np.uint8(2)) & high2)], axis=-1)
    return scales, mins


def _k_scale_terms(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(b)
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    scales, mins = _k_scales_mins(b[:, 4:16])
    return ((d * scales.astype(np.float32)).reshape(n, 8, 1),
            (dmin * mins.astype(np.float32)).reshape(n, 8, 1))


def _dequant_q4_k(b: np.ndarray) -> np.ndarray:
    # block_q4_K: d, dmin, scales[12], qs[128]; 8 sub-blocks of 32
    n = len(b)
    scale, offset = _k_scale_terms(b)
    q = _nibbles(b[:, 16:], 4, 32).reshape(n, 8, 32).astype(np.float32)
    return (scale * q - offset).reshape(n, QK_K)


def _dequant_q5_k(b: np.ndarray) -> np.ndarray:
    # block_q5_K: d, dmin, scales[12], qh[32], qs[128]
    n = len(b)
    scale, offset = _k_scale_terms(b)
    low = _nibbles(b[:, 48:], 4, 32).reshape(n, 8, 32)
    high = _bits(b[:, 16:48], 32, 8, 1).reshape(n, 8, 32)
    q = (low | (high << np.uint8(4))).astype(np.float32)
    return (scale * q - offset).reshape(n, QK_K)


def _dequant_q6_k(b: np.ndarray) -> np.ndarray:
    # block_q6_K: ql[128], qh[64], scales[16] (int8), d
    n = len(b)
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    scale = (d * scales.view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    low = _nibbles(ql, 2, 64).reshape(n, 8, 32)
    high = _bits(qh, 32, 4, 2).reshape(n, 8, 32)
    q = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    return (scale * q).reshape(n, QK_K)


# ggml-common.h kvalues_iq4nl: the 16 levels of IQ4_NL and IQ4_XS, indexed by a nibble.
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def _dequant_iq4_nl(b: np.ndarray) -> np.ndarray:
    # block_iq4_nl: d, qs[16] (nibbles as Q4_0's, indices into IQ4_VALUES)
    d = _f16(b[:, :2])
    q = IQ4_VALUES[_nibbles(b[:, 2:], 1, 16).reshape(len(b), 32)].astype(np.float32)
    return d * q


def _dequant_iq4_xs(b: np.ndarray) -> np.ndarray:
    # block_iq4_xs: d, scales_h (u16: bits 2j..2j+1 = top bits of scale j), scales_l[4] (nibble j =
    # low bits of scale j), qs[128]; 8 sub-blocks of 32, each with a 6-bit scale biased by 32
    n = len(b)
    d = _f16(b[:, :2])
    high = _bits(b[:, 2:4], 1, 4, 2).reshape(n, 8)  # little-endian u16: byte 0 holds scales 0-3
    low = _nibbles(b[:, 4:8], 4, 1).reshape(n, 8)
    scales = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)
    dl = (d * scales).reshape(n, 8, 1)
    q = IQ4_VALUES[_nibbles(b[:, 8:], 8, 16).reshape(n, 8, 32)].astype(np.float32)
    return (dl * q).reshape(n, QK_K)


def _dequant_f32(b: np.ndarray) -> np.ndarray:
    return b.copy().view("<f4")


def _dequant_f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view("<f2").astype(np.float32)


def _dequant_bf16(b: np.ndarray) -> np.ndarray:
    return (b.copy().view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)


_DEQUANTIZE: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    _T.F32: _dequant_f32, _T.F16: _dequant_f16, _T.BF16: _dequant_bf16,
    _T.Q4_0: _dequant_q4_0, _T.Q4_1: _dequant_q4_1, _T.Q5_0: _dequant_q5_0, _T.Q5_1: _dequant_q5_1,
    _T.Q8_0: _dequant_q8_0, _T.Q2_K: _dequant_q2_k, _T.Q3_K: _dequant_q3_k, _T.Q4_K: _dequant_q4_k,
    _T.Q5_K: _dequant_q5_k, _T.Q6_K: _dequant_q6_k, _T.IQ4_NL: _dequant_iq4_nl, _T.IQ4_XS: _dequant_iq4_xs,
}

_SLAB_VALUES = 1 << 20  # values per slab: bounds the temporaries of one step


def dequantize_tensor(info) -> np.ndarray:
    """A GGUF file's tensor (`TensorInfo`) as float32 values in numpy shape."""
    return dequantize(info.data, info.type, info.shape)


def dequantize(raw: np.ndarray, type: GGMLType, shape: Sequence[int]) -> np.ndarray:
    """Raw tensor bytes of `type` and ggml-order `shape` -> float32 array of numpy shape reversed(shape)."""
    type = GGMLType(type)
    convert = _DEQUANTIZE.get(type)
    if convert is None:
        raise GGUFError(f"dequantizing {type.name} is not supported")
    info = TYPES[type]
    n_bytes = tensor_bytes(type, shape)
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if raw.size != n_bytes:
        raise GGUFError(f"{type.name} tensor of shape {tuple(shape)} needs {n_bytes} bytes, got {raw.size}")
    blocks = raw.reshape(-1, info.type_size)
    out = np.empty((len(blocks), info.block_size), np.float32)
    step = max(1, _SLAB_VALUES // info.block_size)
    for start in range(0, len(blocks), step):
        out[start:start + step] = convert(blocks[start:start + step])
    return out.reshape(tuple(int(d) for d in reversed(shape)))


# ---------------------------------------------------------------- quantize (ggml-quants.c reference)
# Each takes (n_blocks, block_size) float32 and returns (n_blocks, type_size) uint8.

def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, 0, 1 / d)


def _round_away(x: np.ndarray) -> np.ndarray:
    """roundf(): halves away from zero, exactly (floor(|x| + 0.5) can round up in float32)."""
    magnitude = np.abs(x)
    whole = np.floor(magnitude)
    return np.sign(x) * (whole + np.floor(2 * (magnitude - whole)))


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes: value j in the low nibble, value j+16 in the high."""
    return (q[:, :16] & np.uint8(0x0F)) | (q[:, 16:] << np.uint8(4))


def _pack_high_bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..31 -> (n, 4) bytes: bit 4 of value j is bit j of a little-endian u32."""
    return np.packbits(q >> np.uint8(4), axis=-1, bitorder="little")


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8)


def _absmax_signed(blocks: np.ndarray) -> np.ndarray:
    """The value of largest magnitude in each block, with its sign (the first one on ties)."""
    where = np.abs(blocks).argmax(axis=-1, keepdims=True)
    return np.take_along_axis(blocks, where, axis=-1)


def _quant_q4_0(x: np.ndarray) -> np.ndarray:
    d = _absmax_signed(x) / -8
    q = np.trunc(x * _inverse(d) + np.float32(8.5), dtype=np.float32).astype(np.uint8).clip(0, 15)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=-1)


def _quant_q4_1(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    d = (hi - lo) / 15
    q = np.trunc((x - lo) * _inverse(d) + np.float32(0.5), dtype=np.float32).astype(np.uint8).clip(0, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], axis=-1)


def _quant_q5_0(x: np.ndarray) -> np.ndarray:
    d = _absmax_signed(x) / -16
    q = np.trunc(x * _inverse(d) + np.float32(16.5), dtype=np.float32).astype(np.uint8).clip(0, 31)
    return np.concatenate([_f16_bytes(d), _pack_high_bits(q), _pack_nibbles(q)], axis=-1)


def _quant_q5_1(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    d = (hi - lo) / 31
    q = np.trunc((x - lo) * _inverse(d) + np.float32(0.5), dtype=np.float32).astype(np.uint8).clip(0, 31)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_high_bits(q), _pack_nibbles(q)], axis=-1)


def _quant_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=-1, keepdims=True) / 127
    q = _round_away(x * _inverse(d)).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=-1)


def _quant_f32(x: np.ndarray) -> np.ndarray:
    return x.astype("<f4").view(np.uint8)


def _quant_f16(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8)


def _quant_bf16(x: np.ndarray) -> np.ndarray:
    # ggml_compute_fp32_to_bf16: NaN -> quiet NaN, otherwise round to nearest even
    bits = x.astype(np.float32).view(np.uint32)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    bits = np.where(is_nan, (bits & np.uint32(0xFFFF0000)) | np.uint32(64 << 16), bits)
    rounded = (bits.astype(np.uint64) + (np.uint64(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint64(16)
    return rounded.astype("<u2").view(np.uint8)


_QUANTIZE: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    _T.F32: _quant_f32, _T.F16: _quant_f16, _T.BF16: _quant_bf16,
    _T.Q4_0: _quant_q4_0, _T.Q4_1: _quant_q4_1, _T.Q5_0: _quant_q5_0, _T.Q5_1: _quant_q5_1,
    _T.Q8_0: _quant_q8_0,
}


def quantize(x: np.ndarray, type: GGMLType) -> np.ndarray:
    """float32 array (numpy order, rows last) -> uint8 array (..., bytes per row) of `type`."""
    type = GGMLType(type)
    convert = _QUANTIZE.get(type)
    if convert is None:
        raise GGUFError(f"quantizing to {type.name} is not supported")
    info = TYPES[type]
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % info.block_size:
        raise GGUFError(f"rows of {x.shape[-1] if x.ndim else 0} values cannot be quantized to "
                        f"{type.name} (block size {info.block_size})")
    blocks = x.reshape(-1, info.block_size)
    out = np.empty((len(blocks), info.type_size), np.uint8)
    step = max(1, _SLAB_VALUES // info.block_size)
    for start in range(0, len(blocks), step):
        out[start:start + step] = convert(blocks[start:start + step]).reshape(-1, info.type_size)
    return out.reshape(*x.shape[:-1], x.shape[-1] // info.block_size * info.type_size)
