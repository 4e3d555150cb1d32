"""ember.tokenizer.wpm: WordPiece ("bert" vocabularies) with llama.cpp's ids."""

from __future__ import annotations

import numpy as np
import pytest
from encoder_models import MINILM, minilm_gguf
from tokenizer_support import llama_cpp_fixture

from ember.gguf import open_gguf
from ember.tokenizer.tokenizer import Tokenizer

CONTROL, NORMAL = 3, 1


def wpm_tokenizer(pieces: list[str], **flags) -> Tokenizer:
    """[PAD] [UNK] [CLS] [SEP] then `pieces` ("▁word" starts a word, "piece" continues one)."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *pieces]
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([CONTROL] * 4 + [NORMAL] * len(pieces), np.int32),
        "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.seperator_token_id": 3,
        "tokenizer.ggml.unknown_token_id": 1, "tokenizer.ggml.padding_token_id": 0,
        **{f"tokenizer.ggml.normalizer.{key}": value for key, value in flags.items()},
    })


def pieces_of(tok: Tokenizer, text: str) -> list[str]:
    return [tok.piece(i) for i in tok.encode(text, add_special=False)]


def test_words_are_cut_into_the_longest_pieces_from_the_left():
    tok = wpm_tokenizer(["▁un", "▁unaff", "aff", "able", "ab", "le"])
    assert pieces_of(tok, "unaffable") == ["▁unaff", "able"]


def test_a_word_with_a_part_that_is_no_token_is_one_unknown_token():
    tok = wpm_tokenizer(["▁un", "▁a"])
    assert pieces_of(tok, "unx a") == ["[UNK]", "▁a"]


def test_cls_first_and_sep_last_whatever_add_bos_and_add_eos_say():
    tok = wpm_tokenizer(["▁a"])
    assert tok.encode("a") == [2, 4, 3]
    assert tok.add_bos and not tok.add_eos


def test_punctuation_ascii_symbols_and_cjk_are_words_of_their_own():
    tok = wpm_tokenizer(["▁a", "▁b", "▁,", "▁$", "▁中", "▁文"])
    assert pieces_of(tok, "a,b$中文") == ["▁a", "▁,", "▁b", "▁$", "▁中", "▁文"]


def test_lowercase_and_accent_stripping_follow_the_file():
    pieces = ["▁cafe", "▁CAFÉ", "▁café"]
    assert pieces_of(wpm_tokenizer(pieces, lowercase=True), "CAFÉ") == ["▁cafe"]
    assert pieces_of(wpm_tokenizer(pieces), "CAFÉ") == ["▁CAFÉ"]
    assert pieces_of(wpm_tokenizer(pieces, lowercase=True, strip_accents=False), "CAFÉ") == ["▁café"]


def test_control_characters_are_dropped_and_whitespace_ends_a_word():
    tok = wpm_tokenizer(["▁ab", "▁c"])
    assert pieces_of(tok, "a\u200bb\x00\u3000c") == ["▁ab", "▁c"]


def test_decode_writes_word_starts_as_spaces():
    tok = wpm_tokenizer(["▁un", "aff", "able", "▁day", "▁."])
    assert tok.decode(tok.encode("unaffable day."), skip_special=True) == " unaffable day."


# -- all-MiniLM-L6-v2 against llama.cpp -----------------------------------------------------------

@pytest.fixture(scope="module")
def minilm() -> Tokenizer:
    with open_gguf(minilm_gguf()) as f:
        return Tokenizer.from_gguf(f)


@pytest.mark.model
def test_ids_equal_llama_cpp_for_the_corpus(minilm):
    cases = llama_cpp_fixture(f"tokenize-corpus-{MINILM}")["cases"]
    wrong = [(c["text"], c["parse_special"]) for c in cases
             if minilm.encode(c["text"], parse_special=c["parse_special"]) != c["ids"]]
    assert len(cases) >= 300
    assert wrong == []


@pytest.mark.model
def test_end_of_generation_ids_equal_llama_cpp(minilm):
    assert sorted(minilm.eog_ids) == llama_cpp_fixture(f"tokenize-corpus-{MINILM}")["eog_ids"]
