"""Shared by the tokenizer and chat tests: registry models' metadata and llama.cpp fixtures."""

from __future__ import annotations

import functools
import json

import numpy as np

from ember.gguf import open_gguf
from ember.hub import resolve_model
from ember.tokenizer.tokenizer import Tokenizer
from paths import FIXTURES

REGISTRY_MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m")


@functools.cache
def metadata(model: str) -> dict:
    with open_gguf(resolve_model(model)) as gguf_file:
        return gguf_file.metadata


@functools.cache
def tokenizer(model: str) -> Tokenizer:
    return Tokenizer.from_metadata(metadata(model))


@functools.cache
def llama_cpp_fixture(name: str) -> dict:
    """tokenize-<model>.json (a few strings) or tokenize-corpus-<model>.json (the corpus)."""
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def corpus_cases(model: str, parse_special: bool | None = None) -> list[dict]:
    cases = llama_cpp_fixture(f"tokenize-corpus-{model}")["cases"]
    return [case for case in cases if parse_special is None or case["parse_special"] == parse_special]


def corpus_texts(model: str) -> list[str]:
    return [case["text"] for case in corpus_cases(model, parse_special=False)]


# -- vocabularies of tokenizer kinds no registry model has ------------------------------------------
# llama.cpp's fixtures for them (make_synthetic_vocab_fixtures.py) were made on files holding
# exactly this metadata: a registry model's own, with the tokenizer changed as below.

def qwen35_metadata() -> dict:
    """Qwen2.5's byte-level BPE vocabulary and merges under Qwen3.5's pre-tokenizer."""
    return {**metadata("qwen2.5-coder-0.5b"), "tokenizer.ggml.pre": "qwen35"}


@functools.cache
def gemma4_metadata() -> dict:
    """Gemma 3's vocabulary as Gemma 4's BPE ("gemma4"): every token of two or more characters is
    the merge of the split whose halves are both tokens with the best lesser score, merges ranked
    by the token's score (a deterministic stand-in for Gemma 4's own merges). add_bos_token is
    false, which llama.cpp overrides for Gemma 4."""
    meta = dict(metadata("gemma3-270m"))
    tokens = list(meta["tokenizer.ggml.tokens"])
    scores = np.asarray(meta["tokenizer.ggml.scores"], np.float64)
    types = np.asarray(meta["tokenizer.ggml.token_type"])
    ids = {text: i for i, text in enumerate(tokens)}
    merges = []
    for i in sorted(range(len(tokens)), key=lambda i: (-scores[i], i)):
        text = tokens[i]
        if types[i] != 1 or len(text) < 2 or " " in text:
            continue
        splits = [(min(scores[ids[text[:k]]], scores[ids[text[k:]]]), -k) for k in range(1, len(text))
                  if text[:k] in ids and text[k:] in ids]
        if splits:
            k = -max(splits)[1]
            merges.append(f"{text[:k]} {text[k:]}")
    meta.update({"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.merges": merges,
                 "tokenizer.ggml.add_bos_token": False})
    meta.pop("tokenizer.ggml.scores", None)
    meta.pop("tokenizer.ggml.pre", None)
    return meta
