"""Tokenizer metadata for `ember convert`, as llama.cpp's converter writes it (tokenizer.ggml.*).

Three sources, tried in the order llama.cpp tries them for the architecture:

- tokenizer.model (SentencePiece): model "llama", pieces with their scores and types. The file is
  a protobuf ModelProto; the few fields needed are read here, so no sentencepiece package is needed.
- tokenizer.json with a byte-fallback BPE model (a SentencePiece vocabulary exported by
  transformers; llama only): model "llama", scores -1000 as llama.cpp's LlamaHfVocab writes them.
- tokenizer.json with a byte-level BPE model: model "gpt2", tokens, merges and the pre-tokenizer
  name (`tokenizer.ggml.pre`) recognised from the tokenizer's pre_tokenizer.
- tokenizer.json with a WordPiece model (BERT): model "bert", word-initial pieces written "▁piece"
  and continuations "##piece" as "piece" (llama.cpp's phantom space), the normalizer's
  lower-casing and accent stripping, the number of token types, and the pre-tokenizer name
  llama.cpp's converter gives the tokenizer by the hash of its ids for a fixed text.
- sentencepiece.bpe.model (XLM-RoBERTa's Unigram model): model "t5", the pieces moved to the ids
  transformers gives them (<s> <pad> </s> <unk> first), the normalizer's precompiled charsmap,
  dummy prefix and whitespace rule, as llama.cpp's XLMRobertaModel converter writes them; without
  it, the Unigram model of tokenizer.json as that converter reads it through transformers.

Special token ids, add_bos/add_eos and the chat template come from tokenizer_config.json,
tokenizer.json and config.json (the rules of gguf-py's SpecialVocab). A folder with no tokenizer
files gets tokenizer.ggml.model "none".
"""

from __future__ import annotations

import re
import struct
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from ember.convert.checkpoint import read_json
from ember.errors import EmberError


class TokenType(IntEnum):
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "mask")
# a role the tokenizer leaves empty takes the token of another (gguf-py: BERT's [CLS] and [SEP])
_FALLBACK_ROLES = {"bos": "cls", "eos": "sep"}

# tokenizer.json pre-tokenizer regexes -> llama.cpp pre-tokenizer names
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_PRE = {_LLAMA3_REGEX: "llama-bpe", _QWEN2_REGEX: "qwen2"}

# llama.cpp's converter names a tokenizer by the sha256 of str(ids) of this text (get_vocab_base_pre);
# the names of the WordPiece tokenizers it knows (uncased BERT's, as bge-small-en-v1.5, all-MiniLM
# and jina-embeddings-v2-base-en have it, is jina-v2-en: that entry comes last)
_CHECK_TEXT = ("\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ "
               "🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
               "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
               "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL")
_WORDPIECE_PRE = {"0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f": "jina-v2-en",
                  "8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7": "bert-bge-large"}


def vocab_metadata(path: Path, arch: str, config: dict) -> dict[str, Any]:
    """tokenizer.ggml.* keys for the model folder `path` (typed: numpy arrays, str, int, bool)."""
    n_vocab = config.get("vocab_size")
    spm, hf_json = path / "tokenizer.model", path / "tokenizer.json"
    if str((config.get("architectures") or [""])[0]).startswith("XLMRoberta"):
        meta = _xlm_roberta_vocab(path, n_vocab, config)
    elif spm.is_file() and arch != "gpt2":
        meta = _sentencepiece_vocab(path, n_vocab)
        if arch in ("gemma2", "gemma3"):
            meta["tokenizer.ggml.add_space_prefix"] = False
    elif hf_json.is_file():
        tokenizer = read_json(hf_json)
        if (tokenizer.get("model") or {}).get("type") == "WordPiece":
            meta = _wordpiece_vocab(tokenizer, n_vocab, config)
        elif arch == "llama" and _is_byte_fallback_bpe(tokenizer):
            meta = _llama_hf_vocab(tokenizer, _read_json_if(path / "tokenizer_config.json"), n_vocab)
        else:
            meta = _bpe_vocab(tokenizer, n_vocab)
    else:
        return {"tokenizer.ggml.model": "none"}
    if arch == "llama":
        add_prefix = _read_json_if(path / "tokenizer_config.json").get("add_prefix_space")
        if isinstance(add_prefix, bool):
            meta["tokenizer.ggml.add_space_prefix"] = add_prefix
    meta.update(special_tokens(path, len(meta["tokenizer.ggml.tokens"])))
    return meta


