"""The expert matmul (ggml's mul_mat_id) against numpy, for every weight type and ISA.

matmul_id(W, x, ids, n_experts): W stacks n_experts matrices of N rows (GGUF's 3-D
ffn_*_exps); for each token t and each of its k expert ids, row t k + j of the result is
W[ids[t, j]] x, where x is the token's row (gate and up projections) or the slot's own row
(the down projection). The reference is float64 numpy on the dequantized weights and the
activations rounded through the weight type's activation format, within 2e-5 of sum |x w|
(the matmul's bound, tests/csrc/test_kernels.py). Token counts 1 (decode), 7, 33 and 70, with 4
experts and 2 per token: experts get from 1 to 40 tokens, above and below the 16 at which
prompt processing repacks activations into panels.
"""

import numpy as np
import pytest
from csrc.test_kernels import VEC_DOT_TYPE, WEIGHT_TYPES, has_kernels, random_rows

from ember import _core
from ember.gguf.types import TYPES, GGMLType
from ember.quant.reference import dequantize

F32 = int(GGMLType.F32)
N_EXPERTS, K_USED = 4, 2


def random_ids(n_tokens, n_experts=N_EXPERTS, k=K_USED, seed=0):
    """k distinct expert ids per token, as F32 (what the top_k op gives)."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(n_experts)[:k] for _ in range(n_tokens)]).astype(np.float32)


def expert_graph(t, w_raw, n_in, n_out, per_slot=False, n_threads=2, float_activations=False, k=K_USED,
                 n_experts=N_EXPERTS, max_tokens=80):
    """A graph of inputs x (per token, or k rows per token) and ids -> matmul_id."""
    g = _core.Graph(n_threads, float_activations=float_activations)
    w = g.weight(int(t), n_in, n_experts * n_out, w_raw.reshape(-1))
    x = g.input(n_in * (k if per_slot else 1))
    if per_slot:
        x = g.reshape(x, n_in)
    ids = g.input(k)
    g.set_output(g.matmul_id(w, x, ids, n_experts))
    g.plan(max_tokens, max_tokens, max_tokens)
    return g


def run(g, x, ids):
    n = len(ids)
    rows = np.arange(n, dtype=np.int32)
    return np.array(g.run(np.zeros(n, np.int32), rows, np.zeros(n, np.int32), rows,
                          [np.ascontiguousarray(x.reshape(n, -1)), np.ascontiguousarray(ids)]))


def reference(t, w_raw, x, ids, n_in, n_out, activations_rounded=True):
    """float64 (expected, scale): row t k + j = W[ids[t, j]] x_row, and sum |x| |w| per entry."""
    k = ids.shape[1]
    w = dequantize(w_raw.reshape(-1), t, (n_in, N_EXPERTS * n_out)).astype(np.float64).reshape(N_EXPERTS, n_out, n_in)
    rows = x.reshape(len(ids), -1, n_in)
    vdt = VEC_DOT_TYPE[t]
    if activations_rounded:
        rows = np.stack([[_core.dequantize_row(int(vdt), _core.quantize_row(int(vdt), r), n_in) for r in tok]
                         for tok in rows])
    rows = rows.astype(np.float64)
    expected, scale = [], []
    for tok in range(len(ids)):
        for j in range(k):
            e = int(ids[tok, j])
            r = rows[tok, j if rows.shape[1] > 1 else 0]
            expected.append(w[e] @ r)
            scale.append(np.abs(w[e]) @ np.abs(r))
    return np.array(expected), np.array(scale)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
@pytest.mark.parametrize("n_tokens", [1, 7, 33, 70])
@pytest.mark.parametrize("per_slot", [False, True], ids=["row-per-token", "row-per-slot"])
def test_matmul_id_matches_numpy(isa, t, n_tokens, per_slot):
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n_in, n_out = 512, 37
    w_raw = random_rows(t, N_EXPERTS * n_out, n_in, seed=5)
    x = np.random.default_rng(6).standard_normal((n_tokens, K_USED if per_slot else 1, n_in)).astype(np.float32)
    ids = random_ids(n_tokens)
    out = run(expert_graph(t, w_raw, n_in, n_out, per_slot), x, ids)
    assert out.shape == (n_tokens * K_USED, n_out)
    expected, scale = reference(t, w_raw, x, ids, n_in, n_out)
    assert np.all(np.abs(out - expected) <= 2e-5 * scale + 1e-6)


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.F16], ids=lambda t: TYPES[t].name)
def test_float_activations_dequantize_the_experts(isa, t):
    """A graph with float activations: float64 W x within float32 accumulation, x not rounded."""
    n_in, n_out, n_tokens = 512, 37, 33
    w_raw = random_rows(t, N_EXPERTS * n_out, n_in, seed=5)
    x = np.random.default_rng(6).standard_normal((n_tokens, 1, n_in)).astype(np.float32)
    ids = random_ids(n_tokens)
    out = run(expert_graph(t, w_raw, n_in, n_out, float_activations=True), x, ids)
    expected, scale = reference(t, w_raw, x, ids, n_in, n_out, activations_rounded=False)
    assert np.all(np.abs(out - expected) <= 1e-6 * scale + 1e-7)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: TYPES[t].name)
def test_a_batch_gives_each_token_the_bits_it_gets_alone(isa, t):
    """37 tokens, 8 experts, 2 each: experts with one token and with more than a panel's 16; rows
    of 2560 weights (10 K-quant super-blocks). Alone, in the batch, and on 1 or 3 threads: equal bits."""
    if not has_kernels(t):
        pytest.skip(f"{TYPES[t].name} has no native kernels yet")
    n_in, n_out, n_experts = 2560, 19, 8
    w_raw = random_rows(t, n_experts * n_out, n_in, seed=8)
    x = np.random.default_rng(9).standard_normal((37, 1, n_in)).astype(np.float32)
    ids = random_ids(37, n_experts=n_experts, seed=3)
    ids[:20, 0] = 5  # one expert with more than a panel of tokens
    ids[:20, 1] = np.where(ids[:20, 1] == 5, 6, ids[:20, 1])
    g = expert_graph(t, w_raw, n_in, n_out, n_experts=n_experts, max_tokens=40)
    alone = np.concatenate([run(g, x[i:i + 1], ids[i:i + 1]) for i in range(len(x))])
    assert np.array_equal(run(g, x, ids), alone)
    for n_threads in (1, 3):
        g = expert_graph(t, w_raw, n_in, n_out, n_experts=n_experts, max_tokens=40, n_threads=n_threads)
        assert np.array_equal(run(g, x, ids), alone)


def test_experts_no_token_chose_are_not_read(isa):
    """An expert whose weights are NaN changes nothing while no token chooses it."""
    n_in, n_out = 64, 16
    w = np.random.default_rng(1).standard_normal((N_EXPERTS, n_out, n_in)).astype(np.float32)
    w[3] = np.nan
    x = np.random.default_rng(2).standard_normal((9, 1, n_in)).astype(np.float32)
    ids = random_ids(9, n_experts=3)
    out = run(expert_graph(GGMLType.F32, w.view(np.uint8), n_in, n_out), x, ids)
    assert np.isfinite(out).all()
    expected, _ = reference(GGMLType.F32, w.view(np.uint8), x, ids, n_in, n_out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_an_expert_chosen_twice_gets_the_token_twice(isa):
    n_in, n_out = 64, 16
    w_raw = random_rows(GGMLType.F32, N_EXPERTS * n_out, n_in, seed=4)
    x = np.random.default_rng(2).standard_normal((3, 1, n_in)).astype(np.float32)
    ids = np.array([[1, 1], [0, 1], [2, 2]], np.float32)
    out = run(expert_graph(GGMLType.F32, w_raw, n_in, n_out), x, ids)
    assert np.array_equal(out[0], out[1]) and np.array_equal(out[4], out[5])
    expected, _ = reference(GGMLType.F32, w_raw, x, ids, n_in, n_out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [-1.0, 4.0, 1.5, np.nan, 1e10])
def test_an_id_that_is_no_expert_gives_a_row_of_zeros(isa, bad):
    n_in, n_out = 64, 16
    w_raw = random_rows(GGMLType.Q8_0, N_EXPERTS * n_out, n_in, seed=4)
    x = np.random.default_rng(2).standard_normal((2, 1, n_in)).astype(np.float32)
    ids = np.array([[0, bad], [3, 2]], np.float32)
    out = run(expert_graph(GGMLType.Q8_0, w_raw, n_in, n_out), x, ids)
    assert np.array_equal(out[1], np.zeros(n_out, np.float32))
    good = ids.copy()
    good[0, 1] = 1
    assert np.array_equal(np.delete(out, 1, axis=0), np.delete(run(expert_graph(GGMLType.Q8_0, w_raw, n_in, n_out), x, good), 1, axis=0))


def test_shapes_that_do_not_fit_are_refused():
    g = _core.Graph(1)
    w = g.weight(F32, 32, 4 * 8, np.zeros(4 * 8 * 32, np.float32))
    x, ids = g.input(32), g.input(2)
    with pytest.raises(ValueError, match="experts do not divide"):
        g.matmul_id(w, x, ids, 3)
    with pytest.raises(ValueError, match="inner dimensions"):
        g.matmul_id(w, g.input(16), ids, 4)
    with pytest.raises(ValueError, match="first operand must be a weight"):
        g.matmul_id(x, x, ids, 4)
    with pytest.raises(ValueError, match="a row per token or per chosen expert"):
        g.matmul_id(w, g.reshape(g.input(96), 32), ids, 4)  # 3 rows per token, 2 ids
