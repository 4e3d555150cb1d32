"""SentencePiece-style ("llama") tokenization as llama.cpp does it (llm_tokenizer_spm).

The text is cut at special tokens first (ember.special_tokens). Each piece of plain text gets
the space prefix when the vocabulary asks for it, its spaces become "▁", and then, starting
from single characters, the adjacent pair whose concatenation is the highest-scoring token is
merged (ties: the leftmost), until no pair makes a token. A character that is no token becomes
its UTF-8 bytes' <0xXX> tokens.

Nothing is built up front beyond the list of special tokens, so the 262k-token vocabulary of
Gemma 3 costs no start-up time and no memory beyond the vocabulary itself.
"""

from __future__ import annotations

import heapq

import numpy as np

from ember.special_tokens import SpecialTokens
from ember.vocab import UNKNOWN, Vocab

SPACE = "\u2581"  # "▁", SentencePiece's visible space


class SpmEncoder:
    def __init__(self, vocab: Vocab):
        self._token_to_id = vocab.token_to_id
        self._scores = vocab.scores if vocab.scores is not None else np.zeros(vocab.n_vocab, np.float32)
        self._add_space_prefix = vocab.add_space_prefix
        self._special = SpecialTokens(vocab)
        unknown = np.flatnonzero(vocab.attrs & UNKNOWN)
        self._byte_ids = [self._byte_token(b, int(unknown[0]) if unknown.size else 0) for b in range(256)]

    def _byte_token(self, b: int, unknown: int) -> int:
        for text in (f"<0x{b:02X}>", chr(b)):
            token = self._token_to_id.get(text)
            if token is not None:
                return token
        return unknown

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._special.encode(text, parse_special, self._encode_plain)

    def _encode_plain(self, piece: str, out: list[int]) -> None:
        self._encode_text((" " + piece if self._add_space_prefix else piece).replace(" ", SPACE), out)

    def _encode_text(self, text: str, out: list[int]) -> None:
        n = len(text)
        if n == 0:
            return
        start = list(range(n))
        length = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, int]] = []
        token_to_id, scores = self._token_to_id, self._scores

        def try_pair(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            pair = text[start[left]:start[left] + length[left] + length[right]]
            token = token_to_id.get(pair)
            if token is None:
                return
            heapq.heappush(heap, (-float(scores[token]), left, right, len(pair)))

        for i in range(1, n):
            try_pair(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # one of the two has changed since the pair was queued
            length[left] += length[right]
            length[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_pair(prev[left], left)
            try_pair(left, nxt[left])

        # Every merged symbol is a token (a pair is only queued when it makes one), so only a single
        # character can be left without a token: it becomes byte tokens.
        symbol = 0
        while symbol != -1:
            piece = text[start[symbol]:start[symbol] + length[symbol]]
            token = token_to_id.get(piece)
            if token is not None:
                out.append(token)
            else:
                out.extend(self._byte_ids[b] for b in piece.encode("utf-8"))
            symbol = nxt[symbol]
