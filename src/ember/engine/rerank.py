"""Reranking: how relevant each document is to a query, scored by a cross-encoder.

    reranker = Reranker(Embedder(model, tokenizer))    # model: a reranker's (Model.ranks)
    scores = reranker.score("query", ["first document", "second"])   # one float per document

Each document is paired with the query as llama-server pairs them (Tokenizer.encode_pair, or the
file's `tokenizer.chat_template.rerank` with {query} and {document} filled in), the document's
tokens of token type 1 as transformers gives a pair to BERT, and every pair runs through the
encoder and its classification head, packed into shared graph runs (engine/embed.py). A score is
the head's first output, unnormalised, as llama-server reports it (`relevance_score`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ember.engine.embed import Embedder
from ember.errors import EmberError
from ember.gguf.metadata import string_key

RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


@dataclass
class Score:
    index: int  # the document's place in the request
    score: float
    n_tokens: int  # of the query and document together


class Reranker:
    def __init__(self, embedder: Embedder):
        if embedder.pooling != "rank":
            raise EmberError("reranking needs a reranker's model (pooling type rank)")
        self.embedder = embedder
        self.template = string_key(embedder.model.gguf.metadata, RERANK_TEMPLATE_KEY)

    def pair(self, query: str, document: str) -> tuple[list[int], list[int]]:
        """The ids of a query-document pair and their token types (0 the query's part, 1 the document's)."""
        tokenizer = self.embedder.tokenizer
        if self.template is not None:
            text = self.template.replace("{query}", query).replace("{document}", document)
            ids = tokenizer.encode(text, add_special=False, parse_special=True)
            return ids, [0] * len(ids)
        ids, n_first = tokenizer.encode_pair(query, document)
        return ids, [0] * n_first + [1] * (len(ids) - n_first)

    def score(self, query: str, documents: Sequence[str], truncate: bool = False) -> list[Score]:
        """Each document's score, in the documents' order; truncate cuts a pair to what the model
        reads at once (else a longer pair is an EmberError)."""
        if not documents:
            raise EmberError("no documents to rerank")
        pairs = [self.pair(query, document) for document in documents]
        limit = self.embedder.max_tokens
        for i, (ids, _) in enumerate(pairs):
            if len(ids) > limit and not truncate:
                raise EmberError(f"the query with document {i} is {len(ids)} tokens, longer than the {limit} "
                                 "this model reads at once; shorten them (or truncate)")
        pairs = [(ids[:limit], types[:limit]) for ids, types in pairs]
        found = self.embedder.embed_tokens([ids for ids, _ in pairs], [types for _, types in pairs])
        return [Score(i, float(np.asarray(e.vector).reshape(-1)[0]), e.n_tokens) for i, e in enumerate(found)]


def ranked(scores: Sequence[Score], top_n: int | None = None) -> list[Score]:
    """The scores best first (a stable sort: equal scores keep the documents' order), the top_n best."""
    order = sorted(scores, key=lambda s: -s.score)
    return order if top_n is None else order[:max(0, top_n)]
