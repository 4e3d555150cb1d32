"""The router's ops (csrc/ops/routing.cpp, sigmoid in elementwise.cpp) against numpy, on every ISA.

Softmax and sigmoid: rtol 1e-6 (the core's exp is a polynomial, relative error < 2e-7); top_k
and take: exact (ids as F32 whole numbers, largest first, ties to the lower index); sum_normalize
and weighted_sum: rtol 1e-6 (float32 products and sums, maybe fused).
"""

import numpy as np
import pytest
from csrc.test_ops import activations, run_graph

from ember import _core

N_EXPERTS = 16


def softmax_reference(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def top_k_reference(scores, k, n_groups=0, groups_used=0, group_score="top2"):
    """Column indices of the k largest, largest first (stable: ties to the lower index), among the
    columns of the groups_used best groups when there are groups (DeepSeek-V3's selection)."""
    scores = np.where(np.isnan(scores), -np.inf, scores.astype(np.float64))
    if n_groups > 1:
        grouped = scores.reshape(len(scores), n_groups, -1)
        best = np.sort(grouped, axis=2)[:, :, ::-1]
        group_scores = best[:, :, :2].sum(axis=2) if group_score == "top2" else best[:, :, 0]
        keep = np.argsort(-group_scores, axis=1, kind="stable")[:, :groups_used]
        mask = np.full(grouped.shape[:2], True)
        np.put_along_axis(mask, keep, False, axis=1)
        scores = np.where(mask[:, :, None], -np.inf, grouped).reshape(len(scores), -1)
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.float32)


@pytest.mark.parametrize("n_tokens", [1, 33])
def test_softmax_rows_sum_to_one(isa, n_tokens):
    x = activations(n_tokens)
    out = run_graph(lambda g, x: g.softmax(x), [x])
    np.testing.assert_allclose(out, softmax_reference(x), rtol=1e-6, atol=1e-12)


def test_softmax_of_large_values_does_not_overflow(isa):
    x = np.array([[1000.0, 999.0, -1000.0, 0.0]], np.float32)
    np.testing.assert_allclose(run_graph(lambda g, x: g.softmax(x), [x]), softmax_reference(x), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("n_tokens", [1, 33])
def test_sigmoid(isa, n_tokens):
    x = activations(n_tokens)
    expected = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(run_graph(lambda g, x: g.sigmoid(x), [x]), expected, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("n_tokens", [1, 33])
@pytest.mark.parametrize("k", [1, 2, 6])
def test_top_k_ids_largest_first(isa, n_tokens, k):
    x = activations(n_tokens, width=N_EXPERTS, special=False)
    assert np.array_equal(run_graph(lambda g, x: g.top_k(x, k), [x]), top_k_reference(x, k))


def test_top_k_ties_go_to_the_lower_index_and_nan_is_least(isa):
    x = np.array([[1, 3, 3, 0, np.nan, 3, 2, 2]], np.float32)
    assert run_graph(lambda g, x: g.top_k(x, 6), [x]).tolist() == [[1, 2, 5, 6, 7, 0]]
    assert run_graph(lambda g, x: g.top_k(x, 8), [x])[0, -1] == 4


@pytest.mark.parametrize("group_score", ["top2", "max"])
@pytest.mark.parametrize("n_groups, groups_used, k", [(4, 2, 4), (8, 3, 6), (4, 1, 2)])
def test_top_k_within_the_best_groups(isa, group_score, n_groups, groups_used, k):
    x = activations(33, width=N_EXPERTS, special=False)
    out = run_graph(lambda g, x: g.top_k(x, k, n_groups, groups_used, 0 if group_score == "top2" else 1), [x])
    expected = top_k_reference(x, k, n_groups, groups_used, group_score)
    assert np.array_equal(out, expected)
    assert not np.array_equal(expected, top_k_reference(x, k))  # the groups change the choice


@pytest.mark.parametrize("args, message", [
    ((0,), "k must be"), ((17,), "k must be"), ((2, 3, 1), "groups do not divide"),
    ((2, 4, 0), "groups used"), ((2, 4, 5), "groups used"), ((9, 4, 2), "more than the groups"),
    ((2, 4, 2, 2), "group_score"),
])
def test_top_k_rejects_bad_arguments(args, message):
    g = _core.Graph(1)
    with pytest.raises(ValueError, match=message):
        g.top_k(g.input(N_EXPERTS), *args)


def test_take_reads_each_rows_columns_by_id(isa):
    x = activations(5, width=N_EXPERTS)
    ids = np.array([[3, 0], [15, 15], [1, 2], [7, 8], [0, 9]], np.float32)
    out = run_graph(lambda g, x, i: g.take(x, i), [x, ids])
    assert np.array_equal(out, np.take_along_axis(x, ids.astype(int), axis=1))


def test_take_of_an_id_outside_the_row_is_zero(isa):
    x = activations(1, width=N_EXPERTS)
    ids = np.array([[-1, 16, 2.5, np.nan]], np.float32)
    assert np.array_equal(run_graph(lambda g, x, i: g.take(x, i), [x, ids]), np.zeros((1, 4), np.float32))


def test_sum_normalize_divides_by_the_row_sum(isa):
    w = np.abs(activations(33, width=6))
    out = run_graph(lambda g, w: g.sum_normalize(w), [w])
    np.testing.assert_allclose(out, w / w.astype(np.float64).sum(axis=1, keepdims=True), rtol=1e-6)


def test_sum_normalize_of_a_tiny_sum_divides_by_min_sum(isa):
    w = np.array([[0.0, 0.0], [1e-9, 1e-9]], np.float32)
    out = run_graph(lambda g, w: g.sum_normalize(w, 6.103515625e-5), [w])
    np.testing.assert_allclose(out, w / 6.103515625e-5, rtol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 8])
def test_weighted_sum_mixes_each_tokens_rows(isa, k):
    n_tokens, width = 9, 67
    x = activations(n_tokens, width=k * width)
    w = activations(n_tokens, width=k, seed=3)
    out = run_graph(lambda g, x, w: g.weighted_sum(g.reshape(x, width) if k > 1 else x, w), [x, w])
    expected = np.einsum("tkc,tk->tc", x.reshape(n_tokens, k, width).astype(np.float64), w)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-5)


def test_weighted_sum_needs_a_row_per_weight():
    g = _core.Graph(1)
    with pytest.raises(ValueError, match="one row per weight"):
        g.weighted_sum(g.reshape(g.input(24), 8), g.input(2))
