"""ember.tokenizer.tokenizer: llama.cpp's token ids for GGUF vocabularies, decoding and streaming."""

from __future__ import annotations

import functools
import json
import struct

import numpy as np
import pytest

from ember import cli
from ember.errors import EmberError
from ember.hub import resolve_model
from ember.tokenizer.pretokenizers import PRE_TOKENIZERS, UNSUPPORTED
from ember.tokenizer.tokenizer import Tokenizer
from tokenizer_support import (
    REGISTRY_MODELS,
    corpus_cases,
    corpus_texts,
    digits_vocab_metadata,
    gemma4_metadata,
    llama_cpp_fixture,
    metadata,
    qwen2_vocab_as,
    qwen35_metadata,
    tokenizer,
    whitespace_vocab_metadata,
)

# -- vocabularies built by hand, for rules that need no model ------------------------------------

SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def spm_metadata(pieces: dict[str, float], **flags) -> dict:
    """A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens, then `pieces`.

    No space prefix unless `flags` asks for one (an explicit add_space_prefix=None leaves the key out).
    """
    flags.setdefault("add_space_prefix", False)
    flags = {key: value for key, value in flags.items() if value is not None}
    tokens = SPM_SPECIALS + BYTE_TOKENS + list(pieces)
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * (3 + 256) + list(pieces.values())
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        **{f"tokenizer.ggml.{key}": value for key, value in flags.items()},
    }


def pieces_of(tok: Tokenizer, text: str) -> list[str]:
    return [tok.piece(i) for i in tok.encode(text, add_special=False)]


def test_spm_merges_the_pair_whose_token_scores_highest():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1, "b": -1, "c": -1, "ab": -3, "bc": -2}))
    assert pieces_of(tok, "abc") == ["a", "bc"]


def test_spm_merge_order_follows_the_scores_not_the_position():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1, "b": -1, "c": -1, "ab": -2, "bc": -3}))
    assert pieces_of(tok, "abc") == ["ab", "c"]


def test_spm_falls_back_to_byte_tokens_for_unknown_characters():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1}))
    assert pieces_of(tok, "aé") == ["a", "<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("aé", add_special=False)) == "aé"


def test_spm_writes_spaces_as_the_visible_space_piece():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1, "▁": -1, "▁a": -2}, add_space_prefix=False))
    assert pieces_of(tok, " a a") == ["▁a", "▁a"]
    assert pieces_of(tok, "a") == ["a"]


def test_spm_space_prefix_is_added_when_the_file_says_so():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1, "▁": -1, "▁a": -2}, add_space_prefix=True))
    assert pieces_of(tok, "a") == ["▁a"]


def test_spm_space_prefix_is_the_default_when_the_file_is_silent():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1, "▁": -1, "▁a": -2}, add_space_prefix=None))
    assert pieces_of(tok, "a") == ["▁a"]


def test_decode_removes_the_space_prefix_encode_added():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1, "▁": -1, "▁a": -2}, add_space_prefix=True))
    assert tok.decode(tok.encode("a a"), skip_special=True) == "a a"


def test_spm_adds_bos_by_default_and_not_when_the_file_says_no():
    assert Tokenizer.from_metadata(spm_metadata({"a": -1})).encode("a") == [1, 259]
    no_bos = Tokenizer.from_metadata(spm_metadata({"a": -1}, add_bos_token=False))
    assert no_bos.encode("a") == [259]


def test_eos_is_appended_when_the_file_says_so():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1}, add_eos_token=True))
    assert tok.encode("a") == [1, 259, 2]
    assert tok.encode("a", add_special=False) == [259]


def test_unknown_pre_tokenizer_is_an_error_naming_it():
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre",
          "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
    with pytest.raises(EmberError, match="no-such-pre"):
        Tokenizer.from_metadata(md)


