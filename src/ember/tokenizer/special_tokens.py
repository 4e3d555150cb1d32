"""Special tokens cut text before it is tokenized, as llama.cpp's tokenizer_st_partition does.

User-defined tokens are always recognised, control (and unknown) tokens only with parse_special.
Longest token text first: each special token that occurs cuts every plain piece at each of its
occurrences, and the pieces in between go on to the tokenizer (BPE or SentencePiece-style).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ember import _core
from ember.tokenizer.vocab import CONTROL, UNKNOWN, USER_DEFINED, Vocab


class SpecialTokens:
    def __init__(self, vocab: Vocab):
        special = np.flatnonzero(vocab.attrs & (CONTROL | USER_DEFINED | UNKNOWN))
        # (text, always recognised), longest text first; a stable sort keeps id order on ties.
        ids = sorted(special.tolist(), key=lambda i: -len(vocab.tokens[i].encode("utf-8")))
        # text -> (rank in that order, id, recognised without parse_special)
        self._special = {vocab.tokens[i]: (rank, vocab.find(vocab.tokens[i]),
                                           not vocab.attrs[i] & (CONTROL | UNKNOWN))
                         for rank, i in enumerate(ids) if vocab.tokens[i]}
        self._matchers: dict[bool, tuple[list[str], _core.SubstringSet]] = {}

    def encode(self, text: str, parse_special: bool, encode_plain: Callable[[str, list[int]], None]) -> list[int]:
        """The ids of `text`: special tokens as they are, the plain pieces between them through
        `encode_plain(piece, out)`, which appends to `out`."""
        ids: list[int] = []
        for piece in self.partition(text, parse_special):
            if isinstance(piece, int):
                ids.append(piece)
            else:
                encode_plain(piece, ids)
        return ids

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
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
        """The special tokens that occur in text, in partition order (one native scan of the
        text for all of them)."""
        texts, matcher = self._matcher(parse_special)
        return sorted((texts[i] for i in matcher.present(text)), key=lambda t: self._special[t][0])

    def _matcher(self, parse_special: bool) -> tuple[list[str], _core.SubstringSet]:
        """The special token texts recognised with or without parse_special, and their matcher."""
        if parse_special not in self._matchers:
            texts = [t for t, (_, _, always) in self._special.items() if always or parse_special]
            self._matchers[parse_special] = texts, _core.SubstringSet(texts)
        return self._matchers[parse_special]
