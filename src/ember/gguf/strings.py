"""Arrays of strings in GGUF metadata: located in bulk, validated up front, decoded lazily.

A vocabulary is ~150k length-prefixed strings (u64 length, then the bytes). Walking them one by
one in Python costs ~40 ms per array, so large arrays are located with numpy instead:

1. In a window of the file, every offset whose u64 could be a string length below 2^16 (bytes
   2..7 zero) and that is followed by a non-NUL byte (or is an empty string) is a *candidate*.
   Every length field of a vocabulary is one; inside the text of the strings there are almost none.
2. Each candidate c points to the next field at c + 8 + length(c). Where that equals the next
   candidate, the two are linked; maximal runs of links are followed in one numpy slice.
3. Where a run breaks (a false candidate, a string of >= 64 KiB, a string starting with NUL) or
   the window ends, one exact step is taken in Python, with the same bounds checks as for any
   other value, and following resumes.

The result is exact: every accepted field is reached from the array start by following real
lengths, and every length is checked against the bytes left before anything is trusted. A crafted
file only makes this slower (one Python step per string), never wrong.

`StringArray` keeps a copy of the array's bytes and the offset of each length field. Indexing
decodes one string; iterating, slicing and comparing decode all of them at once (one `decode`
and one `split` over the joined bytes) and keep the list. Invalid UTF-8 raises GGUFError naming
the element and its file offset when that element is first decoded.
"""

from __future__ import annotations

import operator
from typing import Iterator, Sequence

import numpy as np

from ember.errors import GGUFError
from ember.gguf.format import U64

_BULK_MIN_COUNT = 1024  # below this, walking in Python is as fast as the numpy setup
_WINDOW_SLACK = 4096
_SCAN_SLICE = 1 << 16  # bytes scanned per numpy step


