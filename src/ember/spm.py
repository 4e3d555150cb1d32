"""SentencePiece-style ("llama") tokenization as llama.cpp does it (llm_tokenizer_spm).

The text is cut at special tokens first (user-defined tokens always, control tokens only with
parse_special; longest token text first, as llama.cpp's tokenizer_st_partition). Each piece of
plain text gets the space prefix when the vocabulary asks for it, its spaces become "▁", and
then, starting from single characters, the adjacent pair whose concatenation is the
highest-scoring token is merged (ties: the leftmost), until no pair makes a token. A character
that is no token becomes its UTF-8 bytes' <0xXX> tokens.

Nothing is built up front beyond the list of special tokens, so the 262k-token vocabulary of
Gemma 3 costs no start-up time and no memory beyond the vocabulary itself.
"""

from __future__ import annotations

import heapq

import numpy as np

from ember.vocab import CONTROL, UNKNOWN, USER_DEFINED, Vocab

SPACE = "\u2581"  # "▁", SentencePiece's visible space


class SpmEncoder:
    def __init__(self, vocab: Vocab):
        self._token_to_id = vocab.token_to_id
        self._scores = vocab.scores if vocab.scores is not None else np.zeros(vocab.n_vocab, np.float32)
        self._add_space_prefix = vocab.add_space_prefix
        special = np.flatnonzero(vocab.attrs & (CONTROL | USER_DEFINED | UNKNOWN))
        # (text, always recognised), longest text first; a stable sort keeps id order on ties.
        ids = sorted(special.tolist(), key=lambda i: -len(vocab.tokens[i].encode("utf-8")))
        # text -> (rank in that order, id, recognised without parse_special)
        self._special = {vocab.tokens[i]: (rank, self._token_to_id[vocab.tokens[i]], not vocab.attrs[i] & (CONTROL | UNKNOWN))
                         for rank, i in enumerate(ids) if vocab.tokens[i]}
        self._by_prefix: dict[bool, dict[str, tuple[set[str], list[int]]]] = {}
        unknown = np.flatnonzero(vocab.attrs & UNKNOWN)
        self._byte_ids = [self._byte_token(b, int(unknown[0]) if unknown.size else 0) for b in range(256)]

    def _byte_token(self, b: int, unknown: int) -> int:
        for text in (f"<0x{b:02X}>", chr(b)):
            token = self._token_to_id.get(text)
            if token is not None:
                return token
        return unknown

    def encode(self, text: str, parse_special: bool) -> list[int]:
        ids: list[int] = []
        for piece in self._partition(text, parse_special):
            if isinstance(piece, int):
                ids.append(piece)
            else:
                self._encode_text((" " + piece if self._add_space_prefix else piece).replace(" ", SPACE), ids)
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """The text cut into plain strings and special token ids: each special token that occurs,
        in llama.cpp's order (longest first), cuts every plain piece at each of its occurrences."""
        pieces: list[str | int] = [text] if text else []
        for token_text in self._present(text, parse_special):
            token_id = self._special[token_text][1]
            cut: list[str | int] = []
            for piece in pieces:
                if isinstance(piece, int) or token_text not in piece:
                    cut.append(piece)
                    continue
                for k, part in enumerate(piece.split(token_text)):
                    if k:
                        cut.append(token_id)
                    if part:
                        cut.append(part)
            pieces = cut
        return pieces

    def _present(self, text: str, parse_special: bool) -> list[str]:
        """The special tokens that occur in text, in partition order: each place where a token's
        first two characters occur is checked for the tokens of each length that start so."""
        present = set()
        for prefix, (texts, lengths) in self._groups(parse_special).items():
            start = text.find(prefix)
            while start != -1:
                present.update(t for t in (text[start:start + n] for n in lengths) if t in texts)
                start = text.find(prefix, start + 1)
        return sorted(present, key=lambda t: self._special[t][0])

    def _groups(self, parse_special: bool) -> dict[str, tuple[set[str], list[int]]]:
        """Special token texts by their first two characters, with their lengths."""
        if parse_special not in self._by_prefix:
            groups: dict[str, tuple[set[str], set[int]]] = {}
            for t, (_, _, always) in self._special.items():
                if always or parse_special:
                    texts, lengths = groups.setdefault(t[:2], (set(), set()))
                    texts.add(t)
                    lengths.add(len(t))
            self._by_prefix[parse_special] = {k: (texts, sorted(lengths)) for k, (texts, lengths) in groups.items()}
        return self._by_prefix[parse_special]

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