def test_unknown_tokenizer_model_is_an_error_naming_it():
    md = {"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(EmberError, match="rwkv"):
        Tokenizer.from_metadata(md)


@pytest.mark.parametrize("key, value, match", [
    ("tokenizer.ggml.model", ["gpt2"], "tokenizer.ggml.model must be a string"),
    ("tokenizer.ggml.pre", 3, "tokenizer.ggml.pre must be a string"),
    ("tokenizer.ggml.tokens", np.arange(3), "tokenizer.ggml.tokens must be an array of strings"),
    ("tokenizer.ggml.tokens", 0.5, "tokenizer.ggml.tokens must be an array of strings"),
    ("tokenizer.ggml.merges", "a b", "tokenizer.ggml.merges must be an array of strings"),
    ("tokenizer.ggml.token_type", "", "tokenizer.ggml.token_type must be an array of integers"),
    ("tokenizer.ggml.token_type", np.array([np.inf] * 3), "tokenizer.ggml.token_type must be an array of integers"),
    ("tokenizer.ggml.token_type", np.array([1]), "tokenizer.ggml.token_type has 1 entries for 3 tokens"),
    ("tokenizer.ggml.add_bos_token", np.zeros(3, np.float32), "tokenizer.ggml.add_bos_token must be a bool"),
    ("tokenizer.ggml.eos_token_id", "2", "tokenizer.ggml.eos_token_id must be an integer"),
])
def test_tokenizer_metadata_of_the_wrong_kind_is_an_error_naming_the_key(key, value, match):
    # these used to surface as ValueError, TypeError or OverflowError from numpy
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
          "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"], key: value}
    with pytest.raises(EmberError, match=match):
        Tokenizer.from_metadata(md)


def test_special_ids_outside_the_vocabulary_are_ignored():
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
          "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.bos_token_id": -1, "tokenizer.ggml.eos_token_id": 2**40}
    tok = Tokenizer.from_metadata(md)
    assert (tok.bos_id, tok.eos_id) == (None, None)


def test_a_model_without_a_vocabulary_is_an_error():
    with pytest.raises(EmberError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2"})


def test_gpt2_byte_level_bpe_uses_the_files_merges():
    tokens = ["a", "b", "c", "Ġ", "ab", "abc", "Ġa"]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.merges": ["Ġ a", "a b", "ab c"]}
    tok = Tokenizer.from_metadata(md)
    # the first merge (rank 0) takes "a" away from "b" in the second word
    assert pieces_of(tok, "abc abc") == ["abc", "Ġa", "b", "c"]
    assert tok.decode(tok.encode("abc abc")) == "abc abc"


def test_lone_surrogates_are_encoded_as_the_replacement_character():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1}))
    assert tok.encode("a\ud800a") == tok.encode("a\ufffda")


def gpt2_style(pre: str, tokens: list[str]) -> Tokenizer:
    return Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                                    "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": []})


def test_decode_cleans_spaces_as_llama_cpp_does_for_gpt2_style_vocabularies():
    tokens = ["I", "Ġ'm", "Ġhere", "Ġ,", "Ġyou", "Ġ're", "Ġdon", "Ġ't", "Ġ.", "Ġ'", "Ġx"]
    tok = gpt2_style("gpt-2", tokens)
    # " ," and " ." lose the space, " ' " both, " 'm" and " 're" theirs, " 't" keeps it
    assert tok.decode(range(len(tokens))) == "I'm here, you're don 't.'x"


def test_decode_keeps_spaces_where_the_pre_tokenizer_does_not_clean_them():
    tokens = ["I", "Ġ'm", "Ġ,"]
    assert gpt2_style("qwen2", tokens).decode(range(3)) == "I 'm ,"


@pytest.mark.parametrize("pre", sorted(name for name, pre in PRE_TOKENIZERS.items() if pre.byte_encode))
def test_every_known_pre_tokenizer_builds_and_round_trips(pre):
    alphabet = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [chr(c) for c in range(0xA1, 0x100) if c != 0xAD]
    alphabet += [chr(0x100 + n) for n in range(256 - len(alphabet))]  # GPT-2's bytes_to_unicode
    tok = gpt2_style(pre, alphabet)
    text = "It's 2024: naïve café, 你好 123456 — ok?\n\n  done"
    ids = tok.encode(text, add_special=False)
    assert len(ids) == len(text.encode())  # no merges: one token per byte
    assert tok.decode(ids) == text