class StringArray(Sequence[str]):
    """A read-only list of str backed by the GGUF encoding of the array (lengths + bytes)."""

    __slots__ = ("_raw", "_fields", "_list", "_what", "_base")

    def __init__(self, raw: bytes, fields: np.ndarray, what: str = "string array", base: int = 0):
        self._raw = raw  # the array body as stored: (u64 length, bytes) per element
        self._fields = fields  # offset of each element's length field in _raw (int64)
        self._list: list[str] | None = None
        self._what = what  # for error messages: the metadata key
        self._base = base  # file offset of _raw[0], for error messages

    def __len__(self) -> int:
        return len(self._fields)

    def __getitem__(self, index):
        if isinstance(index, slice):
            positions = range(*index.indices(len(self)))
            if self._list is None and len(positions) < 1024:
                return [self._decode(i) for i in positions]
            return self.tolist()[index]
        i = operator.index(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"{self._what} index {index} out of range ({len(self)} strings)")
        return self._list[i] if self._list is not None else self._decode(i)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def __contains__(self, value: object) -> bool:
        return value in self.tolist()

    def index(self, value, start: int = 0, stop: int | None = None) -> int:
        return self.tolist().index(value, start, len(self) if stop is None else stop)

    def count(self, value) -> int:
        return self.tolist().count(value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self._raw == other._raw
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, like list

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(repr(self[i]) for i in range(min(n, 3)))
        tail = f", ..., {self[n - 1]!r}" if n > 3 else ""
        return f"StringArray([{head}{tail}], {n} strings)"

    def tolist(self) -> list[str]:
        if self._list is None:
            self._list = self._decode_all()
        return self._list

    def encoded(self) -> bytes:
        """The array body exactly as GGUF stores it (what a writer copies)."""
        return self._raw

    def has_empty(self) -> bool:
        """Whether some element is the empty string."""
        ends = np.append(self._fields[1:], len(self._raw))
        return bool(np.any(ends - self._fields == 8))

    def table(self) -> tuple[bytes, np.ndarray]:
        """The array body and the offset of each element's length field in it (int64)."""
        return self._raw, self._fields

    def _span(self, i: int) -> tuple[int, int]:
        start = int(self._fields[i]) + 8
        end = int(self._fields[i + 1]) if i + 1 < len(self._fields) else len(self._raw)
        return start, end

    def _decode(self, i: int) -> str:
        start, end = self._span(i)
        try:
            return self._raw[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self._what}[{i}] is not valid UTF-8 (at byte {self._base + start - 8})") from None

    def _decode_all(self) -> list[str]:
        # Replace each 8-byte length field by one NUL separator, decode once, split once. A string
        # that contains NUL (or invalid UTF-8) shows up as a wrong count (or an error): then decode
        # one by one, which also names the bad element.
        n = len(self._fields)
        joined = np.frombuffer(self._raw, np.uint8).copy()
        keep = np.ones(joined.size, bool)
        for k in range(7):
            keep[self._fields + k] = False
        joined[self._fields + 7] = 0
        try:
            parts = joined[keep].tobytes().decode("utf-8").split("\x00")
        except UnicodeDecodeError:
            parts = []
        if len(parts) != n + 1:
            return [self._decode(i) for i in range(n)]
        return parts[1:]


def string_table(strings) -> tuple[bytes, np.ndarray]:
    """Strings as GGUF stores an array of them (u64 length, then the UTF-8 bytes, per element),
    with the offset of each length field: what native code reads a vocabulary from."""
    if isinstance(strings, StringArray):
        return strings.table()
    encoded = [s.encode("utf-8", errors="surrogatepass") for s in strings]
    sizes = np.array([8 + len(e) for e in encoded], dtype=np.int64)
    fields = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if encoded else np.empty(0, np.int64)
    raw = b"".join(U64.pack(len(e)) + e for e in encoded)
    return raw, fields


def read_string_array(mm, buf: np.ndarray, start: int, count: int, limit: int, what: str) -> tuple[StringArray, int]:
    """The `count` strings whose first length field is at `start`; returns (array, end offset).

    `mm` is the mapped file (for exact reads), `buf` a uint8 view of it, `limit` the file size,
    `what` names the array in errors (the file and the key).
    """
    fields, end = locate_strings(mm, buf, start, count, limit, what)
    return StringArray(bytes(mm[start:end]), fields - start, what, start), end


def locate_strings(mm, buf: np.ndarray, start: int, count: int, limit: int, what: str) -> tuple[np.ndarray, int]:
    """Offsets of the length fields of `count` consecutive strings from `start`, and the end."""
    if count < _BULK_MIN_COUNT:
        fields = []
        pos = start
        for i in range(count):
            fields.append(pos)
            pos = _step(mm, pos, limit, what, i)
        return np.array(fields, dtype=np.int64), pos
    return _locate_bulk(mm, buf, start, count, limit, what)


def _step(mm, pos: int, limit: int, what: str, index: int) -> int:
    """One exact string: bounds-checked; returns the offset after it."""
    if limit - pos < 8:
        raise GGUFError(f"{what}[{index}]: string length runs past the end of the file (at byte {pos})")
    length = U64.unpack_from(mm, pos)[0]
    if length > limit - pos - 8:
        raise GGUFError(f"{what}[{index}]: string of {length} bytes runs past the end of the file (at byte {pos})")
    return pos + 8 + length


def _locate_bulk(mm, buf, start, count, limit, what) -> tuple[np.ndarray, int]:
    pieces: list[np.ndarray] = []
    done, pos = 0, start
    while done < count:
        bytes_per_string = (pos - start) / done if done else 16
        hi = min(limit, pos + int((count - done) * bytes_per_string * 1.25) + _WINDOW_SLACK)
        fields, after = _candidates(buf, pos, hi)
        resolvable_end = limit if hi == limit else hi - 9  # candidates exist up to hi - 9
        done, pos = _follow(mm, fields, after, pieces, done, pos, count, limit, resolvable_end, what)
    return np.concatenate(pieces), pos


def _follow(mm, fields, after, pieces, done, pos, count, limit, resolvable_end, what) -> tuple[int, int]:
    """Follow the chain from `pos` through linked candidates, stepping exactly where links break."""
    breaks = np.flatnonzero(after[:-1] != fields[1:])  # candidate j does not lead to candidate j+1
    while done < count:
        j = int(np.searchsorted(fields, pos))
        if j < len(fields) and fields[j] == pos:
            k = int(np.searchsorted(breaks, j))
            run_end = int(breaks[k]) if k < len(breaks) else len(fields) - 1
            take = min(run_end - j + 1, count - done)
            pieces.append(fields[j:j + take])
            done += take
            pos = int(after[j + take - 1])
            if pos > limit:
                last = int(fields[j + take - 1])
                raise GGUFError(f"{what}[{done - 1}]: string of {pos - last - 8} bytes runs past the end "
                                f"of the file (at byte {last})")
        elif pos <= resolvable_end:
            pieces.append(np.array([pos], dtype=np.int64))
            pos = _step(mm, pos, limit, what, done)
            done += 1
        else:
            break  # past this window: scan the next one
    return done, pos


def _candidates(buf: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets c in [lo, hi-9] that may be string length fields, and c + 8 + length(c) for each.

    Scanned in slices that fit in the cache: whole-window temporaries cost more in page faults
    than in arithmetic."""
    fields, afters = [], []
    end = hi - 8  # one past the last candidate offset
    for start in range(lo, end, _SCAN_SLICE):
        stop = min(start + _SCAN_SLICE, end)
        found, after = _candidates_in(buf[start:stop + 8], start)
        fields.append(found)
        afters.append(after)
    if not fields:
        empty = np.empty(0, np.int64)
        return empty, empty
    return np.concatenate(fields), np.concatenate(afters)


def _candidates_in(b: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    m = b.size  # candidates are the offsets 0 .. m-9
    zero = b == 0
    zero2 = zero[:-1] & zero[1:]  # b[i], b[i+1] are 0
    zero6 = (zero2[:-2] & zero2[2:])[:-2] & zero2[4:]  # b[i..i+5] are 0
    high_bytes_zero = zero6[2:m - 6]  # bytes 2..7 of the u64 at c
    text_follows = ~zero[8:] | zero2[:m - 8]  # first byte of the string is not NUL, or length 0
    offsets = np.flatnonzero(high_bytes_zero & text_follows)
    length = b[offsets].astype(np.int64) | (b[offsets + 1].astype(np.int64) << 8)
    fields = offsets + base
    return fields, fields + 8 + length
