"""GGUF writer: metadata and tensors, aligned, streamed to disk.

    w = GGUFWriter("out.gguf", "llama")
    w.add("llama.context_length", 2048)                       # inferred: UINT32
    w.add("tokenizer.ggml.token_type", types, GGUFValueType.INT32)
    w.add_tensor("blk.0.attn_q.weight", q4_0_bytes, GGMLType.Q4_0, (576, 576))
    w.add_tensor("output_norm.weight", np.ones(576, np.float32))   # F32, shape from the array
    w.write()

Metadata is encoded when it is added (so a bad value fails at `add`). Tensor data is only
referenced until `write`, which streams each tensor to the file in order: a numpy array (a memmap
or a view into another GGUF file is not copied), a bytes-like object, or a callable returning an
iterable of bytes-like chunks (produced while writing: quantize a slab, yield it, drop it). The
file is written under a temporary name and renamed into place when complete.

Type inference for `add(key, value)`: str -> STRING, bool -> BOOL, int -> UINT32 when it fits
(the type llama.cpp expects for counts and sizes; INT32 if negative, else 64-bit), float ->
FLOAT32, numpy scalars and arrays -> their dtype, lists -> ARRAY of the type their items infer to
(all of them considered), lists of lists -> arrays of arrays. `type` may name the scalar type, the
element type of an array value, or be a full spec such as (ARRAY, INT32) from
`GGUFFile.metadata_types`, so `w.add(k, f.metadata[k], f.metadata_types[k])` reproduces a key.
"""

from __future__ import annotations

import operator
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, Union

import numpy as np

from ember.errors import GGUFError
from ember.gguf.format import (
    ALIGNMENT_KEY,
    ARCHITECTURE_KEY,
    DEFAULT_ALIGNMENT,
    HEADER,
    MAGIC,
    MAX_DIMS,
    SCALAR_DTYPES,
    SCALAR_STRUCTS,
    U32,
    U64,
    VERSIONS,
    GGUFValueType,
    ValueSpec,
    align,
    is_power_of_two,
)
from ember.gguf.arrays import ArrayOfArrays
from ember.gguf.strings import StringArray
from ember.gguf.types import ELEMENT_DTYPES, TYPES, GGMLType, type_by_name

V = GGUFValueType
TensorSource = Union[np.ndarray, bytes, bytearray, memoryview, Callable[[], Iterable[Any]], Iterable[Any]]

_DTYPE_VALUE_TYPES = {(dt.kind, dt.itemsize): vt for vt, dt in SCALAR_DTYPES.items() if vt != V.BOOL}
_DTYPE_VALUE_TYPES[("b", 1)] = V.BOOL
_DTYPE_TENSOR_TYPES = {
    ("f", 4): GGMLType.F32, ("f", 2): GGMLType.F16, ("f", 8): GGMLType.F64, ("i", 1): GGMLType.I8,
    ("i", 2): GGMLType.I16, ("i", 4): GGMLType.I32, ("i", 8): GGMLType.I64,
}
_SEQUENCES = (list, tuple, np.ndarray, StringArray, ArrayOfArrays)
_ROWS_PER_CHUNK = 4096  # rows copied at a time from a non-contiguous array


@dataclass
class _Tensor:
    name: str
    type: GGMLType
    shape: tuple[int, ...]
    n_bytes: int
    source: Any


