"""Sampling: from the logits of one position to the next token id.

The chain is llama.cpp's default order (`common_params_sampling` in its common/common.h),
applied to the raw logits, with a grammar's mask first:

    grammar mask -> logit bias -> penalties -> top-k -> typical-p -> top-p -> min-p -> temperature -> random draw

or, with mirostat (which replaces the filters, as in llama.cpp's common_sampler):

    grammar mask -> logit bias -> penalties -> temperature -> mirostat (v1 or v2) -> random draw

- grammar mask (engine/constraints.py, when the parameters carry a `grammar`): tokens that
  would take the text out of the grammar get -inf, so no later step can pick them. Greedy
  checks the unmasked argmax first and masks only when the grammar forbids it; where the
  grammar allows fewer than 1/16 of the vocabulary, the rest of the chain runs over the
  allowed tokens alone.
- logit bias: `logit[id] += bias`; a bias of -inf bans a token.
- penalties, over the last `repeat_last_n` tokens seen (prompt included; -1 = all of them):
  a token seen `c` times gets `logit / repeat_penalty` if its logit is positive, else
  `logit * repeat_penalty` (the CTRL penalty with the usual fix for negative logits), then
  `logit - c * frequency_penalty - presence_penalty` (OpenAI's penalties).
- top-k keeps the k largest logits (k <= 0: off).
- typical-p (locally typical sampling, Meister et al. 2022; llama.cpp's `typical`): with p_i the
  softmax (temperature 1) of the candidates and H = -sum p_i ln p_i their entropy, the
  candidates are ranked by |-ln p_i - H| (most typical first) and the shortest run of that
  ranking whose probability exceeds typical_p is kept (typical_p = 1: off).
- top-p keeps the shortest run of the most probable tokens whose probability (softmax at
  temperature 1 over what top-k kept) reaches p (p = 1: off).
- min-p keeps the tokens with p_i >= min_p * p_max, i.e. logit_i >= logit_max + ln(min_p)
  (min_p = 0: off).
- temperature divides the logits that are left; 0 is greedy: the largest logit after bias
  and penalties, ties to the lowest id.
- the draw: one uniform u in [0, 1) from a PCG64 generator seeded per request; the token is
  the first candidate whose cumulative probability reaches u times the total (llama.cpp's
  `dist`). Candidates are in descending logit order, ties to the lower id; with no filter at
  all (top-k, top-p and min-p off) they are the whole vocabulary in id order.

- mirostat v1 (Basu et al. 2021; llama.cpp's `mirostat` with m = 100): from the m most probable
  tokens, s_hat = sum t_i b_i / sum t_i^2 with t_i = ln((i+2)/(i+1)), b_i = ln(p_i / p_(i+1));
  then k = (eps 2^mu / (1 - n_vocab^-eps))^(1/s_hat) with eps = s_hat - 1, and the draw is
  from the top max(k, 1).
- mirostat v2: the draw is from the tokens whose surprise -log2 p_i is at most mu (at least one).
  Both renormalize before the draw and then move mu by -eta (surprise of the drawn token - tau),
  starting from mu = 2 tau; mu lives as long as the request.

Defaults are llama.cpp's: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, typical_p 1.0 (off),
repeat_last_n 64, repeat_penalty 1.0 (off), frequency and presence penalties 0 (off), mirostat
off (tau 5.0, eta 0.1). XTC, DRY and top-n-sigma (off by default in llama.cpp) are not implemented.

Speed (benchmarks/sampling_speed.py): the vocabulary is never argsorted. Top-k gathers a small
superset of the k largest logits with one comparison pass (the threshold is the k-th largest
of a strided sample), then partitions and sorts only that. Without top-k, min-p's threshold
(or, for top-p alone, a widening distance from the max) cuts the candidates first, and only
their logits are sorted, not their ids. With a fixed seed the sampled ids depend only on the
logits: this runs single-threaded in numpy, whatever the model's thread count.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter, deque
from typing import Iterable, Mapping

import numpy as np

from ember.engine.constraints import Constraint, constraint_for
from ember.engine.sampling_params import DEFAULTS, InvalidParameter, SamplingParams

__all__ = ["DEFAULTS", "InvalidParameter", "Sampler", "SamplingParams", "token_logprobs", "top_k_ids"]

_SAMPLE_SIZE = 4096  # strided sample used to estimate the top-k threshold


def fresh_seed() -> int:
    """A random 32-bit seed (printed so that a run can be repeated with -s)."""
    return secrets.randbits(32)


class Sampler:
    """The sampling state of one request: its random generator, its penalty window and its
    grammar's matcher.

    `history` (the prompt) counts for the penalties; `accept(token)` records a generated token
    (for the penalties and the grammar); `sample(logits)` picks the next one. A grammar needs
    the `tokenizer` (its token bytes).
    """

    def __init__(self, params: SamplingParams, n_vocab: int, history: Iterable[int] = (), tokenizer=None):
        self.params = params
        self.n_vocab = n_vocab
        self._bias_ids, self._bias_values = _bias_arrays(params.logit_bias, n_vocab)
        self.constraint: Constraint | None = constraint_for(params.grammar, tokenizer, n_vocab)
        self.seed = params.seed if params.seed is not None and params.seed >= 0 else fresh_seed()
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._window: deque[int] | None = deque() if params.penalizes else None
        self._window_size = None if params.repeat_last_n < 0 else params.repeat_last_n
        self._counts: Counter[int] = Counter()
        self._all_ids: np.ndarray | None = None
        self.mu = 2.0 * params.mirostat_tau  # mirostat's running surprise bound
        for token in history:
            self._remember(token)

    @property
    def finished(self) -> bool:
        """The grammar is complete: nothing but an end-of-generation token may follow."""
        return self.constraint is not None and self.constraint.finished

    def accept(self, token: int) -> None:
        self._remember(token)
        if self.constraint is not None:
            self.constraint.accept(token)

    def _remember(self, token: int) -> None:
        if self._window is None:
            return
        if self._window_size is not None and len(self._window) == self._window_size:
            oldest = self._window.popleft()
            self._counts[oldest] -= 1
            if not self._counts[oldest]:
                del self._counts[oldest]
        self._window.append(token)
        self._counts[token] += 1

    def sample(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return self._greedy(logits)
        candidates, probs, ids = self._chain(logits)
        rank = _draw(probs, self._rng.random())
        if probs[rank] == 0:  # a draw of u = 0 onto a token the grammar forbids
            rank = int(np.argmax(probs))
        if self.params.mirostat_mode:
            surprise = -math.log2(float(probs[rank]))
            self.mu -= self.params.mirostat_eta * (surprise - self.params.mirostat_tau)
        token = candidates.token(rank)
        return token if ids is None else int(ids[token])

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates the next draw chooses from, in draw order, and their probabilities."""
        if self.params.greedy:
            return np.array([self._greedy(logits)]), np.array([1.0])
        candidates, probs, ids = self._chain(logits)
        ranked = candidates.ranked_ids(probs.size)
        if ids is not None:
            ranked = ids[ranked]
        if self.constraint is None:
            return ranked, probs
        keep = np.flatnonzero(probs > 0)
        return ranked[keep], probs[keep]

    def _chain(self, logits: np.ndarray) -> tuple["_Candidates", np.ndarray, np.ndarray | None]:
        """The candidates in draw order and their probabilities after the whole chain. Where
        the grammar allows few tokens the chain runs over those alone (the others' -inf would
        change nothing): then candidates are positions in `ids`, the allowed ids."""
        if self.constraint is None:
            return (*self._candidates(self.adjusted(logits)), None)
        x = self.adjusted(logits, masked=False)
        ids = self.constraint.allowed_ids()
        if ids.size == 0:
            raise InvalidParameter(f"the {self.constraint.grammar.kind} admits no token here")
        if ids.size * 16 > x.size:
            return (*self._candidates(self._masked(x)), None)
        return (*self._candidates(x[ids]), ids)

    def _greedy(self, logits: np.ndarray) -> int:
        x = self.adjusted(logits, masked=False)
        token = int(np.argmax(x))
        if self.constraint is None or self.constraint.is_allowed(token):
            return token
        return int(np.argmax(self._masked(x)))

    def adjusted(self, logits: np.ndarray, masked: bool = True) -> np.ndarray:
        """The logits after the grammar's mask, logit bias and penalties (a copy when any changes them)."""
        x = np.asarray(logits, dtype=np.float32)
        if masked and self.constraint is not None:
            x = self._masked(x)
        elif self._bias_ids.size == 0 and not self._counts:
            return x
        else:
            x = x.copy()
        if self._bias_ids.size:
            x[self._bias_ids] += self._bias_values
        if self._counts:
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            p = self.params
            x[ids] = apply_penalties(x[ids], counts, p.repeat_penalty, p.frequency_penalty, p.presence_penalty)
        return x

    def _masked(self, x: np.ndarray) -> np.ndarray:
        """A copy of x with -inf where the grammar forbids the token."""
        allowed = self.constraint.allowed()
        if not allowed.any():
            raise InvalidParameter(f"the {self.constraint.grammar.kind} admits no token here")
        if x.size > allowed.size:  # logits past the vocabulary the grammar knows
            allowed = np.concatenate([allowed, np.zeros(x.size - allowed.size, np.bool_)])
        return np.where(allowed[:x.size], x, np.float32(-np.inf))

    def _candidates(self, x: np.ndarray) -> tuple["_Candidates", np.ndarray]:
        """The candidates in draw order, and their probabilities after the whole chain."""
        p = self.params
        if p.mirostat_mode:
            return _mirostat_candidates(x / np.float32(p.temperature), p.mirostat_mode, self.mu, self.n_vocab)
        top_k_on = 0 < p.top_k < x.size
        typical_on = p.typical_p < 1.0
        if not top_k_on and not typical_on and p.top_p >= 1.0 and p.min_p <= 0.0:
            if self._all_ids is None or self._all_ids.size != x.size:
                self._all_ids = np.arange(x.size)
            return _Candidates(x, ids=self._all_ids), _softmax(x / np.float32(p.temperature))
        if top_k_on or typical_on:
            ids = top_k_ids(x, p.top_k) if top_k_on else _sorted_desc(np.arange(x.size), x)
            candidates = _Candidates(x[ids], ids=ids)
            if typical_on:
                candidates = _typical(candidates, p.typical_p)
            log_z = _log_sum_exp(candidates.values)
        else:
            candidates, log_z = _whole_vocab_candidates(x, p.top_p, p.min_p)
        values = candidates.values
        keep = values.size
        if p.top_p < 1.0:
            keep = min(keep, _top_p_count(values, log_z, p.top_p))
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(values[:keep] >= values[0] + np.float32(math.log(p.min_p)))))
        return candidates, _softmax(values[:keep] / np.float32(p.temperature))


