"""The multi-head latent attention op (ops/attention.cpp) against numpy's plain multi-head form.

The reference builds every head's keys and values from the cached latents, K_h = [W_UK[h] c |
k_pe] and V_h = W_UV[h] c, and attends with them; the op never forms them (absorbed form) and
caches one F16 row [c | k_pe] per position. So the reference rounds c and k_pe to F16, and
takes the weights as their type stores them (dequantized)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ember import _core
from ember.gguf.types import GGMLType
from ember.quant.reference import dequantize, quantize

F32 = int(GGMLType.F32)
ISAS = _core.available_isas()


@pytest.fixture(params=ISAS)
def isa(request):
    previous = _core.isa()
    _core.set_isa(request.param)
    yield request.param
    _core.set_isa(previous)


class Shape:
    def __init__(self, n_head=4, rank=64, rope=16, nope=32, value=32):
        self.n_head, self.rank, self.rope, self.nope, self.value = n_head, rank, rope, nope, value


def weights(shape: Shape, kind: GGMLType, seed=0):
    """attn_k_b [H * rank rows, nope] and attn_v_b [H * value rows, rank]: (bytes, dequantized values)."""
    rng = np.random.default_rng(seed)
    out = []
    for rows, cols in ((shape.n_head * shape.rank, shape.nope), (shape.n_head * shape.value, shape.rank)):
        values = (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)
        data = quantize(values, kind)
        out.append((data, dequantize(data, kind, (cols, rows)).reshape(rows, cols).astype(np.float64)))
    return out


def inputs(shape: Shape, n_tokens, seed=1):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_tokens, shape.n_head * (shape.nope + shape.rope))).astype(np.float32)
    c = rng.standard_normal((n_tokens, shape.rank)).astype(np.float32)
    k_pe = rng.standard_normal((n_tokens, shape.rope)).astype(np.float32)
    return q, c, k_pe


class ReferenceMLA:
    """numpy, float64: per head, keys [W_UK c | k_pe] and values W_UV c over the cached positions."""

    def __init__(self, shape: Shape, wk, wv, n_ctx, n_seq=1, scale=None):
        self.s, self.wk, self.wv = shape, wk, wv
        self.scale = 1.0 / math.sqrt(shape.nope + shape.rope) if scale is None else scale
        self.c = np.zeros((n_seq, n_ctx, shape.rank))
        self.k_pe = np.zeros((n_seq, n_ctx, shape.rope))

    def __call__(self, q, c, k_pe, positions, seq_ids):
        s = self.s
        self.c[seq_ids, positions] = c.astype(np.float16).astype(np.float64)
        self.k_pe[seq_ids, positions] = k_pe.astype(np.float16).astype(np.float64)
        out = np.zeros((len(q), s.n_head, s.value))
        heads = q.astype(np.float64).reshape(len(q), s.n_head, s.nope + s.rope)
        for t, (pos, seq) in enumerate(zip(positions, seq_ids)):
            latents, rotary = self.c[seq, :pos + 1], self.k_pe[seq, :pos + 1]
            for h in range(s.n_head):
                w_uk = self.wk[h * s.rank:(h + 1) * s.rank].T  # [nope, rank]: k_nope = W_UK c
                w_uv = self.wv[h * s.value:(h + 1) * s.value]  # [value, rank]
                keys = np.concatenate([latents @ w_uk.T, rotary], axis=1)
                values = latents @ w_uv.T
                scores = keys @ heads[t, h] * self.scale
                p = np.exp(scores - scores.max())
                out[t, h] = (p / p.sum()) @ values
        return out.reshape(len(q), -1)


class CoreMLA:
    def __init__(self, shape: Shape, kind: GGMLType, data_k, data_v, n_ctx, n_seq=1, scale=None, max_tokens=64,
                 float_activations=False, n_threads=2, type_k=GGMLType.F16):
        s = shape
        self.g = _core.Graph(n_threads, float_activations)
        q = self.g.input(s.n_head * (s.nope + s.rope))
        c, k_pe = self.g.input(s.rank), self.g.input(s.rope)
        wk = self.g.weight(int(kind), s.nope, s.n_head * s.rank, data_k)
        wv = self.g.weight(int(kind), s.rank, s.n_head * s.value, data_v)
        scale = 1.0 / math.sqrt(s.nope + s.rope) if scale is None else scale
        self.g.set_output(self.g.mla_attention(q, c, k_pe, wk, wv, s.n_head, s.rank, s.rope, s.nope, s.value, scale))
        self.g.plan(max_tokens, max_tokens, n_ctx, n_seq, type_k=int(type_k))

    def __call__(self, q, c, k_pe, positions, seq_ids):
        n = len(q)
        return self.g.run(np.zeros(n, np.int32), np.asarray(positions, np.int32), np.asarray(seq_ids, np.int32),
                          np.arange(n, dtype=np.int32), [q, c, k_pe])


def pair(shape, kind, n_ctx=64, seed=0, **kwargs):
    (data_k, wk), (data_v, wv) = weights(shape, kind, seed)
    return CoreMLA(shape, kind, data_k, data_v, n_ctx, **kwargs), ReferenceMLA(
        shape, wk, wv, n_ctx, n_seq=kwargs.get("n_seq", 1), scale=kwargs.get("scale"))


def relative_error(out, expected):
    return float(np.abs(out - expected).max() / np.abs(expected).max())


# F32 weights take F32 activations; F16 weights round the queries and latents to F16, Q8_0 to 8 bits.
TOLERANCE = {GGMLType.F32: 1e-5, GGMLType.F16: 2e-3, GGMLType.Q8_0: 2e-2}


@pytest.mark.parametrize("kind", list(TOLERANCE), ids=lambda k: k.name)
@pytest.mark.parametrize("n_tokens", [1, 33])
def test_prefill_equals_the_plain_multi_head_form(isa, kind, n_tokens):
    shape = Shape()
    core, ref = pair(shape, kind)
    q, c, k_pe = inputs(shape, n_tokens)
    positions, seqs = np.arange(n_tokens), np.zeros(n_tokens, int)
    assert relative_error(core(q, c, k_pe, positions, seqs), ref(q, c, k_pe, positions, seqs)) <= TOLERANCE[kind]


def test_float_activations_take_quantized_weights_without_rounding_the_activations(isa):
    shape = Shape()
    core, ref = pair(shape, GGMLType.Q8_0, float_activations=True)
    q, c, k_pe = inputs(shape, 33)
    positions, seqs = np.arange(33), np.zeros(33, int)
    assert relative_error(core(q, c, k_pe, positions, seqs), ref(q, c, k_pe, positions, seqs)) <= 1e-5


def test_decode_steps_after_a_prefill_read_the_cached_latents(isa):
    shape = Shape(n_head=3, rank=32, rope=8, nope=16, value=24)
    core, ref = pair(shape, GGMLType.F32, n_ctx=32)
    q, c, k_pe = inputs(shape, 14, seed=2)
    for begin, end in ((0, 9), (9, 10), (10, 11), (11, 14)):
        positions = np.arange(begin, end)
        args = (q[begin:end], c[begin:end], k_pe[begin:end], positions, np.zeros(end - begin, int))
        assert relative_error(core(*args), ref(*args)) <= 1e-5


def test_sequences_in_one_batch_attend_to_their_own_latents(isa):
    shape = Shape(n_head=2, rank=32, rope=8, nope=16, value=16)
    core, ref = pair(shape, GGMLType.F32, n_ctx=16, n_seq=3)
    q, c, k_pe = inputs(shape, 30, seed=3)
    seqs, positions = np.array([0, 1, 2] * 10), np.repeat(np.arange(10), 3)
    out = core(q, c, k_pe, positions, seqs)
    assert relative_error(out, ref(q, c, k_pe, positions, seqs)) <= 1e-5
    alone, _ = pair(shape, GGMLType.F32, n_ctx=16)
    mine = seqs == 1
    np.testing.assert_array_equal(alone(q[mine], c[mine], k_pe[mine], np.arange(10), np.zeros(10, int)), out[mine])


def test_the_scale_multiplies_the_scores(isa):
    shape = Shape(n_head=2)
    core, ref = pair(shape, GGMLType.F32, scale=0.3)
    q, c, k_pe = inputs(shape, 20, seed=4)
    positions, seqs = np.arange(20), np.zeros(20, int)
    assert relative_error(core(q, c, k_pe, positions, seqs), ref(q, c, k_pe, positions, seqs)) <= 1e-5


def test_the_cache_holds_the_latent_and_the_rotary_key_per_position():
    """kv_lora_rank + rope F16 values per token, against 2 n_head head_dim for attention's K and V."""
    shape = Shape(n_head=16, rank=64, rope=16, nope=32, value=32)
    core, _ = pair(shape, GGMLType.F32, n_ctx=128, n_seq=2)
    assert core.g.kv_size == 2 * 128 * (shape.rank + shape.rope) * 2


