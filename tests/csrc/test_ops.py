"""Every graph op against a numpy reference, on every ISA this CPU runs (the `isa` fixture).

Activations are F32 and the references compute in float64. Tolerances, per kind of op:
- add, mul, scale, get_rows, select_outputs, views: exact (one float32 rounding, as numpy's);
- SiLU, GELU, SwiGLU, GeGLU, soft-capping: rtol 1e-6 plus a small atol, because the core's
  exp/tanh are polynomials (relative error < 2e-7) and tanh(x) = 1 - 2 / (exp(2x) + 1) loses
  about 1e-7 absolute near 0;
- RMSNorm, LayerNorm: rtol 2e-6 (the sum runs in double, then a few float32 roundings);
- RoPE: atol 4e-7 x position x max|x|, because theta is computed in float32 (as in llama.cpp);
- attention: rtol 1e-5, atol 3e-6 x max|V| (float32 dot products and exp), after rounding K and V
  exactly as the KV cache stores them (float16 by default, Q8_0 blocks, or float32).
Shapes are odd on purpose: 1 token (decode) and 33 tokens, rows of 67 columns (a SIMD tail).
Matmul and get_rows by token, for every weight type, are covered in test_kernels.py.
"""

import math

import numpy as np
import pytest

from ember import _core
from ember.gguf.types import GGMLType
from ember.quant.reference import dequantize, quantize

F32 = int(GGMLType.F32)
ISAS = _core.available_isas()
TOKEN_COUNTS = [1, 33]
WIDTH = 67
# Values where the approximations saturate, underflow or lose precision.
SPECIAL_VALUES = [-100.0, -20.0, -5.0, -1e-3, 0.0, 1e-3, 5.0, 20.0, 100.0]



def activations(n_tokens, width=WIDTH, seed=0, scale=3.0, special=True):
    """Random rows, the first of them starting with SPECIAL_VALUES (unless special=False)."""
    x = (np.random.default_rng(seed).standard_normal((n_tokens, width)) * scale).astype(np.float32)
    if special:
        x.reshape(-1)[:len(SPECIAL_VALUES)] = SPECIAL_VALUES
    return x


def vector(g, values):
    """An F32 weight vector (norm weight, bias, RoPE factors)."""
    return g.weight(F32, len(values), 1, np.ascontiguousarray(values, dtype=np.float32))


def run_graph(build, inputs, positions=None, output_rows=None, n_threads=2):
    """Builds a graph over F32 inputs [n_tokens, cols] with build(g, *input_ids) -> output id,
    runs one batch of n_tokens tokens and returns the output rows."""
    n_tokens = inputs[0].shape[0]
    positions = np.arange(n_tokens) if positions is None else np.asarray(positions)
    output_rows = np.arange(n_tokens) if output_rows is None else np.asarray(output_rows)
    g = _core.Graph(n_threads)
    ids = [g.input(x.shape[1]) for x in inputs]
    g.set_output(build(g, *ids))
    g.plan(n_tokens, len(output_rows), int(positions.max()) + 1)
    return g.run(np.zeros(n_tokens, np.int32), positions.astype(np.int32), np.zeros(n_tokens, np.int32),
                 output_rows.astype(np.int32), [np.ascontiguousarray(x, np.float32) for x in inputs])


# -- element-wise ----------------------------------------------------------------------------

def silu_reference(x):
    x = x.astype(np.float64)
    return x / (1.0 + np.exp(-x))


