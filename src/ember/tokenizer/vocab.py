"""The vocabulary of a GGUF file: tokens, their kinds, special ids and tokenizer flags.

Everything here follows llama.cpp's `llama_vocab::load` (src/llama-vocab.cpp): the defaults
for each tokenizer model, the special ids the metadata may override, and the tokens it
recognises by their text (end of turn, fill-in-the-middle) when the metadata is silent.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember import _core
from ember.errors import EmberError, EmberWarning
from ember.gguf.metadata import bool_key, int_key, numeric_array_key, string_array_key, string_key
from ember.gguf.strings import StringArray, string_table
from ember.tokenizer.pretokenizers import PreTokenizer, pre_tokenizer

# Token attributes (bit flags, llama.h `llama_token_attr`).
UNKNOWN = 1 << 0
UNUSED = 1 << 1
NORMAL = 1 << 2
CONTROL = 1 << 3
USER_DEFINED = 1 << 4
BYTE = 1 << 5

# tokenizer.ggml.token_type value -> attribute (0 = undefined and anything unknown).
_ATTR_OF_TYPE = np.array([0, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE], dtype=np.uint16)

MODELS = {"gpt2": "bpe", "llama": "spm", "bert": "wpm", "t5": "ugm", "gemma4": "bpe", "whitespace": "bpe"}
# tokenizer models whose pre-tokenizer is fixed, whatever tokenizer.ggml.pre says (llama.cpp)
_OWN_PRE = {"gemma4": "gemma4"}

_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# tokenizer.ggml.<name>_token_id keys read over the defaults, in llama.cpp's order.
_SPECIAL_KEYS = ("bos", "eos", "eot", "eom", "fim_pre", "fim_suf", "fim_mid", "fim_pad",
                 "fim_rep", "fim_sep")
_LEGACY_FIM_KEYS = {"prefix": "fim_pre", "suffix": "fim_suf", "middle": "fim_mid"}
# tokenizer.ggml.<key>_token_id -> role, for the roles WordPiece and Unigram vocabularies use
_ROLE_KEYS = {"unknown": "unk", "seperator": "sep", "padding": "pad"}  # "seperator" as GGUF spells it
# llama.cpp's defaults for "bert" vocabularies (BERT's [CLS], [UNK], [SEP], [PAD]) and "t5" ones
_ROLE_DEFAULTS = {"wpm": {"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0},
                  "ugm": {"bos": None, "eos": 1, "unk": 2, "sep": None, "pad": 0}}
# BPE pre-tokenizers after which llama.cpp separates a text pair by default (add_sep)
_SEPARATING_PRE = ("jina-v1-en", "jina-v2-code", "roberta-bpe")


@dataclass
class Vocab:
    tokens: Sequence[str]  # a file's StringArray (decoded one token at a time) or a list
    attrs: np.ndarray  # uint16 attribute bits per token
    scores: np.ndarray | None  # float32 per token (SentencePiece-style vocabularies)
    merges: Any  # list-like of "left right" strings (BPE vocabularies)
    kind: str  # "bpe", "spm", "wpm" or "ugm"
    pre: PreTokenizer | None  # BPE only
    special: dict[str, int | None]  # bos, eos, eot, eom, fim_* -> id
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    add_sep: bool = False  # WordPiece: encode(add_special=True) puts the separator ([SEP]) last
    lowercase: bool = False  # WordPiece: lower-case the text (tokenizer.ggml.normalizer.lowercase)
    strip_accents: bool = False  # WordPiece: drop accents (normalizer.strip_accents, default: lowercase)
    # llama.cpp's add_bos / add_eos / add_sep as the file sets them (llama.cpp's defaults per kind),
    # which place the special tokens of a text pair (Tokenizer.encode_pair)
    pair_specials: tuple[bool, bool, bool] = (False, False, False)
    drop_whitespace: bool = False  # "whitespace" BPE: the text's runs between whitespace, which is dropped
    # Unigram: SentencePiece's normalization rules (tokenizer.ggml.precompiled_charsmap) and
    # whether runs of spaces become one (tokenizer.ggml.remove_extra_whitespaces)
    precompiled_charsmap: bytes | None = None
    remove_extra_whitespaces: bool = False
    _index: Any = field(default=None, repr=False)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def index(self) -> _core.TextIndex:
        """The token texts and their ids in native memory (~10 bytes a token, no Python objects)."""
        if self._index is None:
            self._index = _core.TextIndex(*string_table(self.tokens))
        return self._index

    def find(self, text: str) -> int | None:
        """The id of the token whose text is `text` (of equal texts the last, as llama.cpp), or None."""
        token = self.index.find(text)
        return token if token >= 0 else None


def vocab_from_metadata(metadata: dict) -> Vocab:
    model = string_key(metadata, "tokenizer.ggml.model")
    if model is None or model in ("none", "no_vocab"):
        raise EmberError(f"the model file has no tokenizer (tokenizer.ggml.model = {model!r}), "
                         "so it cannot turn text into tokens")
    kind = MODELS.get(str(model))
    if kind is None:
        raise EmberError(f"unsupported tokenizer model tokenizer.ggml.model={model!r}; "
                         f"ember supports: {', '.join(MODELS)}")
    tokens = string_array_key(metadata, "tokenizer.ggml.tokens")
    if tokens is None or len(tokens) == 0:
        raise EmberError("the model's vocabulary (tokenizer.ggml.tokens) is missing or empty")
    has_empty = tokens.has_empty() if isinstance(tokens, StringArray) else "" in tokens
    if has_empty:  # llama.cpp names empty tokens so that each text stays unique
        tokens = [text or f"[EMPTY_{i}]" for i, text in enumerate(tokens)]
    elif not isinstance(tokens, StringArray):
        tokens = list(tokens)
    n_vocab = len(tokens)
    pre = (pre_tokenizer(_OWN_PRE[model]) if model in _OWN_PRE else _pre_tokenizer(metadata)) if kind == "bpe" else None
    merges = string_array_key(metadata, "tokenizer.ggml.merges") if kind == "bpe" else None
    if kind == "bpe" and merges is None:
        raise EmberError("a BPE vocabulary needs tokenizer.ggml.merges, which is missing")
    vocab = Vocab(
        tokens=tokens,
        attrs=_attrs(metadata, n_vocab),
        scores=_array(metadata, "tokenizer.ggml.scores", n_vocab, np.float32),
        merges=merges,
        kind=kind,
        pre=pre,
        special={},
        eog_ids=frozenset(),
        add_bos=(pre is not None and pre.force_bos)
        or _flag(metadata, "add_bos_token", kind == "spm" or (pre is not None and pre.add_bos)),
        add_eos=_flag(metadata, "add_eos_token", kind == "ugm"),
        add_space_prefix=_flag(metadata, "add_space_prefix", kind == "spm"),
        clean_spaces=pre.clean_spaces if pre is not None else kind == "wpm",
    )
    vocab.pair_specials = (_flag(metadata, "add_bos_token", True) if kind == "wpm" else vocab.add_bos, vocab.add_eos,
                           _flag(metadata, "add_sep_token", kind == "wpm" or string_key(metadata, "tokenizer.ggml.pre")
                                 in _SEPARATING_PRE))
    if model == "whitespace":  # llama.cpp's whitespace session; lower-cased only where the file says
        vocab.drop_whitespace = True
        vocab.lowercase = _flag(metadata, "normalizer.lowercase", string_key(metadata, "tokenizer.ggml.pre") != "whitespace")
    if kind == "ugm":
        charsmap = numeric_array_key(metadata, "tokenizer.ggml.precompiled_charsmap", "iu")
        vocab.precompiled_charsmap = charsmap.astype(np.uint8).tobytes() if charsmap is not None and charsmap.size else None
        vocab.remove_extra_whitespaces = _flag(metadata, "remove_extra_whitespaces", False)
    if kind == "wpm":  # llama.cpp puts [CLS] (BOS) and [SEP] around the text, whatever the flags say
        vocab.add_bos, vocab.add_eos, vocab.add_sep = True, False, True
        vocab.lowercase = _flag(metadata, "normalizer.lowercase", False)
        vocab.strip_accents = _flag(metadata, "normalizer.strip_accents", vocab.lowercase)
    vocab.special = _special_ids(metadata, vocab)
    vocab.eog_ids = _end_of_generation(vocab)
    return vocab


def _pre_tokenizer(metadata: dict) -> PreTokenizer:
    name = string_key(metadata, "tokenizer.ggml.pre")
    if name is None:
        warnings.warn("tokenizer.ggml.pre is missing: using the 'default' pre-tokenizer, as "
                      "llama.cpp does; tokenization quality may be degraded", EmberWarning, stacklevel=3)
        name = "default"
    return pre_tokenizer(str(name))


def _attrs(metadata: dict, n_vocab: int) -> np.ndarray:
    types = _array(metadata, "tokenizer.ggml.token_type", n_vocab, np.int64)
    if types is None:
        return np.full(n_vocab, NORMAL, dtype=np.uint16)
    known = (types >= 0) & (types < len(_ATTR_OF_TYPE))
    return np.where(known, _ATTR_OF_TYPE[np.where(known, types, 0)], 0).astype(np.uint16)


def _special_ids(metadata: dict, vocab: Vocab) -> dict[str, int | None]:
    n_vocab = vocab.n_vocab
    default_bos, default_eos = (1, 2) if vocab.kind == "spm" else (11, 11)
    special: dict[str, int | None] = dict.fromkeys(_SPECIAL_KEYS)
    defaults = dict(_ROLE_DEFAULTS.get(vocab.kind) or {"bos": default_bos, "eos": default_eos})
    if vocab.pre is not None and not vocab.pre.default_bos:
        defaults["bos"] = None
    for name, default in defaults.items():
        special[name] = default if default is not None and default < n_vocab else None
    keys = [(name, name) for name in _SPECIAL_KEYS] + list(_LEGACY_FIM_KEYS.items())
    if vocab.kind in _ROLE_DEFAULTS:
        keys += list(_ROLE_KEYS.items())
    for key, name in keys:
        value = int_key(metadata, f"tokenizer.ggml.{key}_token_id", None, minimum=-(2**63), maximum=2**64)
        if value is not None and 0 <= value < n_vocab:
            special[name] = value
    by_text = {"eot": _EOT_TEXTS, "eom": ("<|eom_id|>",), **_FIM_TEXTS}
    for name, texts in by_text.items():
        if special[name] is None:
            special[name] = _first_token(vocab, texts)
            if special[name] is not None:
                vocab.attrs[special[name]] |= CONTROL
    return special


def _end_of_generation(vocab: Vocab) -> frozenset[int]:
    special = vocab.special
    eog = {special[name] for name in ("fim_pad", "fim_rep", "fim_sep", "eos", "eot", "eom")}
    for text in _EOG_TEXTS:
        token = vocab.find(text)
        if token is not None:
            eog.add(token)
            vocab.attrs[token] |= CONTROL
    eog.discard(None)
    texts = {vocab.tokens[token]: token for token in eog}
    # gpt-oss and solar-open end a message with <|end|> but go on generating after it
    if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts.keys()
                               or {"<|calls|>", "<|flush|>"} <= texts.keys()):
        eog.discard(texts["<|end|>"])
        vocab.attrs[texts["<|end|>"]] = USER_DEFINED
    # where <|tool_response> or <|plamo:eos|> exists, </s> is an ordinary token
    if "</s>" in texts and ({"<|tool_response>", "<|plamo:eos|>"} & texts.keys()):
        eog.discard(texts["</s>"])
        vocab.attrs[texts["</s>"]] = NORMAL
    return frozenset(int(token) for token in eog)


def _first_token(vocab: Vocab, texts: tuple[str, ...]) -> int | None:
    for text in texts:
        token = vocab.find(text)
        if token is not None:
            return token
    return None


def _flag(metadata: dict, name: str, default: bool) -> bool:
    return bool_key(metadata, f"tokenizer.ggml.{name}", default)


def _array(metadata: dict, key: str, n_vocab: int, dtype) -> np.ndarray | None:
    values = numeric_array_key(metadata, key, "iu" if np.dtype(dtype).kind in "iu" else "iuf")
    if values is None:
        return None
    if len(values) < n_vocab:
        raise EmberError(f"{key} has {values.size} entries for {n_vocab} tokens")
    return values[:n_vocab].astype(dtype)
