"""WordPiece ("bert" vocabularies) as llama.cpp does it (llm_tokenizer_wpm).

The text is cut at special tokens first (ember.special_tokens). Each plain piece goes through
BERT's basic tokenizer: with accent stripping every character becomes the first character of its
NFD decomposition and marks (\\p{M}) are dropped; control characters, NUL and U+FFFD are dropped;
letters are lower-cased where the file asks (tokenizer.ggml.normalizer.lowercase, simple case
mapping); whitespace ends a word; punctuation, ASCII symbols and CJK ideographs are words of one
character. Each word, with "▁" put before it, is then cut greedily into the longest vocabulary
tokens from the left (the converter writes word-initial pieces as "▁piece" and continuations
"##piece" as "piece"); a word with a part that is no token becomes the unknown token.
"""

from __future__ import annotations

import unicodedata

from ember.tokenizer.special_tokens import SpecialTokens
from ember.tokenizer.spm import SPACE
from ember.tokenizer.vocab import Vocab

# llama.cpp's unicode_set_whitespace
WHITESPACE = frozenset([*range(0x09, 0x0E), *range(0x2000, 0x200B), 0x20, 0x85, 0xA0, 0x1680, 0x2028,
                         0x2029, 0x202F, 0x205F, 0x3000])
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))

# What the basic tokenizer does with one (normalized) character.
_SPLIT, _DROP, _ALONE, _APPEND = range(4)


def _is_cjk(cp: int) -> bool:
    return any(first <= cp <= last for first, last in _CJK_RANGES)


def simple_lower(char: str) -> str:
    lower = char.lower()  # full case mapping; the simple one is its first character (U+0130 -> i)
    return lower if len(lower) == 1 else lower[0]


class WpmEncoder:
    def __init__(self, vocab: Vocab):
        self._ids = {}
        for token_id, text in enumerate(vocab.tokens):
            self._ids[text.encode()] = token_id  # of equal texts the last, as llama.cpp
        self._max_len = max((len(text) for text in self._ids), default=0)
        self._unknown = vocab.special.get("unk")
        self._lowercase = vocab.lowercase
        self._strip_accents = vocab.strip_accents
        self._chars: dict[str, tuple[int, str]] = {}
        self._special = SpecialTokens(vocab)

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._special.encode(text, parse_special, self._encode_plain)

    def _encode_plain(self, text: str, out: list[int]) -> None:
        for word in self.words(text):
            self._encode_word((SPACE + word).encode(), out)

    def words(self, text: str) -> list[str]:
        """BERT's basic tokenizer (llm_tokenizer_wpm_session::preprocess)."""
        words: list[str] = []
        current: list[str] = []
        for char in text:
            action, normalized = self._chars.get(char) or self._classify(char)
            if action == _APPEND:
                current.append(normalized)
                continue
            if current:
                words.append("".join(current))
                current = []
            if action == _ALONE:
                words.append(normalized)
        if current:
            words.append("".join(current))
        return [word for word in words if word]

    def _classify(self, char: str) -> tuple[int, str]:
        cp = ord(char)
        if self._strip_accents:
            cp = ord(unicodedata.normalize("NFD", char)[0])
        normalized = chr(cp)
        category = unicodedata.category(normalized)
        if cp in WHITESPACE:
            result = (_SPLIT, "")
        elif cp in (0, 0xFFFD) or category in ("Cc", "Cf", "Co", "Cs") or self._strip_accents and category[0] == "M":
            result = (_DROP, "")
        else:
            if self._lowercase:
                normalized = simple_lower(normalized)
            alone = category[0] == "P" or (cp < 0x7F and category[0] == "S") or _is_cjk(cp)
            result = (_ALONE if alone else _APPEND, normalized)
        if result[0] == _DROP:  # a dropped character neither ends nor extends a word
            result = (_APPEND, "")
        self._chars[char] = result
        return result

    def _encode_word(self, word: bytes, out: list[int]) -> None:
        # the longest token at each position, left to right; a part that is no token: unknown
        start = len(out)
        i, n = 0, len(word)
        while i < n:
            for j in range(min(n, i + self._max_len), i, -1):
                token = self._ids.get(word[i:j])
                if token is not None:
                    out.append(token)
                    i = j
                    break
            else:
                del out[start:]
                break
        if len(out) == start and self._unknown is not None:
            out.append(self._unknown)
