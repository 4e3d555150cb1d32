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


def qwen2_vocab_as(pre: str) -> dict:
    """Qwen2.5's byte-level BPE vocabulary and merges under another pre-tokenizer."""
    return {**metadata("qwen2.5-coder-0.5b"), "tokenizer.ggml.pre": pre}


def digits_vocab_metadata(pre: str) -> dict:
    """A byte-level BPE vocabulary in which digit groups merge (every 2- and 3-digit string is a
    token, built left to right) and a letter merges with a following digit (a1 ... z9, before any
    digit merge): token ids then show where a pre-tokenizer cuts runs of digits and what it joins
    to them. GPT-2's 256
    byte characters first; pre is tokenizer.ggml.pre."""
    from ember.tokenizer.tokenizer import _byte_level_alphabet

    tokens = sorted(_byte_level_alphabet(), key=_byte_level_alphabet().get)
    merges = []
    digits = "0123456789"
    for letter in "abcdefghijklmnopqrstuvwxyz":  # first: they outrank the digit merges
        for d in digits:
            merges.append(f"{letter} {d}")
            tokens.append(letter + d)
    for a in digits:
        for b in digits:
            merges.append(f"{a} {b}")
            tokens.append(a + b)
    for a in digits:
        for b in digits:
            for c in digits:
                merges.append(f"{a}{b} {c}")
                tokens.append(a + b + c)
    return {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.ones(len(tokens), np.int32),
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
            "tokenizer.ggml.add_bos_token": False}


def whitespace_vocab_metadata() -> dict:
    """A "whitespace" BPE vocabulary (jina-embeddings-v2-base-zh's kind) over the tokenizer corpus:
    every character of the corpus but whitespace is a token, and the letters of each of its ASCII
    words merge left to right into the word (the first 400 words' merges)."""
    import re

    from fixtures.tokenizer_corpus import corpus

    texts = corpus()
    chars = sorted({c for text in texts for c in text if not c.isspace() and c != "\x00"})  # llama.cpp reads no NUL token
    tokens, merges = list(chars), []
    known = set(tokens)
    words = [w for text in texts for w in re.findall(r"[A-Za-z]{2,}", text)]
    for word in list(dict.fromkeys(words))[:400]:
        for k in range(2, len(word) + 1):
            if word[:k] not in known:
                merges.append(f"{word[:k - 1]} {word[k - 1]}")
                tokens.append(word[:k])
                known.add(word[:k])
    return {"general.architecture": "llama", "tokenizer.ggml.model": "whitespace", "tokenizer.ggml.pre": "whitespace",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.ones(len(tokens), np.int32),
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.add_bos_token": False}


UNIGRAM_MODEL = FIXTURES / "unigram.model"
UNIGRAM_N_VOCAB = 1629  # the XLM-RoBERTa ids of its 1627 pieces (fairseq's, one later from 3 on) and <mask>
# the user-defined tokens of unigram_metadata("user"): one the corpus holds, and one that only
# begins as corpus text does ("ｶﾀｶﾅ " there), whose prefix llama.cpp keeps from the charsmap
UNIGRAM_USER_TOKENS = ("ing", "ｶﾀｶﾅ!")


def unigram_metadata(variant: str = "xlm-roberta") -> dict:
    """A "t5" (Unigram) vocabulary, from unigram.model (make_unigram_model.py) as llama.cpp's
    converter writes it for an XLMRobertaModel of UNIGRAM_N_VOCAB ids (its tokenizer keys, recorded
    in llama_cpp_convert/xlm-roberta.json: tests/models/test_xlm_roberta.py), <s> and </s> around
    the text, </s></s> between two. Variants: "xlm-roberta" as written (dummy prefix, extra
    whitespace removed, the nmt_nfkc charsmap); "spaces": no space prefix, spaces kept;
    "user": spaces kept, the UNIGRAM_USER_TOKENS user-defined (the first retyped, the second added)."""
    from ember.convert.vocab import _xlm_roberta_vocab

    import shutil
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(UNIGRAM_MODEL, Path(folder) / "sentencepiece.bpe.model")
        meta = _xlm_roberta_vocab(Path(folder), UNIGRAM_N_VOCAB, {})
    meta.update({"general.architecture": "bert", "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2,
                 "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.seperator_token_id": 2,
                 "tokenizer.ggml.padding_token_id": 1, "tokenizer.ggml.mask_token_id": UNIGRAM_N_VOCAB - 1,
                 "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True,
                 "tokenizer.ggml.add_sep_token": True})
    if variant in ("spaces", "user"):
        meta["tokenizer.ggml.add_space_prefix"] = variant == "user"
        meta["tokenizer.ggml.remove_extra_whitespaces"] = False
    if variant == "user":
        tokens, types = list(meta["tokenizer.ggml.tokens"]), meta["tokenizer.ggml.token_type"].copy()
        retyped, added = UNIGRAM_USER_TOKENS
        types[tokens.index(retyped)] = 4
        meta["tokenizer.ggml.tokens"] = tokens + [added]
        meta["tokenizer.ggml.token_type"] = np.append(types, np.int32(4))
        meta["tokenizer.ggml.scores"] = np.append(meta["tokenizer.ggml.scores"], np.float32(0))
    if variant not in ("xlm-roberta", "spaces", "user"):
        raise ValueError(f"no unigram vocabulary variant {variant!r}")
    return meta
