"""ember.gguf.reader: the reader (against gguf.GGUFReader and hand-made bytes), the writer (files the gguf
package reads back), and validation of malformed files (GGUFError, never a crash or a huge
allocation)."""

from __future__ import annotations

import hashlib
import shutil
import struct
import time
import tracemalloc
from collections.abc import Sequence

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ember.errors import GGUFError, ModelNotFound  # noqa: E402
from ember.gguf import GGUFValueType, GGUFWriter, StringArray, open_gguf  # noqa: E402
from ember.gguf.types import GGMLType  # noqa: E402
from ember.quant.reference import quantize  # noqa: E402

V = GGUFValueType
GV = gguf.GGUFValueType
MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]
SLOW_MODELS = ["smollm2-135m"] + [pytest.param(m, marks=pytest.mark.slow) for m in MODELS[1:]]


# ---------------------------------------------------------------------- hand-made GGUF bytes

def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def gstr(text) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + u32(vtype) + payload


def info(name: str, dims, ttype: int, offset: int) -> bytes:
    return gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(ttype) + u64(offset)


def gguf_bytes(kvs=(), infos=(), data=b"", n_tensors=None, n_kv=None, version=3, magic=b"GGUF",
               alignment=32) -> bytes:
    head = (magic + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
            + u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos))
    return head + bytes(-len(head) % alignment) + data if infos else head


TWO_F32_TENSORS = dict(
    infos=[info("a", [4], GGMLType.F32, 0), info("b", [2, 2], GGMLType.F32, 32)],
    data=np.arange(4, dtype="<f4").tobytes() + bytes(16) + np.arange(4, 8, dtype="<f4").tobytes(),
)


@pytest.fixture
def write(tmp_path):
    count = iter(range(10**6))

    def write_bytes(raw: bytes):
        path = tmp_path / f"crafted{next(count)}.gguf"
        path.write_bytes(raw)
        return path
    return write_bytes


def write_with_gguf(path, fill, alignment=None):
    """A file written by the gguf package (the reference writer)."""
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def peak_bytes_while(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def expect_error(path, match: str, max_alloc: int = 1 << 20) -> GGUFError:
    """open_gguf raises GGUFError matching `match`, having allocated less than `max_alloc`."""
    caught = []

    def attempt():
        with pytest.raises(GGUFError, match=match) as exc:
            open_gguf(path)
        caught.append(exc.value)
    assert peak_bytes_while(attempt) < max_alloc
    return caught[0]


# ---------------------------------------------------------------------- reading gguf-package files

SCALARS = [  # key, gguf writer method, value, expected type
    ("t.u8", "add_uint8", 200, V.UINT8), ("t.i8", "add_int8", -100, V.INT8),
    ("t.u16", "add_uint16", 60000, V.UINT16), ("t.i16", "add_int16", -30000, V.INT16),
    ("t.u32", "add_uint32", 4_000_000_000, V.UINT32), ("t.i32", "add_int32", -2_000_000_000, V.INT32),
    ("t.f32", "add_float32", 1.5, V.FLOAT32), ("t.u64", "add_uint64", 2**64 - 1, V.UINT64),
    ("t.i64", "add_int64", -(2**63), V.INT64), ("t.f64", "add_float64", 0.1, V.FLOAT64),
    ("t.bool", "add_bool", True, V.BOOL), ("t.str", "add_string", "héllo ✓ 日本", V.STRING),
]
NUMERIC_ARRAYS = [(vt, np.dtype(dt)) for vt, dt in [
    (V.UINT8, "u1"), (V.INT8, "i1"), (V.UINT16, "<u2"), (V.INT16, "<i2"), (V.UINT32, "<u4"),
    (V.INT32, "<i4"), (V.FLOAT32, "<f4"), (V.UINT64, "<u8"), (V.INT64, "<i8"), (V.FLOAT64, "<f8")]]
STRINGS = ["a", "", "ü", "x y", "日本語", "\U0001F600"]
F32_TENSOR = np.arange(12, dtype=np.float32).reshape(3, 4)
F16_TENSOR = np.linspace(-1, 1, 64, dtype=np.float16).reshape(2, 32)
Q8_ROWS = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)