class GGUFWriter:
    def __init__(self, path: str | os.PathLike, arch: str | None = None, *,
                 alignment: int = DEFAULT_ALIGNMENT, version: int = 3):
        if version not in VERSIONS:
            raise GGUFError(f"cannot write GGUF version {version}; ember writes {VERSIONS}")
        self.path = Path(path)
        self.version = version
        self.alignment = DEFAULT_ALIGNMENT
        self._kv: dict[str, tuple[GGUFValueType, bytes]] = {}
        self._tensors: dict[str, _Tensor] = {}
        if arch is not None:
            self.add(ARCHITECTURE_KEY, arch)
        if alignment != DEFAULT_ALIGNMENT:
            self.add(ALIGNMENT_KEY, alignment, V.UINT32)

    # ------------------------------------------------------------------ metadata
    def add(self, key: str, value: Any, type: ValueSpec | int | None = None) -> None:
        """Set metadata `key` (a later add of the same key replaces the value, keeping its place)."""
        spec = infer_spec(value, key) if type is None else _normalize_spec(type, value, key)
        if key == ALIGNMENT_KEY:
            if spec != V.UINT32 or not isinstance(value, (int, np.integer)) or not is_power_of_two(int(value)):
                raise GGUFError(f"{ALIGNMENT_KEY} must be a u32 power of two, got {value!r}")
            self.alignment = int(value)
        self._kv[key] = (_tag(spec), encode_value(spec, value, key))

    # ------------------------------------------------------------------ tensors
    def add_tensor(self, name: str, data: TensorSource, type: GGMLType | int | str | None = None,
                   shape: Sequence[int] | None = None) -> None:
        """Add a tensor whose bytes are `data`, already in `type`; `shape` in ggml order (ne0 first).

        Without `type`, a float32/float16/float64/int array gives F32/F16/F64/I*. Without `shape`, an
        array gives it: reversed(array.shape), or for raw uint8 blocks of a quantized type with rows
        last, the row length in values. Bytes, callables and iterables need both.
        """
        if name in self._tensors:
            raise GGUFError(f"tensor {name!r} added twice")
        tensor_type = _tensor_type(type, data, name)
        shape = _tensor_shape(shape, data, tensor_type, name)
        info = TYPES[tensor_type]
        if shape[0] % info.block_size:
            raise GGUFError(f"tensor {name!r}: row length {shape[0]} is not a multiple of the "
                            f"{info.name} block size {info.block_size}")
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        n_bytes = n_elements // info.block_size * info.type_size
        _check_source(data, tensor_type, n_bytes, name)
        self._tensors[name] = _Tensor(name, tensor_type, shape, n_bytes, data)

    # ------------------------------------------------------------------ output
    def write(self) -> Path:
        """Write the file (under a temporary name, renamed when complete); returns its path."""
        head = self._header()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(head)
                for tensor in self._tensors.values():
                    written = _write_tensor(out, tensor)
                    out.write(bytes(align(written, self.alignment) - written))
            os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp's 0600 -> what open() would have given
            os.replace(tmp_name, self.path)
        except BaseException:
            os.unlink(tmp_name)
            raise
        return self.path

    def _header(self) -> bytes:
        head = bytearray(HEADER.pack(MAGIC, self.version, len(self._tensors), len(self._kv)))
        for key, (tag, encoded) in self._kv.items():
            head += _encode_string(key, "metadata key") + U32.pack(tag) + encoded
        offset = 0
        for t in self._tensors.values():
            head += _encode_string(t.name, "tensor name") + U32.pack(len(t.shape))
            head += struct.pack(f"<{len(t.shape)}Q", *t.shape) + U32.pack(t.type) + U64.pack(offset)
            offset += align(t.n_bytes, self.alignment)
        head += bytes(align(len(head), self.alignment) - len(head))
        return bytes(head)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------- value specs

def _tag(spec: ValueSpec) -> GGUFValueType:
    return spec[0] if isinstance(spec, tuple) else spec


def infer_spec(value: Any, what: str = "value") -> ValueSpec:
    if isinstance(value, StringArray):
        return (V.ARRAY, V.STRING)
    if isinstance(value, ArrayOfArrays):
        return (V.ARRAY, value.element_spec)
    if isinstance(value, (str, bytes)):
        return V.STRING
    if isinstance(value, (bool, np.bool_)):
        return V.BOOL
    if isinstance(value, np.generic):
        return _dtype_value_type(value.dtype, what)
    if isinstance(value, int):
        return _int_type([value], what)
    if isinstance(value, float):
        return V.FLOAT32
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise GGUFError(f"metadata {what}: arrays must be 1-D, got shape {value.shape}")
        return (V.ARRAY, _dtype_value_type(value.dtype, what))
    if isinstance(value, (list, tuple)):
        return (V.ARRAY, _infer_element(value, what))
    raise GGUFError(f"metadata {what}: cannot store a {type(value).__name__} in GGUF")


def _infer_element(items: Sequence[Any], what: str) -> ValueSpec:
    if not items:
        raise GGUFError(f"metadata {what}: cannot infer the element type of an empty array; pass type=")
    if all(isinstance(x, (str, bytes)) for x in items):
        return V.STRING
    if all(isinstance(x, (bool, np.bool_)) for x in items):
        return V.BOOL
    numbers = [x for x in items if isinstance(x, (int, float, np.integer, np.floating))
               and not isinstance(x, (bool, np.bool_))]
    if len(numbers) == len(items):
        if all(isinstance(x, (int, np.integer)) for x in items):
            return _int_type([int(x) for x in items], what)
        return V.FLOAT32
    if all(isinstance(x, _SEQUENCES) for x in items):
        return V.ARRAY  # each inner array infers its own element type
    raise GGUFError(f"metadata {what}: array items of mixed types cannot be stored")


