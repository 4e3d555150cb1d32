"""GGUF v2/v3 reader: one mmap, every count, length, size and offset checked before it is used.

    with open_file("model.gguf") as f:
        f.arch, f.field("context_length"), f.metadata["tokenizer.ggml.tokens"][42]
        w = f.tensors["blk.0.attn_q.weight"]     # TensorInfo: type, shape (ne0 first), offset
        w.data                                    # zero-copy uint8 view of the mapped file

Nothing is read whole: values are parsed in place from the mapping and tensor data stays there.
A file that is malformed, truncated or hostile raises GGUFError naming the field or tensor and
the byte offset; no count taken from the file sizes an allocation before it has been checked
against the bytes the file actually has left (the checks of ggml's gguf.cpp, and a few more).

`open_file` reads one file; `ember.gguf.split.open_gguf` (what `ember.gguf.open_gguf` is) also
joins the parts of a split model into one GGUFFile whose `parts` are the files read here.
With `use_mmap=False` the file is read into anonymous memory instead of being mapped (what
llama.cpp's --no-mmap does); `lock()` pins the bytes in RAM (mlock). Either way the memory is
advised for 2 MiB pages unless `huge_pages=False` (`_advise_huge`).

Metadata values: strings -> str; numeric scalars -> int / float / bool; numeric arrays -> numpy
arrays (copies, so they outlive the file); arrays of strings -> StringArray (a lazy list[str], see
gguf/strings.py); arrays of arrays -> ArrayOfArrays (a lazy sequence of those, gguf/arrays.py).
`metadata_types` gives each key's GGUF type (a GGUFValueType, or (ARRAY, element type)) so the
writer can reproduce the file exactly.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ember.errors import GGUFError, ModelNotFound
from ember.gguf.format import (
    ALIGNMENT_KEY,
    ARCHITECTURE_KEY,
    DEFAULT_ALIGNMENT,
    HEADER,
    MAGIC,
    MAX_DIMS,
    MAX_NESTING,
    MIN_KV_BYTES,
    MIN_TENSOR_INFO_BYTES,
    MIN_VALUE_BYTES,
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
from ember.gguf.strings import locate_strings, read_string_array
from ember.gguf.types import ELEMENT_DTYPES, TYPES, GGMLType

INT64_MAX = (1 << 63) - 1
# id -> enum member by dict: calling the Enum class costs microseconds per tensor
_VALUE_TYPES = {int(t): t for t in GGUFValueType}
_TENSOR_TYPES = {int(t): t for t in TYPES}
_TENSOR_INFO_TAIL = {n: struct.Struct(f"<{n}QIQ") for n in range(1, MAX_DIMS + 1)}
_ARRAY_HEADER = struct.Struct("<IQ")  # element type, count
_HEADER_DTYPE = np.dtype([("type", "<u4"), ("count", "<u8")])  # packed: 12 bytes
_BULK_RUN = 8  # fewer repeated inner arrays than this are walked one by one


@dataclass(eq=False)
class TensorInfo:
    name: str
    type: GGMLType
    shape: tuple[int, ...]  # ggml order: ne0 (the row length) first
    offset: int  # absolute offset of the data in the file
    n_bytes: int
    n_elements: int
    _file: "GGUFFile" = dataclass_field(repr=False, default=None)

    @property
    def np_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def data(self) -> np.ndarray:
        """The tensor's bytes: a read-only uint8 view of the mapped file (no copy)."""
        return self._file._view(self.offset, self.n_bytes)

    def array(self) -> np.ndarray:
        """Typed view in numpy shape for F32/F16/F64/I8..I64 (BF16 as uint16); for block types,
        the raw bytes as (*np_shape[:-1], bytes per row)."""
        dtype = ELEMENT_DTYPES.get(self.type)
        if dtype is not None:
            return self.data.view(dtype).reshape(self.np_shape)
        info = TYPES[self.type]
        return self.data.reshape(*self.np_shape[:-1], self.shape[0] // info.block_size * info.type_size)


class GGUFFile:
    """A parsed GGUF file. Use `open_gguf`; close it (or use `with`) to release the mapping.

    `parts` are the files that hold its tensors: itself, or for a split model the files of its
    parts (each tensor's data lives in the part it came from); `size` is their total size.
    """

    def __init__(self, path: Path, mm: mmap.mmap | None, parts: "list[GGUFFile] | None" = None):
        self.path = path
        self.parts: list[GGUFFile] = parts or [self]
        self.size = len(mm) if mm is not None else sum(part.size for part in self.parts)
        self.version = 0
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, ValueSpec] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._mm = mm
        self._buf: np.ndarray | None = np.frombuffer(mm, np.uint8) if mm is not None else None
        if self._buf is not None:
            self._buf.flags.writeable = False

    # -- metadata helpers
    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def arch(self) -> str | None:
        return self.metadata.get(ARCHITECTURE_KEY)

    def field(self, name: str, default: Any = ...) -> Any:
        """metadata[f"{arch}.{name}"], e.g. field("context_length")."""
        key = f"{self.arch}.{name}"
        if default is ...:
            return self.metadata[key]
        return self.metadata.get(key, default)

    @property
    def paths(self) -> list[Path]:
        """The files of the model: this one, or every part of a split model in order."""
        return [part.path for part in self.parts]

    # -- memory
    def lock(self) -> None:
        """Pin the file's bytes in RAM (mlock(2)), so they are never paged out; raises OSError
        when the system refuses (RLIMIT_MEMLOCK, `ulimit -l`)."""
        for part in self.parts:
            if part._buf is None:
                raise ValueError(f"{part.path} is closed")
            _mlock(part._buf)

    # -- lifetime
    def close(self) -> None:
        """Release the mapping. Views handed out earlier keep it alive until they are dropped."""
        for part in self.parts:
            if part is not self:
                part.close()
        self._buf = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a tensor view still exists; the mapping goes when the last view does
            self._mm = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors)")

    def _view(self, offset: int, n_bytes: int) -> np.ndarray:
        if self._buf is None:
            raise ValueError(f"{self.path} is closed")
        return self._buf[offset:offset + n_bytes]