def bpe_pieces(tokens: list[str], merges: list[str], text: str) -> list[str]:
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges}
    return pieces_of(Tokenizer.from_metadata(md), text)


def test_bpe_merges_the_lowest_ranked_pair_first():
    assert bpe_pieces(["a", "b", "c", "ab", "bc"], ["b c", "a b"], "abc") == ["a", "bc"]
    assert bpe_pieces(["a", "b", "c", "ab", "bc"], ["a b", "b c"], "abc") == ["ab", "c"]
    # equal pairs: the leftmost merges first
    assert bpe_pieces(["a", "aa"], ["a a"], "aaa") == ["aa", "a"]


def test_a_merge_applies_even_when_its_result_is_no_token():
    # as in llama.cpp (llama-tokenize gives a, b, c here): "b c" merges first, "bc" is no
    # token and no merge joins "a" to it, so it falls back to its bytes' tokens
    assert bpe_pieces(["a", "b", "c", "ab"], ["b c", "a b"], "abc") == ["a", "b", "c"]


def test_a_symbol_that_is_no_token_merges_further_by_its_text():
    assert bpe_pieces(["a", "b", "c", "abc"], ["b c", "a bc"], "abc") == ["abc"]


def test_a_bpe_word_without_its_byte_tokens_keeps_the_tokens_it_has():
    assert bpe_pieces(["a", "c"], [], "abc") == ["a", "c"]


def test_token_ids_outside_the_vocabulary_are_an_error():
    tok = Tokenizer.from_metadata(spm_metadata({"a": -1}))
    with pytest.raises(EmberError, match="outside the vocabulary"):
        tok.decode([tok.n_vocab])


# -- the registry models against llama.cpp -------------------------------------------------------

models = pytest.mark.parametrize("model", REGISTRY_MODELS)


@pytest.mark.model
@models
def test_ids_equal_llama_cpp_for_the_shared_strings(model):
    tok = tokenizer(model)
    cases = llama_cpp_fixture(f"tokenize-{model}")["cases"]
    wrong = [(c["text"], c["parse_special"]) for c in cases
             if tok.encode(c["text"], parse_special=c["parse_special"]) != c["ids"]]
    assert wrong == []


@pytest.mark.model
@models
def test_ids_equal_llama_cpp_for_the_corpus(model):
    tok = tokenizer(model)
    cases = corpus_cases(model)
    wrong = [(c["text"], c["parse_special"]) for c in cases
             if tok.encode(c["text"], parse_special=c["parse_special"]) != c["ids"]]
    assert len(corpus_texts(model)) >= 200
    assert wrong == []


def round_tripped(model: str, text: str) -> str:
    """What llama.cpp gives back for `text`: a SentencePiece vocabulary reads "▁" as a space."""
    return text.replace("\u2581", " ") if metadata(model)["tokenizer.ggml.model"] == "llama" else text


@pytest.mark.model
@models
def test_decode_inverts_encode(model):
    tok = tokenizer(model)
    wrong = [text for text in corpus_texts(model)
             if tok.decode(tok.encode(text, add_special=False)) != round_tripped(model, text)]
    assert wrong == []


@pytest.mark.model
@pytest.mark.parametrize("model, text", [
    ("smollm2-135m", "<|im_start|>user\nhi<|im_end|>"),
    ("qwen2.5-coder-0.5b", "<|im_start|>user\nhi<|im_end|>"),
    ("gemma3-270m", "<start_of_turn>user\nhi<end_of_turn>"),
])
def test_decode_can_skip_bos_and_other_control_tokens(model, text):
    tok = tokenizer(model)
    ids = tok.encode(text, parse_special=True)
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    assert tok.decode(ids).endswith(text)