# -- byte-level BPE (tokenizer.json) ---------------------------------------------------------

def _bpe_vocab(tokenizer: dict, n_vocab: int | None) -> dict[str, Any]:
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE":
        raise EmberError(f"tokenizer.json has a {model.get('type')} model; "
                         "ember converts BPE and SentencePiece vocabularies")
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    added = {t["content"]: t for t in tokenizer.get("added_tokens") or []}
    for content, token in added.items():
        vocab[content] = token["id"]
    size = max(int(n_vocab or 0), max(vocab.values(), default=-1) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = np.full(size, TokenType.UNUSED, np.int32)
    for text, token_id in vocab.items():
        tokens[token_id] = text
        types[token_id] = TokenType.NORMAL
    for content, token in added.items():
        if token.get("special") or _looks_special(content):
            types[token["id"]] = TokenType.CONTROL
        else:
            tokens[token["id"]] = content.replace("\u2581", " ")  # pre-normalized user-defined spaces
            types[token["id"]] = TokenType.USER_DEFINED
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre_tokenizer_name(tokenizer.get("pre_tokenizer")),
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": _merges(model.get("merges") or []),
    }


# -- WordPiece (tokenizer.json) ----------------------------------------------------------------

def _wordpiece_vocab(tokenizer: dict, n_vocab: int | None, config: dict) -> dict[str, Any]:
    vocab: dict[str, int] = dict(tokenizer["model"].get("vocab") or {})
    special = {t["content"] for t in tokenizer.get("added_tokens") or [] if t.get("special")}
    for token in tokenizer.get("added_tokens") or []:
        vocab[token["content"]] = token["id"]
    size = max(int(n_vocab or 0), max(vocab.values(), default=-1) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = np.full(size, TokenType.UNUSED, np.int32)
    for text, token_id in vocab.items():
        if text in special:
            tokens[token_id], types[token_id] = text, TokenType.CONTROL
        else:
            tokens[token_id] = text[2:] if text.startswith("##") else "\u2581" + text
            types[token_id] = TokenType.NORMAL
    meta: dict[str, Any] = {
        "tokenizer.ggml.token_type_count": int(config.get("type_vocab_size", 1)),
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.pre": _wordpiece_pre(tokenizer),  # a name only: llama.cpp's WordPiece reads none
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
    }
    flags: dict[str, bool] = {}
    _normalizer_flags(tokenizer.get("normalizer") or {}, flags)
    meta.update({f"tokenizer.ggml.normalizer.{name}": value for name, value in flags.items()})
    return meta


def _wordpiece_pre(tokenizer: dict) -> str:
    """llama.cpp's name of a WordPiece tokenizer, by the hash of its ids (special tokens added) for
    _CHECK_TEXT; "default" for one it does not know (where llama.cpp's converter stops)."""
    import hashlib
    import json

    from tokenizers import Tokenizer

    try:
        runner = Tokenizer.from_str(json.dumps(tokenizer))
        runner.no_truncation()  # as transformers runs it: the file's truncation and padding off
        runner.no_padding()
        ids = runner.encode(_CHECK_TEXT).ids
    except Exception:  # a tokenizer.json the tokenizers library cannot run: no name to find
        return "default"
    return _WORDPIECE_PRE.get(hashlib.sha256(str(ids).encode()).hexdigest(), "default")


def _normalizer_flags(normalizer: dict, flags: dict[str, bool]) -> None:
    """lowercase / strip_accents from a tokenizer.json normalizer, as gguf-py reads them."""
    kind = normalizer.get("type")
    if kind == "Lowercase":
        flags["lowercase"] = True
    elif kind == "StripAccents":
        flags["strip_accents"] = True
    elif kind == "BertNormalizer":
        for name in ("lowercase", "strip_accents"):
            if isinstance(normalizer.get(name), bool):
                flags[name] = normalizer[name]
    elif kind == "Sequence":
        for step in normalizer.get("normalizers") or []:
            _normalizer_flags(step, flags)


def _merges(merges: list) -> list[str]:
    """Merges as "left right" strings; from pairs (tokenizers >= 0.20) with a space inside a part
    written as U+0120, the way llama.cpp does."""
    if merges and isinstance(merges[0], list):
        return [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair)
                for pair in merges]
    return [str(m) for m in merges]


