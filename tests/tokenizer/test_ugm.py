"""ember.tokenizer.ugm: the Unigram tokenizer ("t5" vocabularies: XLM-RoBERTa, T5) with llama.cpp's ids."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tokenizer_support import UNIGRAM_MODEL, llama_cpp_fixture, unigram_metadata

from ember.errors import EmberError
from ember.tokenizer.tokenizer import Tokenizer

CONTROL, NORMAL, UNKNOWN, USER_DEFINED, UNUSED = 3, 1, 2, 4, 5
VARIANTS = ("xlm-roberta", "spaces", "user")


def ugm_tokenizer(pieces: dict[str, float], user: tuple[str, ...] = (), unused: dict[str, float] | None = None,
                  charsmap: bytes | None = None, **flags) -> Tokenizer:
    """<pad> </s> <unk> (T5's ids), then `pieces` with their scores, `user` tokens and `unused` ones."""
    unused = unused or {}
    tokens = ["<pad>", "</s>", "<unk>", *pieces, *user, *unused]
    types = [CONTROL, CONTROL, UNKNOWN] + [NORMAL] * len(pieces) + [USER_DEFINED] * len(user) + [UNUSED] * len(unused)
    scores = [0.0] * 3 + list(pieces.values()) + [-100.0] * len(user) + list(unused.values())
    meta = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array(scores, np.float32),
            "tokenizer.ggml.token_type": np.array(types, np.int32),
            **{f"tokenizer.ggml.{key}": value for key, value in flags.items()}}
    if charsmap is not None:
        meta["tokenizer.ggml.precompiled_charsmap"] = np.frombuffer(charsmap, np.uint8)
    return Tokenizer.from_metadata(meta)


def pieces_of(tok: Tokenizer, text: str) -> list[str]:
    return [tok.piece(i) for i in tok.encode(text, add_special=False)]


def test_the_segmentation_whose_scores_sum_highest_wins():
    tok = ugm_tokenizer({"a": -1.0, "b": -1.0, "ab": -3.0, "abc": -2.5, "c": -1.0})
    assert pieces_of(tok, "ab") == ["a", "b"]  # -2 beats -3
    assert pieces_of(tok, "abc") == ["abc"]  # -2.5 beats -3
    assert pieces_of(tok, "abab") == ["a", "b", "a", "b"]


def test_of_equal_sums_the_one_found_first_stays():
    tok = ugm_tokenizer({"a": -1.0, "b": -1.0, "ab": -2.0})
    assert pieces_of(tok, "ab") == ["ab"]  # found from offset 0; "a" "b" sums the same from offset 1


def test_characters_with_no_token_become_one_unknown_token_per_run():
    tok = ugm_tokenizer({"a": -1.0, "b": -2.0})
    assert tok.encode("axyzb", add_special=False) == [3, 2, 4]
    assert tok.encode("x", add_special=False) == [2]


def test_unknown_scores_the_lowest_normal_score_less_ten():
    # unknown: -2 - 10 = -12, so "a" then an unknown "b" sums to -13; unused tokens are matched
    # with their scores but set no minimum
    normal = {"a": -1.0, "c": -2.0}
    assert pieces_of(ugm_tokenizer(normal, unused={"ab": -12.5}), "ab") == ["ab"]
    assert pieces_of(ugm_tokenizer(normal, unused={"ab": -13.5}), "ab") == ["a", "<unk>"]


def test_spaces_are_escaped_and_the_file_says_whether_runs_merge_and_a_prefix_goes_first():
    pieces = {"\u2581": -3.0, "\u2581a": -1.0, "a": -1.5, "\u2581b": -1.0, "b": -1.5}
    assert pieces_of(ugm_tokenizer(pieces, remove_extra_whitespaces=True), "  a   b ") == ["\u2581a", "\u2581b"]
    assert pieces_of(ugm_tokenizer(pieces), " a  b") == ["\u2581a", "\u2581", "\u2581b"]
    assert pieces_of(ugm_tokenizer(pieces), "ab") == ["a", "b"]
    assert pieces_of(ugm_tokenizer(pieces, add_space_prefix=True), "ab") == ["\u2581a", "b"]
    assert pieces_of(ugm_tokenizer(pieces, add_space_prefix=True), " a") == ["\u2581", "\u2581a"]


def test_user_defined_tokens_are_always_cut_out_and_score_zero():
    tok = ugm_tokenizer({"a": -1.0, "b": -1.0}, user=("ab", "<x>"))
    assert pieces_of(tok, "ab<x>a") == ["ab", "<x>", "a"]


def test_the_precompiled_charsmap_normalizes_before_segmentation():
    tok = Tokenizer.from_metadata(unigram_metadata())
    assert tok.encode("ＨＥＬＬＯ ﬁx", add_special=False) == tok.encode("HELLO fix", add_special=False)


