"""Build a `tokenizers.Tokenizer` that produces llama.cpp's ids for a byte-level BPE ("gpt2")
vocabulary: the file's merges, the pre-tokenizer regexes that tokenizer.ggml.pre names, then
GPT-2's byte-to-unicode mapping. (SentencePiece-style vocabularies are ember.spm's.)

Special tokens are added tokens, cut out of the text before anything else: user-defined
tokens always, control tokens only when encode_special_tokens is off (llama.cpp's
parse_special).
"""

from __future__ import annotations

import numpy as np
from tokenizers import AddedToken, Regex, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from ember.vocab import CONTROL, UNKNOWN, USER_DEFINED, Vocab


def build_backend(vocab: Vocab) -> Backend:
    """The `tokenizers` backend of a byte-level BPE vocabulary (SentencePiece-style ones use ember.spm)."""
    backend = _bpe_backend(vocab)
    _add_special_tokens(backend, vocab)
    backend.encode_special_tokens = True
    return backend


def _bpe_backend(vocab: Vocab) -> Backend:
    try:
        model = _bpe_model(vocab, [tuple(merge.split(" ", 1)) for merge in vocab.merges])
    except Exception:  # noqa: BLE001 - tokenizers raises plain Exception for a merge it rejects
        # (no space, a leading space, parts or result not tokens)
        model = _bpe_model(vocab, _valid_merges(vocab))
    backend = Backend(model)
    splits = [pre_tokenizers.Split(Regex(regex), "isolated") for regex in vocab.pre.regexes]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    return backend


def _bpe_model(vocab: Vocab, merges: list[tuple[str, str]]) -> models.BPE:
    return models.BPE(vocab.token_to_id, merges, ignore_merges=vocab.pre.ignore_merges)


def _valid_merges(vocab: Vocab) -> list[tuple[str, str]]:
    # "left right" is cut at the first space after the first character, as llama.cpp does; a
    # merge whose parts or result are not tokens can never apply and is left out
    token_to_id = vocab.token_to_id
    valid = []
    for merge in vocab.merges:
        cut = merge.find(" ", 1)
        left, right = merge[:cut], merge[cut + 1:]
        if cut > 0 and left in token_to_id and right in token_to_id and left + right in token_to_id:
            valid.append((left, right))
    return valid


def _add_special_tokens(backend: Backend, vocab: Vocab) -> None:
    special = vocab.attrs & (CONTROL | UNKNOWN) != 0
    user_defined = (vocab.attrs & USER_DEFINED != 0) & ~special
    backend.add_special_tokens(_added_tokens(vocab, np.flatnonzero(special), special=True))
    backend.add_tokens(_added_tokens(vocab, np.flatnonzero(user_defined), special=False))


def _added_tokens(vocab: Vocab, ids: np.ndarray, special: bool) -> list[AddedToken]:
    return [AddedToken(vocab.tokens[i], single_word=False, lstrip=False, rstrip=False,
                       normalized=False, special=special)
            for i in ids if vocab.tokens[i]]
