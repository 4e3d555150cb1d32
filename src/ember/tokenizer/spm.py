"""SentencePiece-style ("llama") tokenization as llama.cpp does it (llm_tokenizer_spm).

The text is cut at special tokens first (ember.special_tokens). Each piece of plain text gets
the space prefix when the vocabulary asks for it, its spaces become "▁", and then, starting
from single characters, the adjacent pair whose concatenation is the highest-scoring token is
merged (ties: the leftmost), until no pair makes a token. A character that is no token becomes
its UTF-8 bytes' <0xXX> tokens.

The merging runs in ember._core.SpmVocab over the vocabulary's native text index (Vocab.index),
so the 262k-token vocabulary of Gemma 3 costs no Python object per token.
"""

from __future__ import annotations

import numpy as np

from ember import _core
from ember.tokenizer.special_tokens import SpecialTokens
from ember.tokenizer.vocab import UNKNOWN, Vocab

SPACE = "\u2581"  # "▁", SentencePiece's visible space


class SpmEncoder:
    def __init__(self, vocab: Vocab):
        scores = vocab.scores if vocab.scores is not None else np.zeros(vocab.n_vocab, np.float32)
        unknown = np.flatnonzero(vocab.attrs & UNKNOWN)
        byte_ids = [self._byte_token(vocab, b, int(unknown[0]) if unknown.size else 0) for b in range(256)]
        self._native = _core.SpmVocab(vocab.index, np.ascontiguousarray(scores, np.float32), byte_ids)
        self._add_space_prefix = vocab.add_space_prefix
        self._special = SpecialTokens(vocab)

    @staticmethod
    def _byte_token(vocab: Vocab, b: int, unknown: int) -> int:
        for text in (f"<0x{b:02X}>", chr(b)):
            token = vocab.find(text)
            if token is not None:
                return token
        return unknown

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._special.encode(text, parse_special, self._encode_plain)

    def _encode_plain(self, piece: str, out: list[int]) -> None:
        out.extend(self._native.encode((" " + piece if self._add_space_prefix else piece).replace(" ", SPACE)))