def open_file(path: str | os.PathLike, use_mmap: bool = True, huge_pages: bool = True) -> GGUFFile:
    """Map (or, use_mmap=False, read) and parse one GGUF file; raises GGUFError if anything in it
    is out of bounds or invalid. huge_pages: ask the kernel for 2 MiB pages (see `_advise_huge`)."""
    path = Path(path)
    mm = _map(path, use_mmap, huge_pages)
    gguf = GGUFFile(path, mm)
    try:
        _Parser(gguf).parse()
    except BaseException:
        gguf.close()
        raise
    return gguf


def _decode_array(path: str, what: str, depth: int):
    """How an ArrayOfArrays item is decoded: parsed again from the stored bytes (already validated)."""

    def decode(raw: bytes, offset: int):
        parser = _Parser(SimpleNamespace(path=path), raw)
        parser.pos = offset
        return parser.array(what, depth)[0]

    return decode


def _map(path: Path, use_mmap: bool = True, huge_pages: bool = True) -> mmap.mmap:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER.size:
                raise GGUFError(f"{path}: {size} bytes is too small to be a GGUF file")
            if use_mmap:
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                if huge_pages:
                    _advise_huge(mapping)
                return mapping
            return _read_into_memory(f, size, path, huge_pages)
    except FileNotFoundError:
        raise ModelNotFound(f"no such file: {path}") from None
    except IsADirectoryError:
        raise GGUFError(f"{path} is a directory, not a GGUF file") from None
    except (OSError, ValueError) as exc:
        raise GGUFError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _read_into_memory(f, size: int, path: Path, huge_pages: bool = True) -> mmap.mmap:
    """The whole file in anonymous memory (no mapping of the file stays behind)."""
    # private, not mmap's default MAP_SHARED: shared anonymous memory is shmem, which transparent
    # huge pages leave alone (shmem_enabled), whatever is asked for it
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages:
        _advise_huge(memory)  # before the pages are first touched, so they are allocated huge
    view = memoryview(memory)
    try:
        done = 0
        while done < size:
            n = f.readinto(view[done:])
            if not n:
                raise GGUFError(f"{path}: the file shrank while it was read ({done} of {size} bytes)")
            done += n
    except BaseException:
        view.release()
        memory.close()
        raise
    view.release()
    return memory


