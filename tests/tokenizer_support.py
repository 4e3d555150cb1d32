"""Shared by the tokenizer and chat tests: registry models' metadata and llama.cpp fixtures."""

from __future__ import annotations

import functools
import json

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
