"""ember.quants: the type table and the numpy reference (de)quantizers, against the gguf package."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ember import _core  # noqa: E402
from ember.errors import EmberError, GGUFError  # noqa: E402
from ember.gguf.types import TYPES, GGMLType, tensor_bytes, type_by_name  # noqa: E402
from ember.quant.reference import dequantize, dequantize_tensor, quantize

DEQUANTIZED_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                     "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
QUANTIZED_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# where each block keeps its f16 scales (d, and dmin where there is one): ggml-common.h
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
              "IQ4_NL": [0], "IQ4_XS": [0]}


def gguf_type(name: str):
    return gguf.GGMLQuantizationType[name]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes of `n_blocks` blocks, with finite f16 scales so no NaN arithmetic is compared."""
    info = TYPES[type_by_name(name)]
    raw = rng.integers(0, 256, size=(n_blocks, info.type_size), dtype=np.uint8)
    if name == "F16":
        return rng.standard_normal((n_blocks, 1)).astype(np.float16).view(np.uint8)
    for offset in F16_FIELDS.get(name, []):
        scale = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw


# ---------------------------------------------------------------------- the table

def test_type_ids_are_ggml_ids():
    for t in GGMLType:
        assert int(t) == int(gguf.GGMLQuantizationType[t.name])


def test_block_and_type_sizes_match_ggml():
    for t, info in TYPES.items():
        if t == GGMLType.Q8_1:
            continue  # the gguf package still sizes it with float d and s; see the next test
        assert (info.block_size, info.type_size) == gguf.GGML_QUANT_SIZES[gguf_type(t.name)]
        assert info.name == t.name


def test_q8_1_blocks_are_36_bytes_as_in_ggml():
    # ggml-common.h: block_q8_1 is ggml_half d, ggml_half s, int8 qs[32] (static_assert 2*2 + 32);
    # the core's own table agrees (quantize_row writes 36-byte blocks).
    assert (TYPES[GGMLType.Q8_1].block_size, TYPES[GGMLType.Q8_1].type_size) == (32, 36)
    assert _core.quantize_row(int(GGMLType.Q8_1), np.ones(64, np.float32)).size == 2 * 36


def test_every_required_type_is_in_the_table():
    for name in DEQUANTIZED_TYPES + ["Q8_1", "Q8_K"]:
        assert type_by_name(name) in TYPES


def test_type_by_name_ignores_case():
    assert type_by_name("q4_k") is GGMLType.Q4_K


def test_unknown_type_name_is_an_error_for_people():
    with pytest.raises(EmberError, match="unknown tensor type 'Q4_2'"):
        type_by_name("Q4_2")


def test_tensor_bytes_counts_whole_blocks():
    assert tensor_bytes(GGMLType.Q4_K, (512, 3)) == 2 * 3 * 144
    assert tensor_bytes(GGMLType.F16, (7, 5)) == 70


def test_tensor_bytes_rejects_partial_blocks():
    with pytest.raises(GGUFError, match="not a multiple of the Q8_0 block size 32"):
        tensor_bytes(GGMLType.Q8_0, (48, 2))


# ---------------------------------------------------------------------- dequantize

@pytest.mark.parametrize("name", DEQUANTIZED_TYPES)
def test_dequantize_is_bit_exact_with_gguf_on_random_blocks(name):
    rng = np.random.default_rng(1234)
    info = TYPES[type_by_name(name)]
    rows, row_blocks = 8, 3
    raw = random_blocks(name, rows * row_blocks, rng).reshape(rows, row_blocks * info.type_size)
    expected = gguf.quants.dequantize(raw, gguf_type(name))
    got = dequantize(raw, type_by_name(name), (row_blocks * info.block_size, rows))
    assert got.dtype == np.float32
    assert same_bits(got, expected)


def test_dequantize_returns_numpy_order_for_a_ggml_shape():
    raw = np.arange(2 * 3 * 4, dtype=np.float32).view(np.uint8)
    got = dequantize(raw, GGMLType.F32, (4, 3, 2))
    assert got.shape == (2, 3, 4)
    assert got[1, 2, 3] == 23.0


def test_dequantize_handles_more_blocks_than_one_slab():
    rng = np.random.default_rng(7)
    raw = random_blocks("Q4_K", 4100, rng)  # 1,049,600 values: more than one slab of 2^20
    expected = gguf.quants.dequantize(raw.reshape(1, -1), gguf_type("Q4_K"))
    assert same_bits(dequantize(raw, GGMLType.Q4_K, (4100 * 256, 1)), expected)


