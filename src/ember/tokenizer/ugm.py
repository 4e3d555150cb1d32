"""Unigram ("t5" vocabularies: T5, XLM-RoBERTa, bge-m3) as llama.cpp does it (llm_tokenizer_ugm).

The text is cut at special tokens first (ember.special_tokens). Each plain piece is normalized
byte by byte, as SentencePiece's normalizer runs: at each position the longest prefix of a
user-defined token is kept as it is; otherwise the longest prefix the precompiled charsmap
(tokenizer.ggml.precompiled_charsmap) holds is replaced by its replacement; otherwise one UTF-8
character is kept (a byte that starts none becomes U+FFFD). Then spaces: with
remove_extra_whitespaces every run of non-space bytes gets one "▁" before it and the spaces are
dropped; otherwise each space becomes "▁" and, with add_space_prefix, one more "▁" goes before
the first non-space byte. (Spaces are always escaped and never a suffix: llama.cpp reads no key
for SentencePiece's escape_whitespaces or treat_whitespace_as_suffix and holds them true and false.)

The ids are those of the best segmentation of the normalized bytes (Viterbi): the one whose
token scores (log probabilities; 0 for user-defined tokens) sum highest, summed in double
precision, a later segmentation replacing an earlier one only when it scores strictly higher.
A character that starts no token of its own length may be the unknown token, scored the lowest
normal score less 10; runs of unknown tokens become one.
"""

from __future__ import annotations

import re
import struct

import numpy as np

from ember.errors import EmberError
from ember.tokenizer.special_tokens import SpecialTokens
from ember.tokenizer.vocab import NORMAL, UNUSED, USER_DEFINED, Vocab

SPACE = "\u2581".encode()  # "▁", the escaped space
_REPLACEMENT = "\ufffd".encode()
_UNKNOWN_PENALTY = np.float32(10.0)
# UTF-8 sequence length by the high nibble of its first byte (llama.cpp's unicode_len_utf8)
_UTF8_LEN = (1,) * 12 + (2, 2, 3, 4)
_KEY_BYTES = 4


