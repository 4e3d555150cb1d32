"""Embeddings: the final hidden states of texts, pooled per text and normalised.

    embedder = Embedder(model, tokenizer)          # model: Model(..., embeddings=True), or an encoder
    vectors = embedder.embed(["first text", "second"])   # float32 arrays [n_embd], unit length

Pooling is the file's `<arch>.pooling_type` (llama.cpp's enum: 0 none, 1 mean, 2 CLS, 3 last,
4 rank); a file without one (a generation model) gets DEFAULT_POOLING and a warning that names it.
"none" gives one vector per token. A reranker's model (Model.ranks) pools by rank only: its
graph takes the [CLS] state through the classification head, and the "embedding" of an input is
its class scores, unnormalised (engine/rerank.py reads them). Several texts run in one graph run, each in a sequence slot of
its own (positions from 0; attention never crosses slots), as many as the batch's tokens and the
model's slots allow, so 32 short texts cost a few forward passes, not 32.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ember.engine.runtime import Model, token_ids
from ember.errors import EmberError, EmberWarning
from ember.models.pooling import file_pooling

POOLINGS = ("none", "mean", "cls", "last", "rank")
DEFAULT_POOLING = "mean"  # for files that do not say (llama.cpp's server pools so too)


@dataclass
class Embedding:
    vector: np.ndarray  # [n_embd], or [n_tokens, n_embd] without pooling
    n_tokens: int


class Embedder:
    """Pooled (and, with normalize, unit-length) embeddings from a model whose graph returns hidden states."""

    def __init__(self, model: Model, tokenizer, pooling: str | None = None, normalize: bool = True,
                 name: str = "the model"):
        if not model.embeddings:
            raise EmberError("embeddings need a model built with embeddings=True")
        self.model = model
        self.tokenizer = tokenizer
        self.normalize = normalize
        own = "rank" if model.ranks else file_pooling(model.gguf)
        if pooling is None:
            pooling = own
            if pooling is None:
                pooling = DEFAULT_POOLING
                warnings.warn(EmberWarning(
                    f"{name} has no {model.hp.arch}.pooling_type (it is not an embedding model); "
                    f"embedding with {pooling} pooling"), stacklevel=2)
        if pooling not in POOLINGS:
            raise EmberError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        if model.ranks and pooling != "rank":
            raise EmberError(f"{name} is a reranker: its graph ends in a classification head, so it scores "
                             "text pairs (rerank) and does not pool embeddings")
        if pooling == "rank" and not model.ranks:
            raise EmberError(f"{name} is not a reranker: rank pooling needs an encoder with a classification "
                             "head (cls.output.weight)")
        self.pooling = pooling

    @property
    def n_embd(self) -> int:
        return self.model.n_out

    def tokenize(self, text: str, truncate: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text, add_special=True, parse_special=False)
        limit = self.max_tokens
        if len(ids) > limit:
            if not truncate:
                raise EmberError(f"an input of {len(ids)} tokens is longer than the {limit} this model embeds "
                                 "at once; shorten it (or truncate)")
            ids = ids[:limit]
        return ids

    @property
    def max_tokens(self) -> int:
        """The longest input: the context (an encoder sees a text in one run, so its batch too)."""
        return self.model.n_batch if self.model.is_encoder else self.model.n_ctx

    def embed(self, texts: Sequence[str], truncate: bool = False) -> list[Embedding]:
        return self.embed_tokens([self.tokenize(text, truncate) for text in texts])

    def embed_tokens(self, inputs: Sequence[Sequence[int]],
                     token_types: Sequence[Sequence[int]] | None = None) -> list[Embedding]:
        """One Embedding per token list, computed in as few graph runs as fit; token_types: each
        input's token types (a reranker's text pairs), else all 0."""
        inputs = [token_ids(ids, self.model.n_vocab) for ids in inputs]
        types = [np.zeros(ids.size, np.int64) for ids in inputs] if token_types is None else \
            [np.asarray(t, np.int64).reshape(-1) for t in token_types]
        if len(types) != len(inputs) or any(t.size != ids.size for t, ids in zip(types, inputs)):
            raise EmberError("token types must be given for every token of every input")
        for ids in inputs:
            if ids.size == 0:
                raise EmberError("cannot embed an empty input")
            if ids.size > self.max_tokens:
                raise EmberError(f"an input of {ids.size} tokens is longer than the {self.max_tokens} this "
                                 "model embeds at once")
        out: list[Embedding | None] = [None] * len(inputs)
        for group in self._groups(inputs):
            for index, states in zip(group, self._run([inputs[i] for i in group], [types[i] for i in group])):
                out[index] = Embedding(self._pool(states), int(inputs[index].size))
        return out  # type: ignore[return-value]

    def _groups(self, inputs: list[np.ndarray]) -> list[list[int]]:
        """Indices of inputs packed into runs: at most n_batch tokens and n_seq texts a run; a longer
        text (a decoder's, chunked by eval) runs alone."""
        groups: list[list[int]] = []
        tokens = 0
        for i, ids in enumerate(inputs):
            if groups and tokens + ids.size <= self.model.n_batch and len(groups[-1]) < self.model.n_seq:
                groups[-1].append(i)
                tokens += ids.size
            else:
                groups.append([i])
                tokens = ids.size
        return groups

    def _run(self, inputs: list[np.ndarray], types: list[np.ndarray]) -> list[np.ndarray]:
        """The hidden states of each input's tokens (only the rows its pooling reads)."""
        model = self.model
        if len(inputs) == 1 and inputs[0].size > model.n_batch:  # a long decoder input: chunked
            model.reset(0)
            try:
                return [model.eval(inputs[0], seq=0, logits=self._rows(inputs[0].size))]
            finally:
                model.reset(0)
        tokens = np.concatenate(inputs)
        positions = np.concatenate([np.arange(ids.size, dtype=np.int32) for ids in inputs])
        seq_ids = np.concatenate([np.full(ids.size, s, np.int32) for s, ids in enumerate(inputs)])
        starts = np.cumsum([0] + [ids.size for ids in inputs])
        rows = np.concatenate([start + self._rows(ids.size) for start, ids in zip(starts, inputs)])
        states = model._run(tokens, positions, seq_ids, rows.astype(np.int32), np.concatenate(types))
        counts = np.cumsum([0] + [self._rows(ids.size).size for ids in inputs])
        return [states[a:b] for a, b in itertools.pairwise(counts)]

    def _rows(self, n_tokens: int) -> np.ndarray:
        if self.pooling == "cls" or (self.pooling == "rank" and self.model.is_encoder):  # [CLS], as llama.cpp's
            return np.array([0])
        if self.pooling in ("last", "rank"):  # a decoder's reranker reads its last token
            return np.array([n_tokens - 1])
        return np.arange(n_tokens)

    def _pool(self, states: np.ndarray) -> np.ndarray:
        if self.pooling == "rank":
            return np.asarray(states[0], dtype=np.float32)  # the class scores, as the head gives them
        vector = states if self.pooling == "none" else states.mean(axis=0) if self.pooling == "mean" else states[0]
        vector = np.asarray(vector, dtype=np.float32)
        if self.normalize:
            norm = np.linalg.norm(vector, axis=-1, keepdims=True)
            vector = vector / np.maximum(norm, 1e-12)
        return vector.astype(np.float32)
