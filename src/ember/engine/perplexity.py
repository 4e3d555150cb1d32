"""`ember perplexity`: llama.cpp's perplexity method.

The text is tokenized once (with BOS when the model adds one) and cut into non-overlapping
chunks of n_ctx tokens; each chunk is evaluated from an empty cache, its first token replaced
by BOS when the model uses one, and only the second half of each chunk is scored (the first
half gives every scored token at least n_ctx/2 tokens of context). PPL = exp(mean NLL); the
error is exp(mean) * sqrt(var(NLL) / (N - 1)), as llama.cpp reports it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ember.errors import EmberError


@dataclass
class PerplexityResult:
    ppl: float
    ppl_error: float
    n_chunks: int
    n_ctx: int
    n_scored: int
    chunk_ppl: list = field(default_factory=list)
    seconds: float = 0.0


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] per row, as llama.cpp computes it: exp(x - max) in float32,
    summed in float64 (a float64 copy of a 262k-word vocabulary's logits costs seconds)."""
    x_max = logits.max(axis=1, keepdims=True)
    sum_exp = np.exp(logits - x_max).sum(axis=1, dtype=np.float64)
    target_logits = logits[np.arange(len(targets)), targets].astype(np.float64)
    return np.log(sum_exp) + x_max[:, 0].astype(np.float64) - target_logits


def chunk_count(n_tokens: int, n_ctx: int, max_chunks: int | None = None) -> int:
    n_chunks = n_tokens // n_ctx
    if n_chunks < 1:
        raise EmberError(f"the text has {n_tokens} tokens; perplexity needs at least n_ctx = {n_ctx}"
                         " (use a longer file or a smaller -c)")
    return min(n_chunks, max_chunks) if max_chunks else n_chunks


def perplexity(model, tokens: list[int], n_ctx: int, bos_id: int | None, max_chunks: int | None = None,
               progress=None) -> PerplexityResult:
    n_chunks = chunk_count(len(tokens), n_ctx, max_chunks)
    first = n_ctx // 2
    nll_sum = nll2_sum = 0.0
    count = 0
    chunk_ppl = []
    start = time.perf_counter()
    for i in range(n_chunks):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        model.reset()
        logits = model.eval(chunk, logits=range(first, n_ctx - 1))  # only the scored positions
        nll = token_nll(logits, np.asarray(chunk[first + 1:n_ctx]))
        nll_sum += float(nll.sum())
        nll2_sum += float((nll ** 2).sum())
        count += len(nll)
        chunk_ppl.append(math.exp(nll_sum / count))
        if progress:
            progress(i + 1, n_chunks, chunk_ppl[-1], time.perf_counter() - start)
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    error = math.sqrt(max(var, 0.0) / max(count - 1, 1)) * math.exp(mean)
    return PerplexityResult(math.exp(mean), error, n_chunks, n_ctx, count, chunk_ppl, time.perf_counter() - start)