def gelu_tanh_reference(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf_reference(x):
    erf = np.vectorize(math.erf)
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
def test_add_is_exact(isa, n_tokens):
    a, b = activations(n_tokens, seed=1), activations(n_tokens, seed=2)
    np.testing.assert_array_equal(run_graph(lambda g, x, y: g.add(x, y), [a, b]), a + b)


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
def test_mul_is_exact(isa, n_tokens):
    a, b = activations(n_tokens, seed=1), activations(n_tokens, seed=2)
    np.testing.assert_array_equal(run_graph(lambda g, x, y: g.mul(x, y), [a, b]), a * b)


def test_add_and_mul_broadcast_a_vector_over_rows(isa):
    x = activations(33)
    bias, gain = activations(1, seed=3)[0], activations(1, seed=4)[0]
    out = run_graph(lambda g, x: g.mul(g.add(x, vector(g, bias)), vector(g, gain)), [x])
    np.testing.assert_array_equal(out, (x + bias) * gain)


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
def test_scale_is_exact(isa, n_tokens):
    x = activations(n_tokens)
    np.testing.assert_array_equal(run_graph(lambda g, x: g.scale(x, 0.37), [x]), x * np.float32(0.37))


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
def test_silu(isa, n_tokens):
    x = activations(n_tokens)
    np.testing.assert_allclose(run_graph(lambda g, x: g.silu(x), [x]), silu_reference(x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
def test_gelu_is_the_tanh_form(isa, n_tokens):
    x = activations(n_tokens)
    out = run_graph(lambda g, x: g.gelu(x), [x])
    np.testing.assert_allclose(out, gelu_tanh_reference(x), rtol=1e-6, atol=1e-6)
    if n_tokens > 1:  # the erf form differs by up to ~5e-4: the test tells them apart
        assert np.abs(out - gelu_erf_reference(x)).max() > 1e-4


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
def test_swiglu_is_silu_of_gate_times_up(isa, n_tokens):
    gate, up = activations(n_tokens, seed=1), activations(n_tokens, seed=2)
    out = run_graph(lambda g, a, b: g.swiglu(a, b), [gate, up])
    np.testing.assert_allclose(out, silu_reference(gate) * up, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
def test_geglu_is_gelu_of_gate_times_up(isa, n_tokens):
    gate, up = activations(n_tokens, seed=1), activations(n_tokens, seed=2)
    out = run_graph(lambda g, a, b: g.geglu(a, b), [gate, up])
    np.testing.assert_allclose(out, gelu_tanh_reference(gate) * up, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("cap", [5.0, 30.0])
def test_softcap_is_cap_times_tanh_of_x_over_cap(isa, cap):
    x = activations(33, scale=20.0)
    out = run_graph(lambda g, x: g.softcap(x, cap), [x])
    np.testing.assert_allclose(out, cap * np.tanh(x.astype(np.float64) / cap), rtol=1e-6, atol=2e-7 * cap)
    assert np.abs(out).max() <= cap


@pytest.mark.parametrize("cap", [0.0, -1.0, float("nan")])
def test_softcap_must_be_positive(cap):
    g = _core.Graph(1)
    with pytest.raises(ValueError, match="softcap"):
        g.softcap(g.input(8), cap)


# -- norms -----------------------------------------------------------------------------------

def rms_norm_reference(x, weight=None, eps=1e-6, group=None):
    x64 = x.astype(np.float64)
    rows = x64.reshape(x.shape[0], -1, group or x.shape[1])
    y = rows / np.sqrt((rows ** 2).mean(axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight
    return y.reshape(x.shape)


def layer_norm_reference(x, weight=None, bias=None, eps=1e-5):
    x64 = x.astype(np.float64)
    centered = x64 - x64.mean(axis=1, keepdims=True)
    y = centered / np.sqrt((centered ** 2).mean(axis=1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
@pytest.mark.parametrize("with_weight", [False, True])
def test_rms_norm(isa, n_tokens, with_weight):
    x = activations(n_tokens)
    w = activations(1, seed=5)[0] if with_weight else None
    out = run_graph(lambda g, x: g.rms_norm(x, vector(g, w) if with_weight else -1, 1e-6), [x])
    np.testing.assert_allclose(out, rms_norm_reference(x, w, 1e-6), rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("with_weight", [False, True])
def test_rms_norm_per_head_group(isa, with_weight):
    """QK-norm: each head of head_dim columns is normalized alone, with a weight of head_dim."""
    n_heads, head_dim = 3, 20
    x = activations(33, n_heads * head_dim)
    x[:, head_dim:2 * head_dim] *= 50  # heads of very different scales
    w = activations(1, head_dim, seed=6)[0] if with_weight else None
    out = run_graph(lambda g, x: g.rms_norm(x, vector(g, w) if with_weight else -1, 1e-6, head_dim), [x])
    np.testing.assert_allclose(out, rms_norm_reference(x, w, 1e-6, head_dim), rtol=2e-6, atol=1e-30)


def test_rms_norm_eps_dominates_tiny_rows(isa):
    x = activations(4, scale=1e-4, special=False)
    out = run_graph(lambda g, x: g.rms_norm(x, -1, 1e-5), [x])
    np.testing.assert_allclose(out, rms_norm_reference(x, None, 1e-5), rtol=2e-6, atol=1e-30)
    assert np.abs(out).max() < 0.1  # without eps the rows would have unit RMS


def test_rms_norm_of_a_zero_row_is_zero(isa):
    x = np.zeros((2, WIDTH), np.float32)
    np.testing.assert_array_equal(run_graph(lambda g, x: g.rms_norm(x), [x]), x)


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
def test_layer_norm(isa, n_tokens, affine):
    x = activations(n_tokens)
    w = activations(1, seed=5)[0] if affine != "none" else None
    b = activations(1, seed=6)[0] if affine == "weight+bias" else None

    def build(g, x):
        return g.layer_norm(x, vector(g, w) if w is not None else -1, vector(g, b) if b is not None else -1, 1e-5)

    np.testing.assert_allclose(run_graph(build, [x]), layer_norm_reference(x, w, b, 1e-5), rtol=2e-6, atol=2e-6)


def test_layer_norm_of_rows_with_a_large_mean(isa):
    # The mean is stored in float32: half an ulp of 100 (4e-6) shifts every output a little.
    x = activations(33, scale=1.0, special=False) + np.float32(100.0)
    out = run_graph(lambda g, x: g.layer_norm(x), [x])
    np.testing.assert_allclose(out, layer_norm_reference(x), rtol=1e-5, atol=1e-5)


def test_layer_norm_of_a_constant_row_is_the_bias(isa):
    x = np.full((3, WIDTH), 7.5, np.float32)
    b = activations(1, seed=6)[0]
    out = run_graph(lambda g, x: g.layer_norm(x, vector(g, np.ones(WIDTH)), vector(g, b)), [x])
    np.testing.assert_array_equal(out, np.tile(b, (3, 1)))


# -- RoPE ------------------------------------------------------------------------------------

def rope_reference(x, positions, head_dim, n_rot, neox, base, freq_scale=1.0, factors=None):
    """theta_i = pos * freq_scale * base^(-2i / n_rot) / factors_i; NeoX rotates (i, i + n_rot/2),
    the normal layout (2i, 2i + 1); columns past n_rot pass through."""
    half = n_rot // 2
    inv_freq = base ** (-2.0 * np.arange(half) / n_rot)
    if factors is not None:
        inv_freq = inv_freq / factors
    theta = np.asarray(positions, np.float64)[:, None, None] * freq_scale * inv_freq  # [tokens, 1, half]
    first = np.arange(half) if neox else 2 * np.arange(half)
    second = first + half if neox else first + 1
    heads = x.astype(np.float64).reshape(x.shape[0], -1, head_dim)
    out = heads.copy()
    x0, x1 = heads[..., first], heads[..., second]
    out[..., first] = x0 * np.cos(theta) - x1 * np.sin(theta)
    out[..., second] = x0 * np.sin(theta) + x1 * np.cos(theta)
    return out.reshape(x.shape)


def rope_tolerance(positions, x):
    return 4e-7 * max(1, int(np.max(positions))) * float(np.abs(x).max())


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("n_rot", [40, 24], ids=["full", "partial"])
@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
def test_rope(isa, neox, n_rot, n_tokens):
    head_dim, n_heads = 40, 3
    x = activations(n_tokens, n_heads * head_dim, scale=1.0, special=False)
    positions = 5 + 3 * np.arange(n_tokens)
    out = run_graph(lambda g, x: g.rope(x, head_dim, n_rot, neox, 10000.0), [x], positions)
    expected = rope_reference(x, positions, head_dim, n_rot, neox, 10000.0)
    np.testing.assert_allclose(out, expected, rtol=0, atol=rope_tolerance(positions, x))
    heads = out.reshape(n_tokens, n_heads, head_dim)
    np.testing.assert_array_equal(heads[..., n_rot:], x.reshape(n_tokens, n_heads, head_dim)[..., n_rot:])


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
def test_rope_frequency_base_and_linear_scaling(isa, neox):
    head_dim = 64
    x = activations(33, 2 * head_dim, scale=1.0, special=False)
    positions = np.arange(100, 133)
    out = run_graph(lambda g, x: g.rope(x, head_dim, head_dim, neox, 1e6, 0.25), [x], positions)
    expected = rope_reference(x, positions, head_dim, head_dim, neox, 1e6, 0.25)
    np.testing.assert_allclose(out, expected, rtol=0, atol=rope_tolerance(positions, x))


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
def test_rope_frequency_factors_divide_theta(isa, neox):
    head_dim, n_rot = 32, 32
    x = activations(33, head_dim, scale=1.0, special=False)
    factors = np.random.default_rng(7).uniform(1.0, 8.0, n_rot // 2).astype(np.float32)
    positions = np.arange(33)
    out = run_graph(lambda g, x: g.rope(x, head_dim, n_rot, neox, 500000.0, 1.0, vector(g, factors)), [x], positions)
    expected = rope_reference(x, positions, head_dim, n_rot, neox, 500000.0, 1.0, factors.astype(np.float64))
    np.testing.assert_allclose(out, expected, rtol=0, atol=rope_tolerance(positions, x))


def test_rope_at_position_zero_is_the_identity(isa):
    x = activations(1, 64)
    out = run_graph(lambda g, x: g.rope(x, 64, 64, False, 10000.0), [x], [0])
    np.testing.assert_array_equal(out, x)


def test_rope_uses_each_tokens_own_position(isa):
    """Positions are a run-time input, in any order (several sequences share a batch)."""
    x = np.tile(activations(1, 32, scale=1.0, special=False), (4, 1))
    positions = np.array([9, 0, 31, 9])
    out = run_graph(lambda g, x: g.rope(x, 32, 32, True, 10000.0), [x], positions)
    np.testing.assert_allclose(out, rope_reference(x, positions, 32, 32, True, 10000.0), rtol=0,
                               atol=rope_tolerance(positions, x))
    np.testing.assert_array_equal(out[0], out[3])


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
def test_rope_offset_rotates_the_last_dimensions_of_each_head(isa, neox):
    """DeepSeek's heads are [nope | rope]: only the last n_rot dimensions rotate."""
    head_dim, offset, n_rot, n_heads = 24, 16, 8, 3
    x = activations(5, n_heads * head_dim, scale=1.0, special=False)
    positions = np.arange(3, 8)
    out = run_graph(lambda g, x: g.rope(x, head_dim, n_rot, neox, 10000.0, offset=offset), [x], positions)
    heads, got = x.reshape(5, n_heads, head_dim), out.reshape(5, n_heads, head_dim)
    np.testing.assert_array_equal(got[..., :offset], heads[..., :offset])
    tails = np.ascontiguousarray(heads[..., offset:]).reshape(5, -1)
    expected = rope_reference(tails, positions, n_rot, n_rot, neox, 10000.0).reshape(5, n_heads, n_rot)
    np.testing.assert_allclose(got[..., offset:], expected, rtol=0, atol=rope_tolerance(positions, x))


@pytest.mark.parametrize("head_dim, n_rot", [(0, 0), (30, 30), (32, 0), (32, 34), (32, 15)])
def test_rope_rejects_bad_dimensions(head_dim, n_rot):
    g = _core.Graph(1)
    with pytest.raises(ValueError, match="rope"):
        g.rope(g.input(64), head_dim, n_rot, False, 10000.0)


def test_rope_rejects_an_offset_past_the_head():
    g = _core.Graph(1)
    with pytest.raises(ValueError, match="rope"):
        g.rope(g.input(64), 32, 16, False, 10000.0, offset=20)


# -- rows: embeddings by position, output selection, views -------------------------------------

@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0], ids=lambda t: t.name)
def test_get_rows_by_position_reads_the_position_embedding(isa, t):
    """GPT-2's learned position embeddings: row positions[r] of the table."""
    n_cols, n_positions = 64, 40
    table = np.random.default_rng(8).standard_normal((n_positions, n_cols)).astype(np.float32)
    raw = quantize(table, t)
    g = _core.Graph(2)
    g.set_output(g.get_rows(g.weight(int(t), n_cols, n_positions, raw.reshape(-1)), by_position=True))
    g.plan(8, 8, 64)
    positions = np.array([39, 0, 7, 7, 20], np.int32)
    tokens = np.zeros(5, np.int32)
    out = g.run(tokens, positions, np.zeros(5, np.int32), np.arange(5, dtype=np.int32))
    np.testing.assert_array_equal(out, dequantize(raw.reshape(-1), t, (n_cols, n_positions))[positions])


def test_select_outputs_gathers_the_requested_rows_in_order(isa):
    x = activations(33)
    rows = np.array([32, 0, 5, 5])
    out = run_graph(lambda g, x: g.select_outputs(x), [x], output_rows=rows)
    np.testing.assert_array_equal(out, x[rows])


def test_matmul_after_select_outputs_computes_only_those_rows(isa):
    n_in, n_out = 64, 37
    w = np.random.default_rng(9).standard_normal((n_out, n_in)).astype(np.float32)
    x = activations(33, n_in, scale=1.0, special=False)
    rows = np.array([32])
    out = run_graph(lambda g, x: g.matmul(g.weight(F32, n_in, n_out, w), g.select_outputs(x)), [x], output_rows=rows)
    np.testing.assert_allclose(out, x[rows].astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_view_selects_columns_without_a_copy_op(isa):
    x = activations(33, 3 * 20)
    out = run_graph(lambda g, x: g.view(x, 20, 20), [x])
    np.testing.assert_array_equal(out, x[:, 20:40])


def test_view_of_a_view_adds_the_offsets(isa):
    x = activations(33, 60)
    out = run_graph(lambda g, x: g.view(g.view(x, 10, 40), 15, 7), [x])
    np.testing.assert_array_equal(out, x[:, 25:32])


# Reshape and permute views: [tokens, heads * d] as [tokens * heads, d] and as [heads * tokens, d].
HEADS, HEAD_D = 4, 16


def test_reshape_lets_a_row_op_work_per_head(isa):
    """rms_norm over [tokens * heads, d] normalizes each head, with no copy in or out."""
    x = activations(33, HEADS * HEAD_D)
    w = activations(1, HEAD_D, seed=4)[0]
    out = run_graph(lambda g, x: g.reshape(g.rms_norm(g.reshape(x, HEAD_D), vector(g, w), 1e-6), HEADS * HEAD_D), [x])
    expected = rms_norm_reference(x.reshape(-1, HEAD_D), w, 1e-6).reshape(x.shape)
    np.testing.assert_allclose(out, expected, rtol=2e-6, atol=1e-30)


def test_permute_orders_the_rows_head_major_and_back(isa):
    x = activations(7, HEADS * HEAD_D)
    by_head = run_graph(lambda g, x: g.scale(g.permute(g.reshape(x, HEAD_D)), 1.0), [x])
    np.testing.assert_array_equal(by_head, x.reshape(7, HEADS, HEAD_D).transpose(1, 0, 2).reshape(-1, HEAD_D))
    round_trip = run_graph(lambda g, x: g.scale(g.permute(g.scale(g.permute(g.reshape(x, HEAD_D)), 1.0)), 1.0), [x])
    np.testing.assert_array_equal(round_trip, x.reshape(-1, HEAD_D))


def test_permuted_rows_are_read_and_written_in_head_major_order(isa):
    """A permuted view, made dense by an op, multiplied head by head, permuted back and made dense
    again: the round trip equals the same work done in numpy on [tokens, heads, d]."""
    n_out = 8
    x = activations(7, HEADS * HEAD_D)
    w = activations(n_out, HEAD_D, seed=5)

    def build(g, x):
        by_head = g.silu(g.permute(g.reshape(x, HEAD_D)))   # dense [heads * tokens, d]
        projected = g.matmul(g.weight(F32, HEAD_D, n_out, w), by_head)  # [heads * tokens, n_out]
        return g.reshape(g.scale(g.permute(projected), 1.0), HEADS * n_out)  # back to token rows

    out = run_graph(build, [x])
    x64 = x.astype(np.float64).reshape(7, HEADS, HEAD_D)
    expected = (silu_reference(x64) @ w.T.astype(np.float64)).reshape(7, HEADS * n_out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build, message", [
    (lambda g, x: g.reshape(x, 24), "divide"),
    (lambda g, x: g.reshape(g.view(x, 0, 32), 16), "dense"),
    (lambda g, x: g.reshape(g.permute(g.reshape(x, 16)), 64), "dense"),
    (lambda g, x: g.permute(x), "reshape"),
    (lambda g, x: g.permute(g.reshape(x, 16)), "evenly strided"),
    (lambda g, x: g.rope(g.reshape(x, 16), 16, 16, False, 10000.0), "one row per token"),
    (lambda g, x: g.matmul(g.weight(F32, 16, 2, np.ones(32, np.float32)), g.permute(g.reshape(x, 16))), "evenly strided"),
])
def test_views_that_the_strides_do_not_allow_are_refused(build, message):
    g = _core.Graph(1)
    x = g.input(64)
    with pytest.raises(ValueError, match=message):
        g.set_output(build(g, x))


def test_ops_read_strided_views(isa):
    """Ops read a view's rows with the stride of the tensor it belongs to (fused QKV layout)."""
    x = activations(33, 3 * 32)
    w = activations(1, 32, seed=4)[0]

    def build(g, x):
        a, b, c = g.view(x, 0, 32), g.view(x, 32, 32), g.view(x, 64, 32)
        return g.add(g.mul(a, b), g.rms_norm(c, vector(g, w)))

    expected = x[:, :32] * x[:, 32:64] + rms_norm_reference(x[:, 64:], w)
    np.testing.assert_allclose(run_graph(build, [x]), expected, rtol=2e-6, atol=1e-6)


def test_matmul_reads_a_strided_view(isa):
    n_in, n_out = 48, 19
    w = np.random.default_rng(10).standard_normal((n_out, n_in)).astype(np.float32)
    x = activations(33, 2 * n_in, scale=1.0, special=False)
    out = run_graph(lambda g, x: g.matmul(g.weight(F32, n_in, n_out, w), g.view(x, n_in, n_in)), [x])
    expected = x[:, n_in:].astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offset, n_cols", [(-1, 4), (0, 0), (60, 5), (0, 65)])
def test_view_out_of_range_is_rejected(offset, n_cols):
    g = _core.Graph(1)
    with pytest.raises(ValueError, match="view"):
        g.view(g.input(64), offset, n_cols)


def test_view_of_a_weight_is_rejected():
    g = _core.Graph(1)
    with pytest.raises(ValueError, match="view"):
        g.view(vector(g, np.zeros(8)), 0, 4)


# -- attention over the KV cache -----------------------------------------------------------------

class ReferenceAttention:
    """numpy model of the core's attention layer: a KV cache of n_seq sequences x n_ctx positions
    holding K and V rows as the cache types store them (F16 rounding, Q8_0 blocks, F32). A batch
    first writes its K/V rows at (seq, position), then every (token, head) attends to its own sequence's positions p - window + 1 .. p (all of 0 .. p without a window;
    not causal: all of 0 .. the last position of its sequence in the batch); query head h reads KV
    head h // (n_head / n_kv_head). ALiBi (alibi_max_bias > 0): head h's scaled score of position j
    from position i gets -slope_h |i - j|, the slopes of the ALiBi paper for max bias 8, as ggml
    generalises them to other biases."""

    def __init__(self, n_head, n_kv_head, head_dim, n_ctx, n_seq=1, scale=None, window=0, softcap=0.0,
                 causal=True, alibi_max_bias=0.0, type_k=GGMLType.F16, type_v=GGMLType.F16, **_):
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        self.window, self.softcap, self.causal = window, softcap, causal
        self.slopes = alibi_slopes(n_head, alibi_max_bias) if alibi_max_bias > 0 else np.zeros(n_head)
        self.type_k, self.type_v = type_k, type_v
        self.k = np.zeros((n_seq, n_ctx, n_kv_head, head_dim))
        self.v = np.zeros((n_seq, n_ctx, n_kv_head, head_dim))

    def _stored(self, rows, type):
        if type == GGMLType.F16:
            rows = rows.astype(np.float16)
        elif type == GGMLType.Q8_0:
            rows = dequantize(quantize(rows.astype(np.float32), type), type, rows.shape[::-1]).reshape(rows.shape)
        return rows.astype(np.float64).reshape(-1, self.n_kv_head, self.head_dim)

    def __call__(self, q, k, v, positions, seq_ids):
        self.k[seq_ids, positions] = self._stored(k, self.type_k)
        self.v[seq_ids, positions] = self._stored(v, self.type_v)
        group = self.n_head // self.n_kv_head
        out = np.zeros((len(q), self.n_head, self.head_dim))
        for t, (pos, seq) in enumerate(zip(positions, seq_ids)):
            first = max(0, pos - self.window + 1) if self.window > 0 else 0
            if not self.causal:
                pos = max(p for p, s in zip(positions, seq_ids) if s == seq)
            for h in range(self.n_head):
                keys, values = self.k[seq, first:pos + 1, h // group], self.v[seq, first:pos + 1, h // group]
                scores = keys @ q[t, h * self.head_dim:(h + 1) * self.head_dim].astype(np.float64) * self.scale
                if self.softcap > 0:
                    scores = self.softcap * np.tanh(scores / self.softcap)
                scores = scores - self.slopes[h] * np.abs(np.arange(first, pos + 1) - positions[t])
                p = np.exp(scores - scores.max())
                out[t, h] = (p / p.sum()) @ values
        return out.reshape(len(q), -1)

    def kv_copy(self, src, dst, n):
        self.k[dst, :n] = self.k[src, :n]
        self.v[dst, :n] = self.v[src, :n]


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """2^(-b (h + 1) / n) for the first n heads (n: n_head rounded down to a power of 2), then
    every other slope of 2 n heads: 2^(-b (2 (h - n) + 1) / (2 n))."""
    n = 2 ** int(math.floor(math.log2(n_head)))
    return np.array([2.0 ** (-max_bias * (h + 1) / n) if h < n else 2.0 ** (-max_bias * (2 * (h - n) + 1) / (2 * n))
                     for h in range(n_head)])


class CoreAttention:
    """A graph of one attention layer over inputs q, k, v, planned for max_tokens per batch."""

    def __init__(self, n_head, n_kv_head, head_dim, n_ctx, n_seq=1, scale=None, window=0, softcap=0.0,
                 max_tokens=64, n_threads=2, causal=True, alibi_max_bias=0.0, type_k=GGMLType.F16,
                 type_v=GGMLType.F16):
        self.g = _core.Graph(n_threads)
        q, k, v = (self.g.input(n * head_dim) for n in (n_head, n_kv_head, n_kv_head))
        scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        self.g.set_output(self.g.attention(q, k, v, n_head, n_kv_head, head_dim, scale, window, softcap, causal,
                                           alibi_max_bias))
        self.g.plan(max_tokens, max_tokens, n_ctx, n_seq, type_k=int(type_k), type_v=int(type_v))

    def __call__(self, q, k, v, positions, seq_ids):
        n = len(q)
        return self.g.run(np.zeros(n, np.int32), np.asarray(positions, np.int32), np.asarray(seq_ids, np.int32),
                          np.arange(n, dtype=np.int32), [q, k, v])


def qkv(n_tokens, n_head, n_kv_head, head_dim, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return tuple((rng.standard_normal((n_tokens, n * head_dim)) * scale).astype(np.float32)
                 for n in (n_head, n_kv_head, n_kv_head))


def both(n_head, n_kv_head, head_dim, n_ctx, **kwargs):
    return (CoreAttention(n_head, n_kv_head, head_dim, n_ctx, **kwargs),
            ReferenceAttention(n_head, n_kv_head, head_dim, n_ctx, **kwargs))


def both_run(core, ref, q, k, v, positions, seq_ids=None):
    positions = np.asarray(positions)
    seq_ids = np.zeros(len(q), int) if seq_ids is None else np.asarray(seq_ids)
    return core(q, k, v, positions, seq_ids), ref(q, k, v, positions, seq_ids)


def attention_tolerance(v):
    """Each output is a convex combination of V rows: its error scales with max|V|."""
    return dict(rtol=1e-5, atol=3e-6 * float(np.abs(v).max()))


def assert_attention_close(out, expected, v):
    np.testing.assert_allclose(out, expected, **attention_tolerance(v))


@pytest.mark.parametrize("n_tokens", TOKEN_COUNTS)
@pytest.mark.parametrize("n_head, n_kv_head", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("head_dim", [20, 64])
def test_causal_prefill_attention(isa, n_tokens, n_head, n_kv_head, head_dim):
    core, ref = both(n_head, n_kv_head, head_dim, 64)
    q, k, v = qkv(n_tokens, n_head, n_kv_head, head_dim, seed=head_dim)
    out, expected = both_run(core, ref, q, k, v, np.arange(n_tokens))
    assert_attention_close(out, expected, v)


def test_attention_of_the_first_token_is_its_own_value(isa):
    q, k, v = qkv(1, 2, 1, 16)
    out = CoreAttention(2, 1, 16, 8)(q, k, v, [0], [0])
    value = v[0].astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(out, np.concatenate([value, value])[None], rtol=1e-6)


def test_a_token_does_not_see_later_tokens(isa):
    core_a, core_b = CoreAttention(2, 2, 16, 64), CoreAttention(2, 2, 16, 64)
    q, k, v = qkv(33, 2, 2, 16)
    out_a = core_a(q, k, v, np.arange(33), np.zeros(33, int))
    k[-1], v[-1] = 100.0, -100.0
    out_b = core_b(q, k, v, np.arange(33), np.zeros(33, int))
    np.testing.assert_array_equal(out_a[:-1], out_b[:-1])
    assert not np.allclose(out_a[-1], out_b[-1])


def test_kv_cache_stores_float16(isa):
    """The reference that keeps K/V in float32 is further off than the tolerance: the F16 rounding
    is part of the expected result."""
    core, ref = both(2, 2, 32, 64)
    exact = ReferenceAttention(2, 2, 32, 64, type_k=GGMLType.F32, type_v=GGMLType.F32)
    q, k, v = qkv(33, 2, 2, 32, scale=3.0)
    out, expected = both_run(core, ref, q, k, v, np.arange(33))
    assert_attention_close(out, expected, v)
    assert not np.allclose(out, exact(q, k, v, np.arange(33), np.zeros(33, int)), **attention_tolerance(v))


@pytest.mark.parametrize("window", [1, 4, 7])
def test_sliding_window_sees_the_last_window_positions(isa, window):
    """Gemma 3's local layers: a token at position p sees positions p - window + 1 .. p."""
    core, ref = both(4, 2, 16, 64, window=window)
    q, k, v = qkv(33, 4, 2, 16, seed=window)
    out, expected = both_run(core, ref, q, k, v, np.arange(33))
    assert_attention_close(out, expected, v)
    full = ReferenceAttention(4, 2, 16, 64)(q, k, v, np.arange(33), np.zeros(33, int))
    np.testing.assert_allclose(out[:window], full[:window], **attention_tolerance(v))
    assert not np.allclose(out[window:], full[window:], **attention_tolerance(v))


def test_sliding_window_of_one_returns_the_tokens_own_value(isa):
    core = CoreAttention(2, 2, 8, 16, window=1)
    q, k, v = qkv(9, 2, 2, 8)
    out = core(q, k, v, np.arange(9), np.zeros(9, int))
    np.testing.assert_allclose(out, v.astype(np.float16).astype(np.float32), rtol=1e-6)


def test_non_causal_attention_sees_its_whole_sequence_and_no_other(isa):
    """Encoders: sequences of 5, 12 and 16 tokens in one batch (token order mixed), each token
    attending to every position of its own sequence."""
    lengths = (5, 12, 16)
    seq_ids = np.concatenate([np.full(n, s) for s, n in enumerate(lengths)])
    positions = np.concatenate([np.arange(n) for n in lengths])
    order = np.random.default_rng(1).permutation(len(seq_ids))
    core, ref = both(4, 2, 16, 32, n_seq=3, causal=False)
    q, k, v = qkv(len(order), 4, 2, 16, seed=3)
    out, expected = both_run(core, ref, q, k, v, positions[order], seq_ids[order])
    assert_attention_close(out, expected, v)
    causal = ReferenceAttention(4, 2, 16, 32, n_seq=3)(q, k, v, positions[order], seq_ids[order])
    assert not np.allclose(out, causal, **attention_tolerance(v))


@pytest.mark.parametrize("n_head, n_kv_head", [(4, 2), (6, 3), (5, 5)], ids=["four", "six", "five"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_alibi_penalises_distance_per_head(isa, n_head, n_kv_head, causal):
    """ALiBi (jina-bert-v2): two sequences in one batch, head counts of and off a power of 2."""
    lengths = (9, 24)
    seq_ids = np.concatenate([np.full(n, s) for s, n in enumerate(lengths)])
    positions = np.concatenate([np.arange(n) for n in lengths])
    core, ref = both(n_head, n_kv_head, 16, 32, n_seq=2, causal=causal, alibi_max_bias=8.0)
    q, k, v = qkv(len(seq_ids), n_head, n_kv_head, 16, seed=n_head)
    out, expected = both_run(core, ref, q, k, v, positions, seq_ids)
    assert_attention_close(out, expected, v)
    plain = ReferenceAttention(n_head, n_kv_head, 16, 32, n_seq=2, causal=causal)(q, k, v, positions, seq_ids)
    assert not np.allclose(out, plain, **attention_tolerance(v))


def test_alibi_slopes_are_the_papers_for_max_bias_8():
    """The ALiBi paper's slopes for 8 heads: 1/2, 1/4, ... 1/256."""
    np.testing.assert_allclose(alibi_slopes(8, 8.0), 0.5 ** np.arange(1, 9))


def test_attention_logit_softcap(isa):
    core, ref = both(4, 2, 16, 64, softcap=5.0)
    q, k, v = qkv(33, 4, 2, 16, scale=3.0)  # scores well beyond the cap
    out, expected = both_run(core, ref, q, k, v, np.arange(33))
    assert_attention_close(out, expected, v)
    uncapped = ReferenceAttention(4, 2, 16, 64)(q, k, v, np.arange(33), np.zeros(33, int))
    assert not np.allclose(out, uncapped, **attention_tolerance(v))


def test_attention_uses_the_given_scale(isa):
    core, ref = both(2, 1, 32, 64, scale=0.0625)
    q, k, v = qkv(33, 2, 1, 32, scale=2.0)
    out, expected = both_run(core, ref, q, k, v, np.arange(33))
    assert_attention_close(out, expected, v)


def test_several_sequences_in_one_batch(isa):
    """Tokens of three sequences interleaved in one batch each attend to their own sequence only,
    with the same result as running each sequence alone."""
    n_head, n_kv_head, head_dim = 4, 2, 16
    seq_ids = np.array([0, 1, 2] * 11)
    positions = np.repeat(np.arange(11), 3)
    core, ref = both(n_head, n_kv_head, head_dim, 32, n_seq=3)
    q, k, v = qkv(33, n_head, n_kv_head, head_dim, seed=3)
    out, expected = both_run(core, ref, q, k, v, positions, seq_ids)
    assert_attention_close(out, expected, v)
    for seq in range(3):
        alone = CoreAttention(n_head, n_kv_head, head_dim, 32)
        mine = seq_ids == seq
        np.testing.assert_array_equal(alone(q[mine], k[mine], v[mine], np.arange(11), np.zeros(11, int)), out[mine])


def test_decode_after_prefill_matches_one_long_prefill(isa):
    n_head, n_kv_head, head_dim, n_prompt, n_total = 4, 2, 24, 9, 13
    q, k, v = qkv(n_total, n_head, n_kv_head, head_dim, seed=4)
    core, ref = both(n_head, n_kv_head, head_dim, 32)
    out, expected = both_run(core, ref, q[:n_prompt], k[:n_prompt], v[:n_prompt], np.arange(n_prompt))
    steps = [out]
    assert_attention_close(out, expected, v)
    for p in range(n_prompt, n_total):
        out, expected = both_run(core, ref, q[p:p + 1], k[p:p + 1], v[p:p + 1], [p])
        assert_attention_close(out, expected, v)
        steps.append(out)
    one_pass = CoreAttention(n_head, n_kv_head, head_dim, 32)(q, k, v, np.arange(n_total), np.zeros(n_total, int))
    np.testing.assert_array_equal(np.concatenate(steps), one_pass)


def test_kv_copy_shares_a_prefix_between_sequences(isa):
    n_head, n_kv_head, head_dim, n_prefix = 2, 1, 16, 6
    core, ref = both(n_head, n_kv_head, head_dim, 16, n_seq=2)
    q, k, v = qkv(n_prefix, n_head, n_kv_head, head_dim, seed=5)
    both_run(core, ref, q, k, v, np.arange(n_prefix))
    core.g.kv_copy(0, 1, n_prefix)
    ref.kv_copy(0, 1, n_prefix)
    q, k, v = qkv(2, n_head, n_kv_head, head_dim, seed=6)  # the next token of each sequence differs
    out, expected = both_run(core, ref, q, k, v, [n_prefix, n_prefix], [0, 1])
    assert_attention_close(out, expected, v)
    assert not np.allclose(out[0], out[1])


def test_kv_copy_of_part_of_a_prefix_leaves_the_source_alone(isa):
    n_head, n_kv_head, head_dim = 2, 2, 8
    core, ref = both(n_head, n_kv_head, head_dim, 16, n_seq=2)
    q, k, v = qkv(8, n_head, n_kv_head, head_dim, seed=7)
    both_run(core, ref, q, k, v, np.arange(8))
    core.g.kv_copy(0, 1, 4)
    ref.kv_copy(0, 1, 4)
    q, k, v = qkv(4, n_head, n_kv_head, head_dim, seed=8)  # seq 1 diverges at position 4
    out, expected = both_run(core, ref, q, k, v, np.arange(4, 8), np.ones(4, int))
    assert_attention_close(out, expected, v)
    q, k, v = qkv(1, n_head, n_kv_head, head_dim, seed=9)  # seq 0 still holds its own positions 4..7
    out, expected = both_run(core, ref, q, k, v, [8], [0])
    assert_attention_close(out, expected, v)


def test_attention_reads_q_k_v_as_views_of_a_fused_projection(isa):
    n_head, n_kv_head, head_dim = 4, 2, 16
    q, k, v = qkv(33, n_head, n_kv_head, head_dim, seed=10)
    fused = np.concatenate([q, k, v], axis=1)
    scale = 1.0 / math.sqrt(head_dim)

    def build(g, x):
        qv = g.view(x, 0, n_head * head_dim)
        kv = g.view(x, n_head * head_dim, n_kv_head * head_dim)
        vv = g.view(x, (n_head + n_kv_head) * head_dim, n_kv_head * head_dim)
        return g.attention(qv, kv, vv, n_head, n_kv_head, head_dim, scale)

    separate = CoreAttention(n_head, n_kv_head, head_dim, 33)(q, k, v, np.arange(33), np.zeros(33, int))
    np.testing.assert_array_equal(run_graph(build, [fused]), separate)


@pytest.mark.parametrize("n_head, n_kv_head, head_dim, q_width, kv_width", [
    (4, 3, 16, 64, 48), (0, 1, 16, 64, 16), (4, 2, 16, 60, 32), (4, 2, 16, 64, 16), (4, 2, 0, 64, 32)])
def test_attention_rejects_inconsistent_head_counts(n_head, n_kv_head, head_dim, q_width, kv_width):
    g = _core.Graph(1)
    q, k, v = g.input(q_width), g.input(kv_width), g.input(kv_width)
    with pytest.raises(ValueError, match="attention"):
        g.attention(q, k, v, n_head, n_kv_head, head_dim, 0.25)


@pytest.mark.parametrize("max_bias", [-1.0, float("nan"), float("inf")])
def test_attention_rejects_a_bad_alibi_bias(max_bias):
    g = _core.Graph(1)
    q, k, v = g.input(32), g.input(32), g.input(32)
    with pytest.raises(ValueError, match="alibi_max_bias"):
        g.attention(q, k, v, 2, 2, 16, 0.25, alibi_max_bias=max_bias)


# -- long contexts: several blocks of cached positions, tiles of prompt rows, split decoding ------
# The core reads the cache in blocks of 64 positions, segments of 256, and takes a prompt's
# (token, head) rows in tiles of 32; a lone token's segments are shared out among the threads
# when it is the whole batch. These shapes cross every such boundary.

def prefill_then_decode(n_head, n_kv_head, head_dim, n_prompt, n_decode, n_threads=2, seed=0, input_scale=1.0,
                        **kwargs):
    """A prompt of n_prompt tokens in one batch, then n_decode tokens one at a time, on the core
    and on the reference; asserts each step close."""
    n_total = n_prompt + n_decode
    core = CoreAttention(n_head, n_kv_head, head_dim, n_total, max_tokens=n_prompt, n_threads=n_threads, **kwargs)
    ref = ReferenceAttention(n_head, n_kv_head, head_dim, n_total, **kwargs)
    q, k, v = qkv(n_total, n_head, n_kv_head, head_dim, seed=seed, scale=input_scale)
    out, expected = both_run(core, ref, q[:n_prompt], k[:n_prompt], v[:n_prompt], np.arange(n_prompt))
    assert_attention_close(out, expected, v)
    for p in range(n_prompt, n_total):
        out, expected = both_run(core, ref, q[p:p + 1], k[p:p + 1], v[p:p + 1], [p])
        assert_attention_close(out, expected, v)
    return core, ref


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("n_head, n_kv_head", [(8, 2), (6, 6), (7, 1)], ids=["gqa", "mha", "mqa"])
def test_long_prompt_and_decode_at_depth(isa, n_threads, n_head, n_kv_head):
    """200 prompt tokens (4 blocks, several tiles per KV head), then decode steps at depth 200+."""
    prefill_then_decode(n_head, n_kv_head, 64, 200, 3, n_threads=n_threads)


def test_a_tile_of_more_heads_than_lanes(isa):
    """40 query heads on one KV head: more than a tile's 32 rows and a lone token's 8 heads."""
    prefill_then_decode(40, 1, 32, 70, 2)


@pytest.mark.parametrize("head_dim", [20, 128])
def test_long_context_with_odd_and_large_heads(isa, head_dim):
    prefill_then_decode(4, 2, head_dim, 130, 2)


@pytest.mark.parametrize("window", [1, 50, 100])
def test_sliding_window_over_a_long_context(isa, window):
    """Gemma's local layers at depth: the window starts inside a block; decode splits what it sees."""
    prefill_then_decode(4, 2, 32, 260, 3, window=window)


def test_softcap_over_a_long_context(isa):
    prefill_then_decode(4, 2, 32, 150, 2, softcap=5.0, input_scale=3.0)


def test_non_causal_attention_over_a_long_sequence(isa):
    core, ref = both(4, 2, 32, 150, causal=False, max_tokens=150)
    q, k, v = qkv(150, 4, 2, 32, seed=11)
    out, expected = both_run(core, ref, q, k, v, np.arange(150))
    assert_attention_close(out, expected, v)


def test_one_sequences_prompt_beside_other_sequences_decode(isa):
    """A batch of a 70-token prompt of sequence 1 between single tokens of sequences 0 and 2, each
    at its own depth."""
    n_head, n_kv_head, head_dim = 4, 2, 32
    core, ref = both(n_head, n_kv_head, head_dim, 256, n_seq=3, max_tokens=150)
    q, k, v = qkv(140, n_head, n_kv_head, head_dim, seed=12)
    both_run(core, ref, q[:140], k[:140], v[:140], np.concatenate([np.arange(70)] * 2), np.repeat([0, 2], 70))
    q, k, v = qkv(72, n_head, n_kv_head, head_dim, seed=13)
    positions = np.concatenate([[70], np.arange(70), [70]])
    out, expected = both_run(core, ref, q, k, v, positions, np.concatenate([[0], np.ones(70, int), [2]]))
    assert_attention_close(out, expected, v)


# -- KV cache types --------------------------------------------------------------------------------

CACHE_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0]


@pytest.mark.parametrize("type_k", CACHE_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("type_v", CACHE_TYPES, ids=lambda t: t.name)
def test_attention_over_each_cache_type(isa, type_k, type_v):
    """The core attends over exactly the values the cache type stores: the reference rounds K and
    V rows as the type does (Q8_0: blocks of 32 scaled by max|x| / 127, the scale in F16)."""
    prefill_then_decode(4, 2, 64, 100, 2, type_k=type_k, type_v=type_v, input_scale=3.0)


def test_q8_0_cache_is_not_the_f16_cache(isa):
    """The Q8_0 rounding is part of the expected result: the F16 reference is further off."""
    core, ref = both(4, 2, 32, 64, type_k=GGMLType.Q8_0, type_v=GGMLType.Q8_0)
    f16 = ReferenceAttention(4, 2, 32, 64)
    q, k, v = qkv(40, 4, 2, 32, seed=14, scale=3.0)
    out, expected = both_run(core, ref, q, k, v, np.arange(40))
    assert_attention_close(out, expected, v)
    assert not np.allclose(out, f16(q, k, v, np.arange(40), np.zeros(40, int)), **attention_tolerance(v))


@pytest.mark.parametrize("type_k, type_v, n_threads", [
    (GGMLType.F16, GGMLType.F16, 1), (GGMLType.F16, GGMLType.F16, 2), (GGMLType.F16, GGMLType.F16, 3),
    (GGMLType.F32, GGMLType.F32, 2), (GGMLType.Q8_0, GGMLType.Q8_0, 2), (GGMLType.F16, GGMLType.Q8_0, 1)],
    ids=lambda x: x.name if isinstance(x, GGMLType) else f"t{x}")
def test_decode_at_depth_over_each_cache_type(isa, type_k, type_v, n_threads):
    """smollm2's heads (9 on 3 KV heads of 64 elements) decoding at a depth of 1100 positions
    (17 blocks, 5 segments): each step within the reference's tolerance, and the same bits as the
    token's row in one prompt of all the tokens (a token's result does not depend on the batch).
    One thread takes a lone token's heads in one tile; two share its segments with all KV heads
    per segment; three share (KV head, segment) pairs; the cache is read in place or from F32
    copies of a block, whichever the shape picks."""
    n_head, n_kv_head, head_dim, n_prompt, n_decode = 9, 3, 64, 1100, 3
    n_total = n_prompt + n_decode
    types = dict(type_k=type_k, type_v=type_v)
    q, k, v = qkv(n_total, n_head, n_kv_head, head_dim, seed=17, scale=2.0)
    core = CoreAttention(n_head, n_kv_head, head_dim, n_total, max_tokens=n_total, n_threads=n_threads, **types)
    ref = ReferenceAttention(n_head, n_kv_head, head_dim, n_total, **types)
    core(q[:n_prompt], k[:n_prompt], v[:n_prompt], np.arange(n_prompt), np.zeros(n_prompt, int))
    ref.k[0, :n_prompt], ref.v[0, :n_prompt] = ref._stored(k[:n_prompt], type_k), ref._stored(v[:n_prompt], type_v)
    steps = []
    for p in range(n_prompt, n_total):
        out, expected = both_run(core, ref, q[p:p + 1], k[p:p + 1], v[p:p + 1], [p])
        assert_attention_close(out, expected, v)
        steps.append(out)
    one_pass = CoreAttention(n_head, n_kv_head, head_dim, n_total, max_tokens=n_total, n_threads=n_threads, **types)
    np.testing.assert_array_equal(np.concatenate(steps),
                                  one_pass(q, k, v, np.arange(n_total), np.zeros(n_total, int))[n_prompt:])


def test_lone_tokens_of_several_sequences_at_depth(isa):
    """A batch of single tokens of three sequences at depths 300, 700 and 40 (a lone token of a
    sequence takes all its heads in one tile): each close to the reference, and each the same
    bits as that token decoded alone."""
    n_head, n_kv_head, head_dim = 8, 2, 64
    depths = [300, 700, 40]
    core = CoreAttention(n_head, n_kv_head, head_dim, 704, n_seq=3, max_tokens=704)
    ref = ReferenceAttention(n_head, n_kv_head, head_dim, 704, n_seq=3)
    alone = [CoreAttention(n_head, n_kv_head, head_dim, 704, max_tokens=704) for _ in depths]
    q, k, v = qkv(sum(depths) + 3, n_head, n_kv_head, head_dim, seed=18)
    start = 0
    for seq, depth in enumerate(depths):
        rows = slice(start, start + depth)
        core(q[rows], k[rows], v[rows], np.arange(depth), np.full(depth, seq))
        alone[seq](q[rows], k[rows], v[rows], np.arange(depth), np.zeros(depth, int))
        ref.k[seq, :depth], ref.v[seq, :depth] = ref._stored(k[rows], ref.type_k), ref._stored(v[rows], ref.type_v)
        start += depth
    last = slice(start, start + 3)
    out, expected = both_run(core, ref, q[last], k[last], v[last], depths, [0, 1, 2])
    assert_attention_close(out, expected, v)
    for seq, depth in enumerate(depths):
        row = slice(start + seq, start + seq + 1)
        np.testing.assert_array_equal(alone[seq](q[row], k[row], v[row], [depth], [0]), out[seq:seq + 1])


@pytest.mark.parametrize("type_k, type_v, bytes_per_element", [
    (GGMLType.F16, GGMLType.F16, 2 + 2), (GGMLType.F32, GGMLType.F32, 4 + 4),
    (GGMLType.Q8_0, GGMLType.Q8_0, 34 / 32 * 2), (GGMLType.Q8_0, GGMLType.F16, 34 / 32 + 2)])
def test_kv_size_follows_the_cache_types(type_k, type_v, bytes_per_element):
    n_kv_head, head_dim, n_ctx, n_seq = 2, 64, 96, 3
    core = CoreAttention(4, n_kv_head, head_dim, n_ctx, n_seq=n_seq, type_k=type_k, type_v=type_v)
    assert core.g.kv_size == n_kv_head * head_dim * n_ctx * n_seq * bytes_per_element


def test_q8_0_cache_state_saves_loads_and_copies(isa):
    n_head, n_kv_head, head_dim = 4, 2, 32
    q8 = dict(type_k=GGMLType.Q8_0, type_v=GGMLType.Q8_0, max_tokens=90)
    a, ref = both(n_head, n_kv_head, head_dim, 128, n_seq=2, **q8)
    q, k, v = qkv(90, n_head, n_kv_head, head_dim, seed=15)
    both_run(a, ref, q, k, v, np.arange(90))
    state = a.g.kv_save(0, 90)
    assert state.size == a.g.kv_size * 90 // (128 * 2)
    b = CoreAttention(n_head, n_kv_head, head_dim, 128, n_seq=2, **q8)
    b.g.kv_load(1, 90, state)
    a.g.kv_copy(0, 1, 90)
    ref.kv_copy(0, 1, 90)
    q, k, v = qkv(1, n_head, n_kv_head, head_dim, seed=16)
    out, expected = both_run(a, ref, q, k, v, [90], [1])
    assert_attention_close(out, expected, v)
    np.testing.assert_array_equal(b(q, k, v, np.array([90]), np.array([1])), out)
    with pytest.raises(ValueError, match="wrong size"):
        CoreAttention(n_head, n_kv_head, head_dim, 128, n_seq=2).g.kv_load(0, 90, state)  # an F16 cache


def test_q8_0_cache_needs_heads_of_whole_blocks():
    with pytest.raises(ValueError, match="q8_0 KV cache needs a head size that is a multiple of 32, not 20"):
        CoreAttention(2, 1, 20, 16, type_v=GGMLType.Q8_0)


@pytest.mark.parametrize("type", [GGMLType.Q4_0, GGMLType.Q8_1, GGMLType.Q4_K, GGMLType.BF16], ids=lambda t: t.name)
def test_other_cache_types_are_refused_by_name(type):
    with pytest.raises(ValueError, match=f"KV cache type {type.name.lower()} is not supported; use f32, f16 or q8_0"):
        CoreAttention(2, 1, 32, 16, type_k=type)


def test_unknown_cache_type_ids_are_refused():
    with pytest.raises(ValueError, match="KV cache type 77 is not a tensor type"):
        CoreAttention(2, 1, 32, 16, type_v=77)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("window", [0, 50])
def test_decoding_at_depth_equals_the_prompt_bit_for_bit(isa, n_threads, window):
    """A token's output is the same whether it came in a prompt's tile or alone, its positions
    (several segments of 256) shared out among the threads: what prompt-lookup decoding and
    incremental decoding rely on."""
    n_head, n_kv_head, head_dim, n_prompt, n_total = 4, 2, 48, 600, 604
    q, k, v = qkv(n_total, n_head, n_kv_head, head_dim, seed=17)
    kwargs = dict(max_tokens=n_total, n_threads=n_threads, window=window)
    stepwise = CoreAttention(n_head, n_kv_head, head_dim, n_total, **kwargs)
    steps = [stepwise(q[:n_prompt], k[:n_prompt], v[:n_prompt], np.arange(n_prompt), np.zeros(n_prompt, int))]
    for p in range(n_prompt, n_total):
        steps.append(stepwise(q[p:p + 1], k[p:p + 1], v[p:p + 1], np.array([p]), np.zeros(1, int)))
    one_pass = CoreAttention(n_head, n_kv_head, head_dim, n_total, **kwargs)
    np.testing.assert_array_equal(np.concatenate(steps), one_pass(q, k, v, np.arange(n_total), np.zeros(n_total, int)))


def test_alibi_over_a_long_context(isa):
    """jina-bert-v2's biases past several blocks and segments, decoded and split as well."""
    prefill_then_decode(8, 8, 32, 300, 2, alibi_max_bias=8.0, causal=False)
