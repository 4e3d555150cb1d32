"""Text <-> token ids for a GGUF model, with exactly the ids llama.cpp produces.

    tok = Tokenizer.from_gguf(open_gguf(path))
    ids = tok.encode("Hello")                 # BOS/EOS as the model's metadata asks
    tok.decode(ids)                           # "Hello"
    stream = tok.stream_decoder()             # for generation: only whole UTF-8 characters
    text = "".join(stream.feed(i) for i in ids) + stream.flush()

Byte-level BPE is ember.bpe's (native merges), SentencePiece-style merging ember.spm's, WordPiece
ember.wpm's, Unigram ember.ugm's; which tokens are special, which end generation and the BOS/EOS
rules come from ember.vocab.
"""

from __future__ import annotations

import codecs
import gc
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from ember.errors import EmberError
from ember.tokenizer.bpe import BpeEncoder
from ember.tokenizer.spm import SPACE, SpmEncoder
from ember.tokenizer.ugm import UgmEncoder
from ember.tokenizer.wpm import WpmEncoder
from ember.tokenizer.vocab import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    Vocab,
    vocab_from_metadata,
)

_SPECIAL = CONTROL | UNKNOWN
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_VERBATIM = CONTROL | UNKNOWN | USER_DEFINED  # pieces that are their own text, not encoded


class Tokenizer:
    """A GGUF model's tokenizer. Build it with `from_gguf` or `from_metadata`."""

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        self._encoder = {"spm": SpmEncoder, "wpm": WpmEncoder, "ugm": UgmEncoder}.get(vocab.kind, BpeEncoder)(vocab)
        self._bytes: list[bytes | None] = [None] * vocab.n_vocab
        self.bos_id: int | None = vocab.special["bos"]
        self.eos_id: int | None = vocab.special["eos"]
        self.eog_ids: frozenset[int] = vocab.eog_ids

    @classmethod
    def from_metadata(cls, metadata: dict) -> Tokenizer:
        with _gc_paused():  # the build makes ~10^5 tuples and strings that no cycle can hold
            return cls(vocab_from_metadata(metadata))

    @classmethod
    def from_gguf(cls, gguf_file) -> Tokenizer:
        return cls.from_metadata(gguf_file.metadata)

    @property
    def n_vocab(self) -> int:
        return self._vocab.n_vocab

    @property
    def add_bos(self) -> bool:
        """Whether encode(add_special=True) puts BOS first (tokenizer.ggml.add_bos_token)."""
        return self._vocab.add_bos

    @property
    def add_eos(self) -> bool:
        """Whether encode(add_special=True) puts EOS last (tokenizer.ggml.add_eos_token)."""
        return self._vocab.add_eos

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`.

        add_special: add BOS / EOS where tokenizer.ggml.add_bos_token / add_eos_token say so.
        parse_special: text such as "<|im_end|>" becomes that control token; otherwise it is
        tokenized as ordinary text (user-defined tokens are always recognised, as in llama.cpp).
        """
        text = _LONE_SURROGATE.sub("\ufffd", text)  # not encodable as UTF-8; llama.cpp sees U+FFFD
        ids = self._encoder.encode(text, parse_special)
        if add_special and self.add_bos:
            ids.insert(0, self._required("bos"))
        if add_special and self.add_eos:
            ids.append(self._required("eos"))
        if add_special and self._vocab.add_sep:
            ids.append(self._required("sep"))
        return ids

    def encode_pair(self, first: str, second: str) -> tuple[list[int], int]:
        """A text pair as llama-server's rerank input: [BOS] first [EOS] [SEP] second [EOS], each
        special token where the file's add_bos / add_eos / add_sep say (EOS: the separator where
        the file has none); BERT's files give [CLS] first [SEP] second [SEP]. Returns the ids and
        the length of the first part (the tokens before `second`)."""
        add_bos, add_eos, add_sep = self._vocab.pair_specials
        eos = self._vocab.special.get("eos")
        eos = self._required("sep") if add_eos and eos is None else eos
        ids = [self._required("bos")] if add_bos else []
        ids += self._encoder.encode(_LONE_SURROGATE.sub("\ufffd", first), False)
        ids += ([eos] if add_eos else []) + ([self._required("sep")] if add_sep else [])
        n_first = len(ids)
        ids += self._encoder.encode(_LONE_SURROGATE.sub("\ufffd", second), False) + ([eos] if add_eos else [])
        return ids, n_first

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids`; invalid UTF-8 becomes U+FFFD.

        skip_special drops control tokens (BOS, EOS, <|im_end|>, ...). For SentencePiece-style
        vocabularies the space that encode put before the text is removed again.
        """
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """The bytes of `ids`, as `decode` joins them before decoding UTF-8 (a token that is part
        of a character stays those bytes)."""
        ids = list(ids)
        pieces = [b"" if skip_special and self.is_special(i) else self.token_bytes(i) for i in ids]
        if self._vocab.kind in ("spm", "ugm") and self._vocab.add_space_prefix:
            first = 1 if ids[:1] == [self.bos_id] else 0
            if first < len(pieces):
                pieces[first] = pieces[first].removeprefix(b" ")
        data = b"".join(pieces)
        return clean_spaces(data) if self._vocab.clean_spaces else data

    def special_id(self, name: str) -> int | None:
        """The id of a special token by its role (bos, eos, eot, fim_pre, fim_suf, fim_mid, ...), or
        None when the vocabulary has none."""
        return self._vocab.special.get(name)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (a special token's own text)."""
        cached = self._bytes[self._checked(token_id)]
        if cached is None:
            cached = self._bytes[token_id] = self._piece_bytes(token_id)
        return cached

    def piece(self, token_id: int) -> str:
        """The token as the vocabulary writes it ("Ġworld", "▁world", "<0x0A>", "<|im_end|>")."""
        return self._vocab.tokens[self._checked(token_id)]

    def is_special(self, token_id: int) -> bool:
        """A control token: parsed from text only with parse_special, dropped by skip_special."""
        return bool(self._vocab.attrs[self._checked(token_id)] & _SPECIAL)

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)

    def _piece_bytes(self, token_id: int) -> bytes:
        # llama.cpp's token_to_piece(special=true)
        attr = int(self._vocab.attrs[token_id])
        text = self._vocab.tokens[token_id]
        if attr & _VERBATIM:
            return text.encode()
        if attr & NORMAL:
            pre = self._vocab.pre
            return byte_level_bytes(text) if pre is not None and pre.byte_encode else _spm_bytes(text)
        if attr & BYTE:
            return _byte_token_bytes(text)
        return b""

    def _checked(self, token_id: int) -> int:
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)):
            raise EmberError(f"token ids are integers, got {token_id!r}")
        if not 0 <= token_id < self._vocab.n_vocab:
            raise EmberError(f"token id {token_id} is outside the vocabulary (0..{self.n_vocab - 1})")
        return token_id

    def _required(self, name: str) -> int:
        token_id = self._vocab.special[name]
        if token_id is None:
            raise EmberError(f"the model asks for a {name.upper()} token but does not define one")
        return token_id