def pre_tokenizer_name(pre: dict | None) -> str:
    """The llama.cpp name of a tokenizer.json pre_tokenizer (regexes identical to llama.cpp's)."""
    steps = (pre.get("pretokenizers") if pre and pre.get("type") == "Sequence" else [pre]) if pre else []
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        name = _SPLIT_PRE.get((steps[0].get("pattern") or {}).get("Regex"))
        if name:
            return name
    regexes = [(s.get("pattern") or {}).get("Regex", "") for s in steps if s.get("type") == "Split"]
    if len(regexes) >= 2 and regexes[0] in ("[\r\n]", "[\\r\\n]") and regexes[1].startswith("\\s?[A-Za-zµÀ-ÖØ-öø-ƺ"):
        return "deepseek-llm"
    raise EmberError("tokenizer.json: pre-tokenizer not recognised (ember convert knows those of GPT-2, "
                     "Llama 3, Qwen2, SmolLM and DeepSeek LLM)")


def _looks_special(text: str) -> bool:
    """Added tokens some models forget to mark special (llama.cpp's does_token_look_special)."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


# -- SentencePiece-style vocabularies --------------------------------------------------------

def _sentencepiece_vocab(path: Path, n_vocab: int | None) -> dict[str, Any]:
    pieces = read_sentencepiece_model(path / "tokenizer.model")
    size = int(n_vocab or len(pieces))
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores = np.full(size, -10000.0, np.float32)
    types = np.full(size, TokenType.UNUSED, np.int32)
    for token_id, (piece, score, kind) in enumerate(pieces[:size]):
        tokens[token_id], scores[token_id], types[token_id] = piece, score, kind
    added = _read_json_if(path / "added_tokens.json")
    for text, token_id in added.items():
        if isinstance(token_id, int) and 0 <= token_id < size:
            tokens[token_id], scores[token_id], types[token_id] = text, -1000.0, TokenType.USER_DEFINED
    decoder = _read_json_if(path / "tokenizer_config.json").get("added_tokens_decoder") or {}
    for key, token in decoder.items():
        token_id, text = int(key), token.get("content", "")
        if not 0 <= token_id < size:
            continue
        if token.get("special") or _looks_special(text):
            types[token_id] = TokenType.CONTROL
        else:
            text = text.replace("\u2581", " ")
            types[token_id] = TokenType.USER_DEFINED
        tokens[token_id], scores[token_id] = text, -1000.0
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
    }


def _xlm_roberta_vocab(path: Path, n_vocab: int | None, config: dict) -> dict[str, Any]:
    """llama.cpp's _xlmroberta_set_vocab: the Unigram pieces, fairseq's ids (transformers' <s> <pad>
    </s> <unk>, then SentencePiece's pieces from id 3 on, one later; the last id dropped so the
    count stays), the padding ids "[PAD<i>]" unused with score -10000."""
    model = path / "sentencepiece.bpe.model"
    if not model.is_file():
        return _unigram_json_vocab(path, n_vocab, config)
    pieces = read_sentencepiece_model(model)
    spec = read_sentencepiece_normalizer(model)
    if spec["model_type"] != 1:
        raise EmberError(f"{model} is not a Unigram model (SentencePiece model type {spec['model_type']})")
    size = max(int(n_vocab or 0), len(pieces))
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores = [-10000.0] * size
    types = [int(TokenType.UNUSED)] * size
    for token_id, (piece, score, kind) in enumerate(pieces):
        tokens[token_id], scores[token_id], types[token_id] = piece, score, kind
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + tokens[3:-1]
    scores = [0.0] * 4 + scores[3:-1]
    types = [int(TokenType.CONTROL)] * 3 + [int(TokenType.UNKNOWN)] + types[3:-1]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, np.float32),
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.add_space_prefix": spec["add_dummy_prefix"],
        "tokenizer.ggml.token_type_count": int(config.get("type_vocab_size", 1)),
        "tokenizer.ggml.remove_extra_whitespaces": spec["remove_extra_whitespaces"],
    }
    if spec["precompiled_charsmap"]:
        meta["tokenizer.ggml.precompiled_charsmap"] = np.frombuffer(spec["precompiled_charsmap"], np.uint8).copy()
    return meta


def _unigram_json_vocab(path: Path, n_vocab: int | None, config: dict) -> dict[str, Any]:
    """llama.cpp's XLM-RoBERTa vocabulary from tokenizer.json: the Unigram model's pieces and scores
    at their own ids, the unknown token UNKNOWN, transformers' special tokens CONTROL, other added
    tokens USER_DEFINED; add_space_prefix and remove_extra_whitespaces from tokenizer_config.json's
    add_prefix_space and clean_up_tokenization_spaces (as transformers >= 5 reads them for
    XLMRobertaTokenizer: true and false when absent), the charsmap of the normalizer."""
    import base64

    file = path / "tokenizer.json"
    tokenizer = read_json(file) if file.is_file() else {}
    model = tokenizer.get("model") or {}
    if model.get("type") != "Unigram":
        raise EmberError(f"{path} has neither sentencepiece.bpe.model nor a Unigram tokenizer.json; ember converts "
                         "XLM-RoBERTa's vocabulary from one of them")
    tokenizer_config = _read_json_if(path / "tokenizer_config.json")
    pieces = [(str(piece), float(score)) for piece, score in model.get("vocab") or []]
    added = {t["content"]: t["id"] for t in tokenizer.get("added_tokens") or []}
    unknown = added.get(_token_content(tokenizer_config.get("unk_token")), model.get("unk_id", 3))
    special = {added.get(text) for text in _config_special_tokens(tokenizer_config)}
    size = max(int(n_vocab or 0), len(pieces))
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores = np.full(size, -10000.0, np.float32)
    types = np.full(size, TokenType.UNUSED, np.int32)
    for token_id, (piece, score) in enumerate(pieces):
        tokens[token_id], scores[token_id] = piece, score
        types[token_id] = (TokenType.UNKNOWN if token_id == unknown else TokenType.CONTROL if token_id in special
                           else TokenType.USER_DEFINED if token_id in added.values() else TokenType.NORMAL)
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": bool(tokenizer_config.get("add_prefix_space", True)),
        "tokenizer.ggml.token_type_count": int(config.get("type_vocab_size", 1)),
        "tokenizer.ggml.remove_extra_whitespaces": bool(tokenizer_config.get("clean_up_tokenization_spaces", False)),
    }
    charsmap = (tokenizer.get("normalizer") or {}).get("precompiled_charsmap")
    if charsmap:
        meta["tokenizer.ggml.precompiled_charsmap"] = np.frombuffer(base64.b64decode(charsmap), np.uint8).copy()
    return meta


def read_sentencepiece_normalizer(file: Path) -> dict[str, Any]:
    """The model type (TrainerSpec, ModelProto field 2: model_type = 3, default UNIGRAM = 1) and
    the normalizer (NormalizerSpec, field 3: precompiled_charsmap = 2, add_dummy_prefix = 3,
    remove_extra_whitespaces = 4, both true by default) of a SentencePiece model."""
    spec: dict[str, Any] = {"model_type": 1, "precompiled_charsmap": b"", "add_dummy_prefix": True,
                            "remove_extra_whitespaces": True}
    fields = {2: "precompiled_charsmap", 3: "add_dummy_prefix", 4: "remove_extra_whitespaces"}
    try:
        for field, value in _proto_fields(file.read_bytes()):
            if field == 2:
                spec["model_type"] = dict(_proto_fields(value)).get(3, 1)
            elif field == 3:
                for inner, item in _proto_fields(value):
                    if inner in fields:
                        spec[fields[inner]] = bytes(item) if inner == 2 else bool(item)
    except (IndexError, struct.error, ValueError):
        raise EmberError(f"{file} is not a valid SentencePiece model") from None
    return spec


# SentencePiece piece types (sentencepiece_model.proto) -> GGUF token types, as llama.cpp maps
# them: USER_DEFINED pieces count as NORMAL.
_PIECE_TYPES = {1: TokenType.NORMAL, 2: TokenType.UNKNOWN, 3: TokenType.CONTROL, 4: TokenType.NORMAL,
                5: TokenType.UNUSED, 6: TokenType.BYTE}


def read_sentencepiece_model(file: Path) -> list[tuple[str, float, int]]:
    """(piece, score, GGUF token type) of each piece of a SentencePiece ModelProto, in id order.

    ModelProto field 1 is `repeated SentencePiece pieces`; SentencePiece has piece = 1 (string),
    score = 2 (float) and type = 3 (enum, default NORMAL). Other fields are skipped.
    """
    data = file.read_bytes()
    pieces = []
    try:
        for field, value in _proto_fields(data):
            if field == 1:
                pieces.append(_piece(value))
    except (IndexError, struct.error, UnicodeDecodeError, ValueError):
        raise EmberError(f"{file} is not a valid SentencePiece model") from None
    if not pieces:
        raise EmberError(f"{file} holds no SentencePiece pieces")
    return pieces


def _piece(message: bytes) -> tuple[str, float, int]:
    text, score, kind = "", 0.0, 1
    for field, value in _proto_fields(message):
        if field == 1:
            text = value.decode("utf-8")
        elif field == 2:
            (score,) = struct.unpack("<f", value)
        elif field == 3:
            kind = value
    return text, score, int(_PIECE_TYPES.get(kind, TokenType.NORMAL))


def _proto_fields(data: bytes):
    """(field number, value) of a protobuf message: varints as int, everything else as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(data, pos)
            value, pos = data[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated protobuf message")
        yield field, value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _is_byte_fallback_bpe(tokenizer: dict) -> bool:
    model = tokenizer.get("model") or {}
    return (model.get("type") == "BPE" and bool(model.get("byte_fallback"))
            and (tokenizer.get("decoder") or {}).get("type") == "Sequence")


def _llama_hf_vocab(tokenizer: dict, tokenizer_config: dict, n_vocab: int | None) -> dict[str, Any]:
    """A SentencePiece vocabulary exported to tokenizer.json, typed as llama.cpp's LlamaHfVocab types
    it: byte pieces BYTE, the tokenizer_config special tokens CONTROL, other added tokens USER_DEFINED."""
    vocab = dict(tokenizer["model"].get("vocab") or {})
    added = sorted(tokenizer.get("added_tokens") or [], key=lambda t: t["id"])
    ids = {**vocab, **{t["content"]: t["id"] for t in added}}
    special_ids = {ids[text] for text in _config_special_tokens(tokenizer_config) if text in ids}
    size = max(int(n_vocab or 0), len(vocab) + sum(t["id"] >= len(vocab) for t in added))
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = np.full(size, TokenType.UNUSED, np.int32)
    for text, token_id in vocab.items():
        tokens[token_id] = text
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            types[token_id] = TokenType.BYTE
        else:
            types[token_id] = TokenType.CONTROL if token_id in special_ids else TokenType.NORMAL
    for token in added:
        if token["id"] >= len(vocab):
            tokens[token["id"]] = token["content"]
            types[token["id"]] = TokenType.CONTROL if token["id"] in special_ids else TokenType.USER_DEFINED
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.full(size, -1000.0, np.float32),
        "tokenizer.ggml.token_type": types,
    }


