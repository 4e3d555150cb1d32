"""The KV cache's types on a real model (smollm2-135m): Q8_0 and F16 caches against the F32 one.

Float activations (activations="f32") keep the 8-bit rounding of the matmul inputs out of the
comparison, so what differs is only what the cache stores. Per element, F16 rounds to 2^-11 of
the element; Q8_0 to half a step of max|block| / 127, about 2^-8 of the block's largest element,
so its errors are one to two orders larger than F16's (measured: rms 0.16 against 0.005 over
400 positions). The bounds: Q8_0's logits within 64 times F16's rms error of the F32 cache's (and
more than 4 times it: the Q8_0 rows are really used), the same top token at 90% of positions,
and perplexity within 2% (measured: -0.5%; F16: +0.02%).
"""

import numpy as np
import pytest

from ember.engine.perplexity import perplexity
from ember.engine.runtime import Model
from ember.hub import resolve_model
from ember.tokenizer.tokenizer import Tokenizer
from paths import REPO

pytestmark = pytest.mark.model

TEXT = REPO / "benchmarks" / "data" / "public-domain-en.txt"
TYPES = ("f32", "f16", "q8_0")


@pytest.fixture(scope="module")
def runs():
    """Logits of 400 tokens and the perplexity of 2 chunks of 512 tokens, per cache type."""
    path = resolve_model("smollm2-135m")
    out = {}
    for t in TYPES:
        model = Model(path, n_ctx=512, n_outputs=512, activations="f32", type_k=t, type_v=t)
        try:
            tokenizer = Tokenizer.from_gguf(model.gguf)
            tokens = tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special=True)
            logits = model.eval(tokens[:400], logits="all")
            bos = tokenizer.bos_id if tokenizer.add_bos else None
            out[t] = logits, perplexity(model, tokens, 512, bos, 2).ppl
        finally:
            model.close()
    return out


def rms(x):
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def test_q8_0_cache_logits_are_close_to_the_f32_caches(runs):
    f32, f16, q8 = (runs[t][0] for t in TYPES)
    f16_error, q8_error = rms(f16 - f32), rms(q8 - f32)
    assert 4 * f16_error < q8_error < 64 * f16_error
    assert np.mean(q8.argmax(axis=1) == f32.argmax(axis=1)) >= 0.9


def test_q8_0_cache_costs_little_perplexity(runs):
    f32, f16, q8 = (runs[t][1] for t in TYPES)
    assert abs(f16 / f32 - 1) < 0.002
    assert abs(q8 / f32 - 1) < 0.02


def test_q8_0_cache_is_17_32_of_f16s():
    path = resolve_model("smollm2-135m")
    sizes = {}
    for t in ("f16", "q8_0"):
        model = Model(path, n_ctx=1024, n_threads=1, type_k=t, type_v=t)
        sizes[t] = model.memory()["kv_cache"], model.kv_bytes_per_token
        model.close()
    assert sizes["q8_0"][0] * 32 == sizes["f16"][0] * 17
    assert sizes["q8_0"][1] * 32 == sizes["f16"][1] * 17