def fill_everything(w) -> None:
    for key, method, value, _ in SCALARS:
        getattr(w, method)(key, value)
    w.add_key_value("t.empty_str", "", GV.STRING)
    for vt, _ in NUMERIC_ARRAYS:
        w.add_key_value(f"t.arr.{vt.name}", [1, 2, 3], GV.ARRAY, sub_type=GV(int(vt)))
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.strings", STRINGS)
    w.add_key_value("t.nested", [[1, 2], [3]], GV.ARRAY)
    w.add_tensor("f32", F32_TENSOR)
    w.add_tensor("f16", F16_TENSOR)
    w.add_tensor("q8", gguf.quants.quantize(Q8_ROWS, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)


@pytest.fixture
def package_file(tmp_path):
    return write_with_gguf(tmp_path / "package.gguf", fill_everything)


def test_reads_every_scalar_type(package_file):
    with open_gguf(package_file) as f:
        for key, _, value, vtype in SCALARS:
            assert f.metadata[key] == value, key
            assert f.metadata_types[key] is vtype, key
        assert f.metadata["t.empty_str"] == ""


def test_scalars_become_python_values(package_file):
    with open_gguf(package_file) as f:
        assert type(f.metadata["t.u64"]) is int
        assert type(f.metadata["t.f64"]) is float
        assert f.metadata["t.bool"] is True


def test_reads_numeric_arrays_as_numpy_arrays_of_their_type(package_file):
    with open_gguf(package_file) as f:
        for vt, dtype in NUMERIC_ARRAYS:
            value = f.metadata[f"t.arr.{vt.name}"]
            assert isinstance(value, np.ndarray) and value.dtype == dtype
            assert value.tolist() == [1, 2, 3]
            assert f.metadata_types[f"t.arr.{vt.name}"] == (V.ARRAY, vt)
        assert f.metadata["t.bools"].dtype == np.bool_
        assert f.metadata["t.bools"].tolist() == [True, False, True]


def test_reads_arrays_of_strings_as_lists_of_str(package_file):
    with open_gguf(package_file) as f:
        assert f.metadata["t.strings"] == STRINGS
        assert f.metadata_types["t.strings"] == (V.ARRAY, V.STRING)


def test_reads_nested_arrays_as_sequences_of_arrays(package_file):
    with open_gguf(package_file) as f:
        nested = f.metadata["t.nested"]
        assert isinstance(nested, Sequence) and len(nested) == 2
        assert [a.tolist() for a in nested] == [[1, 2], [3]]
        assert nested == [[1, 2], [3]] and nested.tolist() == [[1, 2], [3]]
        assert nested[-1].tolist() == [3] and [a.tolist() for a in nested[0:1]] == [[1, 2]]
        assert f.metadata_types["t.nested"] == (V.ARRAY, (V.ARRAY, V.INT32))


def test_metadata_and_tensors_keep_file_order(package_file):
    reader = gguf.GGUFReader(package_file)
    with open_gguf(package_file) as f:
        assert list(f.metadata) == [k for k in reader.fields if not k.startswith("GGUF.")]
        assert list(f.tensors) == [t.name for t in reader.tensors]


def test_tensor_infos_match_the_gguf_reader(package_file):
    reader = gguf.GGUFReader(package_file)
    with open_gguf(package_file) as f:
        assert f.data_offset == reader.data_offset
        for ref in reader.tensors:
            t = f.tensors[ref.name]
            assert (t.type, t.shape, t.offset) == (int(ref.tensor_type), tuple(ref.shape.tolist()), ref.data_offset)
            assert (t.n_bytes, t.n_elements) == (ref.n_bytes, ref.n_elements)


def test_shape_is_ggml_order_and_np_shape_numpy_order(package_file):
    with open_gguf(package_file) as f:
        assert f.tensors["f32"].shape == (4, 3)
        assert f.tensors["f32"].np_shape == (3, 4)


def test_array_gives_typed_views(package_file):
    with open_gguf(package_file) as f:
        np.testing.assert_array_equal(f.tensors["f32"].array(), F32_TENSOR)
        np.testing.assert_array_equal(f.tensors["f16"].array(), F16_TENSOR)
        q8 = gguf.quants.quantize(Q8_ROWS, gguf.GGMLQuantizationType.Q8_0)
        np.testing.assert_array_equal(f.tensors["q8"].array(), q8)
        np.testing.assert_array_equal(f.tensors["q8"].data, q8.reshape(-1))


def test_tensor_data_is_a_read_only_view_of_the_mapping(package_file):
    with open_gguf(package_file) as f:
        data = f.tensors["f32"].data
        assert data.dtype == np.uint8 and not data.flags.writeable and not data.flags.owndata
        assert np.shares_memory(data, f.tensors["f32"].array())


def test_opening_maps_the_file_instead_of_reading_it(tmp_path):
    big = np.ones((1024, 4096), np.float32)  # 16 MiB of tensor data
    path = write_with_gguf(tmp_path / "big.gguf", lambda w: w.add_tensor("big", big))

    def open_and_touch():
        with open_gguf(path) as f:
            assert f.tensors["big"].data[3::4096].sum() == 4096 * 0x3F  # a byte of every page: 1.0f = 00 00 80 3F
    assert peak_bytes_while(open_and_touch) < 1 << 20


def test_custom_alignment_is_honoured(tmp_path):
    path = write_with_gguf(tmp_path / "a64.gguf", fill_everything, alignment=64)
    reader = gguf.GGUFReader(path)
    with open_gguf(path) as f:
        assert f.alignment == 64 and f.data_offset % 64 == 0
        assert [t.offset for t in f.tensors.values()] == [t.data_offset for t in reader.tensors]


def test_reads_version_2(package_file, write):
    raw = bytearray(package_file.read_bytes())
    raw[4:8] = u32(2)
    with open_gguf(write(bytes(raw))) as f, open_gguf(package_file) as f3:
        assert f.version == 2
        assert f.metadata["t.strings"] == f3.metadata["t.strings"]
        assert f.tensors.keys() == f3.tensors.keys()


def test_helpers_read_architecture_fields(write):
    path = write(gguf_bytes([kv("general.architecture", V.STRING, gstr("llama")),
                             kv("llama.context_length", V.UINT32, u32(2048))]))
    with open_gguf(path) as f:
        assert f.arch == "llama"
        assert f.field("context_length") == 2048
        assert f.field("missing", None) is None
        assert f.get("general.name", "unnamed") == "unnamed"
        with pytest.raises(KeyError):
            f.field("missing")


def test_views_fail_after_close(package_file):
    f = open_gguf(package_file)
    tensor = f.tensors["f32"]
    f.close()
    with pytest.raises(ValueError, match="closed"):
        _ = tensor.data


def test_a_missing_file_is_model_not_found(tmp_path):
    with pytest.raises(ModelNotFound, match="no such file"):
        open_gguf(tmp_path / "nope.gguf")


# ---------------------------------------------------------------------- large string arrays

def tricky_strings(rng: np.random.Generator, n: int) -> list[str]:
    """Vocabulary-like strings plus everything the bulk walker must not be fooled by."""
    alphabet = list("abcdefghij ĠĊ日本\U0001F600") + ["\x00"]
    strings = ["".join(rng.choice(alphabet, size=rng.integers(0, 12))) for _ in range(n)]
    strings[10] = ""
    strings[11] = "\x00"  # starts with NUL
    strings[12] = "\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    strings[13] = "x" * 70_000  # longer than 2^16
    strings[14] = "\x05\x00\x00\x00\x00\x00\x00\x00abc"  # looks like a length field
    for i in range(100, n, 97):
        strings[i] = "\x03\x00\x00\x00\x00\x00\x00\x00zz" + strings[i]
    return strings


@pytest.mark.parametrize("n", [5, 1500, 8000])  # per-string walk, bulk, bulk over several slices
def test_string_arrays_read_exactly_what_was_written(tmp_path, n):
    strings = tricky_strings(np.random.default_rng(n), max(n, 20))[:n] if n >= 20 else STRINGS[:n]
    path = write_with_gguf(tmp_path / "s.gguf", lambda w: w.add_array("t.s", strings))
    with open_gguf(path) as f:
        value = f.metadata["t.s"]
        assert [value[i] for i in range(n)] == strings  # decoded one at a time
        assert value.tolist() == strings  # decoded in bulk


def test_string_array_behaves_like_a_list(tmp_path):
    strings = [f"tok{i}" for i in range(3000)]
    path = write_with_gguf(tmp_path / "s.gguf", lambda w: w.add_array("t.s", strings))
    with open_gguf(path) as f:
        value = f.metadata["t.s"]
    assert isinstance(value, StringArray)
    assert len(value) == 3000
    assert value[0] == "tok0" and value[-1] == "tok2999"
    assert value[10:13] == ["tok10", "tok11", "tok12"]
    assert value[::1000] == ["tok0", "tok1000", "tok2000"]
    assert list(value) == strings and value == strings and value == tuple(strings)
    assert "tok42" in value and value.index("tok42") == 42 and value.count("tok7") == 1
    with pytest.raises(IndexError):
        value[3000]


def test_string_array_knows_whether_it_holds_an_empty_string(tmp_path):
    assert string_array_of(tmp_path, ["a", "", "b"] * 600).has_empty()
    assert not string_array_of(tmp_path, ["a", "b"] * 600).has_empty()
    assert string_array_of(tmp_path, ["a", ""]).has_empty()


def string_array_of(tmp_path, strings):
    path = write_with_gguf(tmp_path / "e.gguf", lambda w: w.add_array("t.s", strings))
    with open_gguf(path) as f:
        return f.metadata["t.s"]


def test_invalid_utf8_is_reported_when_the_string_is_used(write):
    payload = u32(V.STRING) + u64(2) + gstr(b"ok") + gstr(b"\xff\xfe")
    path = write(gguf_bytes([kv("t.s", V.ARRAY, payload)]))
    key_end = 24 + 8 + len("t.s") + 4
    bad_at = key_end + 12 + 8 + 2
    with open_gguf(path) as f:
        value = f.metadata["t.s"]
        assert value[0] == "ok"
        with pytest.raises(GGUFError, match=rf"{path.name}: t\.s\[1\] is not valid UTF-8 \(at byte {bad_at}\)"):
            value[1]
        with pytest.raises(GGUFError, match=r"t\.s\[1\]"):
            list(value)


# ---------------------------------------------------------------------- writing

def fill_ember_writer(w: GGUFWriter) -> None:
    for key, _, value, vtype in SCALARS:
        w.add(key, value, vtype)
    for vt, dt in NUMERIC_ARRAYS:
        w.add(f"t.arr.{vt.name}", np.array([1, 2, 3], dt))
    w.add("t.bools", [True, False, True])
    w.add("t.strings", STRINGS)
    w.add("t.nested", [[1, 2], [3]], (V.ARRAY, (V.ARRAY, V.INT32)))
    w.add_tensor("f32", F32_TENSOR)
    w.add_tensor("f16", F16_TENSOR)
    w.add_tensor("q4", quantize(Q8_ROWS, GGMLType.Q4_0), GGMLType.Q4_0)
    w.add_tensor("i32", np.arange(6, dtype=np.int32))


def test_files_ember_writes_open_in_the_gguf_package(tmp_path):
    path = tmp_path / "ember.gguf.reader"
    w = GGUFWriter(path, "llama")
    fill_ember_writer(w)
    w.write()
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "llama"
    for key, _, value, vtype in SCALARS:
        assert reader.fields[key].types == [GV(int(vtype))]
        assert reader.fields[key].contents() == pytest.approx(value), key
    for vt, _ in NUMERIC_ARRAYS:
        assert reader.fields[f"t.arr.{vt.name}"].types == [GV.ARRAY, GV(int(vt))]
        assert reader.fields[f"t.arr.{vt.name}"].contents() == [1, 2, 3]
    assert reader.fields["t.strings"].contents() == STRINGS
    assert reader.fields["t.nested"].contents() == [1, 2, 3]  # the gguf reader flattens nested arrays
    tensors = {t.name: t for t in reader.tensors}
    np.testing.assert_array_equal(tensors["f32"].data, F32_TENSOR)
    np.testing.assert_array_equal(tensors["f16"].data, F16_TENSOR)
    np.testing.assert_array_equal(tensors["i32"].data, np.arange(6))
    assert tensors["q4"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    np.testing.assert_array_equal(tensors["q4"].data, gguf.quants.quantize(Q8_ROWS, gguf.GGMLQuantizationType.Q4_0))


def test_ember_round_trip_keeps_values_and_types(tmp_path):
    w = GGUFWriter(tmp_path / "rt.gguf", "llama")
    fill_ember_writer(w)
    with open_gguf(w.write()) as f:
        for key, _, value, vtype in SCALARS:
            assert f.metadata_types[key] is vtype
            assert f.metadata[key] == pytest.approx(value)
        assert f.metadata["t.strings"] == STRINGS
        assert f.metadata_types["t.nested"] == (V.ARRAY, (V.ARRAY, V.INT32))
        assert f.tensors["q4"].shape == (64, 2)


def test_round_trip_through_metadata_types_reproduces_a_gguf_package_file(package_file, tmp_path):
    with open_gguf(package_file) as f:
        w = GGUFWriter(tmp_path / "copy.gguf", f.arch)
        for key, value in f.metadata.items():
            w.add(key, value, f.metadata_types[key])
        for t in f.tensors.values():
            w.add_tensor(t.name, t.data, t.type, t.shape)
        w.write()
    assert (tmp_path / "copy.gguf").read_bytes() == package_file.read_bytes()


def test_writes_version_2(tmp_path):
    w = GGUFWriter(tmp_path / "v2.gguf", "llama", version=2)
    w.add_tensor("x", np.ones(8, np.float32))
    with open_gguf(w.write()) as f:
        assert f.version == 2 and f.tensors["x"].array().tolist() == [1.0] * 8


@pytest.mark.parametrize("alignment", [32, 64, 256])
def test_tensor_data_is_aligned(tmp_path, alignment):
    w = GGUFWriter(tmp_path / "al.gguf", "llama", alignment=alignment)
    for i in range(3):
        w.add_tensor(f"t{i}", np.ones(3 + i, np.float32))
    reader = gguf.GGUFReader(w.write())
    assert reader.alignment == alignment
    assert all(t.data_offset % alignment == 0 for t in reader.tensors)
    assert [t.data.tolist() for t in reader.tensors] == [[1.0] * 3, [1.0] * 4, [1.0] * 5]


@pytest.mark.parametrize("value, expected", [
    ("text", V.STRING), (True, V.BOOL), (7, V.UINT32), (-7, V.INT32), (2**40, V.UINT64),
    (-(2**40), V.INT64), (0.5, V.FLOAT32), (np.float64(0.5), V.FLOAT64), (np.int16(-3), V.INT16),
    (["a", "b"], (V.ARRAY, V.STRING)), ([1, 2], (V.ARRAY, V.UINT32)), ([1, -2], (V.ARRAY, V.INT32)),
    ([1, 2.5], (V.ARRAY, V.FLOAT32)), ([True], (V.ARRAY, V.BOOL)),
    (np.zeros(2, np.int64), (V.ARRAY, V.INT64)), ([[1], ["a"]], (V.ARRAY, V.ARRAY)),
])
def test_writer_infers_types(tmp_path, value, expected):
    w = GGUFWriter(tmp_path / "t.gguf", "llama")
    w.add("k", value)
    with open_gguf(w.write()) as f:
        assert f.metadata_types["k"] == expected


def test_writer_takes_the_element_type_of_an_array(tmp_path):
    w = GGUFWriter(tmp_path / "t.gguf", "llama")
    w.add("k", [1, 2, 3], V.INT32)
    with open_gguf(w.write()) as f:
        assert f.metadata_types["k"] == (V.ARRAY, V.INT32)
        assert f.metadata["k"].dtype == np.int32


def test_adding_a_key_again_replaces_it_in_place(tmp_path):
    w = GGUFWriter(tmp_path / "t.gguf", "llama")
    w.add("a", 1)
    w.add("b", 2)
    w.add("a", "one")
    with open_gguf(w.write()) as f:
        assert list(f.metadata.items()) == [("general.architecture", "llama"), ("a", "one"), ("b", 2)]


def test_tensors_can_be_streamed_from_a_callable(tmp_path):
    rows = np.arange(64 * 4, dtype=np.float32).reshape(4, 64)

    def chunks():
        for row in rows:  # produced while writing, one row at a time
            yield quantize(row, GGMLType.Q8_0)
    w = GGUFWriter(tmp_path / "s.gguf", "llama")
    w.add_tensor("q", chunks, GGMLType.Q8_0, (64, 4))
    with open_gguf(w.write()) as f:
        np.testing.assert_array_equal(f.tensors["q"].data, quantize(rows, GGMLType.Q8_0).reshape(-1))


def test_non_contiguous_arrays_are_written_in_row_order(tmp_path):
    matrix = np.arange(20, dtype=np.float32).reshape(4, 5)
    w = GGUFWriter(tmp_path / "t.gguf", "llama")
    w.add_tensor("t", matrix.T)
    with open_gguf(w.write()) as f:
        np.testing.assert_array_equal(f.tensors["t"].array(), matrix.T)


@pytest.mark.parametrize("n_chunks", [1, 3])
def test_a_stream_of_the_wrong_length_fails_and_leaves_no_file(tmp_path, n_chunks):
    w = GGUFWriter(tmp_path / "s.gguf", "llama")
    w.add_tensor("q", lambda: [bytes(34)] * n_chunks, GGMLType.Q8_0, (64,))
    with pytest.raises(GGUFError, match="tensor 'q'"):
        w.write()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("call, match", [
    (lambda w: w.add_tensor("x", np.zeros(32, np.float32), GGMLType.Q4_0, (32,)), "float32 data cannot be Q4_0"),
    (lambda w: w.add_tensor("x", bytes(10), GGMLType.Q8_0, (32,)), "is 34 bytes, data has 10"),
    (lambda w: w.add_tensor("x", bytes(34), GGMLType.Q8_0, (33,)), "not a multiple of the Q8_0 block size"),
    (lambda w: w.add_tensor("x", bytes(4), GGMLType.F32), "pass shape="),
    (lambda w: w.add_tensor("x", np.zeros(4, np.uint8)), "pass type="),
    (lambda w: w.add_tensor("x", bytes(4), GGMLType.F32, (1, 1, 1, 1, 1)), "1 to 4 positive dimensions"),
    (lambda w: w.add("k", []), "empty array"),
    (lambda w: w.add("k", 300, V.UINT8), "cannot store 300 as UINT8"),
    (lambda w: w.add("k", [1, 2**40], V.UINT32), "out of the UINT32 range"),
    (lambda w: w.add("k", [0.5], V.INT32), "floating-point items"),
    (lambda w: w.add("k", [1, "a"]), "mixed types"),
    (lambda w: w.add("k", 1, 99), "unknown value type 99"),
    (lambda w: w.add("k", object()), "cannot store a object"),
    (lambda w: w.add("general.alignment", 48, V.UINT32), "power of two"),
])
def test_writer_rejects_bad_input(tmp_path, call, match):
    with pytest.raises(GGUFError, match=match):
        call(GGUFWriter(tmp_path / "t.gguf", "llama"))


def test_writer_rejects_a_tensor_name_twice(tmp_path):
    w = GGUFWriter(tmp_path / "t.gguf", "llama")
    w.add_tensor("x", np.zeros(4, np.float32))
    with pytest.raises(GGUFError, match="added twice"):
        w.add_tensor("x", np.zeros(4, np.float32))


# ---------------------------------------------------------------------- validation (crafted files)

def test_a_valid_crafted_file_opens(write):
    with open_gguf(write(gguf_bytes(**TWO_F32_TENSORS))) as f:
        assert f.tensors["b"].array().tolist() == [[4.0, 5.0], [6.0, 7.0]]


@pytest.mark.parametrize("raw, match", [
    (b"GGML" + bytes(20), r"not a GGUF file \(magic b'GGML'"),
    (b"GGUF" + u32(1) + bytes(16), "unsupported GGUF version 1"),
    (b"GGUF" + u32(4) + bytes(16), "unsupported GGUF version 4"),
    (b"GGUF" + u32(3 << 24) + bytes(16), "big-endian files are not supported"),
    (b"GGUF" + u32(3) + bytes(8), "too small to be a GGUF file"),
])
def test_header_is_checked(write, raw, match):
    expect_error(write(raw), match)


@pytest.mark.parametrize("counts", [dict(n_tensors=2**63), dict(n_kv=2**63), dict(n_tensors=2**64 - 1, n_kv=2**64 - 1)])
def test_huge_counts_are_rejected_before_allocating(write, counts):
    expect_error(write(gguf_bytes(**counts)), "more than the file can hold")


def test_a_key_length_of_2_63_is_rejected_with_its_offset(write):
    raw = gguf_bytes(n_kv=1) + u64(2**63) + b"key" + bytes(64)
    expect_error(write(raw), r"key of metadata entry 0: string length 9223372036854775808 .* \(at byte 24\)")


def test_a_string_one_byte_past_the_end_is_rejected(write):
    raw = gguf_bytes([kv("k", V.STRING, u64(5) + b"abcd")])
    expect_error(write(raw), r"'k'|k: string length 5 is past the end")


@pytest.mark.parametrize("elem_type, min_bytes", [(V.UINT8, 1), (V.FLOAT64, 8), (V.STRING, 8), (V.ARRAY, 12)])
def test_array_lengths_of_2_63_are_rejected_before_allocating(write, elem_type, min_bytes):
    raw = gguf_bytes([kv("arr", V.ARRAY, u32(elem_type) + u64(2**63) + bytes(64))])
    count_at = 24 + 8 + len("arr") + 4 + 4
    expect_error(write(raw), rf"arr: array length {2**63} is more than the file can hold \(at byte {count_at}\)")


def test_array_length_is_bounded_by_element_size(write):
    raw = gguf_bytes([kv("arr", V.ARRAY, u32(V.UINT32) + u64(3) + bytes(8))])
    expect_error(write(raw), "arr: array length 3 is more than the file can hold")


def bulk_strings_with_a_bad_length(bad_index: int, n: int = 2000) -> tuple[bytes, int]:
    parts, offset = [], 24 + 8 + 3 + 4 + 12
    bad_offset = None
    for i in range(n):
        if i == bad_index:
            bad_offset = offset
            parts.append(u64(2**62) + b"x")
            break
        parts.append(gstr(f"s{i}"))
        offset += len(parts[-1])
    body = u32(V.STRING) + u64(n) + b"".join(parts) + bytes(8 * n)  # room for n strings, but not for the bad one
    return gguf_bytes([kv("voc", V.ARRAY, body)]), bad_offset


@pytest.mark.parametrize("bad_index", [3, 1500])  # the per-string walk and the bulk walk
def test_a_string_in_an_array_running_past_the_end_is_named(write, bad_index):
    raw, bad_offset = bulk_strings_with_a_bad_length(bad_index)
    error = expect_error(write(raw), rf"voc\[{bad_index}\]: string of {2**62} bytes runs past the end of the file")
    assert str(error).endswith(f"(at byte {bad_offset})")


@pytest.mark.parametrize("payload, match", [
    (None, "k: unknown value type 13"),
    (u32(13) + u64(1) + b"x", r"k: unknown value type 13 \(at byte 37\)"),
    (u32(0xFFFFFFFF) + u64(1) + b"x", "k: unknown value type 4294967295"),
])
def test_unknown_value_types_are_rejected(write, payload, match):
    entry = kv("k", 13, b"abcd") if payload is None else kv("k", V.ARRAY, payload)
    expect_error(write(gguf_bytes([entry])), match)


def test_duplicate_keys_are_rejected(write):
    raw = gguf_bytes([kv("a", V.UINT8, b"\x01"), kv("a", V.UINT8, b"\x02")])
    expect_error(write(raw), r"duplicate metadata key 'a' \(at byte 38\)")


@pytest.mark.parametrize("entry, match", [
    (kv("general.alignment", V.UINT32, u32(0)), r"got 0 \(UINT32\)"),
    (kv("general.alignment", V.UINT32, u32(48)), r"got 48 \(UINT32\)"),
    (kv("general.alignment", V.UINT64, u64(64)), r"got 64 \(UINT64\)"),
    (kv("general.alignment", V.STRING, gstr("32")), r"got '32' \(STRING\)"),
])
def test_alignment_must_be_a_u32_power_of_two(write, entry, match):
    expect_error(write(gguf_bytes([entry], **TWO_F32_TENSORS)),
                 rf"general\.alignment must be a u32 power of two, {match} \(at byte 24\)")


@pytest.mark.parametrize("tensor, match", [
    (info("w", [], GGMLType.F32, 0), "tensor 'w': 0 dimensions, expected 1 to 4"),
    (info("w", [1, 1, 1, 1, 1], GGMLType.F32, 0), "tensor 'w': 5 dimensions"),
    (info("w", [4, 0], GGMLType.F32, 0), r"tensor 'w': dimension 0 in shape \[4, 0\] is out of range"),
    (info("w", [2**63], GGMLType.F32, 0), "dimension 9223372036854775808"),
    (info("w", [2**32, 2**32], GGMLType.F32, 0), "more than 2\\^63 elements"),
    (info("w", [2**62, 2**62, 2**62, 2**62], GGMLType.F32, 0), "more than 2\\^63 elements"),
    (info("w", [4], 4, 0), "tensor 'w': unknown tensor type 4"),
    (info("w", [4], 1000, 0), "unknown tensor type 1000"),
    (info("w", [33], GGMLType.Q4_0, 0), "row length 33 is not a multiple of the Q4_0 block size 32"),
    (info("w", [4], GGMLType.F32, 4), "data offset 4 is not a multiple of the alignment 32"),
    (info("w", [64], GGMLType.F32, 0), "256 bytes at offset 64 run past the end of the file"),
    (info("w", [4], GGMLType.F32, 2**64 - 32), "run past the end of the file"),
])
def test_tensor_infos_are_checked(write, tensor, match):
    expect_error(write(gguf_bytes(infos=[tensor], data=bytes(64))), match)


def test_tensor_errors_give_the_offset_of_the_tensor_info(write):
    first = info("a", [4], GGMLType.F32, 0)
    error = expect_error(write(gguf_bytes(infos=[first, info("w", [4], GGMLType.F32, 8)], data=bytes(64))),
                         "tensor 'w'")
    assert str(error).endswith(f"(at byte {24 + len(first)})")


def test_duplicate_tensor_names_are_rejected(write):
    infos = [info("w", [4], GGMLType.F32, 0), info("w", [4], GGMLType.F32, 32)]
    expect_error(write(gguf_bytes(infos=infos, data=bytes(64))), "duplicate tensor name 'w'")


def test_overlapping_tensors_are_rejected(write):
    infos = [info("a", [16], GGMLType.F32, 0), info("b", [4], GGMLType.F32, 32)]
    expect_error(write(gguf_bytes(infos=infos, data=bytes(64))), "tensors 'a' and 'b' overlap")


def test_arrays_nested_too_deep_are_rejected(write):
    payload = (u32(V.ARRAY) + u64(1)) * 9 + u32(V.UINT8) + u64(0)
    expect_error(write(gguf_bytes([kv("deep", V.ARRAY, payload)])), "nested more than 8 deep")


def test_a_million_empty_arrays_open_without_an_object_each(tmp_path):
    # One key of 10^6 empty arrays (a 12 MB file) used to cost a Python object per array (~500 bytes
    # each, seconds to build).
    n = 1_000_000
    w = GGUFWriter(tmp_path / "nested.gguf", "llama")
    w.add("t.nested", [np.zeros(0, np.int32)] * n, (V.ARRAY, (V.ARRAY, V.INT32)))
    path = w.write()
    opened = []
    peak = peak_bytes_while(lambda: opened.append(open_gguf(path)))
    with opened[0] as f:
        nested = f.metadata["t.nested"]
        assert len(nested) == n and nested[123_456].tolist() == [] and nested[-1].dtype == np.int32
        assert f.metadata_types["t.nested"] == (V.ARRAY, (V.ARRAY, V.INT32))
    assert peak < 32 * n  # per array: its 12 bytes, an int64 offset, and 8 bytes while runs are filled in


def test_runs_of_equal_inner_arrays_are_read_exactly(tmp_path):
    # long runs (checked in bulk) broken by arrays of another count or element type
    items = [np.zeros(0, np.int32)] * 40 + [np.array([7], np.int32)] + [np.array([1, 2], np.int32)] * 30
    items += [np.array([3], np.uint8)] + [np.zeros(0, np.int32)] * 9 + [np.array([4, 5, 6], np.int32)]
    w = GGUFWriter(tmp_path / "runs.gguf", "llama")
    w.add("t.runs", items, (V.ARRAY, V.ARRAY))
    with open_gguf(w.write()) as f:
        runs = f.metadata["t.runs"]
        assert [a.tolist() for a in runs] == [a.tolist() for a in items]
        assert [a.dtype for a in runs] == [a.dtype for a in items]
        assert f.metadata_types["t.runs"] == (V.ARRAY, V.ARRAY)  # the inner element types differ
        copy = GGUFWriter(tmp_path / "copy.gguf", "llama")
        copy.add("t.runs", runs, f.metadata_types["t.runs"])
        assert (tmp_path / "runs.gguf").read_bytes() == copy.write().read_bytes()


def test_a_truncated_array_inside_a_run_of_equal_arrays_is_named(write):
    body = u32(V.ARRAY) + u64(50) + (u32(V.UINT16) + u64(1) + b"\x01\x00") * 49 + u32(V.UINT16) + u64(5)
    expect_error(write(gguf_bytes([kv("runs", V.ARRAY, body)])), r"runs\[49\]: array length 5 is more than")


def crafted_everything() -> bytes:
    kvs = [kv("general.architecture", V.STRING, gstr("llama")),
           kv("t.u32", V.UINT32, u32(7)),
           kv("t.s", V.ARRAY, u32(V.STRING) + u64(3) + gstr("a") + gstr("") + gstr("日本")),
           kv("t.f", V.ARRAY, u32(V.FLOAT32) + u64(2) + struct.pack("<2f", 0.5, 1.5)),
           kv("t.n", V.ARRAY, u32(V.ARRAY) + u64(1) + u32(V.INT8) + u64(2) + b"\x01\xff")]
    return gguf_bytes(kvs, **TWO_F32_TENSORS)


def test_every_truncation_of_a_file_is_a_gguf_error(write):
    raw = crafted_everything()
    open_gguf(write(raw)).close()
    for length in range(len(raw)):
        with pytest.raises(GGUFError):
            open_gguf(write(raw[:length]))


def test_every_truncation_inside_a_bulk_string_array_is_a_gguf_error(write, tmp_path):
    path = write_with_gguf(tmp_path / "voc.gguf", lambda w: w.add_array("voc", [f"t{i}" for i in range(3000)]))
    raw = path.read_bytes()
    for length in range(0, len(raw), 97):
        with pytest.raises(GGUFError):
            open_gguf(write(raw[:length]))


def test_flipped_bytes_never_crash(write):
    raw = crafted_everything()
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0xFF
        try:
            open_gguf(write(bytes(flipped))).close()
        except GGUFError:
            pass
        if i < 24:  # a flipped header byte is always caught
            with pytest.raises(GGUFError):
                open_gguf(write(bytes(flipped)))


# ---------------------------------------------------------------------- the registry models

@pytest.fixture(scope="module")
def smollm2_path():
    from ember.hub import resolve_model
    return resolve_model("smollm2-135m")


@pytest.mark.model
@pytest.mark.slow  # gguf.GGUFReader takes seconds per file
@pytest.mark.parametrize("model", MODELS)
def test_registry_models_read_like_the_gguf_reader(model):
    from ember.hub import resolve_model

    path = resolve_model(model)
    reader = gguf.GGUFReader(path)
    with open_gguf(path) as f:
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            value, spec = f.metadata[key], f.metadata_types[key]
            assert (spec[0] if isinstance(spec, tuple) else spec) == int(field.types[0]), key
            if isinstance(value, (np.ndarray, StringArray)):
                assert value.tolist() == field.contents(), key
            elif spec == V.FLOAT32:
                assert np.float32(value) == np.float32(field.contents()), key
            else:
                assert value == field.contents(), key
        assert list(f.tensors) == [t.name for t in reader.tensors]
        for ref in reader.tensors:
            t = f.tensors[ref.name]
            assert (t.type, t.shape, t.offset, t.n_bytes) == (
                int(ref.tensor_type), tuple(ref.shape.tolist()), ref.data_offset, ref.n_bytes)
            assert np.array_equal(t.data, ref.data.reshape(-1).view(np.uint8)), ref.name


@pytest.mark.model
@pytest.mark.parametrize("model", SLOW_MODELS)
def test_registry_models_round_trip_byte_for_byte(model, tmp_path):
    from ember.hub import resolve_model

    path = resolve_model(model)
    with open_gguf(path) as f:
        w = GGUFWriter(tmp_path / "copy.gguf", f.arch)
        for key, value in f.metadata.items():
            w.add(key, value, f.metadata_types[key])
        for t in f.tensors.values():
            w.add_tensor(t.name, t.data, t.type, t.shape)
        copy = w.write()
    assert sha256(copy) == sha256(path)


def sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.mark.model
def test_smollm2_vocabulary_is_list_like(smollm2_path):
    with open_gguf(smollm2_path) as f:
        tokens = f.metadata["tokenizer.ggml.tokens"]
        assert len(tokens) == 49152 == len(f.metadata["tokenizer.ggml.token_type"])
        assert tokens[0] == "<|endoftext|>"
        assert tokens[1:3] == ["<|im_start|>", "<|im_end|>"]
        assert tokens.index("Ġthe") == tokens.tolist().index("Ġthe")


@pytest.mark.model
def test_truncated_registry_model_is_a_gguf_error_at_ten_points(smollm2_path, tmp_path):
    with open_gguf(smollm2_path) as f:
        first = next(iter(f.tensors.values()))
        points = [3, 20, 30, 200, 100_000, 1_000_000, 1_700_000, f.data_offset,
                  first.offset + first.n_bytes // 2, f.size - 1]
    raw = smollm2_path.read_bytes()
    for point in points:
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(raw[:point])
        with pytest.raises(GGUFError):
            open_gguf(cut)


@pytest.mark.model
def test_registry_model_with_a_flipped_header_byte_is_a_gguf_error(smollm2_path, tmp_path):
    copy = tmp_path / "flip.gguf"
    shutil.copyfile(smollm2_path, copy)
    with open(copy, "r+b") as f:
        for i in range(24):
            f.seek(i)
            byte = f.read(1)[0]
            f.seek(i)
            f.write(bytes([byte ^ 0xFF]))
            f.flush()
            with pytest.raises(GGUFError):
                open_gguf(copy)
            f.seek(i)
            f.write(bytes([byte]))
            f.flush()


@pytest.mark.model
@pytest.mark.slow
def test_opening_qwen_is_much_faster_than_the_gguf_reader():
    """The recorded numbers are in benchmarks/gguf_open.md; this only guards against regressions."""
    from ember.hub import resolve_model

    path = resolve_model("qwen2.5-coder-0.5b")

    def ember_open():
        with open_gguf(path) as f:
            return len(f.metadata["tokenizer.ggml.tokens"]), len(f.metadata["tokenizer.ggml.merges"])
    ember_open()
    ember_times = []
    for _ in range(5):
        start = time.perf_counter()
        assert ember_open() == (151936, 151387)
        ember_times.append(time.perf_counter() - start)
    start = time.perf_counter()
    gguf.GGUFReader(path)
    reader_time = time.perf_counter() - start
    assert min(ember_times) * 10 < reader_time
