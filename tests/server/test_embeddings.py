"""`/v1/embeddings` as its users see it: a real `ember serve` of all-MiniLM-L6-v2, spoken to with
the official openai client (which asks for base64 unless told otherwise) and with raw httpx. The
oracle is ember's Python API (LLM.embed, one text at a time)."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

import ember
from ember_server import ServerProcess
from encoder_models import minilm_gguf

pytestmark = pytest.mark.model

TEXTS = [f"Sentence number {i} is about {topic}." for i, topic in
         enumerate(["cats", "dogs", "the sea", "mountains", "bread", "trains", "music", "rain"] * 4)]


@pytest.fixture(scope="module")
def reference():
    with ember.LLM(minilm_gguf(), n_threads=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("-m", str(minilm_gguf()), "-t", "2").wait_ready()
    yield process.url
    process.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_batch_of_texts_embeds_as_each_text_alone(client, reference):
    response = client.embeddings.create(input=TEXTS, model="minilm")  # base64 on the wire, decoded by the client
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    got = np.array([d.embedding for d in response.data])
    expected = np.array([reference.embed(text) for text in TEXTS])
    np.testing.assert_allclose(got, expected, atol=2e-6)
    assert response.usage.prompt_tokens == sum(len(reference.tokenize(t)) for t in TEXTS)
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_float_encoding_is_a_list_of_numbers(server, reference):
    body = httpx.post(f"{server}/v1/embeddings", json={"input": "a cat", "encoding_format": "float"}, timeout=60).json()
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(body["data"][0]["embedding"], reference.embed("a cat"), atol=2e-6)


def test_token_ids_are_inputs_too(client, reference):
    ids = reference.tokenize("a cat")
    response = client.embeddings.create(input=[ids], model="minilm", encoding_format="float")
    np.testing.assert_allclose(response.data[0].embedding, reference.embed("a cat"), atol=2e-6)


def test_dimensions_are_refused_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(input="a cat", model="minilm", dimensions=64)
    assert error.value.body["param"] == "dimensions" and "dimensions" in error.value.body["message"]


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "word " * 600}, "input"),  # past the model's 512 positions
    ({"input": "a", "pooling": "cls"}, "pooling"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    response = httpx.post(f"{server}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_an_embedding_model_does_not_generate(server):
    response = httpx.post(f"{server}/v1/completions", json={"prompt": "Hello"}, timeout=60)
    assert response.status_code == 400 and "embedding model" in response.json()["error"]["message"]