class _Candidates:
    """Candidate tokens in draw order: by descending logit, ties to the lower id (or, with no
    filter, the whole vocabulary in id order).

    `values` are their logits in that order. Either `ids` holds the ids in rank order, or (for large
    sets, where sorting ids costs far more than sorting values) `pool` holds them in id order
    with `pool_values`, and the id at a rank is found when it is needed.
    """

    def __init__(self, values: np.ndarray, ids: np.ndarray | None = None, pool: np.ndarray | None = None,
                 pool_values: np.ndarray | None = None):
        self.values = values
        self.ids = ids
        self.pool = pool
        self.pool_values = pool_values

    def token(self, rank: int) -> int:
        if self.ids is not None:
            return int(self.ids[rank])
        value = self.values[rank]
        n_above = int(np.count_nonzero(self.pool_values > value))
        return int(self.pool[self.pool_values == value][rank - n_above])

    def ranked_ids(self, n: int) -> np.ndarray:
        if self.ids is not None:
            return self.ids[:n]
        return self.pool[np.lexsort((self.pool, -self.pool_values))][:n]


def _typical(candidates: _Candidates, typical_p: float) -> _Candidates:
    """The locally typical candidates (llama.cpp's `typical` sampler), still in rank order."""
    values = candidates.values.astype(np.float64)
    log_p = values - _log_sum_exp(values)
    p = np.exp(log_p)
    entropy = -float(np.sum(p[p > 0] * log_p[p > 0]))  # banned tokens (-inf) add nothing
    order = np.argsort(np.abs(-log_p - entropy), kind="stable")
    cumulative = np.cumsum(p[order])
    keep = min(int(np.searchsorted(cumulative, typical_p, side="right")) + 1, order.size)
    kept = np.sort(order[:keep])
    return _Candidates(candidates.values[kept], ids=candidates.ids[kept])