class CharsMap:
    """SentencePiece's precompiled charsmap: a uint32 byte count, that many bytes of an
    XOR-compressed compact double array (XCDA: BASE in bits 10-30, shifted left by 8 where bit 9
    is set; LCHECK in bits 0-7 and 31; LEAF in bit 8) whose leaves hold offsets into the
    NUL-terminated replacement strings that follow."""

    def __init__(self, blob: bytes):
        if len(blob) < 4:
            raise EmberError("tokenizer.ggml.precompiled_charsmap is too short for its size header")
        (n_bytes,) = struct.unpack_from("<I", blob)
        if n_bytes + 4 >= len(blob):
            raise EmberError(f"tokenizer.ggml.precompiled_charsmap says {n_bytes} bytes of XCDA "
                             f"but holds {len(blob) - 4} bytes in all")
        units = np.frombuffer(blob, "<u4", n_bytes // 4, 4).astype(np.int64)
        self._base = ((units >> 10) << ((units & (1 << 9)) >> 6)).tolist()
        self._check = (units & ((1 << 31) | 0xFF)).tolist()
        self._leaf = ((units >> 8) & 1).astype(bool).tolist()
        self._value = (units & ((1 << 31) - 1)).tolist()
        self._replacements = blob[4 + n_bytes:]
        self.empty = not self._base  # no XCDA: nothing is replaced (llama.cpp skips the match)
        self._root = 0 if self.empty else self._node(0, self._base)
        self._texts: dict[int, bytes] = {}

    def ascii_kept(self) -> dict[int, frozenset[int]]:
        """{ASCII byte: the bytes after which a longer match may begin} for each ASCII byte that
        the map does not replace on its own (all but NUL, where matching stops, and the leaves)."""
        kept: dict[int, frozenset[int]] = {0: frozenset()}
        for c in range(1, 128):
            node = self._root ^ c
            if node >= len(self._check) or self._check[node] != c:
                kept[c] = frozenset()
            elif not self._leaf[node]:
                children = node ^ self._base[node]
                kept[c] = frozenset(c2 for c2 in range(1, 256) if (children ^ c2) < len(self._check)
                                    and self._check[children ^ c2] == c2)
        return kept

    def _node(self, index: int, table: list) -> int:
        if index >= len(table):
            raise EmberError("tokenizer.ggml.precompiled_charsmap is malformed: an XCDA index is out of bounds")
        return table[index]

    def longest_match(self, data: bytes, start: int) -> tuple[int, bytes]:
        """(length, replacement) of the longest prefix of data[start:] the map holds; (0, b"")
        when none. Matching stops at a NUL byte."""
        base, check, leaf, size = self._base, self._check, self._leaf, len(self._base)
        node, length, offset = self._root, 0, 0
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break
            node ^= c
            if node >= size:
                self._node(node, base)  # raises
            if check[node] != c:
                break
            is_leaf = leaf[node]
            node ^= base[node]
            if is_leaf:
                length, offset = pos - start + 1, self._node(node, self._value)
        if not length:
            return 0, b""
        return length, self._text(offset)

    def _text(self, offset: int) -> bytes:
        text = self._texts.get(offset)
        if text is None:
            end = self._replacements.find(b"\0", offset)
            if offset >= len(self._replacements) or end < 0:
                raise EmberError("tokenizer.ggml.precompiled_charsmap is malformed: a replacement is out of bounds")
            text = self._texts[offset] = self._replacements[offset:end]
        return text


class UgmEncoder:
    def __init__(self, vocab: Vocab):
        self._special = SpecialTokens(vocab)
        charsmap = CharsMap(vocab.precompiled_charsmap) if vocab.precompiled_charsmap else None
        self._charsmap = charsmap if charsmap is not None and not charsmap.empty else None
        self._add_space_prefix = vocab.add_space_prefix
        self._merge_spaces = vocab.remove_extra_whitespaces
        self._unknown = vocab.special.get("unk")
        scores = vocab.scores if vocab.scores is not None else np.zeros(vocab.n_vocab, np.float32)
        attrs = vocab.attrs
        normal = (attrs & NORMAL) != 0
        min_score = np.float32(scores[normal].min()) if normal.any() else np.float32(np.finfo(np.float32).max)
        self._unknown_score = float(min_score - _UNKNOWN_PENALTY)  # in float32, as llama.cpp
        # token bytes -> id for normal, user-defined and unused tokens (of equal texts the last);
        # the longest of them by their first _KEY_BYTES bytes, which bounds the look-ups from a position
        self._ids: dict[bytes, int] = {}
        self._longest: dict[bytes, int] = {}
        self._scores = scores.astype(np.float64).tolist()
        ids, longest, tokens = self._ids, self._longest, vocab.tokens
        for token_id in np.flatnonzero(attrs & (NORMAL | USER_DEFINED | UNUSED)).tolist():
            text = tokens[token_id].encode()
            if text:
                ids[text] = token_id
                if len(text) >= _KEY_BYTES and longest.get(text[:_KEY_BYTES], 0) < len(text):
                    longest[text[:_KEY_BYTES]] = len(text)
        user_prefixes: set[bytes] = set()
        for token_id in np.flatnonzero(attrs & USER_DEFINED).tolist():
            text = tokens[token_id].encode()
            self._scores[token_id] = 0.0
            user_prefixes.update(text[:end] for end in range(1, len(text) + 1))
        self._user_prefixes = user_prefixes
        self._user_first = {p[0] for p in user_prefixes}
        self._kept_run = _kept_run(self._charsmap, self._user_first)

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._special.encode(text, parse_special, self._encode_plain)

    def _encode_plain(self, piece: str, out: list[int]) -> None:
        normalized = self.normalize(piece)
        if normalized:
            out.extend(self._viterbi(normalized))

    def normalize(self, text: str) -> bytes:
        """The text as the segmentation sees it (llm_tokenizer_ugm_session::normalize)."""
        data = self._normalize_chars(text.encode())
        if self._merge_spaces:
            return b"".join(SPACE + word for word in data.split(b" ") if word)
        escaped = data.replace(b" ", SPACE)
        if self._add_space_prefix:
            first = len(data) - len(data.lstrip(b" "))
            if first < len(data):
                escaped = escaped[:first * len(SPACE)] + SPACE + escaped[first * len(SPACE):]
        return escaped

    def _normalize_chars(self, data: bytes) -> bytes:
        charsmap, user_first = self._charsmap, self._user_first
        if charsmap is None and not user_first:
            return data  # valid UTF-8 already, nothing to replace
        out = bytearray()
        pos, n = 0, len(data)
        kept_run = self._kept_run.match
        while pos < n:
            run = kept_run(data, pos)
            if run is not None:  # ASCII that stays as it is
                out += run.group()
                pos = run.end()
                if pos >= n:
                    break
            if data[pos] in user_first:  # the longest walk along the user-defined tokens' trie
                length = 1
                while pos + length < n and data[pos:pos + length + 1] in self._user_prefixes:
                    length += 1
                out += data[pos:pos + length]
                pos += length
                continue
            if charsmap is not None:
                length, replacement = charsmap.longest_match(data, pos)
                if length:
                    out += replacement
                    pos += length
                    continue
            length = _utf8_length(data, pos)
            if length:
                out += data[pos:pos + length]
                pos += length
            else:
                out += _REPLACEMENT
                pos += 1
        return bytes(out)

    def _viterbi(self, data: bytes) -> list[int]:
        n = len(data)
        ids, longest, scores = self._ids, self._longest, self._scores
        unknown, unknown_score = self._unknown, self._unknown_score
        utf8_len, short = _UTF8_LEN, _KEY_BYTES - 1
        # per end offset: (score sum, start offset, token id) of the best segmentation so far
        best_score = [-float("inf")] * (n + 1)
        best_start = [0] * (n + 1)
        best_token = [unknown] * (n + 1)
        best_score[0] = 0.0
        pos = 0
        while pos < n:
            char_len = utf8_len[data[pos] >> 4]
            if pos + char_len > n:
                char_len = n - pos
            base = best_score[pos]
            whole_char = False
            # the tokens that start here, shortest first: up to _KEY_BYTES - 1 bytes, then up to
            # the longest that shares the next _KEY_BYTES bytes
            last = pos + longest.get(data[pos:pos + _KEY_BYTES], short)
            if last > n:
                last = n
            for end in range(pos + 1, last + 1):
                token = ids.get(data[pos:end])
                if token is None:
                    continue
                if end - pos == char_len:
                    whole_char = True
                score = base + scores[token]
                if score > best_score[end]:
                    best_score[end], best_start[end], best_token[end] = score, pos, token
            if not whole_char:
                end = pos + char_len
                score = base + unknown_score
                if score > best_score[end]:
                    if unknown is None:
                        raise EmberError("the text has a character the vocabulary has no token for, "
                                         "and the vocabulary has no unknown token")
                    best_score[end], best_start[end], best_token[end] = score, pos, unknown
            pos += char_len
        ids: list[int] = []
        end, previous_unknown = n, False
        while True:
            token = best_token[end]
            is_unknown = token == unknown
            if not (previous_unknown and is_unknown):
                ids.append(token)
            end = best_start[end]
            if end == 0:
                break
            previous_unknown = is_unknown
        ids.reverse()
        return ids


def _kept_run(charsmap: CharsMap | None, user_first: set[int]) -> re.Pattern:
    """A regex matching a run of ASCII bytes that normalization keeps as they are: no user-defined
    token starts with them, and the charsmap neither replaces one alone nor, by what follows it,
    begins a longer match there."""
    kept = charsmap.ascii_kept() if charsmap is not None else dict.fromkeys(range(128), frozenset())
    by_next: dict[frozenset[int], list[int]] = {}
    for c, following in kept.items():
        if c not in user_first:
            by_next.setdefault(following, []).append(c)

    def byte_class(values) -> bytes:
        return b"[" + b"".join(re.escape(bytes([v])) for v in sorted(values)) + b"]"

    options = [byte_class(first) + (b"(?!" + byte_class(following) + b")" if following else b"")
               for following, first in by_next.items()]
    return re.compile(b"(?:" + b"|".join(options) + b")+" if options else b"(?!)")


def _utf8_length(data: bytes, pos: int) -> int:
    """The length of the well-formed UTF-8 character at data[pos], or 0 (llama.cpp's
    unicode_cpt_from_utf8, which checks the continuation bytes only)."""
    first = data[pos]
    if first < 0x80:
        return 1
    if first & 0xE0 == 0xC0:
        length = 2
    elif first & 0xF0 == 0xE0:
        length = 3
    elif first & 0xF8 == 0xF0:
        length = 4
    else:
        return 0
    if pos + length > len(data):
        return 0
    if any(data[pos + k] & 0xC0 != 0x80 for k in range(1, length)):
        return 0
    return length