def test_a_prefix_of_a_user_defined_token_is_not_normalized():
    # llama.cpp keeps the longest prefix of a user-defined token as it is: "ｶﾀｶﾅ" (half-width,
    # which the charsmap would make "カタカナ") begins the user-defined "ｶﾀｶﾅ!"
    user = Tokenizer.from_metadata(unigram_metadata("user"))
    plain = Tokenizer.from_metadata(unigram_metadata("spaces"))
    assert [user.piece(i) for i in user.encode("ｶﾀｶﾅ!", add_special=False)] == ["ｶﾀｶﾅ!"]
    assert [user.piece(i) for i in user.encode("ｶﾀｶﾅ ", add_special=False)] == ["\u2581", "<unk>", "\u2581"]
    assert plain.encode("ｶﾀｶﾅ ", add_special=False) == plain.encode("カタカナ ", add_special=False)


def test_eos_is_added_and_bos_only_where_the_file_says():
    tok = ugm_tokenizer({"a": -1.0})
    assert tok.encode("a") == [3, 1]  # llama.cpp's defaults for "t5": no BOS, EOS </s> (id 1)
    tok = Tokenizer.from_metadata(unigram_metadata())
    assert tok.encode("") == [0, 2]  # XLM-RoBERTa's <s> ... </s>


def test_a_charsmap_with_no_rules_changes_nothing():
    tok = ugm_tokenizer({"a": -1.0, "\uff41": -1.0}, charsmap=struct.pack("<I", 0) + b"\0")
    assert pieces_of(tok, "a\uff41") == ["a", "\uff41"]


def test_a_malformed_charsmap_is_an_error():
    with pytest.raises(EmberError, match="precompiled_charsmap"):
        ugm_tokenizer({"a": -1.0}, charsmap=struct.pack("<I", 100) + b"\0" * 8)
    with pytest.raises(EmberError, match="precompiled_charsmap"):
        ugm_tokenizer({"a": -1.0}, charsmap=b"\1")


# -- unigram.model, its vocabulary as the XLM-RoBERTa converters write it, against llama.cpp --------

@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> tuple[str, Tokenizer]:
    return request.param, Tokenizer.from_metadata(unigram_metadata(request.param))


def test_ids_equal_llama_cpp_for_the_corpus(variant):
    name, tok = variant
    cases = llama_cpp_fixture(f"tokenize-corpus-unigram-{name}")["cases"]
    wrong = [(c["text"], c["parse_special"]) for c in cases
             if tok.encode(c["text"], parse_special=c["parse_special"]) != c["ids"]]
    assert len(cases) >= 300
    assert wrong == []


def test_end_of_generation_ids_equal_llama_cpp(variant):
    name, tok = variant
    assert sorted(tok.eog_ids) == llama_cpp_fixture(f"tokenize-corpus-unigram-{name}")["eog_ids"]


def test_decode_gives_sentencepieces_text():
    """Decoding the corpus' ids (those with no unknown token, which SentencePiece writes " ⁇ ")
    gives the text SentencePiece decodes the same pieces to."""
    sentencepiece = pytest.importorskip("sentencepiece")
    processor = sentencepiece.SentencePieceProcessor(model_file=str(UNIGRAM_MODEL))
    tok = Tokenizer.from_metadata(unigram_metadata())
    cases = [c for c in llama_cpp_fixture("tokenize-corpus-unigram-xlm-roberta")["cases"] if not c["parse_special"]]
    decoded = 0
    for case in cases:
        ids = case["ids"][1:-1]  # without <s> and </s>
        if 3 in ids:
            continue
        assert tok.decode(case["ids"], skip_special=True) == processor.decode([i - 1 for i in ids]), case["text"]
        decoded += 1
    assert decoded >= 250


def test_the_vocabulary_is_what_llama_cpps_converter_writes(tmp_path):
    """unigram_metadata's tokenizer keys are those llama.cpp's converter writes for the tiny
    XLM-RoBERTa of tests/models/test_xlm_roberta.py (its record, llama_cpp_convert/xlm-roberta.json)."""
    pytest.importorskip("gguf")
    from converter_record import load_record, summary

    from ember.gguf import GGUFWriter

    writer = GGUFWriter(tmp_path / "vocab.gguf", "bert")
    for key, value in unigram_metadata().items():
        if key != "general.architecture":
            writer.add(key, value)
    ours = summary(writer.write(), tokenizer=True)["metadata"]
    theirs = {key: value for key, value in load_record("xlm-roberta")["metadata"].items() if key.startswith("tokenizer.")}
    assert ours == theirs