@pytest.mark.model
@models
def test_token_bytes_of_the_ids_are_the_texts_bytes(model):
    tok = tokenizer(model)
    wrong = [text for text in corpus_texts(model)
             if b"".join(map(tok.token_bytes, tok.encode(text, add_special=False)))
             != round_tripped(model, text).encode()]
    assert wrong == []


@pytest.mark.model
@models
def test_stream_decoder_emits_only_whole_characters(model):
    tok = tokenizer(model)
    for text in corpus_texts(model):
        stream = tok.stream_decoder()
        chunks = [stream.feed(i) for i in tok.encode(text, add_special=False)] + [stream.flush()]
        assert "".join(chunks) == round_tripped(model, text)
        assert not any("\ufffd" in chunk for chunk in chunks) or "\ufffd" in text


@pytest.mark.model
def test_stream_decoder_holds_back_a_character_split_across_tokens():
    tok = tokenizer("smollm2-135m")
    ids = tok.encode("🤖", add_special=False)
    assert len(ids) > 1  # the emoji's four bytes are spread over several tokens
    stream = tok.stream_decoder()
    assert [stream.feed(i) for i in ids] == [""] * (len(ids) - 1) + ["🤖"]


@pytest.mark.model
def test_stream_decoder_flush_marks_an_unfinished_character():
    tok = tokenizer("smollm2-135m")
    stream = tok.stream_decoder()
    assert stream.feed(tok.encode("🤖", add_special=False)[0]) == ""
    assert stream.flush() == "\ufffd"


@pytest.mark.model
def test_stream_decoder_can_skip_control_tokens():
    tok = tokenizer("qwen2.5-coder-0.5b")
    stream = tok.stream_decoder(skip_special=True)
    ids = tok.encode("<|im_start|>hi<|im_end|>", parse_special=True)
    assert "".join(stream.feed(i) for i in ids) + stream.flush() == "hi"


@pytest.mark.model
@models
def test_end_of_generation_ids_equal_llama_cpp(model):
    assert sorted(tokenizer(model).eog_ids) == llama_cpp_fixture(f"tokenize-corpus-{model}")["eog_ids"]


