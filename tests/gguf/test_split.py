"""ember.gguf.split: a model in several files opens as one (against the gguf package's split
writer, and ember's own), and every inconsistency in the set of parts is a one-line GGUFError."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ember.errors import GGUFError, ModelNotFound  # noqa: E402
from ember.gguf import open_gguf  # noqa: E402
from ember.gguf.split import parse_split_name, split_name  # noqa: E402
from tiny_gguf import tiny_tensors, write_split_model, write_tiny_model  # noqa: E402

SPLIT_KEYS = {"split.no", "split.count", "split.tensors.count"}


def gguf_package_split(directory, n_per_part=2, n_tensors=5):
    """A split model written by the gguf package (llama.cpp's Python writer)."""
    writer = gguf.GGUFWriter(str(directory / "m.gguf"), "llama", split_max_tensors=n_per_part)
    writer.add_uint32("llama.context_length", 7)
    writer.add_string("general.name", "split test")
    arrays = {f"t{i}": np.arange(12, dtype=np.float32).reshape(3, 4) * (i + 1) for i in range(n_tensors)}
    for name, array in arrays.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return arrays


def test_names_follow_gguf_split():
    assert split_name("Model-Q4_K_M", 0, 3) == "Model-Q4_K_M-00001-of-00003.gguf"
    assert parse_split_name("Model-Q4_K_M-00002-of-00003.gguf") == ("Model-Q4_K_M", 1, 3)
    assert parse_split_name("Model-Q4_K_M.gguf") is None
    assert parse_split_name("m-00004-of-00003.gguf") is None


def test_the_first_part_of_a_gguf_package_split_opens_every_part(tmp_path):
    arrays = gguf_package_split(tmp_path)
    with open_gguf(tmp_path / "m-00001-of-00003.gguf") as f:
        assert [p.name for p in f.paths] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
        assert list(f.tensors) == list(arrays)
        for name, array in arrays.items():
            assert np.array_equal(f.tensors[name].array(), array)
        assert f.metadata["general.name"] == "split test"
        assert f.size == sum(p.stat().st_size for p in f.paths)


def test_a_split_model_has_the_tensors_and_metadata_of_the_single_file(tmp_path):
    single = write_tiny_model(tmp_path / "one.gguf", chat_template="{{ x }}")
    (tmp_path / "parts").mkdir()
    write_split_model(tmp_path / "parts", "tiny", 3, chat_template="{{ x }}")
    with open_gguf(single) as one, open_gguf(tmp_path / "parts" / "tiny-00001-of-00003.gguf") as split:
        assert {k: v for k, v in split.metadata.items() if k not in SPLIT_KEYS}.keys() == one.metadata.keys()
        assert list(split.tensors) == list(one.tensors)
        for name, tensor in one.tensors.items():
            assert split.tensors[name].shape == tensor.shape
            assert np.array_equal(split.tensors[name].data, tensor.data)
        assert len({t._file.path for t in split.tensors.values()}) == 3


def test_a_split_model_runs_as_the_single_file_does(tmp_path):
    from ember.engine.runtime import Model

    single = write_tiny_model(tmp_path / "one.gguf")
    write_split_model(tmp_path, "tiny", 2)
    tokens = [1, 2, 3, 257, 258]
    one = Model(open_gguf(single), n_ctx=16, n_threads=1)
    split = Model(open_gguf(tmp_path / "tiny-00001-of-00002.gguf"), n_ctx=16, n_threads=1)
    assert np.array_equal(one.eval(tokens, logits="all"), split.eval(tokens, logits="all"))


def test_a_later_part_names_the_first(tmp_path):
    gguf_package_split(tmp_path)
    with pytest.raises(GGUFError, match=r"part 2 of 3 of a split model; open its first part, m-00001-of-00003.gguf"):
        open_gguf(tmp_path / "m-00002-of-00003.gguf")


def test_a_missing_part_is_named(tmp_path):
    gguf_package_split(tmp_path)
    (tmp_path / "m-00003-of-00003.gguf").unlink()
    with pytest.raises(ModelNotFound, match=r"part 3 of 3 of the split model .* is missing: .*m-00003-of-00003.gguf"):
        open_gguf(tmp_path / "m-00001-of-00003.gguf")


def test_a_part_out_of_place_is_refused(tmp_path):
    write_split_model(tmp_path, "bad", 3, split_keys=lambda i: ((0 if i == 0 else 3 - i), 3, 35))
    with pytest.raises(GGUFError, match=r"says it is part 3 of 3, expected part 2 of 3"):
        open_gguf(tmp_path / "bad-00001-of-00003.gguf")


def test_parts_that_disagree_on_the_count_are_refused(tmp_path):
    write_split_model(tmp_path, "bad", 2, split_keys=lambda i: (i, 2 if i == 0 else 3, 20))
    with pytest.raises(GGUFError, match=r"says it is part 2 of 3, expected part 2 of 2"):
        open_gguf(tmp_path / "bad-00001-of-00002.gguf")


def test_a_wrong_tensor_total_is_refused(tmp_path):
    write_split_model(tmp_path, "bad", 2, split_keys=lambda i: (i, 2, 99))
    n = len(tiny_tensors())
    with pytest.raises(GGUFError, match=rf"split.tensors.count is 99, but the 2 parts hold {n} tensors"):
        open_gguf(tmp_path / "bad-00001-of-00002.gguf")


def test_a_tensor_in_two_parts_is_refused(tmp_path):
    from ember.gguf import GGUFValueType, GGUFWriter

    for index in range(2):
        writer = GGUFWriter(tmp_path / split_name("dup", index, 2), "llama" if index == 0 else None)
        writer.add("split.no", index, GGUFValueType.UINT16)
        writer.add("split.count", 2, GGUFValueType.UINT16)
        writer.add_tensor("same", np.zeros(4, np.float32))
        writer.write()
    with pytest.raises(GGUFError, match=r"tensor 'same' is in two parts of the split model"):
        open_gguf(tmp_path / "dup-00001-of-00002.gguf")


def test_a_first_part_named_otherwise_cannot_find_the_rest(tmp_path):
    gguf_package_split(tmp_path)
    (tmp_path / "m-00001-of-00003.gguf").rename(tmp_path / "renamed.gguf")
    with pytest.raises(GGUFError, match=r"its name does not end in -00001-of-00003.gguf"):
        open_gguf(tmp_path / "renamed.gguf")


@pytest.mark.parametrize("count, no", [(0, 0), (2, 2), (3, -1)])
def test_split_keys_out_of_range_are_refused(tmp_path, count, no):
    from ember.gguf import GGUFValueType, GGUFWriter

    writer = GGUFWriter(tmp_path / "odd.gguf", "llama")
    writer.add("split.count", count, GGUFValueType.INT32)
    writer.add("split.no", no, GGUFValueType.INT32)
    writer.write()
    with pytest.raises(GGUFError, match=r"split\.(count|no) is"):
        open_gguf(tmp_path / "odd.gguf")


def test_close_releases_every_part(tmp_path):
    gguf_package_split(tmp_path)
    f = open_gguf(tmp_path / "m-00001-of-00003.gguf")
    parts = list(f.parts)
    f.close()
    assert all(part._buf is None for part in parts)
    with pytest.raises(ValueError, match="closed"):
        f.tensors["t4"].data


def test_without_mmap_the_bytes_are_read_into_memory(tmp_path):
    arrays = gguf_package_split(tmp_path)
    with open_gguf(tmp_path / "m-00001-of-00003.gguf", use_mmap=False) as f:
        for name, array in arrays.items():
            assert np.array_equal(f.tensors[name].array(), array)
            assert not f.tensors[name].data.flags.writeable


def test_lock_pins_the_parts_when_the_memlock_limit_allows(tmp_path):
    import resource

    gguf_package_split(tmp_path)
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    with open_gguf(tmp_path / "m-00001-of-00003.gguf") as f:
        if soft == resource.RLIM_INFINITY or soft >= f.size + 3 * 4096:
            f.lock()
        else:
            with pytest.raises(OSError):
                f.lock()

