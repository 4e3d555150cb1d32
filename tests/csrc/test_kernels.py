"""Native per-type kernels against the numpy references in ember.quants, for every ISA this CPU runs.

Weights are random blocks (every bit pattern of the quantized fields is a valid block; the f16
scales are set to sane values), so each kernel sees all nibble/bit combinations.
"""

import numpy as np
import pytest

from ember import _core
from ember.gguf.types import TYPES, GGMLType
from ember.quant.reference import dequantize, quantize

ISAS = _core.available_isas()

# Byte offsets of the f16 scale fields inside one block, per type.
SCALE_FIELDS = {
    GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0], GGMLType.Q5_1: [0, 2],
    GGMLType.Q8_0: [0], GGMLType.Q2_K: [80, 82], GGMLType.Q3_K: [108], GGMLType.Q4_K: [0, 2],
    GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208], GGMLType.IQ4_NL: [0], GGMLType.IQ4_XS: [0],
}
QUANTIZED = list(SCALE_FIELDS)
WEIGHT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, *QUANTIZED]
# Activation formats: what each weight type's activations are converted to.
VEC_DOT_TYPE = {
    GGMLType.F32: GGMLType.F32, GGMLType.F16: GGMLType.F16, GGMLType.BF16: GGMLType.BF16,
    GGMLType.Q4_0: GGMLType.Q8_0, GGMLType.Q5_0: GGMLType.Q8_0, GGMLType.Q8_0: GGMLType.Q8_0,
    GGMLType.Q4_1: GGMLType.Q8_1, GGMLType.Q5_1: GGMLType.Q8_1,
    GGMLType.Q2_K: GGMLType.Q8_K, GGMLType.Q3_K: GGMLType.Q8_K, GGMLType.Q4_K: GGMLType.Q8_K,
    GGMLType.Q5_K: GGMLType.Q8_K, GGMLType.Q6_K: GGMLType.Q8_K,
    GGMLType.IQ4_NL: GGMLType.Q8_0, GGMLType.IQ4_XS: GGMLType.Q8_K,
}


def has_kernels(t):
    return TYPES[t].name in _core.types_with_kernels()


def random_rows(t, n_rows, n_cols, seed=0):
    """Raw bytes of n_rows rows of type t, shape (n_rows, row_bytes)."""
    rng = np.random.default_rng(seed)
    if t == GGMLType.F32:
        return rng.standard_normal((n_rows, n_cols)).astype(np.float32).view(np.uint8)
    if t == GGMLType.F16:
        return rng.standard_normal((n_rows, n_cols)).astype(np.float16).view(np.uint8)
    if t == GGMLType.BF16:
        bits = rng.standard_normal((n_rows, n_cols)).astype(np.float32).view(np.uint32)
        return (bits >> 16).astype(np.uint16).view(np.uint8)
    info = TYPES[t]
    n_blocks = n_rows * n_cols // info.block_size
    blocks = rng.integers(0, 256, size=(n_blocks, info.type_size), dtype=np.uint8)
    for off in SCALE_FIELDS[t]:
        scales = (rng.uniform(0.5, 2.0, n_blocks) * rng.choice([-1, 1], n_blocks) / 64).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(n_rows, -1)



@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
def test_dequantize_row_matches_numpy_reference(isa, t):
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n = 512
    raw = random_rows(t, 1, n, seed=1)[0]
    expected = dequantize(raw, t, (n,)).reshape(-1)
    got = _core.dequantize_row(int(t), raw, n)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.F16, GGMLType.BF16], ids=lambda t: TYPES[t].name)
def test_activation_quantizer_is_bit_exact_with_reference(isa, t):
    x = np.random.default_rng(2).standard_normal(1024).astype(np.float32) * 3
    assert np.array_equal(_core.quantize_row(int(t), x), quantize(x, t).reshape(-1))


