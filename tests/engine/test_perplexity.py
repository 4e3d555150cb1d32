"""`ember perplexity`: llama.cpp's method (chunks of n_ctx tokens from an empty cache, BOS first,
only the second half of each chunk scored), checked against a plain numpy computation."""

import json
import math

import numpy as np
import pytest

from ember.cli.main import main
from ember.engine.perplexity import perplexity, token_nll
from ember.engine.runtime import Model
from ember.hub import resolve_model
from ember.tokenizer.tokenizer import Tokenizer
from paths import REPO

TEXT = REPO / "benchmarks" / "data" / "public-domain-en.txt"


def reference_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    log_softmax = x - x.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    return -log_softmax[np.arange(len(targets)), targets]


def test_token_nll_equals_a_float64_log_softmax():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((40, 50000)) * 8).astype(np.float32)
    logits[3, 17] = 60.0  # one confident row
    targets = rng.integers(0, 50000, 40)
    targets[3] = 17
    np.testing.assert_allclose(token_nll(logits, targets), reference_nll(logits, targets), rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def smollm2():
    path = resolve_model("smollm2-135m")
    model = Model(path, n_ctx=64, n_outputs=64)
    tokenizer = Tokenizer.from_gguf(model.gguf)
    tokens = tokenizer.encode(TEXT.read_text(encoding="utf-8")[:4000], add_special=True)
    bos = tokenizer.bos_id if tokenizer.add_bos else None  # as the metadata says (SmolLM2: none)
    return model, bos, tokens


def numpy_perplexity(model, tokens, n_ctx, bos_id, n_chunks):
    nll = []
    for i in range(n_chunks):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        model.reset()
        logits = model.eval(chunk, logits="all")
        nll.append(reference_nll(logits[n_ctx // 2:n_ctx - 1], np.asarray(chunk[n_ctx // 2 + 1:])))
    return math.exp(np.concatenate(nll).mean()), sum(len(n) for n in nll)


@pytest.mark.model
@pytest.mark.parametrize("with_bos", [False, True])
def test_perplexity_follows_llama_cpps_method(smollm2, with_bos):
    model, bos, tokens = smollm2
    bos = 1 if with_bos else bos  # each chunk's first token replaced, as for models that add BOS
    expected, count = numpy_perplexity(model, tokens, 64, bos, 3)
    result = perplexity(model, tokens, 64, bos, max_chunks=3)
    assert result.n_chunks == 3 and result.n_scored == count == 3 * 31
    assert result.ppl == pytest.approx(expected, rel=1e-6)
    assert 1 < result.ppl < 1000 and result.ppl_error > 0


@pytest.mark.model
def test_cli_prints_llama_cpps_final_line_and_json(smollm2, tmp_path, capsys):
    model, bos, tokens = smollm2
    expected, _ = numpy_perplexity(model, tokens, 64, bos, 2)
    text = tmp_path / "text.txt"
    text.write_text(TEXT.read_text(encoding="utf-8")[:4000], encoding="utf-8")
    assert main(["perplexity", "-m", "smollm2-135m", "-f", str(text), "-c", "64", "--chunks", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ppl"] == pytest.approx(expected, rel=1e-6) and report["n_chunks"] == 2
    assert main(["perplexity", "-m", "smollm2-135m", "-f", str(text), "-c", "64", "--chunks", "2"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == f"Final estimate: PPL = {report['ppl']:.4f} +/- {report['ppl_error']:.5f}"


@pytest.mark.model
def test_a_text_shorter_than_one_chunk_is_a_clear_error(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("Too short.", encoding="utf-8")
    assert main(["perplexity", "-m", "smollm2-135m", "-f", str(text), "-c", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "at least n_ctx = 64" in err