_MIROSTAT_M = 100  # tokens that estimate s_hat (llama.cpp's m)


def _mirostat_candidates(x: np.ndarray, mode: int, mu: float, n_vocab: int) -> tuple[_Candidates, np.ndarray]:
    """The candidates mirostat (v1 or v2) draws from at bound mu, and their renormalized
    probabilities; x are the logits after temperature."""
    log_z = _log_sum_exp(x)
    if mode == 2:
        # -log2 p_i <= mu  <=>  x_i >= log Z - mu ln 2; the most probable token always stays
        pool = np.flatnonzero(x >= np.float32(log_z - mu * math.log(2.0)))
        ids = _sorted_desc(pool, x) if pool.size else np.array([int(np.argmax(x))])
    else:
        top = top_k_ids(x, _MIROSTAT_M)
        log_p = x[top].astype(np.float64) - log_z
        i = np.arange(top.size - 1, dtype=np.float64)
        t = np.log((i + 2) / (i + 1))
        b = log_p[:-1] - log_p[1:]
        s_hat = float(np.sum(t * b) / np.sum(t * t)) if top.size > 1 else 1.0
        eps = s_hat - 1.0
        with np.errstate(all="ignore"):
            k = float(np.power(eps * np.exp2(mu) / (1.0 - np.power(float(n_vocab), -eps)), 1.0 / s_hat))
        k = int(k) if math.isfinite(k) and k < x.size else x.size
        k = max(k, 1)
        ids = top[:k] if k <= top.size else top_k_ids(x, k)
    values = x[ids]
    return _Candidates(values, ids=ids), _softmax(values)