def _config_special_tokens(tokenizer_config: dict) -> list[str]:
    """The special tokens tokenizer_config.json names (transformers' all_special_tokens)."""
    named = [_token_content(tokenizer_config.get(f"{typ}_token")) for typ in SPECIAL_TYPES]
    extra = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = tokenizer_config.get(key) or []
        extra += [_token_content(v) for v in (value.values() if isinstance(value, dict) else value)]
    return [text for text in named + extra if text is not None]


# -- special tokens --------------------------------------------------------------------------

def special_tokens(path: Path, n_vocab: int) -> dict[str, Any]:
    """Special token ids, add_bos/add_eos flags and the chat template (gguf-py SpecialVocab's rules)."""
    tokenizer = _read_json_if(path / "tokenizer.json")
    tokenizer_config = _read_json_if(path / "tokenizer_config.json")
    added = tokenizer.get("added_tokens") or []
    ids: dict[str, int] = {}
    add = _post_processor_adds(tokenizer.get("post_processor"), tokenizer_config)
    for typ in SPECIAL_TYPES:
        flag = tokenizer_config.get(f"add_{typ}_token")
        if isinstance(flag, bool):
            add.setdefault(typ, flag)
        content = _token_content(tokenizer_config.get(f"{typ}_token"))
        if content is None and typ in _FALLBACK_ROLES:
            content = _token_content(tokenizer_config.get(f"{_FALLBACK_ROLES[typ]}_token"))
        token_id = next((t.get("id") for t in added if content is not None and t.get("content") == content), None)
        if isinstance(token_id, int) and 0 <= token_id < n_vocab:
            ids.setdefault(typ, token_id)
    config = _read_json_if(path / "config.json")
    for typ in SPECIAL_TYPES:
        token_id = config.get(f"{typ}_token_id")
        if isinstance(token_id, int) and not isinstance(token_id, bool) and 0 <= token_id < n_vocab:
            ids.setdefault(typ, token_id)
    meta: dict[str, Any] = {}
    meta.update({f"tokenizer.ggml.{_ID_KEYS[typ]}": token_id for typ, token_id in ids.items()})
    meta.update({f"tokenizer.ggml.add_{typ}_token": bool(flag) for typ, flag in add.items()
                 if typ in ("bos", "eos", "sep")})
    template = _chat_template(path, tokenizer_config)
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return meta


