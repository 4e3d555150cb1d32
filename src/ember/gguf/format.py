"""GGUF on-disk constants shared by the reader and the writer.

Layout (little-endian, gguf.md in ggml): magic "GGUF", u32 version, u64 tensor count, u64 key count,
then the key/value pairs (string key, u32 value type, value), the tensor infos (string name, u32
n_dims, u64 dims[n_dims] with ne0 first, u32 ggml type, u64 offset relative to the data section),
padding to `general.alignment`, and the tensor data. A string is a u64 byte length and UTF-8 bytes;
an array is a u32 element type, a u64 count and the elements (an element that is itself an array
is again a type, a count and elements).
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Union

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 used 32-bit counts; v2 and v3 are identical for little-endian files
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays deeper than this are rejected (no real file nests at all)
ALIGNMENT_KEY = "general.alignment"
ARCHITECTURE_KEY = "general.architecture"


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


V = GGUFValueType

# The dtype of every fixed-size value type (BOOL is one byte, 0 or 1).
SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {
    V.UINT8: np.dtype("u1"), V.INT8: np.dtype("i1"), V.UINT16: np.dtype("<u2"), V.INT16: np.dtype("<i2"),
    V.UINT32: np.dtype("<u4"), V.INT32: np.dtype("<i4"), V.FLOAT32: np.dtype("<f4"), V.BOOL: np.dtype("u1"),
    V.UINT64: np.dtype("<u8"), V.INT64: np.dtype("<i8"), V.FLOAT64: np.dtype("<f8"),
}
SCALAR_STRUCTS: dict[GGUFValueType, struct.Struct] = {
    V.UINT8: struct.Struct("<B"), V.INT8: struct.Struct("<b"), V.UINT16: struct.Struct("<H"),
    V.INT16: struct.Struct("<h"), V.UINT32: struct.Struct("<I"), V.INT32: struct.Struct("<i"),
    V.FLOAT32: struct.Struct("<f"), V.BOOL: struct.Struct("<B"), V.UINT64: struct.Struct("<Q"),
    V.INT64: struct.Struct("<q"), V.FLOAT64: struct.Struct("<d"),
}
DTYPE_VALUE_TYPES: dict[np.dtype, GGUFValueType] = {
    np.dtype(dt).newbyteorder("="): vt for vt, dt in SCALAR_DTYPES.items() if vt != V.BOOL
}
DTYPE_VALUE_TYPES[np.dtype(np.bool_)] = V.BOOL

# The smallest encoding of one value of each type: bounds counts by the bytes left in the file.
MIN_VALUE_BYTES: dict[GGUFValueType, int] = {
    **{vt: dt.itemsize for vt, dt in SCALAR_DTYPES.items()}, V.STRING: 8, V.ARRAY: 4 + 8,
}
MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, one byte of value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset

# How a metadata value's type is described: a scalar type, or (ARRAY, element type) where the
# element type is again such a description (or a bare ARRAY when the inner arrays differ).
ValueSpec = Union[GGUFValueType, tuple]

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
HEADER = struct.Struct("<4sIQQ")


def align(offset: int, alignment: int) -> int:
    return offset + (-offset % alignment)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