def apply_penalties(logits: np.ndarray, counts: np.ndarray, repeat: float, frequency: float,
                    presence: float) -> np.ndarray:
    """Penalized logits of tokens seen `counts` (> 0) times, in float32 as llama.cpp does."""
    logits = np.asarray(logits, dtype=np.float32)
    repeat32 = np.float32(repeat)
    penalized = np.where(logits <= 0, logits * repeat32, logits / repeat32)
    return penalized - (np.asarray(counts, np.float32) * np.float32(frequency) + np.float32(presence))


def top_k_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest values of x, largest first; ties go to the lower id."""
    n = x.size
    k = min(k, n)
    pool = _top_k_superset(x, k)
    pool_vals = x[pool]
    kth = np.partition(pool_vals, pool.size - k)[pool.size - k]
    above = pool[pool_vals > kth]
    tied = pool[pool_vals == kth][: k - above.size]
    return _sorted_desc(np.concatenate([above, tied]), x)


def _top_k_superset(x: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids of a set that holds the k largest values of x.

    The threshold is the k-th largest value of a strided sample of x: at least k values of x
    reach it (those of the sample), and for typical logits about k * stride do, so the set
    costs one comparison pass over x.
    """
    n = x.size
    stride = n // _SAMPLE_SIZE
    if stride < 4 or k * 16 > n:
        return np.arange(n)
    sample = x[::stride]
    if k > sample.size:
        return np.arange(n)
    threshold = np.partition(sample, sample.size - k)[sample.size - k]
    return np.flatnonzero(x >= threshold)


