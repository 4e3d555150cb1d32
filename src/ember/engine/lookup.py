"""Prompt lookup: draft tokens for speculative decoding found in the text itself, no draft model.

Where the output repeats what the prompt (or the output so far) already holds — an edited
file, a quoted passage, code that renames one variable — the tokens that followed the last
occurrence of the current n-gram are a good guess for what comes next. The generation loop
evaluates the last token and the guesses in one batched forward pass, samples from each
position in turn, and keeps the guesses up to the first one that differs from the sampled
token (Saxena 2023, "prompt lookup decoding"; llama.cpp's llama-lookup and ngram speculative
types). Every token is still sampled from the logits plain decoding would have computed, so
the output is the plain output; only the number of forward passes changes.

`NgramIndex` holds, for each n-gram of ngram_min..ngram_max tokens seen so far, where its most
recent continuation starts: one dict update per n per token, one lookup per n per draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ember.errors import EmberError

MAX_DRAFT = 64  # most tokens one draft may hold


@dataclass(frozen=True)
class Lookup:
    """Prompt-lookup decoding's options: the draft is the continuation of the most recent earlier
    occurrence of the last n tokens, for the longest n in [ngram_min, ngram_max] that occurred,
    and holds at most n_draft tokens."""

    ngram_min: int = 2
    ngram_max: int = 4
    n_draft: int = 10

    def __post_init__(self) -> None:
        for name in ("ngram_min", "ngram_max", "n_draft"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EmberError(f"lookup {name} must be an integer >= 1, got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise EmberError(f"lookup ngram_min ({self.ngram_min}) is larger than ngram_max ({self.ngram_max})")
        if self.n_draft > MAX_DRAFT:
            raise EmberError(f"lookup n_draft must be at most {MAX_DRAFT}, got {self.n_draft}")


def lookup_options(lookup: "Lookup | bool | None") -> Lookup | None:
    """A Lookup from what the API accepts: True for the defaults, False or None for off."""
    if lookup is None or lookup is False:
        return None
    if lookup is True:
        return Lookup()
    if isinstance(lookup, Lookup):
        return lookup
    raise EmberError(f"lookup must be True, False, None or an ember.Lookup, got {lookup!r}")


class NgramIndex:
    """The tokens of a request (prompt, then output) and, per n-gram, its latest continuation."""

    def __init__(self, options: Lookup, tokens: Iterable[int] = ()):
        self.options = options
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token that followed it
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        tokens = self.tokens
        end = len(tokens)  # the new token follows the n-grams that end here
        for n in range(self.options.ngram_min, min(self.options.ngram_max, end) + 1):
            self._next[tuple(tokens[end - n:end])] = end
        tokens.append(token)

    def draft(self, limit: int | None = None) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the longest matching suffix
        (at most n_draft, and at most limit); empty without a match."""
        n_draft = self.options.n_draft if limit is None else min(self.options.n_draft, limit)
        if n_draft <= 0:
            return []
        tokens = self.tokens
        for n in range(min(self.options.ngram_max, len(tokens)), self.options.ngram_min - 1, -1):
            start = self._next.get(tuple(tokens[len(tokens) - n:]))
            if start is not None:
                return tokens[start:start + n_draft]
        return []
