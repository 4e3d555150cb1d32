"""Samplers, checked against a direct transcription of llama.cpp's sampler chain
(src/llama-sampler.cpp: penalties, top-k, typical, top-p, min-p, temperature, dist; mirostat and
mirostat v2) that sorts the whole vocabulary."""

from collections import Counter

import numpy as np
import pytest

from ember.engine.sampling import InvalidParameter, Sampler, SamplingParams, token_logprobs, top_k_ids
from ember.errors import EmberError

QWEN_VOCAB = 151_936


def reference_distribution(logits, params: SamplingParams, history=()):
    """(ids, probs) the way llama.cpp's chain leaves them, with a full sort."""
    x = np.array(logits, dtype=np.float32)
    for token, bias in (params.logit_bias or {}).items():
        x[token] += np.float32(bias)
    if params.penalizes:
        window = list(history) if params.repeat_last_n < 0 else list(history)[-params.repeat_last_n:]
        for token, count in Counter(window).items():
            v = x[token]
            v = v * np.float32(params.repeat_penalty) if v <= 0 else v / np.float32(params.repeat_penalty)
            x[token] = v - (np.float32(count) * np.float32(params.frequency_penalty)
                            + np.float32(params.presence_penalty))
    ids = np.lexsort((np.arange(x.size), -x))  # descending logit, ties by id
    if params.mirostat_mode:
        return reference_mirostat(x / np.float32(params.temperature), params.mirostat_mode,
                                  2 * params.mirostat_tau, x.size)
    if params.top_k > 0:
        ids = ids[:params.top_k]
    if params.typical_p < 1.0:
        ids = reference_typical(x, ids, params.typical_p)
    if params.top_p < 1.0:
        probs = softmax(x[ids])
        cum = 0.0
        for i, p in enumerate(probs):
            cum += p
            if cum >= params.top_p:
                ids = ids[:i + 1]
                break
    if params.min_p > 0.0:
        threshold = x[ids[0]] + np.float32(np.log(params.min_p))
        ids = np.array([i for i in ids if x[i] >= threshold])
    return ids, softmax(x[ids] / np.float32(params.temperature))


def reference_typical(x, ids, typical_p):
    """llama_sampler_typical_apply: rank by |-log p - H|, keep until the running sum exceeds p
    (then back in logit order, the order ember draws in)."""
    probs = softmax(x[ids])
    entropy = -sum(p * np.log(p) for p in probs)
    shifted = [abs(-np.log(p) - entropy) for p in probs]
    order = sorted(range(len(ids)), key=lambda i: shifted[i])
    cum, last = 0.0, len(order)
    for i, index in enumerate(order):
        cum += probs[index]
        if cum > typical_p:
            last = i + 1
            break
    return ids[sorted(order[:last])]


def reference_mirostat(x, mode, mu, n_vocab, m=100):
    """llama_sampler_mirostat_apply / llama_sampler_mirostat_v2_apply, up to the draw."""
    ids = np.lexsort((np.arange(x.size), -x))
    probs = softmax(x[ids])
    if mode == 1:
        sum_ti_bi = sum_ti_sq = 0.0
        for i in range(min(m - 1, len(ids) - 1)):
            t_i = np.log((i + 2) / (i + 1))
            b_i = np.log(probs[i] / probs[i + 1])
            sum_ti_bi += t_i * b_i
            sum_ti_sq += t_i * t_i
        s_hat = sum_ti_bi / sum_ti_sq
        epsilon_hat = s_hat - 1
        k = ((epsilon_hat * 2 ** mu) / (1 - n_vocab ** -epsilon_hat)) ** (1 / s_hat)
        ids = ids[:max(int(k), 1)]
    else:
        n = next((i for i, p in enumerate(probs) if -np.log2(p) > mu), len(ids))
        ids = ids[:max(n, 1)]
    return ids, softmax(x[ids])


def softmax(v):
    e = np.exp(v.astype(np.float64) - v.max())
    return e / e.sum()


