"""Arrays of arrays in GGUF metadata: located in one walk over their headers, decoded lazily.

No model file nests arrays (llama.cpp refuses them), but the format allows it and a hostile file
can hold millions of tiny inner arrays in a few megabytes. Building a Python object per inner
array would cost seconds and hundreds of megabytes, so the reader only walks the headers (a run
of inner arrays with the same element type and count is checked in one numpy step) and keeps
the bytes and the offset of each inner array; `ArrayOfArrays` decodes an item when it is read.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterator, Sequence

import numpy as np


class ArrayOfArrays(Sequence):
    """A read-only list of the inner arrays of a GGUF array of arrays (numpy arrays, StringArray,
    or again ArrayOfArrays), each decoded from the stored bytes when it is read."""

    __slots__ = ("_raw", "_offsets", "_decode", "element_spec")

    def __init__(self, raw: bytes, offsets: np.ndarray, decode: Callable[[bytes, int], Any], element_spec: Any):
        self._raw = raw  # the array body as stored: (u32 element type, u64 count, elements) per item
        self._offsets = offsets  # where each inner array starts in _raw (int64)
        self._decode = decode  # (raw, offset) -> the inner array's value
        self.element_spec = element_spec  # every item's value spec, or ARRAY where they differ

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {index} out of range ({len(self)} arrays)")
        return self._decode(self._raw, int(self._offsets[i]))

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArrayOfArrays):
            return self._raw == other._raw
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(_equal(a, b) for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ArrayOfArrays({len(self)} arrays)"

    def encoded(self) -> bytes:
        """The array body exactly as GGUF stores it, without the outer type and count (what a writer copies)."""
        return self._raw

    def tolist(self) -> list:
        return [item.tolist() if hasattr(item, "tolist") else list(item) for item in self]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, np.asarray(b)))
    return a == b