def _advise_huge(mapping: mmap.mmap) -> None:
    """madvise(MADV_HUGEPAGE): back the mapping with 2 MiB pages where the kernel can, so that a
    matmul reading scattered rows (a token's experts) takes a TLB miss per 2 MiB, not per 4 KiB.
    Anonymous memory then gets huge pages when transparent huge pages are in `madvise` mode; a file
    mapping gets them where the page cache holds the file in 2 MiB folios (filesystems with large
    folios), which faults in such a mapping read ahead. Where the kernel has no THP the advice fails
    and nothing changes."""
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass


def _mlock(buf: np.ndarray) -> None:
    try:
        mlock = ctypes.CDLL(None, use_errno=True).mlock
    except (AttributeError, OSError, TypeError):
        raise OSError(0, "mlock is not available on this system") from None
    if mlock(ctypes.c_void_p(buf.ctypes.data), ctypes.c_size_t(buf.nbytes)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


class _Parser:
    """Reads the header, metadata and tensor infos of one file, validating as it goes."""

    def __init__(self, gguf: GGUFFile | SimpleNamespace, mm=None):
        self.gguf = gguf  # or, to decode stored bytes (mm), a stand-in with the file's path
        self.mm = gguf._mm if mm is None else mm
        self.buf = gguf._buf if mm is None else np.frombuffer(mm, np.uint8)
        self.size = len(self.mm)
        self.pos = 0
        self.key_offsets: dict[str, int] = {}

    def fail(self, message: str, offset: int | None = None) -> GGUFError:
        at = self.pos if offset is None else offset
        return GGUFError(f"{self.gguf.path}: {message} (at byte {at})")

    # -- primitives: each checks that the bytes exist before reading them
    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"{what} runs past the end of the file ({self.size} bytes)")

    def u32(self, what: str) -> int:
        self.need(4, what)
        value = U32.unpack_from(self.mm, self.pos)[0]
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        value = U64.unpack_from(self.mm, self.pos)[0]
        self.pos += 8
        return value

    def string(self, what: str) -> str:
        start = self.pos
        length = self.u64(f"length of {what}")
        if length > self.size - self.pos:
            raise self.fail(f"{what}: string length {length} is past the end of the file", start)
        raw = self.mm[self.pos:self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8", start) from None

    def count(self, what: str, element_bytes: int) -> int:
        """A u64 count of things that each take at least `element_bytes` of the rest of the file."""
        start = self.pos
        n = self.u64(what)
        if n * element_bytes > self.size - self.pos:
            raise self.fail(f"{what} {n} is more than the file can hold", start)
        return n

    # -- the file
    def parse(self) -> None:
        magic, version, _, _ = HEADER.unpack_from(self.mm, 0)
        if magic != MAGIC:
            raise self.fail(f"not a GGUF file (magic {magic!r}, expected {MAGIC!r})", 0)
        if version not in VERSIONS:
            hint = " (big-endian files are not supported)" if version & 0xFFFF == 0 else ""
            raise self.fail(f"unsupported GGUF version {version}, expected 2 or 3{hint}", 4)
        self.gguf.version = version
        self.pos = 8
        n_tensors = self.u64("tensor count")
        n_kv = self.u64("metadata key count")
        if n_tensors * MIN_TENSOR_INFO_BYTES + n_kv * MIN_KV_BYTES > self.size - self.pos:
            raise self.fail(f"{n_tensors} tensors and {n_kv} metadata keys are more than the file can hold", 8)
        for i in range(n_kv):
            self.key_value(i)
        self.gguf.alignment = self.alignment()
        infos = [self.tensor_info(i) for i in range(n_tensors)]
        self.gguf.data_offset = align(self.pos, self.gguf.alignment)
        self.place_tensors(infos)

    def key_value(self, index: int) -> None:
        start = self.pos
        key = self.string(f"key of metadata entry {index}")
        if key in self.gguf.metadata:
            raise self.fail(f"duplicate metadata key {key!r}", start)
        raw_type = self.u32(f"type of {key}")
        value, spec = self.value(raw_type, key, depth=0)
        self.gguf.metadata[key] = value
        self.key_offsets[key] = start
        self.gguf.metadata_types[key] = spec

    def value_type(self, raw_type: int, what: str, offset: int) -> GGUFValueType:
        vtype = _VALUE_TYPES.get(raw_type)
        if vtype is None:
            raise self.fail(f"{what}: unknown value type {raw_type}", offset)
        return vtype

    def value(self, raw_type: int, what: str, depth: int) -> tuple[Any, ValueSpec]:
        vtype = self.value_type(raw_type, what, self.pos - 4)
        if vtype == GGUFValueType.STRING:
            return self.string(what), vtype
        if vtype == GGUFValueType.ARRAY:
            return self.array(what, depth)
        codec = SCALAR_STRUCTS[vtype]
        self.need(codec.size, what)
        value = codec.unpack_from(self.mm, self.pos)[0]
        self.pos += codec.size
        return (value != 0 if vtype == GGUFValueType.BOOL else value), vtype

    def array_header(self, what: str, depth: int) -> tuple[GGUFValueType, int]:
        """An array's element type and count, the count checked against the bytes left."""
        if depth >= MAX_NESTING:
            raise self.fail(f"{what}: arrays nested more than {MAX_NESTING} deep")
        type_offset = self.pos
        elem_type = self.value_type(self.u32(f"element type of {what}"), what, type_offset)
        return elem_type, self.count(f"{what}: array length", MIN_VALUE_BYTES[elem_type])

    def array(self, what: str, depth: int) -> tuple[Any, ValueSpec]:
        elem_type, n = self.array_header(what, depth)
        if elem_type == GGUFValueType.STRING:
            named = f"{self.gguf.path}: {what}"
            strings, self.pos = read_string_array(self.mm, self.buf, self.pos, n, self.size, named)
            return strings, (GGUFValueType.ARRAY, elem_type)
        if elem_type == GGUFValueType.ARRAY:
            return self.nested_array(what, n, depth)
        dtype = SCALAR_DTYPES[elem_type]
        values = np.frombuffer(self.mm, dtype, n, self.pos).copy()
        self.pos += n * dtype.itemsize
        if elem_type == GGUFValueType.BOOL:
            values = values != 0
        return values, (GGUFValueType.ARRAY, elem_type)

    def nested_array(self, what: str, n: int, depth: int) -> tuple[ArrayOfArrays, ValueSpec]:
        start = self.pos
        offsets, spec = self.walk_arrays(what, n, depth + 1)
        raw = bytes(self.mm[start:self.pos])
        decode = _decode_array(str(self.gguf.path), what, depth + 1)
        return ArrayOfArrays(raw, offsets - start, decode, spec[1]), spec

    def walk_arrays(self, what: str, n: int, depth: int) -> tuple[np.ndarray, ValueSpec]:
        """Walk past n consecutive arrays, checking every header and length; the offset of each, and
        the spec of an array holding them (ARRAY, their common spec, or ARRAY where they differ)."""
        offsets = np.empty(n, np.int64)
        common: ValueSpec | None = None
        i = 0
        while i < n:
            first = offsets[i] = self.pos
            spec = self.skip_array(f"{what}[{i}]", depth)
            common = spec if common in (None, spec) else GGUFValueType.ARRAY
            run = self.same_headers(first, self.pos - first, n - i - 1) if spec[1] in SCALAR_DTYPES else 0
            if run:  # the next `run` arrays repeat this one's element type and count
                offsets[i + 1:i + 1 + run] = first + (self.pos - first) * np.arange(1, run + 1)
                self.pos += (self.pos - first) * run
            i += 1 + run
        return offsets, (GGUFValueType.ARRAY, GGUFValueType.ARRAY if common is None else common)

    def skip_array(self, what: str, depth: int) -> ValueSpec:
        """Walk past one array (element type, count, elements) without building its value."""
        elem_type, n = self.array_header(what, depth)
        if elem_type == GGUFValueType.STRING:
            _, self.pos = locate_strings(self.mm, self.buf, self.pos, n, self.size, f"{self.gguf.path}: {what}")
            return (GGUFValueType.ARRAY, elem_type)
        if elem_type == GGUFValueType.ARRAY:
            _, spec = self.walk_arrays(what, n, depth + 1)
            return (GGUFValueType.ARRAY, spec)
        self.pos += n * SCALAR_DTYPES[elem_type].itemsize  # count() checked that the bytes exist
        return (GGUFValueType.ARRAY, elem_type)

    def same_headers(self, first: int, stride: int, limit: int) -> int:
        """How many arrays of `stride` bytes after the one at `first` have its element type and count
        (checked in bulk, so a million empty arrays cost one numpy comparison, not a million steps)."""
        fit = min(limit, (self.size - first) // stride - 1)
        if fit < _BULK_RUN:
            return 0
        head_type, head_count = _ARRAY_HEADER.unpack_from(self.mm, first)
        run = 0
        while run < fit:
            k = min(fit - run, 1 << 16)
            headers = np.ndarray((k,), _HEADER_DTYPE, self.mm, first + stride * (run + 1), (stride,))
            same = (headers["type"] == head_type) & (headers["count"] == head_count)
            if not same.all():
                return run + int(np.argmin(same))
            run += k
        return run

    def alignment(self) -> int:
        if ALIGNMENT_KEY not in self.gguf.metadata:
            return DEFAULT_ALIGNMENT
        value = self.gguf.metadata[ALIGNMENT_KEY]
        spec = self.gguf.metadata_types[ALIGNMENT_KEY]
        if spec != GGUFValueType.UINT32 or not is_power_of_two(value):
            shown = spec.name if isinstance(spec, GGUFValueType) else "array"
            raise self.fail(f"{ALIGNMENT_KEY} must be a u32 power of two, got {value!r} ({shown})",
                            self.key_offsets[ALIGNMENT_KEY])
        return value

    def tensor_info(self, index: int) -> tuple[TensorInfo, int]:
        start = self.pos
        name = self.string(f"name of tensor {index}")
        what = f"tensor {name!r}"
        n_dims = self.u32(f"{what}: number of dimensions")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"{what}: {n_dims} dimensions, expected 1 to {MAX_DIMS}", self.pos - 4)
        dims_offset = self.pos
        layout = _TENSOR_INFO_TAIL[n_dims]  # dims, type, offset
        self.need(layout.size, f"{what}: dimensions, type and offset")
        *dims, raw_type, relative_offset = layout.unpack_from(self.mm, self.pos)
        self.pos += layout.size
        tensor_type = self.tensor_type(raw_type, what, self.pos - 12)
        n_elements, n_bytes = self.tensor_size(dims, tensor_type, what, dims_offset)
        return TensorInfo(name, tensor_type, tuple(dims), relative_offset, n_bytes, n_elements, self.gguf), start

    def tensor_type(self, raw_type: int, what: str, offset: int) -> GGMLType:
        tensor_type = _TENSOR_TYPES.get(raw_type)
        if tensor_type is None:
            raise self.fail(f"{what}: unknown tensor type {raw_type}", offset)
        return tensor_type

    def tensor_size(self, shape, tensor_type: GGMLType, what: str, offset: int) -> tuple[int, int]:
        info = TYPES[tensor_type]
        n_elements = 1
        for dim in shape:
            if dim == 0 or dim > INT64_MAX:
                raise self.fail(f"{what}: dimension {dim} in shape {list(shape)} is out of range", offset)
            n_elements *= dim
        if n_elements > INT64_MAX:
            raise self.fail(f"{what}: shape {list(shape)} has more than 2^63 elements", offset)
        if shape[0] % info.block_size:
            raise self.fail(f"{what}: row length {shape[0]} is not a multiple of the {info.name} "
                            f"block size {info.block_size}", offset)
        return n_elements, n_elements // info.block_size * info.type_size

    def place_tensors(self, infos: list[tuple[TensorInfo, int]]) -> None:
        """Make offsets absolute; check alignment, bounds and overlaps; keep file order."""
        gguf = self.gguf
        for info, start in infos:
            if info.name in gguf.tensors:
                raise self.fail(f"duplicate tensor name {info.name!r}", start)
            if info.offset % gguf.alignment:
                raise self.fail(f"tensor {info.name!r}: data offset {info.offset} is not a multiple of "
                                f"the alignment {gguf.alignment}", start)
            info.offset += gguf.data_offset
            if info.n_bytes > self.size - min(info.offset, self.size):
                raise self.fail(f"tensor {info.name!r}: {info.n_bytes} bytes at offset {info.offset} run "
                                f"past the end of the file ({self.size} bytes)", start)
            gguf.tensors[info.name] = info
        by_offset = sorted(gguf.tensors.values(), key=lambda t: t.offset)
        for before, after in zip(by_offset[:-1], by_offset[1:], strict=True):
            if before.offset + before.n_bytes > after.offset:
                raise GGUFError(f"{gguf.path}: tensors {before.name!r} and {after.name!r} overlap "
                                f"(at byte {after.offset})")