_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id", "mask": "mask_token_id"}


def _token_content(entry) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def _post_processor_adds(post: dict | None, tokenizer_config: dict) -> dict[str, bool]:
    """Whether the tokenizer adds BOS/EOS around a sequence, read from its post-processor."""
    add: dict[str, bool] = {}
    bos = _token_content(tokenizer_config.get("bos_token")) or _token_content(tokenizer_config.get("cls_token"))
    eos = _token_content(tokenizer_config.get("eos_token")) or _token_content(tokenizer_config.get("sep_token"))
    for processor in (post or {}).get("processors", [post] if post else []):
        kind = processor.get("type")
        if kind == "ByteLevel":
            add.setdefault("bos", False)
            add.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            add.update(bos=True, eos=True, sep=True)
        elif kind == "TemplateProcessing":
            single = processor.get("single") or []
            first = last = None
            if len(single) > 1:
                first = (single[0].get("SpecialToken") or {}).get("id")
                last = (single[-1].get("SpecialToken") or {}).get("id")
                if first:
                    add["bos"] = first == bos or not tokenizer_config
                if last:
                    add["eos"] = last == eos or not tokenizer_config
            separator = _pair_separator(processor.get("pair") or [], first, last,
                                        (_token_content(tokenizer_config.get("sep_token")), eos))
            if separator is not None:
                add["sep"] = separator
    return add


def _pair_separator(pair: list, first, last, separators: tuple) -> bool | None:
    """Whether a pair template "A [SEP] B" puts a separator of its own between the texts (gguf-py's
    reading: not when the single template already ends in one, which then serves as EOS), or None
    when the template is not of that form."""
    def special(item) -> str | None:
        return (item.get("SpecialToken") or {}).get("id")

    start = 1 if first and pair and special(pair[0]) == first else 0
    stop = -1 if last and pair and special(pair[-1]) == last else None
    pair = pair[start:stop]
    if not pair or (pair[0].get("Sequence") or {}).get("id") != "A" or (pair[-1].get("Sequence") or {}).get("id") != "B":
        return None
    middle = pair[1:-1]
    if not middle:
        return None
    separated = special(middle[0]) in separators and not last
    if len(middle) == 2 and special(middle[1]) in separators:
        separated = True
    return separated


def _chat_template(path: Path, tokenizer_config: dict) -> str | None:
    template = tokenizer_config.get("chat_template")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None:
        template = _read_json_if(path / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def _read_json_if(path: Path) -> dict:
    return read_json(path) if path.is_file() else {}