def rounding_edges():
    """Blocks whose scaled values x / d fall on halves and next to them (d = 1: max|x| = 127),
    an all-zero block, and one with a single tiny value."""
    halves = np.arange(-126.5, 127, 1.0, dtype=np.float32)
    below = np.nextafter(halves, np.float32(0))
    edges = np.concatenate([halves, below, np.float32([0.5, -0.5, 0.49999997, -0.49999997])])
    blocks = []
    for i in range(0, edges.size, 31):
        part = edges[i:i + 31]
        blocks.append(np.concatenate([[np.float32(127)], part, np.zeros(31 - part.size, np.float32)]))
    blocks.append(np.zeros(32, np.float32))
    blocks.append(np.concatenate([[np.float32(1e-30)], np.zeros(31, np.float32)]))
    return np.concatenate(blocks).astype(np.float32)


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q8_1], ids=lambda t: TYPES[t].name)
def test_activation_quantizers_round_halves_as_the_scalar_reference(isa, t):
    x = rounding_edges()
    got = _core.quantize_row(int(t), x)
    previous = _core.isa()
    _core.set_isa("scalar")
    try:
        expected = _core.quantize_row(int(t), x)
    finally:
        _core.set_isa(previous)
    assert np.array_equal(got, expected)
    if t == GGMLType.Q8_0:
        qs = got.reshape(-1, 34)[0, 2:].view(np.int8)
        assert list(qs[1:4]) == [-127, -126, -125]  # -126.5 -> -127: halves go away from zero


def reference_q8_1(x):
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / 127
    q = np.round(blocks / np.where(d == 0, 1, d)[:, None])
    return d, q


def test_q8_1_quantizer(isa):
    x = np.random.default_rng(3).standard_normal(256).astype(np.float32)
    raw = _core.quantize_row(int(GGMLType.Q8_1), x).reshape(-1, 36)
    d, q = reference_q8_1(x)
    np.testing.assert_allclose(raw[:, 0:2].copy().view(np.float16)[:, 0], d.astype(np.float16))
    assert np.array_equal(raw[:, 4:].view(np.int8), q.astype(np.int8))
    s = raw[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float32)
    np.testing.assert_allclose(s, (d * q.sum(axis=1)).astype(np.float16).astype(np.float32), rtol=1e-3)


def test_q8_k_quantizer(isa):
    x = np.random.default_rng(4).standard_normal(512).astype(np.float32)
    raw = _core.quantize_row(int(GGMLType.Q8_K), x).reshape(-1, 292)
    for b, block in enumerate(x.reshape(-1, 256)):
        extreme = block[np.argmax(np.abs(block))]
        iscale = -127.0 / extreme
        q = np.minimum(127, np.rint(iscale * block)).astype(np.int8)
        assert np.array_equal(raw[b, 4:260].view(np.int8), q)
        assert np.array_equal(raw[b, 260:292].copy().view(np.int16), q.reshape(16, 16).sum(axis=1, dtype=np.int16))
        np.testing.assert_allclose(raw[b, 0:4].copy().view(np.float32)[0], 1 / np.float32(iscale), rtol=1e-7)