def _int_type(values: Sequence[int], what: str) -> GGUFValueType:
    lo, hi = min(values), max(values)
    if lo >= 0:
        if hi < 1 << 32:
            return V.UINT32
        if hi < 1 << 64:
            return V.UINT64
    elif -(1 << 31) <= lo and hi < 1 << 31:
        return V.INT32
    elif -(1 << 63) <= lo and hi < 1 << 63:
        return V.INT64
    raise GGUFError(f"metadata {what}: integer out of the 64-bit range")


def _dtype_value_type(dtype: np.dtype, what: str) -> GGUFValueType:
    found = _DTYPE_VALUE_TYPES.get((dtype.kind, dtype.itemsize))
    if found is None:
        raise GGUFError(f"metadata {what}: numpy dtype {dtype} has no GGUF type")
    return found


def _normalize_spec(spec: Any, value: Any, what: str) -> ValueSpec:
    try:
        if isinstance(spec, tuple):
            if len(spec) != 2 or GGUFValueType(spec[0]) != V.ARRAY:
                raise GGUFError(f"metadata {what}: type {spec!r} is not (ARRAY, element type)")
            element = spec[1]
            return (V.ARRAY, _normalize_spec(element, [], what) if isinstance(element, tuple)
                    else GGUFValueType(element))
        vtype = GGUFValueType(spec)
    except ValueError:
        raise GGUFError(f"metadata {what}: unknown value type {spec!r}") from None
    if vtype == V.ARRAY:
        return infer_spec(value, what)
    if isinstance(value, _SEQUENCES):
        return (V.ARRAY, vtype)  # the type given is the element type
    return vtype


# ---------------------------------------------------------------------- encoding values

def encode_value(spec: ValueSpec, value: Any, what: str) -> bytes:
    """The bytes of `value` as GGUF stores it after its type tag."""
    tag = _tag(spec)
    if tag == V.STRING:
        return _encode_string(value, f"metadata {what}")
    if tag == V.ARRAY:
        if not isinstance(value, _SEQUENCES):
            raise GGUFError(f"metadata {what}: an ARRAY needs a list or array, got {type(value).__name__}")
        element = spec[1] if isinstance(spec, tuple) else _infer_element(value, what)
        return _encode_array(element, value, what)
    try:
        if tag == V.BOOL:
            scalar = bool(value)
        elif tag in (V.FLOAT32, V.FLOAT64):
            scalar = float(value)
        else:
            scalar = operator.index(value)
        return SCALAR_STRUCTS[tag].pack(scalar)
    except (struct.error, OverflowError, TypeError) as exc:
        raise GGUFError(f"metadata {what}: cannot store {value!r} as {tag.name} ({exc})") from None


def _encode_string(value: Any, what: str) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif not isinstance(value, (bytes, bytearray)):
        raise GGUFError(f"{what}: expected a string, got {type(value).__name__}")
    return U64.pack(len(value)) + bytes(value)


def _encode_array(element: ValueSpec, items: Any, what: str) -> bytes:
    tag = _tag(element)
    head = U32.pack(tag) + U64.pack(len(items))
    if tag == V.STRING:
        if isinstance(items, StringArray):
            return head + items.encoded()
        return head + b"".join(_encode_string(s, f"metadata {what}") for s in items)
    if tag == V.ARRAY:
        inner = element[1] if isinstance(element, tuple) else None
        if isinstance(items, ArrayOfArrays) and element in (V.ARRAY, items.element_spec):
            return head + items.encoded()
        parts = []
        for i, item in enumerate(items):
            if not isinstance(item, _SEQUENCES):
                raise GGUFError(f"metadata {what}[{i}]: expected an array, got {type(item).__name__}")
            parts.append(_encode_array(inner if inner is not None else _element_of(item, f"{what}[{i}]"),
                                       item, f"{what}[{i}]"))
        return head + b"".join(parts)
    return head + _numeric_array(items, tag, what).tobytes()


def _element_of(items: Any, what: str) -> ValueSpec:
    spec = infer_spec(items, what)
    return spec[1]


def _numeric_array(items: Any, tag: GGUFValueType, what: str) -> np.ndarray:
    dtype = SCALAR_DTYPES[tag]
    source = np.asarray(items)
    if source.ndim != 1:
        raise GGUFError(f"metadata {what}: arrays must be 1-D, got shape {source.shape}")
    if source.size == 0:
        return np.empty(0, dtype)
    if tag == V.BOOL:
        return (source != 0).astype(np.uint8)
    if source.dtype.kind not in "biuf":
        raise GGUFError(f"metadata {what}: cannot store {source.dtype} items as {tag.name}")
    if dtype.kind in "iu":
        if source.dtype.kind == "f":
            raise GGUFError(f"metadata {what}: cannot store floating-point items as {tag.name}")
        converted = source.astype(dtype)
        if not np.array_equal(converted, source):
            raise GGUFError(f"metadata {what}: items out of the {tag.name} range")
        return converted
    return source.astype(dtype)


