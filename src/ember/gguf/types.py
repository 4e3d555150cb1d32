"""The one table of ggml tensor types: ids, block sizes and byte sizes (ggml-common.h), the
element dtypes of the unquantized ones, and llama.cpp's file-type names.

Every type has a block of `block_size` values stored in `type_size` bytes. Shapes are in ggml
order (ne0 = row length first, as `TensorInfo.shape`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Sequence

import numpy as np

from ember.errors import EmberError, GGUFError

QK_K = 256  # values per K-quant super-block


class GGMLType(IntEnum):
    """ggml's tensor type ids (ggml.h `enum ggml_type`)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


@dataclass(frozen=True)
class TypeInfo:
    name: str
    block_size: int  # values per block
    type_size: int  # bytes per block


def _info(t: GGMLType, block_size: int, type_size: int) -> tuple[GGMLType, TypeInfo]:
    return t, TypeInfo(t.name, block_size, type_size)


_T = GGMLType
TYPES: dict[GGMLType, TypeInfo] = dict([
    _info(_T.F32, 1, 4),
    _info(_T.F16, 1, 2),
    _info(_T.Q4_0, 32, 2 + 16),
    _info(_T.Q4_1, 32, 2 + 2 + 16),
    _info(_T.Q5_0, 32, 2 + 4 + 16),
    _info(_T.Q5_1, 32, 2 + 2 + 4 + 16),
    _info(_T.Q8_0, 32, 2 + 32),
    _info(_T.Q8_1, 32, 2 + 2 + 32),  # d and s = d * sum(q) as f16 (ggml-common.h block_q8_1)
    _info(_T.Q2_K, QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    _info(_T.Q3_K, QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    _info(_T.Q4_K, QK_K, 2 + 2 + 12 + QK_K // 2),
    _info(_T.Q5_K, QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    _info(_T.Q6_K, QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    _info(_T.Q8_K, QK_K, 4 + QK_K + QK_K // 8),
    _info(_T.IQ2_XXS, QK_K, 2 + QK_K // 4),
    _info(_T.IQ2_XS, QK_K, 2 + QK_K // 4 + QK_K // 32),
    _info(_T.IQ3_XXS, QK_K, 2 + QK_K // 4 + QK_K // 8),
    _info(_T.IQ1_S, QK_K, 2 + QK_K // 8 + QK_K // 16),
    _info(_T.IQ4_NL, 32, 2 + 16),
    _info(_T.IQ3_S, QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    _info(_T.IQ2_S, QK_K, 2 + QK_K // 4 + QK_K // 16),
    _info(_T.IQ4_XS, QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    _info(_T.I8, 1, 1),
    _info(_T.I16, 1, 2),
    _info(_T.I32, 1, 4),
    _info(_T.I64, 1, 8),
    _info(_T.F64, 1, 8),
    _info(_T.IQ1_M, QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    _info(_T.BF16, 1, 2),
    _info(_T.TQ1_0, QK_K, 2 + 4 * 13),
    _info(_T.TQ2_0, QK_K, 2 + 64),
    _info(_T.MXFP4, 32, 1 + 16),
])

# numpy dtype of one element, for the types that are not block-quantized (BF16 as raw uint16).
ELEMENT_DTYPES: dict[GGMLType, np.dtype] = {
    _T.F32: np.dtype("<f4"), _T.F16: np.dtype("<f2"), _T.BF16: np.dtype("<u2"), _T.F64: np.dtype("<f8"),
    _T.I8: np.dtype("i1"), _T.I16: np.dtype("<i2"), _T.I32: np.dtype("<i4"), _T.I64: np.dtype("<i8"),
}

# llama.h `enum llama_ftype`: what general.file_type says about a whole model file.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}


def type_by_name(name: str) -> GGMLType:
    """`"Q4_K"` (any case) -> GGMLType.Q4_K."""
    try:
        return GGMLType[name.upper()]
    except KeyError:
        known = ", ".join(t.name for t in TYPES)
        raise EmberError(f"unknown tensor type {name!r} (known: {known})") from None


def file_type_name(file_type: int) -> str:
    return FILE_TYPES.get(file_type, f"unknown ({file_type})")


def tensor_bytes(type: GGMLType, shape: Sequence[int]) -> int:
    """Bytes of a tensor of `type` and ggml-order `shape` (ne0 must be a multiple of the block)."""
    info = TYPES[GGMLType(type)]
    if shape[0] % info.block_size:
        raise GGUFError(f"row length {shape[0]} is not a multiple of the {info.name} block size {info.block_size}")
    n_elements = 1
    for dim in shape:
        n_elements *= int(dim)
    return n_elements // info.block_size * info.type_size
