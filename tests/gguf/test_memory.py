"""The memory a GGUF file's tensors live in: the file's mapping (zero copy) or, use_mmap=False, a
private anonymous copy; with huge_pages (the default) both are advised to the kernel for 2 MiB
pages, and the anonymous copy then gets them wherever transparent huge pages are not off.
Read back from /proc/self/smaps, the kernel's account of this process's mappings."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ember.gguf import GGUFWriter, open_gguf

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
N_FLOATS = 3 << 20  # a 12 MiB tensor: several whole 2 MiB pages however the buffer is placed


def thp_mode() -> str | None:
    """The bracketed word of the THP setting (always, madvise, never), or None without THP."""
    try:
        text = THP.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")]


def mapping_of(address: int) -> dict[str, str]:
    """The smaps entry of the mapping that holds `address`: its first line ("range perms offset dev
    inode path") as "head", then its fields (Rss, AnonHugePages, VmFlags, ...) as text."""
    entry: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(" ", 1)[0]
        if "-" in first and not first.endswith(":"):
            low, high = (int(x, 16) for x in first.split("-"))
            if entry is not None:
                break
            if low <= address < high:
                entry = {"head": line}
        elif entry is not None:
            key, _, value = line.partition(":")
            entry[key] = value.strip()
    assert entry is not None, f"no mapping holds {address:#x}"
    return entry


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    values = np.random.default_rng(0).standard_normal(N_FLOATS, dtype=np.float32)
    path = tmp_path_factory.mktemp("memory") / "big.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("big", values)
    writer.write()
    return path, values


@pytest.mark.parametrize("use_mmap", [True, False])
@pytest.mark.parametrize("huge_pages", [True, False])
def test_every_way_of_opening_reads_the_same_bytes(big_file, use_mmap, huge_pages):
    path, values = big_file
    with open_gguf(path, use_mmap=use_mmap, huge_pages=huge_pages) as f:
        assert np.array_equal(f.tensors["big"].array(), values)


@pytest.mark.parametrize("huge_pages", [True, False])
def test_mapped_tensors_stay_in_the_file_mapping(big_file, huge_pages):
    path, _ = big_file
    with open_gguf(path, huge_pages=huge_pages) as f:
        entry = mapping_of(f.tensors["big"].data.ctypes.data)
        assert entry["head"].endswith(str(path.resolve()))
        if thp_mode() is not None:
            assert ("hg" in entry["VmFlags"].split()) == huge_pages


@pytest.mark.parametrize("huge_pages", [True, False])
def test_read_tensors_live_in_private_anonymous_memory(big_file, huge_pages):
    path, _ = big_file
    with open_gguf(path, use_mmap=False, huge_pages=huge_pages) as f:
        entry = mapping_of(f.tensors["big"].data.ctypes.data)
        assert str(path.resolve()) not in entry["head"]
        assert "sh" not in entry["VmFlags"].split()  # shared anonymous memory is shmem: no THP for it
        if thp_mode() is not None:
            assert ("hg" in entry["VmFlags"].split()) == huge_pages


@pytest.mark.skipif(thp_mode() in (None, "never"), reason="transparent huge pages are off")
def test_the_read_copy_is_in_huge_pages(big_file):
    path, _ = big_file
    with open_gguf(path, use_mmap=False) as f:
        entry = mapping_of(f.tensors["big"].data.ctypes.data)
        # where the kernel found 2 MiB of free memory for at least one of the copy's huge pages
        assert int(entry["AnonHugePages"].split()[0]) >= 2048