class StreamDecoder:
    """Turns generated ids into text as they come, never splitting a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """The text completed by this token (possibly ""): only whole characters."""
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still held back: an unfinished character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)


@contextmanager
def _gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _byte_level_alphabet() -> dict[str, int]:
    # GPT-2's reversible byte -> printable character mapping (bytes_to_unicode)
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in printable]
    chars.update({chr(256 + n): b for n, b in enumerate(others)})
    return chars


_BYTE_OF_CHAR = _byte_level_alphabet()
_TO_LATIN1 = str.maketrans({char: chr(byte) for char, byte in _BYTE_OF_CHAR.items()})


def byte_level_bytes(text: str) -> bytes:
    """The bytes behind a byte-level BPE token ("Ġworld" -> b" world")."""
    try:
        return text.translate(_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:  # a character outside the alphabet stands for itself
        return b"".join(bytes([_BYTE_OF_CHAR[c]]) if c in _BYTE_OF_CHAR else c.encode() for c in text)


def _spm_bytes(text: str) -> bytes:
    return text.replace(SPACE, " ").encode()


def _byte_token_bytes(text: str) -> bytes:
    # "<0x0A>" -> b"\n"; anything else marked as a byte token stands for its own text
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    return text.encode()


_SPACE_BEFORE_PUNCT = re.compile(rb" (?=[?!.,])")
_SPACED_APOSTROPHE = re.compile(rb" ' ")
_SPACE_BEFORE_CONTRACTION = re.compile(rb" '(?=s|m|re|ve)")


def clean_spaces(data: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: "a ." -> "a.", "a ' b" -> "a'b", "it 's" -> "it's"."""
    data = _SPACE_BEFORE_PUNCT.sub(b"", data)
    data = _SPACED_APOSTROPHE.sub(b"'", data)
    return _SPACE_BEFORE_CONTRACTION.sub(b"'", data)
