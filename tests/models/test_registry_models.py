"""The three registry models (real quantized weights) against transformers loading the same GGUF.

transformers dequantizes every weight to float32 and computes in float32. By default ember keeps
the weights quantized and quantizes activations to 8 bits per block for the integer dot
products, as llama.cpp does, so logits agree closely but not exactly: every position's cosine
similarity must be >= 0.99 and the top-1 token must agree wherever transformers' top-2 margin is
clear. With activations="f32" ember dequantizes the weights instead and must agree everywhere
the margin is 0.1 or more, with cosines >= 0.9999.
"""

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ember.engine.runtime import Model  # noqa: E402
from ember.hub import resolve_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

TEXT = (
    "The history of natural language processing generally started in the 1950s, although work can "
    "be found from earlier periods. In 1950, Alan Turing published an article titled Computing "
    "Machinery and Intelligence which proposed what is now called the Turing test as a criterion "
    "of intelligence."
)

# Smallest top-2 margin (in transformers' logits) at which the top-1 tokens must agree. The
# issue's target is 0.1. With 8-bit activations, rounding an activation one way or the other is
# discontinuous, and on this text smollm2 flips at a 0.17 margin and gemma3 (whose residual
# stream is large) at up to 0.27 — the scalar and AVX2 kernels, equal to 2e-7 per matmul, flip
# at different positions. The same files dequantized to F32 match transformers to 5e-4
# relative, so the graph itself is exact; the flips come from activation quantization (llama.cpp
# flips at 0.119 on gemma3 too). activations="f32" leaves the activations unrounded and meets the
# 0.1 target on all three (test_float_activation_logits_agree_with_transformers).
MARGINS = {"smollm2-135m": 0.2, "qwen2.5-coder-0.5b": 0.1, "gemma3-270m": 0.3}


@functools.lru_cache(maxsize=3)
def transformers_model(path):
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    return tok, model


@functools.lru_cache(maxsize=3)
def transformers_logits(path, n_tokens=64):
    tok, model = transformers_model(path)
    ids = tok(TEXT)["input_ids"][:n_tokens]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    return ids, logits


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("name", list(MARGINS))
def test_logits_agree_with_transformers(name):
    path = resolve_model(name)
    ids, ref = transformers_logits(path)
    ours = Model(path, n_ctx=128).eval(ids, logits="all")
    assert cosines(ref, ours).min() >= 0.99
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= MARGINS[name]
    assert np.array_equal(ours.argmax(1)[clear], ref.argmax(1)[clear])


@pytest.mark.parametrize("name", list(MARGINS))
def test_float_activation_logits_agree_with_transformers(name):
    """Unrounded activations remove the flips: on this text none of the three models differs
    from transformers at any position (the smallest margin is 0.007), cosines are >= 0.99999."""
    path = resolve_model(name)
    ids, ref = transformers_logits(path)
    ours = Model(path, n_ctx=128, activations="f32").eval(ids, logits="all")
    assert cosines(ref, ours).min() >= 0.9999
    assert np.abs(ours - ref).max() <= 5e-3 * np.abs(ref).max()
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= 0.1
    assert np.array_equal(ours.argmax(1)[clear], ref.argmax(1)[clear])


@pytest.mark.parametrize("name", list(MARGINS))
def test_float_activation_greedy_tokens_are_transformers_tokens(name):
    """24 greedy tokens through the KV cache, one at a time: the same ids as transformers'
    greedy generate() on the same file."""
    path = resolve_model(name)
    tok, model = transformers_model(path)
    ids = tok("The capital of France is")["input_ids"]
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0][len(ids):].tolist()
    ours, runtime = [], Model(path, n_ctx=64, activations="f32")
    logits = runtime.eval(ids)
    while len(ours) < len(expected):
        ours.append(int(np.argmax(logits)))
        logits = runtime.eval([ours[-1]])
    assert ours == expected


def test_incremental_decode_equals_one_batch():
    model = Model(resolve_model("smollm2-135m"), n_ctx=64)
    ids = [1, 504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30]
    batch = model.eval(ids, logits="all")
    model.reset()
    one_by_one = np.stack([model.eval([t]) for t in ids])
    assert np.array_equal(batch, one_by_one)
