"""The graph runtime: the op table (names), run-time token counts and positions, the arena plan (64-byte aligned, reuse
by liveness), the KV cache size, the thread pool (persistent workers, results independent of the
thread count), no heap allocation during a run, errors for bad inputs, and ISA selection
(EMBER_ISA, set_isa)."""

import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import _core
from ember.gguf.types import GGMLType
from ember.quant.reference import dequantize, quantize

F32 = int(GGMLType.F32)
ISAS = _core.available_isas()



def vector(g, values):
    return g.weight(F32, len(values), 1, np.ascontiguousarray(values, dtype=np.float32))


def batch(n_tokens, positions=None, seq_ids=None, tokens=None, output_rows=None):
    """The run() arguments (tokens, positions, seq_ids, output_rows) of one batch, as int32."""
    as_i32 = lambda values, default: np.asarray(default if values is None else values, dtype=np.int32)
    return (as_i32(tokens, np.zeros(n_tokens)), as_i32(positions, np.arange(n_tokens)),
            as_i32(seq_ids, np.zeros(n_tokens)), as_i32(output_rows, np.arange(n_tokens)))


def random_rows(n_rows, n_cols, seed=0):
    return np.random.default_rng(seed).standard_normal((n_rows, n_cols)).astype(np.float32)


class TinyModel:
    """Three transformer layers over quantized weights, built from every op: a LLaMA-style layer
    (RMSNorm, RoPE, GQA attention, SwiGLU), a GPT-2/Gemma-style one (LayerNorm, sliding-window
    attention with soft-capping, GeGLU, then a mixture of experts) and a DeepSeek-style one
    (multi-head latent attention, RoPE on the last dimensions of each head), then output selection, logits and their soft-cap."""

    N_EMBD, N_HEAD, N_KV_HEAD, HEAD_DIM, N_FF, N_VOCAB = 64, 4, 2, 16, 96, 50

    def __init__(self, n_threads, n_ctx=32, n_seq=3, max_tokens=16):
        self.g = g = _core.Graph(n_threads)
        self._seed = 0
        e, d = self.N_EMBD, self.HEAD_DIM
        h = g.get_rows(self._weight(GGMLType.Q8_0, e, self.N_VOCAB))
        h = g.add(h, g.get_rows(self._weight(GGMLType.F16, e, n_ctx), by_position=True))
        for layer in range(2):
            x = g.rms_norm(h, self._vector(e)) if layer == 0 else g.layer_norm(h, self._vector(e), self._vector(e))
            qkv = g.matmul(self._weight(GGMLType.Q4_0, e, (self.N_HEAD + 2 * self.N_KV_HEAD) * d), x)
            q = g.view(qkv, 0, self.N_HEAD * d)
            k = g.view(qkv, self.N_HEAD * d, self.N_KV_HEAD * d)
            v = g.view(qkv, (self.N_HEAD + self.N_KV_HEAD) * d, self.N_KV_HEAD * d)
            q = g.rope(g.rms_norm(q, self._vector(d), 1e-6, d), d, d, layer == 1, 10000.0)
            k = g.rope(k, d, d // 2, layer == 1, 10000.0, 0.5)
            window, softcap = (0, 0.0) if layer == 0 else (5, 20.0)
            a = g.attention(q, k, v, self.N_HEAD, self.N_KV_HEAD, d, 1 / math.sqrt(d), window, softcap)
            h = g.add(h, g.matmul(self._weight(GGMLType.Q8_0, self.N_HEAD * d, e), a))
            x = g.rms_norm(h, self._vector(e))
            gate, up = (g.matmul(self._weight(GGMLType.Q4_1, e, self.N_FF), x) for _ in range(2))
            f = g.swiglu(gate, up) if layer == 0 else g.mul(g.gelu(gate), g.scale(up, 0.5))
            f = g.geglu(f, f) if layer == 1 else g.silu(f)
            h = g.add(h, g.matmul(self._weight(GGMLType.F16, self.N_FF, e), f))
            if layer == 1:  # a mixture of 4 experts, 2 per token, in 2 groups of which 1 is used
                x = g.rms_norm(h, self._vector(e))
                scores = g.matmul(self._weight(GGMLType.F32, e, 4), x)
                ids = g.top_k(g.sigmoid(scores), 2, 2, 1)
                weights = g.sum_normalize(g.take(g.softmax(scores), ids))
                f = g.silu(g.matmul_id(self._weight(GGMLType.Q8_0, e, 4 * self.N_FF), x, ids, 4))
                h = g.add(h, g.weighted_sum(g.matmul_id(self._weight(GGMLType.Q4_0, self.N_FF, 4 * e), f, ids, 4), weights))
        h = g.add(h, self._latent_attention(g.rms_norm(h, self._vector(e))))
        logits = g.matmul(self._weight(GGMLType.Q8_0, e, self.N_VOCAB), g.select_outputs(g.rms_norm(h)))
        g.set_output(g.softcap(logits, 30.0))
        g.plan(max_tokens, max_tokens, n_ctx, n_seq)

    def _latent_attention(self, x):
        g, e, n_head, rank, nope, rope = self.g, self.N_EMBD, self.N_HEAD, 32, 16, 8
        q = g.rope(g.matmul(self._weight(GGMLType.Q8_0, e, n_head * (nope + rope)), x), nope + rope, rope, False,
                   10000.0, 0.5, offset=nope)
        kv = g.matmul(self._weight(GGMLType.F16, e, rank + rope), x)
        c = g.rms_norm(g.view(kv, 0, rank), self._vector(rank))
        k_pe = g.rope(g.view(kv, rank, rope), rope, rope, False, 10000.0, 0.5)
        k_b, v_b = self._weight(GGMLType.F16, nope, n_head * rank), self._weight(GGMLType.Q8_0, rank, n_head * nope)
        a = g.mla_attention(q, c, k_pe, k_b, v_b, n_head, rank, rope, nope, nope, 1 / math.sqrt(nope + rope))
        return g.matmul(self._weight(GGMLType.Q8_0, n_head * nope, e), a)

    def _weight(self, t, n_cols, n_rows):
        self._seed += 1
        w = random_rows(n_rows, n_cols, self._seed) / np.sqrt(n_cols)
        return self.g.weight(int(t), n_cols, n_rows, quantize(w, t).reshape(-1))

    def _vector(self, n):
        self._seed += 1
        return vector(self.g, 1.0 + 0.1 * random_rows(1, n, self._seed)[0])

    def run(self, tokens, positions, seq_ids, output_rows):
        return self.g.run(*batch(len(tokens), positions, seq_ids, tokens, output_rows))

    def session(self):
        """Prefill of two sequences, a shared prefix copied to a third slot, then decode steps
        of all three in one batch; returns every batch's logits."""
        tokens = np.random.default_rng(99).integers(0, self.N_VOCAB, 40)
        outputs = [self.run(tokens[:13], np.arange(13), [0] * 13, np.arange(13))]
        outputs.append(self.run(tokens[13:20], np.arange(7), [1] * 7, [6]))
        self.g.kv_copy(1, 2, 7)
        for step in range(3):
            outputs.append(self.run(tokens[20 + 3 * step:23 + 3 * step], [13 + step, 7 + step, 7 + step],
                                    [0, 1, 2], [0, 1, 2]))
        return outputs


# -- the op table (core/op.h) ------------------------------------------------------------------

def test_op_names_are_unique_and_each_is_the_graph_method_that_adds_the_op():
    names = _core.op_names()
    assert len(set(names)) == len(names)
    assert all(callable(getattr(_core.Graph, name, None)) for name in names)


def test_profile_names_the_ops_by_the_op_table():
    model = TinyModel(n_threads=1)  # every op but input
    g = _core.Graph(1)
    g.set_output(g.scale(g.input(8), 2.0))
    g.plan(2, 2, 4)
    for graph, inputs in ((model.g, []), (g, [np.ones((2, 8), np.float32)])):
        graph.set_profiling(True)
        graph.run(*batch(2), inputs)
    profiled = {op for graph in (model.g, g) for op, _, _ in graph.profile()}
    assert profiled == set(_core.op_names())


# -- batches: token count and positions are run-time inputs ------------------------------------

def test_one_plan_runs_any_batch_size_up_to_the_maximum(isa):
    n_in, n_out = 40, 23
    w = random_rows(n_out, n_in, seed=1)
    g = _core.Graph(2)
    x = g.input(n_in)
    g.set_output(g.silu(g.matmul(g.weight(F32, n_in, n_out, w), g.rms_norm(x))))
    g.plan(33, 33, 64)
    xs = random_rows(33, n_in, seed=2)
    normed = xs / np.sqrt((xs.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6)
    z = normed @ w.T.astype(np.float64)
    expected = z / (1 + np.exp(-z))
    for n_tokens in (1, 7, 33, 2):
        out = g.run(*batch(n_tokens), [xs[:n_tokens]])
        assert out.shape == (n_tokens, n_out)
        np.testing.assert_allclose(out, expected[:n_tokens], rtol=1e-5, atol=1e-5)


def test_output_row_count_follows_output_rows():
    model = TinyModel(n_threads=2)
    tokens = np.arange(9)
    all_rows = model.run(tokens, np.arange(9), np.zeros(9), np.arange(9))
    assert all_rows.shape == (9, TinyModel.N_VOCAB)
    assert np.all(np.isfinite(all_rows)) and all_rows.std() > 0
    last = model.run(tokens, np.arange(9), np.zeros(9), [8])
    np.testing.assert_array_equal(last, all_rows[8:])


# -- arena -------------------------------------------------------------------------------------

def test_arena_size_is_a_multiple_of_64_bytes():
    for width in (1, 3, 17, 67):
        g = _core.Graph(1)
        g.set_output(g.scale(g.input(width), 2.0))
        g.plan(5, 5, 8)
        assert g.arena_size % 64 == 0


def test_arena_reuses_the_memory_of_dead_tensors(isa):
    """A chain of 32 ops needs two live buffers at a time, not 32."""
    n_tokens, width, depth = 64, 256, 32
    g = _core.Graph(2)
    y = g.input(width)
    for _ in range(depth):
        y = g.scale(y, 1.5)
    g.set_output(y)
    g.plan(n_tokens, n_tokens, n_tokens)
    tensor_bytes = n_tokens * width * 4
    assert tensor_bytes <= g.arena_size <= 3 * tensor_bytes
    x = random_rows(n_tokens, width)
    expected = x.copy()
    for _ in range(depth):
        expected = expected * np.float32(1.5)
    np.testing.assert_array_equal(g.run(*batch(n_tokens), [x]), expected)


def test_arena_keeps_tensors_alive_until_their_last_reader(isa):
    """A residual stream read many ops later (and through views) is never overwritten."""
    n_tokens, width = 33, 48
    g = _core.Graph(2)
    x = g.input(width)
    h, expected_h = x, random_rows(n_tokens, width, seed=3)
    expected = expected_h
    for layer in range(6):
        t = g.scale(h, 0.5 + layer)
        u = g.mul(t, g.add(t, h))
        for _ in range(3):
            u = g.scale(u, 0.25)
        h = g.add(h, g.view(g.add(u, x), 0, width))
        e_t = expected * np.float32(0.5 + layer)
        e_u = e_t * (e_t + expected)
        for _ in range(3):
            e_u = e_u * np.float32(0.25)
        expected = expected + (e_u + expected_h)
    g.set_output(h)
    g.plan(n_tokens, n_tokens, n_tokens)
    np.testing.assert_array_equal(g.run(*batch(n_tokens), [expected_h]), expected)


def test_arena_size_grows_with_the_planned_batch():
    sizes = {}
    for max_tokens in (1, 128):
        g = _core.Graph(1)
        g.set_output(g.silu(g.scale(g.input(256), 2.0)))
        g.plan(max_tokens, 1, 8)
        sizes[max_tokens] = g.arena_size
    assert sizes[128] >= 2 * 128 * 256 * 4 > sizes[1]


def q8_0_matmul_reference(w_raw, n_in, n_out, x):
    """x @ W^T with W and x as the Q8_0 kernels see them (x quantized to Q8_0 per row), and the
    bound 2e-5 * |x| @ |W|^T on float32 accumulation error."""
    w = dequantize(w_raw, GGMLType.Q8_0, (n_in, n_out)).astype(np.float64)
    x_q = dequantize(quantize(x, GGMLType.Q8_0), GGMLType.Q8_0, (n_in, len(x))).astype(np.float64)
    return x_q @ w.T, 2e-5 * (np.abs(x_q) @ np.abs(w).T) + 1e-6


def test_matmul_over_more_rows_than_planned_tokens():
    """The matmul's scratch (activations in Q8_0) is sized for its own input: here output rows
    selected with repeats (max_outputs > max_tokens), and a weight matrix as the input."""
    n_in, n_out = 256, 8
    raw = quantize(random_rows(n_out, n_in, seed=4), GGMLType.Q8_0).reshape(-1)
    x = random_rows(1, n_in, seed=5)
    g = _core.Graph(2)
    g.set_output(g.matmul(g.weight(int(GGMLType.Q8_0), n_in, n_out, raw), g.select_outputs(g.input(n_in))))
    g.plan(1, 40, 4)
    out = g.run(*batch(1, output_rows=np.zeros(40)), [x])
    expected, tolerance = q8_0_matmul_reference(raw, n_in, n_out, np.tile(x, (40, 1)))
    assert out.shape == (40, n_out)
    assert np.all(np.abs(out - expected) <= tolerance)

    many = random_rows(2000, n_in, seed=6)
    g = _core.Graph(2)
    g.set_output(g.matmul(g.weight(int(GGMLType.Q8_0), n_in, n_out, raw), g.weight(F32, n_in, 2000, many)))
    g.plan(1, 1, 4)
    out = g.run(*batch(1))
    expected, tolerance = q8_0_matmul_reference(raw, n_in, n_out, many)
    assert out.shape == (2000, n_out)
    assert np.all(np.abs(out - expected) <= tolerance)


def test_matmuls_of_one_input_give_the_bits_each_gives_alone(isa):
    """Matmuls of one input share its conversion to their vec_dot_type (Q, K and V; gate and up).
    Here Q4_K, Q6_K and a later Q4_K over Q8_K with a Q8_0 matmul and a node between them, and
    two matmuls of a second input (a norm of the first plus it); every node runs whichever one
    is the output. Each equals the same matmul alone in its own graph, at a batch of one token
    (decode), one below the panel size and one of several panels."""
    n_in, planned = 256, 40
    specs = [(GGMLType.Q4_K, 24, "x"), (GGMLType.Q6_K, 8, "x"), (GGMLType.Q8_0, 16, "x"),
             (GGMLType.Q5_K, 16, "y"), (GGMLType.Q4_K, 32, "x"), (GGMLType.Q6_K, 8, "y")]
    raws = [_core.quantize_row(int(t), random_rows(n, n_in, seed=20 + i).reshape(-1) / 16)
            for i, (t, n, _) in enumerate(specs)]
    x = random_rows(planned, n_in, seed=30)
    norm = np.linspace(0.5, 1.5, n_in)

    def second_input(g, h):
        return g.add(g.rms_norm(h, vector(g, norm)), h)

    def graph(output):
        g = _core.Graph(2)
        h = g.input(n_in)
        inputs = {"x": h, "y": second_input(g, h)}
        outs = []
        for (t, n, name), raw in zip(specs, raws):
            outs.append(g.matmul(g.weight(int(t), n_in, n, raw), inputs[name]))
            if len(outs) == 1:
                outs[0] = g.scale(outs[0], 1.0)  # a node between two projections of x
        g.set_output(outs[output])
        g.plan(planned, planned, planned)
        return g

    def alone(i):
        t, n, name = specs[i]
        g = _core.Graph(2)
        h = g.input(n_in)
        g.set_output(g.matmul(g.weight(int(t), n_in, n, raws[i]), second_input(g, h) if name == "y" else h))
        g.plan(planned, planned, planned)
        return g

    for i in range(len(specs)):
        shared, single = graph(i), alone(i)
        for n_tokens in (1, 15, planned):
            got = shared.run(*batch(n_tokens), [x[:n_tokens]])
            assert got.shape == (n_tokens, specs[i][1]) and got.std() > 0
            np.testing.assert_array_equal(got, single.run(*batch(n_tokens), [x[:n_tokens]]))


# -- KV cache ----------------------------------------------------------------------------------

def test_kv_size_is_f16_k_and_v_per_layer_sequence_and_position():
    n_ctx, n_seq, n_kv_head, head_dim, n_layers = 24, 3, 2, 8, 2
    g = _core.Graph(1)
    q, k = g.input(4 * head_dim), g.input(n_kv_head * head_dim)
    for _ in range(n_layers):
        q = g.attention(q, k, k, 4, n_kv_head, head_dim, 0.3)
    g.set_output(q)
    g.plan(4, 4, n_ctx, n_seq)
    assert g.kv_size == n_layers * 2 * n_seq * n_ctx * n_kv_head * head_dim * 2


# -- threads -----------------------------------------------------------------------------------

def test_results_are_bit_identical_for_1_2_and_3_threads(isa):
    sessions = {n: TinyModel(n_threads=n).session() for n in (1, 2, 3)}
    for one, two, three in zip(sessions[1], sessions[2], sessions[3]):
        assert np.all(np.isfinite(one)) and one.std() > 0
        np.testing.assert_array_equal(two, one)
        np.testing.assert_array_equal(three, one)


def test_graph_reports_its_thread_count():
    assert _core.Graph(3).n_threads == 3
    assert _core.Graph(1).n_threads == 1


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_workers_are_started_once_per_graph_not_per_run():
    def n_threads():
        return len(os.listdir("/proc/self/task"))

    before = n_threads()
    model = TinyModel(n_threads=3)
    assert n_threads() == before + 2
    model.session()
    assert n_threads() == before + 2
    del model
    assert n_threads() == before


def test_two_graphs_run_at_once_from_two_python_threads():
    """run() releases the GIL; graphs share no state, so concurrent runs of different graphs
    give the results of sequential ones."""
    models = [TinyModel(n_threads=2), TinyModel(n_threads=2)]
    expected = TinyModel(n_threads=1).session()
    results = {}

    def work(i):
        results[i] = [models[i].session() for _ in range(3)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [0, 1]
    for sessions in results.values():
        for session in sessions:
            for got, want in zip(session, expected):
                np.testing.assert_array_equal(got, want)


# -- allocation --------------------------------------------------------------------------------

def test_a_run_allocates_nothing_on_the_heap():
    model = TinyModel(n_threads=2)
    before = _core.allocations_during_run()
    model.session()
    model.session()
    assert _core.allocations_during_run() == before


# -- bad inputs --------------------------------------------------------------------------------

class Checked:
    """A small graph to feed bad batches: token embedding of 10 rows, one F32 input of 16
    columns, attention over a cache of n_ctx=8 positions x n_seq=2 sequences, batches of <= 4."""

    def __init__(self):
        self.g = g = _core.Graph(2)
        table = random_rows(10, 16, seed=7)
        h = g.add(g.get_rows(g.weight(F32, 16, 10, table)), g.input(16))
        g.set_output(g.attention(h, h, h, 2, 2, 8, 0.35))
        g.plan(4, 4, 8, 2)

    def run(self, n_tokens=2, inputs=None, **fields):
        inputs = [np.ones((n_tokens, 16), np.float32)] if inputs is None else inputs
        return self.g.run(*batch(n_tokens, **fields), inputs)


@pytest.fixture
def checked():
    return Checked()


@pytest.mark.parametrize("fields, error, message", [
    (dict(tokens=[3, 10]), IndexError, "token id 10 out of range"),
    (dict(tokens=[-1, 0]), IndexError, "token id -1 out of range"),
    (dict(positions=[7, 8]), IndexError, "position"),
    (dict(positions=[-1, 0]), IndexError, "position"),
    (dict(seq_ids=[0, 2]), IndexError, "sequence id"),
    (dict(seq_ids=[-1, 0]), IndexError, "sequence id"),
    (dict(output_rows=[2]), IndexError, "output row"),
    (dict(output_rows=[0, 1, 0, 1, 0]), IndexError, "output count"),
    (dict(output_rows=[]), IndexError, "output count"),
    (dict(positions=[0, 1, 2]), ValueError, "same length"),
    (dict(seq_ids=[0]), ValueError, "same length"),
], ids=["token-too-large", "token-negative", "position-past-n_ctx", "position-negative", "seq-too-large",
        "seq-negative", "output-row-past-batch", "too-many-outputs", "no-outputs", "positions-length",
        "seq_ids-length"])
def test_bad_batches_raise(checked, fields, error, message):
    with pytest.raises(error, match=message):
        checked.run(**fields)


def test_batch_larger_than_planned_raises(checked):
    with pytest.raises(IndexError, match="batch size"):
        checked.run(5)


def test_empty_batch_raises(checked):
    with pytest.raises(IndexError, match="batch size"):
        checked.run(0)


@pytest.mark.parametrize("inputs, message", [
    ([np.ones((2, 15), np.float32)], "input 0 has the wrong size"),
    ([np.ones((3, 16), np.float32)], "input 0 has the wrong size"),
    ([], "wrong number of inputs"),
    ([np.ones((2, 16), np.float32)] * 2, "no such input"),
])
def test_wrong_inputs_raise(checked, inputs, message):
    with pytest.raises(ValueError, match=message):
        checked.run(2, inputs)


def test_a_rejected_batch_leaves_the_graph_usable(checked):
    reference = Checked().run(3, tokens=[1, 2, 3])
    for bad in (dict(tokens=[1, 2, 99]), dict(positions=[0, 1, 8]), dict(seq_ids=[0, 0, 5])):
        with pytest.raises(IndexError):
            checked.run(3, **bad)
    np.testing.assert_array_equal(checked.run(3, tokens=[1, 2, 3]), reference)


def test_run_before_plan_raises():
    g = _core.Graph(1)
    g.set_output(g.scale(g.input(4), 2.0))
    with pytest.raises(RuntimeError, match="not planned"):
        g.run(*batch(1), [np.ones((1, 4), np.float32)])


def test_plan_needs_an_output_and_positive_sizes():
    g = _core.Graph(1)
    y = g.scale(g.input(4), 2.0)
    with pytest.raises(ValueError, match="no output"):
        g.plan(4, 4, 4)
    g.set_output(y)
    for sizes in ((0, 4, 4), (4, 0, 4), (4, 4, 0), (4, 4, 4, 0)):
        with pytest.raises(ValueError, match="plan sizes"):
            g.plan(*sizes)


@pytest.mark.parametrize("src, dst, n", [(0, 2, 1), (2, 0, 1), (-1, 0, 1), (0, 1, 9), (0, 1, -1)])
def test_kv_copy_out_of_range_raises(checked, src, dst, n):
    with pytest.raises(IndexError, match="kv_copy"):
        checked.g.kv_copy(src, dst, n)


def test_bad_tensor_ids_raise():
    g = _core.Graph(1)
    x = g.input(8)
    with pytest.raises(IndexError):
        g.add(x, 99)
    with pytest.raises(IndexError):
        g.silu(-1)
    with pytest.raises(IndexError):
        g.set_output(42)


def test_weights_are_checked_against_their_type_and_shape():
    g = _core.Graph(1)
    with pytest.raises(ValueError, match="unknown tensor type"):
        g.weight(4, 32, 1, np.zeros(64, np.uint8))
    with pytest.raises(ValueError, match="smaller than its shape"):
        g.weight(int(GGMLType.Q8_0), 64, 2, np.zeros(4 * 34 - 1, np.uint8))
    with pytest.raises(ValueError, match="block size"):
        g.weight(int(GGMLType.Q4_0), 48, 1, np.zeros(64, np.uint8))
    with pytest.raises(ValueError, match="block size"):
        g.weight(F32, 0, 1, np.zeros(4, np.float32))


def test_shape_mismatches_are_rejected_when_building():
    g = _core.Graph(1)
    x, y = g.input(32), g.input(16)
    w = g.weight(F32, 16, 4, np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="weight"):
        g.matmul(x, x)
    with pytest.raises(ValueError, match="inner dimensions"):
        g.matmul(w, x)
    with pytest.raises(ValueError, match="column counts"):
        g.add(x, y)
    with pytest.raises(ValueError, match="row counts"):
        g.mul(y, w)
    with pytest.raises(ValueError, match="group"):
        g.rms_norm(x, -1, 1e-6, 12)
    with pytest.raises(ValueError, match="32 elements"):
        g.layer_norm(x, vector(g, np.ones(16)))
    with pytest.raises(ValueError, match="get_rows"):
        g.get_rows(x)


def test_quantized_weights_are_not_element_wise_operands():
    g = _core.Graph(1)
    q8 = g.weight(int(GGMLType.Q8_0), 32, 2, np.zeros(68, np.uint8))
    bias = vector(g, np.zeros(32))
    f32 = g.weight(F32, 32, 4, np.zeros(128, np.float32))
    for build in (lambda: g.add(q8, bias), lambda: g.silu(q8), lambda: g.rms_norm(q8),
                  lambda: g.layer_norm(q8), lambda: g.matmul(f32, q8)):
        with pytest.raises(ValueError, match="F32"):
            build()


def test_ops_on_the_batch_rows_reject_other_rows():
    """Attention and RoPE index positions and sequences by row: their inputs must be the
    batch's token rows, not selected output rows or a weight."""
    g = _core.Graph(1)
    x = g.input(16)
    selected = g.select_outputs(x)
    table = g.weight(F32, 16, 3, np.zeros(48, np.float32))
    for build in (lambda: g.attention(selected, x, x, 2, 2, 8, 0.3),
                  lambda: g.attention(x, table, x, 2, 2, 8, 0.3),
                  lambda: g.attention(x, x, selected, 2, 2, 8, 0.3),
                  lambda: g.rope(selected, 8, 8, False, 10000.0),
                  lambda: g.select_outputs(table)):
        with pytest.raises(ValueError, match="token rows"):
            build()


# -- ISA selection -----------------------------------------------------------------------------

def python_with(env_isa, code, emulate_amx=True):
    # The child imports ember from where this process did (the source tree or site-packages).
    ember_root = str(Path(ember.__file__).resolve().parents[1])
    env = dict(os.environ, EMBER_ISA=env_isa, PYTHONPATH=ember_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if not emulate_amx:
        env.pop("EMBER_EMULATE_AMX", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("forced", ISAS)
def test_ember_isa_forces_the_kernel_table(forced):
    result = python_with(forced, "from ember import _core; print(_core.isa(), _core.Graph(1).isa)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [forced, forced]


def test_unknown_ember_isa_is_a_clear_error():
    result = python_with("sse9", "from ember import _core; _core.Graph(1)")
    assert result.returncode == 1  # a Python exception, not a crash
    assert "ValueError: EMBER_ISA: unknown ISA 'sse9' (expected scalar, avx2, avxvnni, avx512 or amx)" in result.stderr


@pytest.mark.skipif("avx512" in ISAS, reason="this CPU runs AVX-512")
def test_ember_isa_this_cpu_lacks_is_a_clear_error():
    result = python_with("avx512", "from ember import _core; _core.isa()")
    assert result.returncode == 1
    assert "ValueError: EMBER_ISA: this CPU (or OS) does not support ISA 'avx512'" in result.stderr


def test_the_avxvnni_table_is_offered_exactly_where_the_cpu_has_avx_vnni():
    """avxvnni (avx2 with VEX vpdpbusd) runs on the CPUs whose CPUID says AVX-VNNI, and only there:
    elsewhere the table's first vpdpbusd would be an illegal instruction."""
    flags = _core.cpu_flags()
    assert _core.built_isas()[:2] == ["scalar", "avx2"] and _core.built_isas()[-2:] == ["avx512", "amx"]
    assert ("avxvnni" in ISAS) == ("avxvnni" in _core.built_isas() and flags["avx2"] and flags["avx_vnni"])
    if "avxvnni" in _core.built_isas() and "avxvnni" not in ISAS:
        result = python_with("avxvnni", "from ember import _core; _core.isa()")
        assert result.returncode == 1
        assert "ValueError: EMBER_ISA: this CPU (or OS) does not support ISA 'avxvnni'" in result.stderr


AMX_NATIVE = _core.cpu_flags()["amx_granted"]


@pytest.mark.skipif(AMX_NATIVE, reason="this CPU and OS give the process AMX tiles")
def test_ember_isa_amx_without_amx_is_a_clear_error():
    result = python_with("amx", "from ember import _core; _core.isa()", emulate_amx=False)
    assert result.returncode == 1
    assert "ValueError: EMBER_ISA: this CPU (or OS) does not support ISA 'amx'" in result.stderr


@pytest.mark.skipif("amx" not in ISAS or AMX_NATIVE, reason="the AMX emulator is not in use")
def test_emulated_amx_is_never_the_default():
    result = python_with("", "from ember import _core; print(_core.isa(), 'amx' in _core.available_isas())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["avx512", "True"]


@pytest.mark.skipif("amx" not in ISAS or AMX_NATIVE, reason="the AMX emulator is not in use")
def test_the_amx_emulator_passes_other_illegal_instructions_on():
    """ud2 under the emulator's SIGILL handler still kills the process with SIGILL (after
    Python's fault handler, which was there first, reports it)."""
    code = """if True:
        import ctypes, faulthandler, mmap
        faulthandler.enable()
        from ember import _core
        assert _core.cpu_flags()["amx_emulated"]
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(bytes([0x0F, 0x0B]))  # ud2
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        ctypes.CFUNCTYPE(None)(address)()
    """
    result = python_with("", code)
    assert result.returncode == -4, (result.returncode, result.stderr)
    assert "Fatal Python error: Illegal instruction" in result.stderr


@pytest.mark.skipif("amx" not in ISAS, reason="no AMX tiles here, native or emulated")
def test_the_amx_tiles_work_after_a_fault_handler_is_installed_over_ember():
    """Python's faulthandler (pytest enables it after ember is imported) takes SIGILL from the
    AMX emulator's handler; the tiles must still reach the emulator (natively: just run)."""
    code = """if True:
        import faulthandler
        import numpy as np
        from ember import _core
        assert "amx" in _core.available_isas()  # the emulator, where it is used, is in place now
        faulthandler.enable()
        rng = np.random.default_rng(0)
        a = rng.integers(0, 256, (16, 64), dtype=np.uint8)
        b = rng.integers(0, 256, (16, 64), dtype=np.uint8)
        c = np.zeros((16, 16), np.int32)
        expected = np.einsum("mki,kni->mn", a.astype(np.int64).reshape(16, 16, 4),
                             b.view(np.int8).astype(np.int64).reshape(16, 16, 4))
        print(np.array_equal(_core.tile_dot_product("u", "s", a, b, c), expected))
    """
    result = python_with("", code)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert result.stdout.split() == ["True"]


def test_available_isas_start_with_scalar_and_include_the_default():
    assert ISAS[0] == "scalar"
    assert python_with("", "from ember import _core; print(_core.isa())").stdout.strip() in ISAS


def test_set_isa_applies_to_graphs_created_afterwards(isa):
    g = _core.Graph(1)
    other = "scalar" if isa != "scalar" else ISAS[-1]
    previous = _core.isa()
    _core.set_isa(other)
    try:
        assert g.isa == isa
        assert _core.Graph(1).isa == other
    finally:
        _core.set_isa(previous)


@pytest.mark.parametrize("name", ["sse9", "AVX2", ""])
def test_set_isa_rejects_unknown_names(name):
    with pytest.raises(ValueError, match="unknown ISA"):
        _core.set_isa(name)


def test_token_range_check_uses_the_embedding_row_count():
    """get_rows remembers the table's row count, however many tensors and nodes the graph
    already holds (adding its node may move the graph's tensor list)."""
    table = random_rows(10, 8)
    for n_before in range(12):
        for _ in range(2):
            g = _core.Graph(1)
            for i in range(n_before):
                g.weight(F32, 8, 1, table[i % 10]) if i % 2 else g.input(8)
            g.set_output(g.get_rows(g.weight(F32, 8, 10, table)))
            g.plan(2, 2, 4)
            inputs = [np.zeros((2, 8), np.float32)] * ((n_before + 1) // 2)
            np.testing.assert_array_equal(g.run(*batch(2, tokens=[9, 0]), inputs), table[[9, 0]])
            with pytest.raises(IndexError, match=r"token id 10 out of range \[0, 10\)"):
                g.run(*batch(2, tokens=[10, 0]), inputs)