# ---------------------------------------------------------------------- tensors

def _tensor_type(type: Any, data: Any, name: str) -> GGMLType:
    if isinstance(type, str):
        return type_by_name(type)
    if type is not None:
        try:
            return GGMLType(type)
        except ValueError:
            raise GGUFError(f"tensor {name!r}: unknown tensor type {type!r}") from None
    if isinstance(data, np.ndarray):
        found = _DTYPE_TENSOR_TYPES.get((data.dtype.kind, data.dtype.itemsize))
        if found is not None:
            return found
    raise GGUFError(f"tensor {name!r}: pass type= (cannot tell it from {type_name(data)})")


def _tensor_shape(shape: Sequence[int] | None, data: Any, tensor_type: GGMLType, name: str) -> tuple[int, ...]:
    if shape is None:
        if not isinstance(data, np.ndarray) or data.ndim == 0:
            raise GGUFError(f"tensor {name!r}: pass shape= (cannot tell it from {type_name(data)})")
        shape = _shape_of_array(data, tensor_type, name)
    shape = tuple(int(d) for d in shape)
    if not 1 <= len(shape) <= MAX_DIMS or any(d <= 0 for d in shape):
        raise GGUFError(f"tensor {name!r}: shape {list(shape)} must have 1 to {MAX_DIMS} positive dimensions")
    return shape


def _shape_of_array(data: np.ndarray, tensor_type: GGMLType, name: str) -> tuple[int, ...]:
    element = ELEMENT_DTYPES.get(tensor_type)
    if element is not None and (data.dtype.kind, data.dtype.itemsize) == (element.kind, element.itemsize):
        return tuple(reversed(data.shape))
    info = TYPES[tensor_type]
    if data.dtype == np.uint8 and data.shape[-1] % info.type_size == 0:
        row_values = data.shape[-1] // info.type_size * info.block_size
        return (row_values, *reversed(data.shape[:-1]))
    raise GGUFError(f"tensor {name!r}: pass shape= for a {data.dtype} array of {tensor_type.name}")


def _check_source(data: Any, tensor_type: GGMLType, n_bytes: int, name: str) -> None:
    if isinstance(data, np.ndarray):
        element = ELEMENT_DTYPES.get(tensor_type)
        natural = element is not None and (data.dtype.kind, data.dtype.itemsize) == (element.kind, element.itemsize)
        if not natural and data.dtype != np.uint8:
            raise GGUFError(f"tensor {name!r}: {data.dtype} data cannot be {tensor_type.name} "
                            "(give the encoded bytes as uint8)")
        size = data.nbytes
    elif isinstance(data, (bytes, bytearray, memoryview)):
        size = memoryview(data).nbytes
    elif callable(data) or isinstance(data, Iterable):
        return  # counted while writing
    else:
        raise GGUFError(f"tensor {name!r}: cannot write data from a {type_name(data)}")
    if size != n_bytes:
        raise GGUFError(f"tensor {name!r}: {tensor_type.name} of this shape is {n_bytes} bytes, data has {size}")


def type_name(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array"
    return f"a {type(value).__name__}"


def _write_tensor(out, tensor: _Tensor) -> int:
    source = tensor.source
    if isinstance(source, np.ndarray):
        chunks: Iterable[Any] = _array_chunks(source)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        chunks = (source,)
    elif callable(source):
        chunks = source()
    else:
        chunks = source
    written = 0
    for chunk in chunks:
        view = _byte_view(chunk, tensor.name)
        if written + view.nbytes > tensor.n_bytes:
            raise GGUFError(f"tensor {tensor.name!r}: data is longer than its {tensor.n_bytes} bytes")
        out.write(view)
        written += view.nbytes
    if written != tensor.n_bytes:
        raise GGUFError(f"tensor {tensor.name!r}: got {written} bytes of data, expected {tensor.n_bytes}")
    return written


def _array_chunks(array: np.ndarray) -> Iterable[np.ndarray]:
    if array.flags.c_contiguous:
        yield array
        return
    for start in range(0, array.shape[0], _ROWS_PER_CHUNK):
        yield np.ascontiguousarray(array[start:start + _ROWS_PER_CHUNK])


def _byte_view(chunk: Any, name: str) -> memoryview:
    if isinstance(chunk, np.ndarray):
        return memoryview(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
    try:
        return memoryview(chunk).cast("B")
    except TypeError:
        raise GGUFError(f"tensor {name!r}: a data chunk must be bytes-like, got {type_name(chunk)}") from None
