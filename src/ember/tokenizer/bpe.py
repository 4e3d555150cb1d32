"""Byte-level BPE ("gpt2" vocabularies) with llama.cpp's ids (llm_tokenizer_bpe); also the BPE of
Gemma 4 ("gemma4"): spaces written "▁", merges over the raw UTF-8 characters, <0xXX> byte tokens;
and the "whitespace" BPE (jina-embeddings-v2-base-zh): the text's runs between whitespace (which is
dropped), lower-cased where the file says, merged over the raw UTF-8 characters.

The text is cut at special tokens first (ember.special_tokens); each plain piece is split into
words by the regexes that tokenizer.ggml.pre names (`tokenizers`' Split pre-tokenizers, one
after another, matches and the text between them both kept), and each word is merged by
ember._core.BpeVocab: GPT-2's byte-to-character mapping, then the file's merges by rank. The
vocabulary (Vocab.index) and merges go to native code as the GGUF string arrays they are stored
as, so no Python object is made per token or merge (a 50k vocabulary costs ~3 MB there).
"""

from __future__ import annotations

from tokenizers import Regex, pre_tokenizers

from ember import _core
from ember.gguf.strings import string_table
from ember.tokenizer.special_tokens import SpecialTokens
from ember.tokenizer.spm import SPACE
from ember.tokenizer.vocab import Vocab
from ember.tokenizer.wpm import WHITESPACE, simple_lower


class BpeEncoder:
    def __init__(self, vocab: Vocab):
        merges, merge_fields = string_table(vocab.merges)
        self._native = _core.BpeVocab(vocab.index, merges, merge_fields, vocab.pre.ignore_merges,
                                      vocab.pre.byte_encode)
        self._escape_whitespace = vocab.pre.escape_whitespace
        self._drop_whitespace, self._lowercase = vocab.drop_whitespace, vocab.lowercase
        self._special = SpecialTokens(vocab)
        self._split = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(regex), "isolated") for regex in vocab.pre.regexes])

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._special.encode(text, parse_special, self._encode_plain)

    def _encode_plain(self, text: str, out: list[int]) -> None:
        if self._escape_whitespace:
            text = text.replace(" ", SPACE)
        pieces = whitespace_runs(text, self._lowercase) if self._drop_whitespace else [text]
        out.extend(self._native.encode([word for piece in pieces for word, _ in self._split.pre_tokenize_str(piece)]))


def whitespace_runs(text: str, lowercase: bool) -> list[str]:
    """The runs of text between whitespace (llama.cpp's set), each character lower-cased where asked
    (simple case mapping), as llama.cpp's whitespace session cuts them."""
    runs, current = [], []
    for char in text:
        if ord(char) in WHITESPACE:
            if current:
                runs.append("".join(current))
                current = []
        else:
            current.append(simple_lower(char) if lowercase else char)
    if current:
        runs.append("".join(current))
    return runs