def llm_like_logits(n_vocab, seed=0):
    """A broad low background with a few dozen strong candidates, as decoder logits look."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(-2.0, 2.0, n_vocab).astype(np.float32)
    head = rng.choice(n_vocab, 30, replace=False)
    logits[head] += rng.uniform(6.0, 14.0, head.size).astype(np.float32)
    return logits


def test_defaults_are_llama_cpps():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty) == (64, 1.0, 0.0, 0.0)
    assert (p.typical_p, p.mirostat_mode, p.mirostat_tau, p.mirostat_eta) == (1.0, 0, 5.0, 0.1)
    assert p.logit_bias is None and p.seed is None


CHAINS = [
    dict(),
    dict(top_k=5),
    dict(top_k=1),
    dict(top_k=0),
    dict(top_k=0, min_p=0.0),
    dict(top_k=0, min_p=0.0, top_p=0.5),
    dict(top_p=0.5, min_p=0.0),
    dict(top_p=1.0, min_p=0.2),
    dict(top_p=0.0),
    dict(min_p=1.0),
    dict(temperature=1.7, top_k=100, top_p=0.99, min_p=0.01),
    dict(temperature=0.3, repeat_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25),
    dict(repeat_penalty=0.7, repeat_last_n=3),
    dict(repeat_penalty=1.5, repeat_last_n=-1, top_k=0),
    dict(logit_bias={7: 25.0, 3: -np.inf}),
    dict(typical_p=0.5),
    dict(typical_p=0.9, top_k=0, min_p=0.0),
    dict(typical_p=0.2, top_k=100, top_p=0.9, temperature=1.3),
    dict(typical_p=0.0),
    dict(mirostat_mode=1),
    dict(mirostat_mode=1, mirostat_tau=2.0, temperature=1.5),
    dict(mirostat_mode=2),
    dict(mirostat_mode=2, mirostat_tau=0.5),
    dict(mirostat_mode=2, mirostat_tau=9.0, temperature=0.5, repeat_penalty=1.3),
]


@pytest.mark.parametrize("chain", CHAINS, ids=[str(c) for c in CHAINS])
def test_distribution_matches_llama_cpp_chain(chain):
    params = SamplingParams(seed=1, **chain)
    logits = llm_like_logits(2000, seed=len(str(chain)))
    history = [5, 7, 7, 11, 3, 400, 7, 9]
    ids, probs = Sampler(params, 2000, history=history).distribution(logits)
    ref_ids, ref_probs = reference_distribution(logits, params, history)
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(probs, ref_probs, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("chain", [dict(), dict(top_k=0), dict(top_k=0, min_p=0.0), dict(top_k=2000, min_p=0.0)],
                         ids=["defaults", "no top-k", "top-p only", "large top-k"])
def test_distribution_over_a_qwen_sized_vocabulary(chain):
    params = SamplingParams(**chain)
    logits = llm_like_logits(QWEN_VOCAB, seed=3)
    ids, probs = Sampler(params, QWEN_VOCAB).distribution(logits)
    ref_ids, ref_probs = reference_distribution(logits, params)
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(probs, ref_probs, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("mode, tau, eta", [(1, 5.0, 0.1), (1, 3.0, 0.5), (2, 5.0, 0.1), (2, 1.0, 1.0)])
def test_mirostat_moves_mu_by_the_surprise_of_each_draw(mode, tau, eta):
    params = SamplingParams(mirostat_mode=mode, mirostat_tau=tau, mirostat_eta=eta, seed=3, temperature=1.0)
    sampler = Sampler(params, 2000)
    mu = 2 * tau
    for step in range(12):
        logits = llm_like_logits(2000, seed=step)
        ids, probs = sampler.distribution(logits)
        ref_ids, ref_probs = reference_mirostat(logits, mode, mu, 2000)
        assert ids.tolist() == ref_ids.tolist()
        np.testing.assert_allclose(probs, ref_probs, rtol=1e-6)
        token = sampler.sample(logits)
        drawn = ref_probs[ref_ids.tolist().index(token)]
        mu -= eta * (-np.log2(drawn) - tau)
        assert sampler.mu == pytest.approx(mu, rel=1e-9)


def test_mirostat_keeps_surprise_near_its_target():
    """What mirostat is for: the mean surprise of the drawn tokens (under the distribution they
    were drawn from) settles at tau."""
    rng = np.random.default_rng(0)
    for mode in (1, 2):
        sampler = Sampler(SamplingParams(mirostat_mode=mode, mirostat_tau=3.0, seed=5, temperature=1.0), 4000)
        surprises = []
        for _ in range(400):
            logits = (rng.standard_normal(4000) * 3).astype(np.float32)
            ids, probs = sampler.distribution(logits)
            token = sampler.sample(logits)
            surprises.append(-np.log2(probs[ids.tolist().index(token)]))
        assert np.mean(surprises[100:]) == pytest.approx(3.0, abs=0.3)


def test_top_k_ids_are_the_k_largest_largest_first():
    logits = llm_like_logits(QWEN_VOCAB, seed=5)
    expected = np.lexsort((np.arange(QWEN_VOCAB), -logits))[:40]
    assert top_k_ids(logits, 40).tolist() == expected.tolist()


def test_top_k_ties_at_the_boundary_go_to_the_lowest_ids():
    logits = np.zeros(QWEN_VOCAB, np.float32)
    logits[[900, 100_000]] = 5.0
    logits[[7, 50_000, 120_000, 3]] = 2.0  # tied for places 3-6
    assert top_k_ids(logits, 4).tolist() == [900, 100_000, 3, 7]


def test_top_k_when_the_strided_sample_is_unrepresentative():
    # every 37th logit is large: the sampled threshold lets fewer than k through, and the
    # selection falls back to the whole vocabulary
    logits = np.zeros(QWEN_VOCAB, np.float32)
    logits[::37] = 100 + np.arange(logits[::37].size, dtype=np.float32)
    expected = np.lexsort((np.arange(QWEN_VOCAB), -logits))[:40]
    assert top_k_ids(logits, 40).tolist() == expected.tolist()


def test_top_k_of_increasing_logits():
    logits = np.linspace(-10, 10, QWEN_VOCAB, dtype=np.float32)
    assert top_k_ids(logits, 40).tolist() == list(range(QWEN_VOCAB - 1, QWEN_VOCAB - 41, -1))


def test_greedy_is_the_largest_logit():
    logits = llm_like_logits(500, seed=2)
    sampler = Sampler(SamplingParams(temperature=0.0, seed=9), 500)
    assert sampler.sample(logits) == int(np.argmax(logits))


def test_greedy_ties_go_to_the_lowest_id():
    logits = np.zeros(10, np.float32)
    logits[[8, 4, 6]] = 3.0
    assert Sampler(SamplingParams(temperature=0.0), 10).sample(logits) == 4


def test_greedy_sees_penalties_and_bias():
    logits = np.array([1.0, 4.0, 3.0, 2.0], np.float32)
    penalized = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0), 4, history=[1])
    assert penalized.sample(logits) == 2  # 4 / 2 = 2 < 3
    biased = Sampler(SamplingParams(temperature=0.0, logit_bias={"0": 10}), 4)
    assert biased.sample(logits) == 0


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -1.0, 0.5, 3.0], np.float32)
    sampler = Sampler(SamplingParams(repeat_penalty=2.0), 4, history=[0, 1])
    np.testing.assert_array_equal(sampler.adjusted(logits), [1.0, -2.0, 0.5, 3.0])


def test_frequency_and_presence_penalties_subtract_per_count_and_once():
    logits = np.array([2.0, 1.0, 0.0], np.float32)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    sampler = Sampler(params, 3, history=[0, 0, 0, 1])
    np.testing.assert_allclose(sampler.adjusted(logits), [2.0 - 1.5 - 0.25, 1.0 - 0.5 - 0.25, 0.0])


def test_penalty_window_holds_the_last_n_tokens():
    logits = np.full(4, 2.0, np.float32)
    sampler = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=2), 4, history=[0, 1])
    sampler.accept(2)  # 0 leaves the window
    np.testing.assert_array_equal(sampler.adjusted(logits), [2.0, 1.0, 1.0, 2.0])


def test_penalty_window_of_minus_one_holds_everything_and_zero_nothing():
    logits = np.full(3, 2.0, np.float32)
    history = [0] + [1] * 500
    everything = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=-1), 3, history=history)
    nothing = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=0), 3, history=history)
    np.testing.assert_array_equal(everything.adjusted(logits), [1.0, 1.0, 2.0])
    np.testing.assert_array_equal(nothing.adjusted(logits), [2.0, 2.0, 2.0])


def test_penalties_leave_the_callers_logits_alone():
    logits = np.array([2.0, 1.0], np.float32)
    Sampler(SamplingParams(repeat_penalty=2.0, logit_bias={1: 1.0}), 2, history=[0]).sample(logits)
    np.testing.assert_array_equal(logits, [2.0, 1.0])


def test_logit_bias_of_minus_infinity_bans_a_token():
    logits = np.array([0.0, 10.0, 9.9], np.float32)
    sampler = Sampler(SamplingParams(temperature=1.0, logit_bias={1: -np.inf}, seed=0), 3)
    assert {sampler.sample(logits) for _ in range(200)} <= {0, 2}


def test_logit_bias_outside_the_vocabulary_is_refused():
    with pytest.raises(InvalidParameter, match="vocabulary has 10 tokens"):
        Sampler(SamplingParams(logit_bias={10: 1.0}), 10)


def test_same_seed_same_tokens():
    logits = llm_like_logits(QWEN_VOCAB, seed=4)
    params = SamplingParams(temperature=1.5, top_k=0, min_p=0.0, top_p=0.99, seed=1234)
    first = Sampler(params, QWEN_VOCAB)
    second = Sampler(params, QWEN_VOCAB)
    draws = [first.sample(logits) for _ in range(50)]
    assert draws == [second.sample(logits) for _ in range(50)]
    assert len(set(draws)) > 5


def test_different_seeds_different_tokens():
    logits = llm_like_logits(2000, seed=4)
    params = dict(temperature=2.0, top_k=0, min_p=0.0, top_p=1.0)
    a = Sampler(SamplingParams(seed=1, **params), 2000)
    b = Sampler(SamplingParams(seed=2, **params), 2000)
    assert [a.sample(logits) for _ in range(20)] != [b.sample(logits) for _ in range(20)]


def test_without_a_seed_each_sampler_draws_its_own():
    seeds = {Sampler(SamplingParams(), 10).seed for _ in range(5)}
    assert len(seeds) == 5


def test_draw_frequencies_follow_the_distribution():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1], np.float32))
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7), 4)
    counts = np.bincount([sampler.sample(logits) for _ in range(20_000)], minlength=4) / 20_000
    np.testing.assert_allclose(counts, [0.5, 0.25, 0.15, 0.1], atol=0.015)


def test_draw_is_the_first_candidate_whose_cumulative_probability_reaches_u():
    # temperature only: candidates in id order; u is the generator's first double
    logits = llm_like_logits(QWEN_VOCAB, seed=8) / 4
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=99)
    u = np.random.Generator(np.random.PCG64(99)).random()
    cum = np.cumsum(softmax(logits))
    expected = int(np.searchsorted(cum, u * cum[-1], side="left"))
    assert Sampler(params, QWEN_VOCAB).sample(logits) == expected


@pytest.mark.parametrize("chain", [dict(), dict(top_k=0), dict(top_k=0, min_p=0.0, top_p=0.9)],
                         ids=["top-k", "min-p pool", "top-p pool"])
def test_each_draw_takes_the_candidate_where_the_cumulative_probability_reaches_u(chain):
    logits = np.round(llm_like_logits(QWEN_VOCAB, seed=10) / 4, 1)  # 36, 593, 118814 candidates, with ties
    for seed in range(20):
        params = SamplingParams(temperature=1.0, seed=seed, **chain)
        ids, probs = Sampler(params, QWEN_VOCAB).distribution(logits)
        u = np.random.Generator(np.random.PCG64(seed)).random()
        cum = np.cumsum(probs, dtype=np.float64)
        expected = ids[min(int(np.searchsorted(cum, u * cum[-1], side="left")), ids.size - 1)]
        assert Sampler(params, QWEN_VOCAB).sample(logits) == expected


def test_token_logprobs_are_the_log_softmax_of_the_logits():
    logits = llm_like_logits(1000, seed=6)
    reference = np.log(softmax(logits))
    logprob, top = token_logprobs(logits, 17, n_top=3)
    assert logprob == pytest.approx(reference[17], abs=1e-9)
    best = np.argsort(-reference)[:3]
    assert [t for t, _ in top] == best.tolist()
    np.testing.assert_allclose([lp for _, lp in top], reference[best], atol=1e-9)


@pytest.mark.parametrize("bad", [
    dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=1.5), dict(top_p=-0.1),
    dict(min_p=2.0), dict(repeat_penalty=0.0), dict(repeat_last_n=-2), dict(top_k=2.5),
    dict(frequency_penalty=float("inf")), dict(logit_bias={"x": 1.0}), dict(logit_bias={-1: 1.0}),
    dict(seed="7"), dict(typical_p=1.5), dict(mirostat_mode=3), dict(mirostat_mode=-1), dict(mirostat_tau=-1.0),
    dict(mirostat_eta=float("nan")),
])
def test_out_of_range_parameters_are_refused_with_one_line(bad):
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(**bad)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, EmberError) and isinstance(info.value, ValueError)
