"""`ember rerank`: a JSON line per document, best first, equal to the Python API's rerank; documents
from arguments, a file or stdin; errors as one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ember
from cli.test_embed import ember_cli
from encoder_models import minilm_gguf, tiny_reranker_gguf

pytestmark = pytest.mark.model

QUERY = "people in Berlin"
DOCUMENTS = ["Berlin has 3.5 million inhabitants.", "Bread is baked.", "Paris is in France."]


@pytest.fixture(scope="module")
def reference():
    with ember.LLM(tiny_reranker_gguf(), n_threads=2) as llm:
        yield llm.rerank(QUERY, DOCUMENTS)


def lines(result) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_each_document_is_a_json_line_best_first(reference):
    out = lines(ember_cli("rerank", "-m", str(tiny_reranker_gguf()), "-t", "2", QUERY, *DOCUMENTS))
    assert [o["index"] for o in out] == [r["index"] for r in reference]
    np.testing.assert_allclose([o["relevance_score"] for o in out], [r["relevance_score"] for r in reference],
                               atol=1e-5)


def test_documents_come_a_line_each_from_stdin_and_top_n_keeps_the_best(reference):
    out = lines(ember_cli("rerank", "-m", str(tiny_reranker_gguf()), "-t", "2", "--top-n", "2", QUERY,
                          input="\n".join(DOCUMENTS) + "\n"))
    assert [o["index"] for o in out] == [r["index"] for r in reference[:2]]


def test_a_model_that_is_not_a_reranker_is_a_one_line_error():
    result = ember_cli("rerank", "-m", str(minilm_gguf()), "-t", "1", QUERY, "a document")
    assert result.returncode != 0 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("ember: error: ") and "is not a reranker" in line


def test_no_documents_is_a_one_line_error():
    result = ember_cli("rerank", "-m", str(tiny_reranker_gguf()), QUERY, input="\n")
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [
        "ember: error: no documents to rerank"]
