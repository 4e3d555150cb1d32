"""`ember embed`: a JSON line per text, equal to the Python API's embeddings; texts from arguments,
a file or stdin; errors as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ember
from encoder_models import minilm_gguf
from paths import ember_root

pytestmark = pytest.mark.model


def ember_cli(*argv, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ember_root())}
    return subprocess.run([sys.executable, "-m", "ember", *argv], capture_output=True, text=True, timeout=300,
                          env=env, **kwargs)


@pytest.fixture(scope="module")
def reference():
    with ember.LLM(minilm_gguf(), n_threads=2) as llm:
        yield llm


def lines(result) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_each_text_is_a_json_line_with_its_embedding(reference):
    out = lines(ember_cli("embed", "-m", str(minilm_gguf()), "-t", "2", "a cat", "a dog on a mat"))
    assert [o["index"] for o in out] == [0, 1]
    assert [o["n_tokens"] for o in out] == [len(reference.tokenize(t)) for t in ("a cat", "a dog on a mat")]
    np.testing.assert_allclose(out[1]["embedding"], reference.embed("a dog on a mat"), atol=2e-6)


def test_texts_come_a_line_each_from_stdin_or_a_file(tmp_path, reference):
    path = tmp_path / "texts.txt"
    path.write_text("a cat\n\na dog\n", encoding="utf-8")
    from_file = lines(ember_cli("embed", "-m", str(minilm_gguf()), "-t", "2", "-f", str(path)))
    from_stdin = lines(ember_cli("embed", "-m", str(minilm_gguf()), "-t", "2", input="a cat\na dog\n"))
    assert len(from_file) == 2 and from_file == from_stdin
    np.testing.assert_allclose(from_file[1]["embedding"], reference.embed("a dog"), atol=2e-6)


def test_pooling_none_gives_a_vector_per_token(reference):
    (out,) = lines(ember_cli("embed", "-m", str(minilm_gguf()), "-t", "2", "--pooling", "none", "a cat"))
    assert np.array(out["embedding"]).shape == (out["n_tokens"], 384)


def test_no_text_is_a_one_line_error():
    result = ember_cli("embed", "-m", str(minilm_gguf()), input="\n")
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["ember: error: no text to embed"]