def test_dequantize_rejects_a_byte_count_that_does_not_match_the_shape():
    with pytest.raises(GGUFError, match="needs 68 bytes, got 34"):
        dequantize(np.zeros(34, np.uint8), GGMLType.Q8_0, (64,))


def test_dequantize_of_an_unsupported_type_is_an_error():
    with pytest.raises(GGUFError, match="IQ2_XXS is not supported"):
        dequantize(np.zeros(66, np.uint8), GGMLType.IQ2_XXS, (256,))


# ---------------------------------------------------------------------- quantize

def tricky_rows(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[0] = 0.0  # d == 0
    x[1] = 0.75  # constant blocks
    x[2, :32] = np.where(np.arange(32) % 2, 2.0, -2.0)  # |max| ties between signs
    x[3] *= np.float32(1e-6)  # tiny scales
    x[4] *= np.float32(1e4)  # large values, still inside the f16 range
    x[5] = np.round(x[5] * 8) / 8  # values on the quantization grid: exact .5 cases
    return x


@pytest.mark.parametrize("name", QUANTIZED_TYPES)
def test_quantize_is_bit_exact_with_gguf(name):
    x = tricky_rows(np.random.default_rng(99))
    expected = gguf.quants.quantize(x, gguf_type(name))
    got = quantize(x, type_by_name(name))
    assert got.dtype == np.uint8
    assert same_bits(got, np.ascontiguousarray(expected).view(np.uint8).reshape(got.shape))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_quantized_bytes_dequantize_like_ggufs(name):
    x = np.random.default_rng(5).standard_normal((4, 128)).astype(np.float32)
    q = quantize(x, type_by_name(name))
    assert same_bits(dequantize(q, type_by_name(name), (128, 4)), gguf.quants.dequantize(q, gguf_type(name)))


def test_bf16_quantize_keeps_nan_quiet_and_rounds_to_even():
    x = np.array([np.nan, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -np.inf], np.float32)
    expected = gguf.quants.quantize(x, gguf_type("BF16"))
    assert same_bits(quantize(x, GGMLType.BF16), np.asarray(expected).view(np.uint8))


def test_quantize_rejects_rows_that_are_not_whole_blocks():
    with pytest.raises(GGUFError, match="block size 32"):
        quantize(np.zeros((2, 48), np.float32), GGMLType.Q4_0)


def test_quantize_to_a_k_quant_is_not_offered():
    with pytest.raises(GGUFError, match="quantizing to Q4_K is not supported"):
        quantize(np.zeros(256, np.float32), GGMLType.Q4_K)


# ---------------------------------------------------------------------- the registry models

def tensors_by_type(f, limit_per_type: int | None):
    """Tensors of every type present in the file, the smallest first, `limit_per_type` of each."""
    grouped = defaultdict(list)
    for t in sorted(f.tensors.values(), key=lambda t: t.n_elements):
        grouped[t.type].append(t)
    return {tensor_type: ts[:limit_per_type] for tensor_type, ts in grouped.items()}


def assert_dequantize_matches(path, limit_per_type):
    """ember's dequantize against gguf's, both fed the bytes ember's reader maps (test_gguf checks
    those against gguf.GGUFReader)."""
    from ember.gguf import open_gguf

    with open_gguf(path) as f:
        for tensor_type, tensors in tensors_by_type(f, limit_per_type).items():
            for t in tensors:
                rows = t.data.reshape(*t.np_shape[:-1], -1)
                expected = gguf.quants.dequantize(rows, gguf_type(tensor_type.name))
                assert same_bits(dequantize(t.data, t.type, t.shape), expected), t.name


MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]


@pytest.mark.model
@pytest.mark.parametrize("model", MODELS)
def test_dequantize_matches_gguf_on_the_smallest_tensors_of_each_type_in(model):
    from ember.hub import resolve_model

    assert_dequantize_matches(resolve_model(model), 3)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_dequantize_matches_gguf_on_every_tensor_of(model):
    from ember.hub import resolve_model

    assert_dequantize_matches(resolve_model(model), None)


@pytest.mark.model
def test_quantize_matches_gguf_on_real_weights():
    from ember.gguf import open_gguf
    from ember.hub import resolve_model

    with open_gguf(resolve_model("smollm2-135m")) as f:
        weights = dequantize_tensor(f.tensors["blk.0.attn_q.weight"])
    for name in QUANTIZED_TYPES:
        expected = np.ascontiguousarray(gguf.quants.quantize(weights, gguf_type(name))).view(np.uint8)
        assert same_bits(quantize(weights, type_by_name(name)), expected.reshape(weights.shape[0], -1)), name
