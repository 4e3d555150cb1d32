"""`/v1/rerank` (and llama-server's aliases) as its users see it: a real `ember serve` of a tiny
random cross-encoder, spoken to with raw httpx in llama-server's (Jina's) and TEI's request forms.
The oracle is ember's Python API (LLM.rerank), itself checked against transformers
(tests/engine/test_rerank.py)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

import ember
from ember_server import ServerProcess
from encoder_models import minilm_gguf, tiny_reranker_gguf

pytestmark = pytest.mark.model

QUERY = "How many people live in Berlin?"
DOCUMENTS = ["Berlin has 3.5 million inhabitants.", "Paris is the capital of France.", "Bread is baked daily.",
             "Berlin", "The Spree flows through Berlin."]


@pytest.fixture(scope="module")
def reference():
    with ember.LLM(tiny_reranker_gguf(), n_threads=2) as llm:
        yield llm.rerank(QUERY, DOCUMENTS)


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("-m", str(tiny_reranker_gguf()), "-t", "2").wait_ready()
    yield process.url
    process.stop()


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/reranking", "/reranking"])
def test_rerank_answers_llama_servers_response(server, reference, path):
    body = httpx.post(f"{server}{path}", json={"query": QUERY, "documents": DOCUMENTS, "model": "tiny"},
                      timeout=60).json()
    assert body["object"] == "list" and body["model"] == "tiny"
    assert [r["index"] for r in body["results"]] == [r["index"] for r in reference]
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]],
                               [r["relevance_score"] for r in reference], atol=1e-5)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(DOCUMENTS)


def test_top_n_keeps_the_best_and_return_documents_adds_their_text(server, reference):
    body = httpx.post(f"{server}/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 2,
                                                  "return_documents": True}, timeout=60).json()
    assert [r["index"] for r in body["results"]] == [r["index"] for r in reference[:2]]
    assert [r["document"]["text"] for r in body["results"]] == [DOCUMENTS[r["index"]] for r in reference[:2]]


def test_tei_form_is_a_list_of_scores(server, reference):
    body = httpx.post(f"{server}/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True},
                      timeout=60).json()
    assert [r["index"] for r in body] == [r["index"] for r in reference]
    np.testing.assert_allclose([r["score"] for r in body], [r["relevance_score"] for r in reference], atol=1e-5)
    assert [r["text"] for r in body] == [DOCUMENTS[r["index"]] for r in reference]


@pytest.mark.parametrize("body, param", [
    ({"documents": ["a"]}, "query"),
    ({"query": "a"}, "documents"),
    ({"query": "a", "documents": []}, "documents"),
    ({"query": "a", "documents": ["b", 3]}, "documents"),
    ({"query": "a", "documents": ["b"], "top_n": -1}, "top_n"),
    ({"query": "a", "documents": ["b"], "texts": ["b"]}, "texts"),
    ({"query": "a", "documents": ["b"], "rank_fields": ["x"]}, "rank_fields"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    response = httpx.post(f"{server}/v1/rerank", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_a_reranker_neither_embeds_nor_generates(server):
    for path, body in (("/v1/embeddings", {"input": "a"}), ("/v1/completions", {"prompt": "a"})):
        response = httpx.post(f"{server}{path}", json=body, timeout=60)
        assert response.status_code == 400 and "is a reranker" in response.json()["error"]["message"]


def test_an_embedding_model_does_not_rerank():
    process = ServerProcess("-m", str(minilm_gguf()), "-t", "1").wait_ready()
    try:
        response = httpx.post(f"{process.url}/v1/rerank", json={"query": "a", "documents": ["b"]}, timeout=60)
        assert response.status_code == 400 and "not a reranker" in response.json()["error"]["message"]
    finally:
        process.stop()