@pytest.mark.model
@models
def test_bos_and_eos_ids_are_the_files(model):
    tok, md = tokenizer(model), metadata(model)
    assert (tok.bos_id, tok.eos_id) == (md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"])
    assert tok.eos_id in tok.eog_ids


@pytest.mark.model
def test_bos_is_added_only_where_the_file_asks():
    gemma, smollm = tokenizer("gemma3-270m"), tokenizer("smollm2-135m")
    assert metadata("gemma3-270m")["tokenizer.ggml.add_bos_token"] is True
    assert gemma.encode("Hi")[0] == gemma.bos_id
    assert gemma.encode("Hi", add_special=False)[0] != gemma.bos_id
    assert metadata("smollm2-135m")["tokenizer.ggml.add_bos_token"] is False
    assert smollm.encode("Hi") == smollm.encode("Hi", add_special=False)


@pytest.mark.model
def test_special_token_text_is_one_token_only_with_parse_special():
    tok = tokenizer("qwen2.5-coder-0.5b")
    im_end = list(metadata("qwen2.5-coder-0.5b")["tokenizer.ggml.tokens"]).index("<|im_end|>")
    assert tok.encode("<|im_end|>", parse_special=True) == [im_end]
    assert im_end not in tok.encode("<|im_end|>")
    assert tok.is_special(im_end)


@pytest.mark.model
def test_user_defined_tokens_are_recognised_without_parse_special():
    tok = tokenizer("gemma3-270m")
    tokens = list(metadata("gemma3-270m")["tokenizer.ggml.tokens"])
    types = metadata("gemma3-270m")["tokenizer.ggml.token_type"]
    blank_lines = tokens.index("\n\n")
    assert types[blank_lines] == 4  # USER_DEFINED
    assert blank_lines in tok.encode("a\n\nb")
    assert not tok.is_special(blank_lines)


@pytest.mark.model
@models
def test_piece_is_the_vocabulary_entry(model):
    tok, tokens = tokenizer(model), metadata(model)["tokenizer.ggml.tokens"]
    sample = range(0, tok.n_vocab, 997)
    assert [tok.piece(i) for i in sample] == [tokens[i] for i in sample]
    assert tok.n_vocab == len(tokens)


# -- ember tokenize ------------------------------------------------------------------------------

def run_cli(capsys, *argv) -> str:
    assert cli.main(["tokenize", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.model
def test_cli_ids_prints_llama_cpps_ids_as_json(capsys):
    path = str(resolve_model("gemma3-270m"))
    case = llama_cpp_fixture("tokenize-gemma3-270m")["cases"][0]
    assert json.loads(run_cli(capsys, "-m", path, "--ids", case["text"])) == case["ids"]


@pytest.mark.model
def test_cli_no_bos_and_parse_special(capsys):
    path = str(resolve_model("qwen2.5-coder-0.5b"))
    case = next(c for c in llama_cpp_fixture("tokenize-qwen2.5-coder-0.5b")["cases"] if c["parse_special"])
    out = run_cli(capsys, "-m", path, "--ids", "--parse-special", "--no-bos", case["text"])
    assert json.loads(out) == case["ids"]
    gemma = str(resolve_model("gemma3-270m"))
    with_bos = json.loads(run_cli(capsys, "-m", gemma, "--ids", "Hi"))
    assert json.loads(run_cli(capsys, "-m", gemma, "--ids", "--no-bos", "Hi")) == with_bos[1:]


@pytest.mark.model
def test_cli_table_lists_each_id_with_its_text(capsys):
    path = str(resolve_model("smollm2-135m"))
    lines = run_cli(capsys, "-m", path, "Hello world\n").splitlines()
    assert lines[0].split() == ["id", "piece"]
    rows = [line.split(maxsplit=1) for line in lines[1:]]
    tok = tokenizer("smollm2-135m")
    assert [int(token_id) for token_id, _ in rows] == tok.encode("Hello world\n")
    assert [json.loads(text) for _, text in rows] == ["Hello", " world", "\n"]


def test_the_native_vocabulary_checks_every_offset_and_length():
    from ember import _core
    from ember.gguf.strings import string_table

    assert _core.TextIndex(*string_table(["dup", "x", "dup"])).find("dup") == 2  # the last, as llama.cpp
    raw, fields = string_table(["a", "", "b"])
    index = _core.TextIndex(raw, fields)
    assert (len(index), index.find("b"), index.find("[EMPTY_1]"), index.find("c")) == (3, 2, 1, -1)
    merges, merge_fields = string_table(["a b"])
    assert _core.BpeVocab(index, merges, merge_fields, False).n_merges == 1
    for bad in ([0, len(raw)], [0, -1], [0, len(raw) - 8], [0, 2**40]):
        with pytest.raises(ValueError, match="tokenizer.ggml.tokens element 1"):
            _core.TextIndex(raw, np.array(bad, np.int64))
    long = raw[:9] + struct.pack("<Q", 2) + b"b"  # a length one byte past the end
    with pytest.raises(ValueError, match="past the array's end"):
        _core.TextIndex(long, fields[:2])
    with pytest.raises(ValueError, match="tokenizer.ggml.merges element 0"):
        _core.BpeVocab(index, merges[:5], merge_fields, False)
    with pytest.raises(ValueError, match="empty"):
        _core.TextIndex(b"", np.empty(0, np.int64))
    scores = np.zeros(3, np.float32)
    assert _core.SpmVocab(index, scores, [0] * 256).encode("ab") == [0, 2]
    with pytest.raises(ValueError, match="2 scores for 3 tokens"):
        _core.SpmVocab(index, scores[:2], [0] * 256)
    with pytest.raises(ValueError, match="byte token id out of range"):
        _core.SpmVocab(index, scores, [3] * 256)
    with pytest.raises(ValueError, match="256 entries"):
        _core.SpmVocab(index, scores, [0] * 255)


def test_the_native_substring_set_finds_what_python_finds():
    import random

    from ember import _core

    rng = random.Random(5)
    alphabet = "ab<>|é▁\n"
    strings = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(300)})
    strings += ["", strings[3]]  # an empty string is never present; a repeated one is found once
    matcher = _core.SubstringSet(strings)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        expected = sorted({strings.index(s) for s in strings if s and s in text})
        assert matcher.present(text) == expected


# -- every pre-tokenizer llama.cpp knows; Qwen3.5's and Gemma 4's against llama.cpp ------------------

def test_every_pre_tokenizer_llama_cpp_knows_is_ember_s_or_refused_by_name():
    names = llama_cpp_fixture("llama_cpp_pre_tokenizers")["names"]
    assert len(names) >= 90
    assert [name for name in names if name not in PRE_TOKENIZERS and name not in UNSUPPORTED] == []
    for name in UNSUPPORTED:
        md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": name,
              "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
        with pytest.raises(EmberError, match=f"tokenizer.ggml.pre={name!r} .*llama.cpp knows but ember does not"):
            Tokenizer.from_metadata(md)


DIGIT_GROUPING = ("tiny_aya", "afmoe", "superbpe")
SYNTHETIC = {"qwen35-vocab": qwen35_metadata, "gemma4-vocab": gemma4_metadata,
             **{f"{pre}-vocab": functools.partial(qwen2_vocab_as, pre) for pre in DIGIT_GROUPING},
             **{f"{pre}-digits": functools.partial(digits_vocab_metadata, pre) for pre in DIGIT_GROUPING},
             "whitespace-vocab": whitespace_vocab_metadata}


@pytest.mark.model
@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_vocabularies_ids_equal_llama_cpp_for_the_corpus(name):
    """Qwen3.5's and Gemma 4's tokenizers, the digit-grouping pre-tokenizers (tiny_aya, afmoe,
    superbpe) on Qwen2.5's vocabulary and on one whose digit groups merge, and the whitespace BPE."""
    tok = Tokenizer.from_metadata(SYNTHETIC[name]())
    cases = llama_cpp_fixture(f"tokenize-corpus-{name}")["cases"]
    wrong = [(c["text"], c["parse_special"]) for c in cases
             if tok.encode(c["text"], parse_special=c["parse_special"]) != c["ids"]]
    assert len(cases) >= 300
    assert wrong == []
    assert sorted(tok.eog_ids) == llama_cpp_fixture(f"tokenize-corpus-{name}")["eog_ids"]


@pytest.mark.model
def test_gemma4_always_adds_bos_and_decodes_its_spaces():
    tok = Tokenizer.from_metadata(gemma4_metadata())
    ids = tok.encode("Hello world, naïve 😀\n\n")
    assert ids[0] == tok.bos_id and tok.add_bos  # though the file says add_bos_token = false
    assert tok.decode(ids, skip_special=True) == "Hello world, naïve 😀\n\n"


def gemma4_style(tokens: list[str], merges: list[str]) -> Tokenizer:
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": ["<pad>", "<bos>", *bytes_, *tokens],
        "tokenizer.ggml.token_type": np.array([3, 3] + [6] * 256 + [1] * len(tokens), np.int32),
        "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1})


def test_gemma4_merges_characters_not_bytes_and_falls_back_to_byte_tokens():
    tok = gemma4_style(["\u2581", "é", "t", "\u2581é", "\u2581ét"], ["\u2581 é", "\u2581é t"])
    assert pieces_of(tok, " étx") == ["\u2581ét", "<0x78>"]


def test_gemma4_keeps_a_run_of_newlines_that_is_a_token_whole():
    tok = gemma4_style(["\n", "\n\n\n"], [])
    assert pieces_of(tok, "\n\n\n") == ["\n\n\n"] and pieces_of(tok, "\n\n") == ["\n", "\n"]