def test_a_saved_sequence_loads_back_into_another_slot(isa):
    shape = Shape(n_head=2, rank=32, rope=8, nope=16, value=16)
    core, ref = pair(shape, GGMLType.F32, n_ctx=16, n_seq=2)
    q, c, k_pe = inputs(shape, 6, seed=5)
    core(q[:5], c[:5], k_pe[:5], np.arange(5), np.zeros(5, int))
    state = core.g.kv_save(0, 5)
    assert state.nbytes == 5 * (shape.rank + shape.rope) * 2
    core.g.kv_load(1, 5, state)
    ref(q[:5], c[:5], k_pe[:5], np.arange(5), np.zeros(5, int))
    step = (q[5:], c[5:], k_pe[5:], [5], [0])
    expected = ref(*step)
    np.testing.assert_array_equal(core(q[5:], c[5:], k_pe[5:], [5], [1]), core(*step))
    assert relative_error(core(*step), expected) <= 1e-5


@pytest.mark.parametrize("change, message", [
    (dict(n_head=0), "positive"),
    (dict(q_cols=10), "q is not"),
    (dict(c_cols=10), "c or k_pe"),
    (dict(k_rows=10), "attn_k_b"),
    (dict(v_rows=10), "attn_v_b"),
])
def test_shapes_that_do_not_fit_are_refused(change, message):
    s = Shape(n_head=2, rank=32, rope=8, nope=16, value=16)
    g = _core.Graph(1)
    q = g.input(change.get("q_cols", s.n_head * (s.nope + s.rope)))
    c, k_pe = g.input(change.get("c_cols", s.rank)), g.input(s.rope)
    k_rows, v_rows = change.get("k_rows", s.n_head * s.rank), change.get("v_rows", s.n_head * s.value)
    wk = g.weight(F32, s.nope, k_rows, np.zeros(k_rows * s.nope, np.float32))
    wv = g.weight(F32, s.rank, v_rows, np.zeros(v_rows * s.rank, np.float32))
    with pytest.raises(ValueError, match=message):
        g.mla_attention(q, c, k_pe, wk, wv, change.get("n_head", s.n_head), s.rank, s.rope, s.nope, s.value, 0.1)


def test_the_latent_cache_is_f16_only():
    with pytest.raises(ValueError, match="multi-head latent attention caches its latent in f16 only"):
        pair(Shape(), GGMLType.F32, type_k=GGMLType.Q8_0)
