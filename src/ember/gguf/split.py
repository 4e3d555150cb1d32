"""Split models: one GGUF model stored as N files (llama.cpp's gguf-split, Hugging Face repos of
large models), opened as one GGUFFile.

The parts are named PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf and lie side by
side. Each is a complete GGUF file holding some of the tensors; the first holds the model's
metadata, and every part says where it belongs: `split.no` (0-based), `split.count` and, in the
first, `split.tensors.count` (the tensors of all parts together). Opening the first part opens
the others; each is read and validated by the single-file reader, and then the set is checked:
every part present, numbered in order, agreeing on the count, no tensor in two parts, and the
tensor total the first part announces.

    with open_gguf("Model-Q4_K_M-00001-of-00003.gguf") as f:   # or a plain single file
        f.tensors["blk.40.ffn_up.weight"].data                  # from whichever part holds it
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ember.errors import GGUFError, ModelNotFound
from ember.gguf.reader import GGUFFile, open_file

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS = "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)
MAX_PARTS = 99_999  # five digits in the names
_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def split_name(prefix: str, index: int, count: int) -> str:
    """The file name of part `index` (0-based, as split.no) of `count`."""
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def parse_split_name(name: str) -> tuple[str, int, int] | None:
    """(prefix, index 0-based, count) of a part's file name; None for a name that is not one."""
    match = _NAME.match(name)
    if match is None:
        return None
    number, count = int(match["no"]), int(match["count"])
    if not 1 <= number <= count:
        return None
    return match["prefix"], number - 1, count


def open_gguf(path: str | os.PathLike, use_mmap: bool = True, huge_pages: bool = True) -> GGUFFile:
    """Open a GGUF model: one file, or (given its first part) all the parts of a split model
    (use_mmap, huge_pages: see `open_file`)."""
    first = open_file(path, use_mmap, huge_pages)
    try:
        count, index = _split_fields(first)
        if count == 1 and index == 0:
            return first
        if index != 0:
            raise GGUFError(f"{first.path} is part {index + 1} of {count} of a split model; "
                            f"open its first part{_first_part_hint(first.path, count)}")
        rest = _open_parts(first, count, use_mmap, huge_pages)
        try:
            return _join(first, rest)
        except BaseException:
            for part in rest:
                part.close()
            raise
    except BaseException:
        first.close()
        raise


def _first_part_hint(path: Path, count: int) -> str:
    parsed = parse_split_name(path.name)
    return f", {split_name(parsed[0], 0, count)}" if parsed is not None else ""


def _split_fields(f: GGUFFile) -> tuple[int, int]:
    """(split.count, split.no) of a file; (1, 0) for a file that is not a part."""
    count = _small_int(f, SPLIT_COUNT, 1)
    index = _small_int(f, SPLIT_NO, 0)
    if not 1 <= count <= MAX_PARTS:
        raise GGUFError(f"{f.path}: {SPLIT_COUNT} is {count}, expected 1 to {MAX_PARTS}")
    if not 0 <= index < count:
        raise GGUFError(f"{f.path}: {SPLIT_NO} is {index}, but {SPLIT_COUNT} is {count}")
    return count, index


def _small_int(f: GGUFFile, key: str, default: int) -> int:
    value = f.metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GGUFError(f"{f.path}: {key} must be an integer, got {value!r}")
    return value


def _open_parts(first: GGUFFile, count: int, use_mmap: bool, huge_pages: bool) -> list[GGUFFile]:
    """Parts 2..count beside the first (named by the convention), each validated on its own."""
    parsed = parse_split_name(first.path.name)
    if parsed is None or parsed[1] != 0 or parsed[2] != count:
        raise GGUFError(f"{first.path} is the first of {count} parts of a split model, but its name does not "
                        f"end in -00001-of-{count:05d}.gguf, so the other parts cannot be found")
    prefix = parsed[0]
    parts: list[GGUFFile] = []
    try:
        for index in range(1, count):
            path = first.path.with_name(split_name(prefix, index, count))
            try:
                part = open_file(path, use_mmap, huge_pages)
            except ModelNotFound:
                raise ModelNotFound(f"part {index + 1} of {count} of the split model {first.path} is missing: "
                                    f"{path}") from None
            parts.append(part)
            part_count, part_index = _split_fields(part)
            if (part_count, part_index) != (count, index):
                raise GGUFError(f"{path} says it is part {part_index + 1} of {part_count}, expected part "
                                f"{index + 1} of {count}")
    except BaseException:
        for part in parts:
            part.close()
        raise
    return parts


def _join(first: GGUFFile, rest: list[GGUFFile]) -> GGUFFile:
    """One GGUFFile over all the parts: the first part's metadata, every part's tensors."""
    parts = [first, *rest]
    joined = GGUFFile(first.path, None, parts)
    joined.version = first.version
    joined.alignment = first.alignment
    joined.data_offset = first.data_offset
    joined.metadata = first.metadata
    joined.metadata_types = first.metadata_types
    for part in parts:
        for name, tensor in part.tensors.items():
            if name in joined.tensors:
                owner = next(p for p in parts if name in p.tensors)
                raise GGUFError(f"tensor {name!r} is in two parts of the split model: {owner.path} and {part.path}")
            joined.tensors[name] = tensor
    expected = first.metadata.get(SPLIT_TENSORS)
    if expected is not None and expected != len(joined.tensors):
        raise GGUFError(f"{first.path}: {SPLIT_TENSORS} is {expected}, but the {len(parts)} parts hold "
                        f"{len(joined.tensors)} tensors")
    return joined