def test_q8_k_quantizer_matches_the_scalar_one_at_its_edges(isa):
    """The SIMD Q8_K quantizer against the scalar table's: values that scale onto halves and next
    to them (rounded to even), equal magnitudes of both signs (the first one gives d its sign), the
    extreme as the last element, an all-zero block, one tiny value, -0.0, and a block of random
    values."""
    edges = rounding_edges()
    edges = np.concatenate([edges, np.zeros(-edges.size % 256, np.float32)])
    tie = np.zeros(256, np.float32)
    tie[[7, 100, 200]] = [-3.0, 3.0, -3.0]
    last = np.random.default_rng(5).uniform(-1, 1, 256).astype(np.float32)
    last[255] = 2.5
    signed_zero = np.full(256, -0.0, np.float32)
    signed_zero[31] = 1e-3
    rand = np.random.default_rng(6).standard_normal(256).astype(np.float32) * 40
    x = np.concatenate([edges, tie, last, np.zeros(256, np.float32), signed_zero, rand])
    got = _core.quantize_row(int(GGMLType.Q8_K), x)
    previous = _core.isa()
    _core.set_isa("scalar")
    try:
        expected = _core.quantize_row(int(GGMLType.Q8_K), x)
    finally:
        _core.set_isa(previous)
    assert np.array_equal(got, expected)
    tie_block = got.reshape(-1, 292)[edges.size // 256]
    assert tie_block[0:4].copy().view(np.float32)[0] > 0  # d = -3 / -127: the first extreme is -3


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
@pytest.mark.parametrize("n", [256, 768, 4096])
def test_vec_dot_matches_dequantized_dot(isa, t, n):
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    rng = np.random.default_rng(n)
    w_raw = random_rows(t, 1, n, seed=n)[0]
    x = rng.standard_normal(n).astype(np.float32)
    w = dequantize(w_raw, t, (n,)).reshape(-1).astype(np.float64)
    vdt = VEC_DOT_TYPE[t]
    x_q = _core.dequantize_row(int(vdt), _core.quantize_row(int(vdt), x), n).astype(np.float64)
    expected = float(w @ x_q)
    scale = float(np.abs(w * x_q).sum())
    got = _core.vec_dot(int(t), w_raw, x)
    assert abs(got - expected) <= 2e-5 * scale, (got, expected)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
@pytest.mark.parametrize("n_tokens", [1, 7, 33, 70])
def test_matmul_matches_numpy(isa, t, n_tokens):
    """Odd shapes: 1 token, 33 tokens, 37 weight rows (not a multiple of the tile); 70 tokens:
    5 panels of 16, more than the AMX kernel multiplies with one unpacked weight block."""
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n_in, n_out = 512, 37
    w_raw = random_rows(t, n_out, n_in, seed=5)
    x = np.random.default_rng(6).standard_normal((n_tokens, n_in)).astype(np.float32)
    g = _core.Graph(2)
    w = g.weight(int(t), n_in, n_out, w_raw.reshape(-1))
    y = g.matmul(w, g.input(n_in))
    g.set_output(y)
    g.plan(80, 80, 80)
    ids = np.arange(n_tokens, dtype=np.int32)
    out = g.run(np.zeros(n_tokens, np.int32), ids, np.zeros(n_tokens, np.int32), ids, [x])
    assert_matches_numpy(out, t, w_raw, x)


K_QUANTS = [t for t in QUANTIZED if VEC_DOT_TYPE[t] == GGMLType.Q8_K]


@pytest.mark.parametrize("t", K_QUANTS, ids=lambda t: TYPES[t].name)
@pytest.mark.parametrize("fill", [0xFF, 0x80, 0x7F])
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("n_tokens", [1, 20])
def test_k_quant_kernels_at_the_extremes(isa, t, fill, sign, n_tokens):
    """Every quant, scale and min byte set to one pattern (0xFF: the largest quants, scales and
    mins), against activations of one magnitude (all quantized to -127): the kernels' integer
    sums at their largest, where a narrower intermediate would wrap or saturate. One token (the
    decode kernels) and 20 (a prompt: a full panel of 16 and a partial one)."""
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n_in, n_out = 768, 5
    info = TYPES[t]
    blocks = np.full((n_out * n_in // info.block_size, info.type_size), fill, np.uint8)
    for off in SCALE_FIELDS[t]:
        blocks[:, off:off + 2] = np.array([1 / 64], np.float16).view(np.uint8)
    w_raw = blocks.reshape(n_out, -1)
    x = np.full((n_tokens, n_in), sign, np.float32)
    assert_matches_numpy(run_matmul(matmul_graph(t, w_raw, n_in, n_out, n_threads=1), x), t, w_raw, x)


BLOCK_32_TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.IQ4_NL]


@pytest.mark.parametrize("t", BLOCK_32_TYPES, ids=lambda t: TYPES[t].name)
@pytest.mark.parametrize("fill", [0xFF, 0x00, 0x0F, 0x7F, 0x80])
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("n_tokens", [1, 3, 16, 21])
def test_16_bit_block_sums_at_their_extremes(isa, t, fill, sign, n_tokens):
    """Every quant byte one pattern (0xFF: every Q4 nibble 15, every Q5 quant 31, Q8_0's -1;
    0x7F and 0x80: Q8_0's 127 and -128; IQ4_NL's 0x00: every value -127, 0xFF: 113) against
    activations of one magnitude, all quantized to +-127: the AVX2 kernels add products in 16-bit
    lanes up to near the int16 limit (16 products of 15 * 127, 30480; Q5's 8 products of 31 * 127,
    31496; the pairs of 128 * 127 of Q8_0 and of 127 * 127 of IQ4_NL, as magnitudes times
    activations with the values' signs), for decode, small batches and 16-token panels. The offset
    m of Q4_1 and Q5_1 is 0: its f16 product with Q8_1's s would blur the integer sums."""
    n_in, n_out = 512, 11
    info = TYPES[t]
    blocks = np.full((n_out * n_in // info.block_size, info.type_size), fill, np.uint8)
    blocks[:, 0:2] = np.array([1 / 64], np.float16).view(np.uint8)
    if t in (GGMLType.Q4_1, GGMLType.Q5_1):
        blocks[:, 2:4] = 0
    w_raw = blocks.reshape(n_out, -1)
    x = np.full((n_tokens, n_in), sign, np.float32)
    assert_matches_numpy(run_matmul(matmul_graph(t, w_raw, n_in, n_out, n_threads=1), x), t, w_raw, x)


def assert_matches_numpy(out, t, w_raw, x):
    """out = x @ W.T with W dequantized and x through the activation format, to 2e-5 of sum |x w|."""
    n_in = x.shape[1]
    w_f = dequantize(w_raw.reshape(-1), t, (n_in, w_raw.shape[0])).astype(np.float64)
    vdt = VEC_DOT_TYPE[t]
    x_q = np.stack([_core.dequantize_row(int(vdt), _core.quantize_row(int(vdt), row), n_in) for row in x])
    expected = x_q.astype(np.float64) @ w_f.T
    scale = np.abs(x_q).astype(np.float64) @ np.abs(w_f).T
    assert np.all(np.abs(out - expected) <= 2e-5 * scale + 1e-6)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
@pytest.mark.parametrize("n_tokens", [1, 33])
def test_float_activation_matmul_matches_numpy(isa, t, n_tokens):
    """A graph with float activations dequantizes the weights and leaves the activations as they
    are: equal to float64 x @ W.T within float32 accumulation (1e-6 of sum |x w|, where the 8-bit
    activations of the default path are ~1e-3 off). 37 rows: two dequantized tiles and a partial
    one; each token with the bits it gets alone, for 1 and 3 threads."""
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n_in, n_out = 512, 37
    w_raw = random_rows(t, n_out, n_in, seed=5)
    x = np.random.default_rng(6).standard_normal((n_tokens, n_in)).astype(np.float32)
    w_f = dequantize(w_raw.reshape(-1), t, (n_in, n_out)).astype(np.float64)
    results = []
    for n_threads in (1, 3):
        g = matmul_graph(t, w_raw, n_in, n_out, n_threads=n_threads, float_activations=True)
        assert g.float_activations
        results.append(run_matmul(g, x))
        alone = np.concatenate([run_matmul(g, x[i:i + 1]) for i in range(n_tokens)])
        assert np.array_equal(results[-1], alone)
    assert np.array_equal(results[0], results[1])
    expected = x.astype(np.float64) @ w_f.T
    assert np.all(np.abs(results[0] - expected) <= 1e-6 * (np.abs(x) @ np.abs(w_f).T) + 1e-7)


def matmul_graph(t, w_raw, n_in, n_out, n_threads=2, float_activations=False):
    g = _core.Graph(n_threads, float_activations=float_activations)
    g.set_output(g.matmul(g.weight(int(t), n_in, n_out, w_raw.reshape(-1)), g.input(n_in)))
    g.plan(64, 64, 64)
    return g


def run_matmul(g, x):
    ids = np.arange(len(x), dtype=np.int32)
    return np.array(g.run(np.zeros(len(x), np.int32), ids, np.zeros(len(x), np.int32), ids, [x]))


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
@pytest.mark.parametrize("n_in", [256, 512, 768, 1024, 2560])
def test_a_batch_gives_each_token_the_bits_it_gets_alone(isa, t, n_in):
    """The tiled kernels (and, with AVX-512, the 16-token panels of prompt processing) must sum
    in the same order as the one-token path: the server's batched decode is only equal to single
    decoding if they do. 37 tokens: two full panels, a partial one, and small batches of each.
    Rows of 2560 weights: 10 K-quant super-blocks, more than the 8 partial sums of their order;
    rows of 1 to 4 super-blocks: the decode kernel that puts several rows in one vector (37 rows:
    a partial group at the end)."""
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n_out = 37
    w_raw = random_rows(t, n_out, n_in, seed=8)
    g = matmul_graph(t, w_raw, n_in, n_out)
    x = np.random.default_rng(9).standard_normal((37, n_in)).astype(np.float32)
    alone = np.concatenate([run_matmul(g, x[i:i + 1]) for i in range(len(x))])
    assert np.array_equal(run_matmul(g, x), alone)
    assert np.array_equal(run_matmul(g, x[:11]), alone[:11])
    assert_matches_numpy(alone, t, w_raw, x)


@pytest.mark.parametrize("n_in", [67, 93])
def test_f32_tiles_with_a_tail(isa, n_in):
    """F32 rows whose length is not a multiple of 16 (the SIMD step): the tile kernel's edge
    blocks and tails give each token its bits alone, and match numpy."""
    n_out, n_tokens = 37, 33
    w_raw = random_rows(GGMLType.F32, n_out, n_in, seed=13)
    g = matmul_graph(GGMLType.F32, w_raw, n_in, n_out)
    x = np.random.default_rng(14).standard_normal((n_tokens, n_in)).astype(np.float32)
    out = run_matmul(g, x)
    assert np.array_equal(out, np.concatenate([run_matmul(g, x[i:i + 1]) for i in range(n_tokens)]))
    assert_matches_numpy(out, GGMLType.F32, w_raw, x)


@pytest.mark.parametrize("n_in", [5632, 20736])
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
def test_long_rows_in_small_batches(isa, t, n_in):
    """Rows of 5632 weights (176 blocks of 32) and of 20736 (648 blocks, past the 640 whose
    activation scales the AVX-512 transposed-rows kernel stages, so that its fallback runs):
    5 tokens against numpy, and each with the bits it gets alone. For the K-quants the 5 tokens of
    20736 weights do not fit the stack copy of gemm_tile_k (Q8KLine blocks), so they run on the
    Q8_K blocks as they are while each token alone runs on the copy: the two layouts agree."""
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n_out = 19
    w_raw = random_rows(t, n_out, n_in, seed=11)
    g = matmul_graph(t, w_raw, n_in, n_out)
    x = np.random.default_rng(12).standard_normal((5, n_in)).astype(np.float32)
    out = run_matmul(g, x)
    assert np.array_equal(out, np.concatenate([run_matmul(g, x[i:i + 1]) for i in range(len(x))]))
    assert_matches_numpy(out, t, w_raw, x)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
def test_get_rows_dequantizes_the_selected_rows(isa, t):
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n_cols, n_rows = 256, 11
    raw = random_rows(t, n_rows, n_cols, seed=7)
    g = _core.Graph(1)
    e = g.get_rows(g.weight(int(t), n_cols, n_rows, raw.reshape(-1)))
    g.set_output(e)
    g.plan(8, 8, 8)
    tokens = np.array([3, 0, 10, 3], np.int32)
    out = g.run(tokens, np.arange(4, dtype=np.int32), np.zeros(4, np.int32), np.arange(4, dtype=np.int32))
    table = dequantize(raw.reshape(-1), t, (n_cols, n_rows))
    np.testing.assert_allclose(out, table[tokens], rtol=1e-6, atol=1e-7)


@pytest.mark.skipif("amx" not in ISAS, reason="no AMX tiles here, native or emulated")
@pytest.mark.parametrize("signs", ["ss", "su", "us", "uu"])
@pytest.mark.parametrize("M, K, N", [(16, 16, 16), (16, 8, 16), (3, 5, 7), (1, 1, 1)])
def test_amx_tile_dot_products_match_numpy(signs, M, K, N):
    """ldtilecfg with these shapes, tile loads and stores at their strides, and each tdpb*d:
    C + A . B in groups of 4 bytes, A (M, 4K) and B (K, 4N) signed or unsigned as named. The
    same test checks the CPU's tiles on an AMX machine and the emulator elsewhere."""
    rng = np.random.default_rng(M * 256 + K * 16 + N)
    a = rng.integers(0, 256, (M, 4 * K), dtype=np.uint8)
    b = rng.integers(0, 256, (K, 4 * N), dtype=np.uint8)
    c = rng.integers(-2**31, 2**31, (M, N), dtype=np.int64).astype(np.int32)
    as_int = lambda v, s: (v.view(np.int8) if s == "s" else v).astype(np.int64)
    products = np.einsum("mki,kni->mn", as_int(a, signs[0]).reshape(M, K, 4), as_int(b, signs[1]).reshape(K, N, 4))
    expected = ((c.astype(np.int64) + products + 2**31) % 2**32 - 2**31).astype(np.int32)  # int32 wrap-around
    assert np.array_equal(_core.tile_dot_product(signs[0], signs[1], a, b, c), expected)