def _whole_vocab_candidates(x: np.ndarray, top_p: float, min_p: float) -> tuple[_Candidates, float]:
    """Candidates when top-k is off, and log Z over the whole vocabulary (for top-p).

    Only the tokens that min-p or top-p can keep are gathered; their logits are sorted, their
    ids are not.
    """
    m = x.max()
    e = np.exp(x - m) if top_p < 1.0 else None
    z = float(e.sum(dtype=np.float64)) if e is not None else 1.0
    if min_p > 0.0:
        pool = np.flatnonzero(x >= m + np.float32(math.log(min_p)))
    else:
        pool = _top_p_superset(x, m, e, top_p * z)
    pool_values = x[pool]
    ranked = np.sort(pool_values)[::-1]
    return _Candidates(ranked, pool=pool, pool_values=pool_values), float(m) + math.log(z)


def _top_p_superset(x: np.ndarray, m: np.float32, e: np.ndarray, target_mass: float) -> np.ndarray:
    """Ascending ids of the tokens within a widening distance of the max logit, once their
    unnormalized probability mass `e` reaches target_mass."""
    for distance in (4.0, 8.0, 16.0, 32.0):
        mask = x >= m - np.float32(distance)
        if e[mask].sum(dtype=np.float64) >= target_mass:
            return np.flatnonzero(mask)
    return np.arange(x.size)


def _top_p_count(sorted_vals: np.ndarray, log_z: float, top_p: float) -> int:
    """How many of the sorted candidates top-p keeps: up to the first whose cumulative probability reaches top_p."""
    dtype = np.float64 if sorted_vals.size <= _SAMPLE_SIZE else np.float32
    cum = np.cumsum(np.exp(sorted_vals.astype(dtype) - dtype(log_z)), dtype=np.float64)
    return int(np.searchsorted(cum, top_p, side="left")) + 1


def _sorted_desc(ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    return ids[np.lexsort((ids, -x[ids]))]


def _log_sum_exp(vals: np.ndarray) -> float:
    dtype = np.float64 if vals.size <= _SAMPLE_SIZE else np.float32
    m = vals.max()
    return float(m) + math.log(np.exp(vals.astype(dtype) - dtype(m)).sum(dtype=np.float64))


def _softmax(vals: np.ndarray) -> np.ndarray:
    """Probabilities of logits: float64 for a few candidates, float32 for a whole vocabulary."""
    dtype = np.float64 if vals.size <= _SAMPLE_SIZE else np.float32
    e = np.exp(vals.astype(dtype) - dtype(vals.max()))
    return e / e.sum(dtype=np.float64).astype(dtype)


def _draw(probs: np.ndarray, u: float) -> int:
    """Index of the first probability whose running sum reaches u times the total.

    Over a whole vocabulary the running sum goes by blocks (sums in float64), so no
    full-length cumulative array is built.
    """
    n = probs.size
    if n <= _SAMPLE_SIZE:
        cum = np.cumsum(probs, dtype=np.float64)
        return min(int(np.searchsorted(cum, u * cum[-1], side="left")), n - 1)
    block = 1024
    block_cum = np.cumsum(np.add.reduceat(probs, np.arange(0, n, block), dtype=np.float64))
    target = u * block_cum[-1]
    b = min(int(np.searchsorted(block_cum, target, side="left")), block_cum.size - 1)
    target -= block_cum[b - 1] if b else 0.0
    cum = np.cumsum(probs[b * block:(b + 1) * block], dtype=np.float64)
    return b * block + min(int(np.searchsorted(cum, target, side="left")), cum.size - 1)


def _bias_arrays(bias: Mapping[int, float] | None, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    if not bias:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    out_of_range = [token for token in bias if token >= n_vocab]
    if out_of_range:
        raise InvalidParameter(f"logit_bias names token {out_of_range[0]}, but the vocabulary has {n_vocab} tokens")
    return np.fromiter(bias.keys(), np.int64), np.fromiter(bias.values(), np.float32)


def token_logprobs(logits: np.ndarray, token: int, n_top: int = 0) -> tuple[float, list[tuple[int, float]]]:
    """Log-probability of `token` under the model's raw logits, and the `n_top` most likely alternatives."""
    x = np.asarray(logits, dtype=np.float32)
    log_z = _log_sum_exp(x)
    top = top_k_ids(x, n_top) if n_top > 0 else np.empty(0, np.int64)
    return float(x[token]) - log_z, [(int(i), float(x[i]) - log_z) for i in top]
