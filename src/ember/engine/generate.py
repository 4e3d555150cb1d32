"""The generation loop: prompt tokens in, a stream of text pieces out.

One `Generation` is one request. Iterating it evaluates the prompt (reusing the longest
prefix already in the KV cache), then samples a token, decodes it and evaluates it, until
one of:

- the model emits an end-of-generation token (finish_reason "stop"; its text is not emitted),
- the text contains a stop string (finish_reason "stop"; stop strings are matched across
  token boundaries and never emitted: text that could be the start of a stop string is held
  back until it cannot),
- `max_tokens` tokens were generated or the context is full (finish_reason "length"),
- the sampling parameters' grammar is complete and admits nothing more (finish_reason "stop").

Text pieces contain only complete UTF-8 characters; control tokens (BOS, <|im_start|>, ...) add
no text, as in llama.cpp's output, unless `keep_special` asks for their text (a tool call's
markers, such as Mistral's [TOOL_CALLS], are control tokens). With `logprobs=n` each chunk carries the
log-probability (under the model's raw logits) of the tokens whose text starts in it, with
the n most likely alternatives.

With `lookup` (engine/lookup.py) each step evaluates the last token together with draft tokens
found in the prompt and output so far, in one forward pass with logits for every position;
tokens are sampled from those rows one by one, as plain decoding samples them, and the rows
after the first sampled token that differs from its draft are dropped with their KV cache.
`n_drafted` and `n_accepted` count the draft tokens.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from ember.engine.lookup import Lookup, NgramIndex
from ember.engine.runtime import token_ids
from ember.engine.sampling import Sampler, SamplingParams, token_logprobs
from ember.errors import ContextFullError, EmberError


@dataclass
class TokenLogprob:
    """A generated token, its log-probability and the `top` alternatives as (id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    text_offset: int = 0  # where the token's text starts in the generated text (characters)


@dataclass
class Chunk:
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


class StopMatcher:
    """Cuts a stream of text at the first stop string, holding back what could start one."""

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """The text that is safe to emit now, and whether a stop string was found."""
        if not self.stops:
            return text, False
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return buffer[:min(hits)], True
        n_held = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - n_held:]
        return buffer[:len(buffer) - n_held], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        longest = min(len(buffer), max(len(s) for s in self.stops) - 1)
        for n in range(longest, 0, -1):
            tail = buffer[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0


class SequenceCache:
    """The tokens held in one KV-cache sequence of a model, so a new prompt can reuse a prefix."""

    def __init__(self, model, seq: int = 0):
        self.model = model
        self.seq = seq
        self.tokens: list[int] = []
        self.owner: object | None = None
        model.reset(seq)

    def prefill(self, prompt: Sequence[int]) -> tuple[np.ndarray, int]:
        """Logits after the prompt, and how many prompt tokens had to be evaluated."""
        n_common = self.keep_prefix(prompt)
        return self.eval(prompt[n_common:]), len(prompt) - n_common

    def common_prefix(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of the prompt are cached (one is always left to evaluate, for logits)."""
        n_common = 0
        limit = min(len(self.tokens), len(prompt) - 1)
        while n_common < limit and self.tokens[n_common] == prompt[n_common]:
            n_common += 1
        return n_common

    def keep_prefix(self, prompt: Sequence[int]) -> int:
        """Forget what follows the cached prefix of the prompt; the prefix's length."""
        n_common = self.common_prefix(prompt)
        self.model.truncate(n_common, self.seq)
        del self.tokens[n_common:]
        return n_common

    def eval(self, tokens: Sequence[int], logits="last") -> np.ndarray:
        self.tokens.extend(tokens)
        try:
            return self.model.eval(tokens, seq=self.seq, logits=logits)
        finally:  # after an interrupt or an error, keep only what the model really holds
            n_held = min(self.model.n_past(self.seq), len(self.tokens))
            del self.tokens[n_held:]
            self.model.truncate(n_held, self.seq)

    @property
    def full(self) -> bool:
        return self.model.n_past(self.seq) >= self.model.n_ctx

    def clear(self) -> None:
        self.tokens.clear()
        self.model.reset(self.seq)

    def truncate(self, n: int) -> None:
        """Forget the cached positions from n on."""
        n = max(0, min(n, len(self.tokens)))
        self.model.truncate(n, self.seq)
        del self.tokens[n:]

    def save(self) -> "SequenceState":
        return SequenceState(tuple(self.tokens), self.model.save_sequence(self.seq))

    def restore(self, state: "SequenceState") -> None:
        self.model.load_sequence(state.kv, len(state.tokens), self.seq)
        self.tokens[:] = list(state.tokens)


@dataclass(frozen=True)
class SequenceState:
    """What a sequence held: its tokens and their KV cache (bytes)."""

    tokens: tuple[int, ...]
    kv: bytes


class Generation:
    """One request; iterate it for `Chunk`s. Afterwards `finish_reason`, the token counts and
    the timings (seconds, the consumer's time between chunks excluded) are set.

    max_tokens: None = until an end token, a stop string or a full context (a negative count is
    an error: llama.cpp's n_predict = -1 for "no limit" is None here).
    """

    def __init__(self, model, tokenizer, prompt_tokens: Sequence[int], params: SamplingParams | None = None,
                 max_tokens: int | None = None, stop: Sequence[str] | str | None = None,
                 logprobs: int | None = None, cache: SequenceCache | None = None, keep_special: bool = False,
                 lookup: Lookup | None = None):
        self.prompt_tokens = token_ids(prompt_tokens, model.n_vocab).tolist()
        if not self.prompt_tokens:
            raise EmberError("the prompt is empty")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 0):
            raise EmberError(f"max_tokens must be a count >= 0, or None for no limit; got {max_tokens!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.params = params or SamplingParams()
        self.max_tokens = max_tokens
        self.stops = [stop] if isinstance(stop, str) else list(stop or [])
        self.n_logprobs = logprobs
        self.cache = cache or SequenceCache(model)
        self.sampler = Sampler(self.params, model.n_vocab, history=self.prompt_tokens, tokenizer=tokenizer)
        self.seed = self.sampler.seed
        self.continuation = Continuation(tokenizer, self.sampler, self.max_tokens, self.stops, logprobs,
                                         keep_special=keep_special)
        self.tokens = self.continuation.tokens
        self.finish_reason: str | None = None
        self.lookup = lookup
        self.n_drafted = 0
        self.n_accepted = 0
        self.n_prompt_evaluated = 0
        self.t_prompt = 0.0
        self.t_generate = 0.0
        self._check_fits()
        self._iterator = self._run()

    @property
    def n_prompt(self) -> int:
        return len(self.prompt_tokens)

    @property
    def n_generated(self) -> int:
        return len(self.tokens)

    def __iter__(self) -> Iterator[Chunk]:
        return self._iterator

    def __next__(self) -> Chunk:
        return next(self._iterator)

    def text(self) -> str:
        """Run to the end and return the whole generated text."""
        return "".join(chunk.text for chunk in self)

    def close(self) -> None:
        self._iterator.close()

    def _check_fits(self) -> None:
        n_ctx = self.model.n_ctx
        if self.n_prompt > n_ctx:
            trained = getattr(self.model, "n_ctx_train", n_ctx)
            advice = (f"raise the context size (-c / n_ctx, up to {trained} for this model) or shorten the prompt"
                      if trained > n_ctx else "shorten the prompt (the context is already the model's maximum)")
            raise ContextFullError(f"the prompt has {self.n_prompt} tokens but the context holds {n_ctx}: {advice}")

    def _run(self) -> Iterator[Chunk]:
        self.cache.owner = self
        start = time.perf_counter()
        logits, self.n_prompt_evaluated = self.cache.prefill(self.prompt_tokens)
        self.t_prompt = time.perf_counter() - start
        start = time.perf_counter()
        reply = self.continuation
        index = NgramIndex(self.lookup, self.prompt_tokens) if self.lookup else None
        rows: deque[np.ndarray] = deque([logits])  # logits not sampled from yet, in order
        drafts: deque[int] = deque()  # the draft token each row after the first was computed for
        try:
            while True:
                # the context is full as plain decoding would see it: without the positions of the unsampled rows
                if reply.at_limit(self.model.n_past(self.cache.seq) - len(rows) >= self.model.n_ctx):
                    chunk = reply.finish("length")
                else:
                    if self.n_generated and self.cache.owner is not self:
                        raise EmberError("this generation was interrupted by a newer request on the same model")
                    if not rows:
                        self._eval_next(rows, drafts, index)
                    n_before = self.n_generated
                    chunk = reply.step(rows.popleft())
                    if index is not None and self.n_generated > n_before:
                        self._check_draft(rows, drafts, index)
                    elif reply.finish_reason:  # an end token: the drafts after it are not the reply's
                        self._drop_rows(rows, drafts)
                if reply.finish_reason:
                    self.finish_reason = reply.finish_reason
                    self.t_generate += time.perf_counter() - start
                    yield chunk
                    return
                if chunk.text:
                    self.t_generate += time.perf_counter() - start
                    yield chunk
                    start = time.perf_counter()
        finally:
            # the first unsampled row follows a token that stays; the drafts after it were never checked
            if len(rows) > 1 and self.cache.owner is self:
                self.cache.truncate(len(self.cache.tokens) - len(rows) + 1)

    def _eval_next(self, rows: deque, drafts: deque, index: NgramIndex | None) -> None:
        """Evaluate the last token (with a draft after it, under lookup); its rows of logits go to rows."""
        token = self.tokens[-1]
        draft = index.draft(self._draft_room()) if index is not None else []
        if not draft:
            rows.append(self.cache.eval([token]))
            return
        self.n_drafted += len(draft)
        rows.extend(self.cache.eval([token, *draft], logits="all"))
        drafts.extend(draft)

    def _draft_room(self) -> int:
        """How many draft tokens may follow the last one: what the context and max_tokens leave."""
        room = self.model.n_ctx - self.model.n_past(self.cache.seq) - 1
        if self.max_tokens is not None:
            room = min(room, self.max_tokens - self.n_generated - 1)
        return room

    def _check_draft(self, rows: deque, drafts: deque, index: NgramIndex) -> None:
        """Record the token just sampled; where it is not the draft's, drop the rows after it."""
        token = self.tokens[-1]
        index.append(token)
        if not drafts:
            return
        if token == drafts.popleft() and not self.continuation.finish_reason:
            self.n_accepted += 1
            return
        self._drop_rows(rows, drafts)

    def _drop_rows(self, rows: deque, drafts: deque) -> None:
        """Forget the unsampled rows and the draft tokens they follow, in the KV cache too."""
        if rows:
            self.cache.truncate(len(self.cache.tokens) - len(rows))
        rows.clear()
        drafts.clear()


class Continuation:
    """The text side of one request: each `step(logits)` samples a token and returns the text it
    completes. It ends (`finish_reason` set, everything held back released) at an
    end-of-generation token, a stop string, the end of the sampler's grammar, or
    `finish("length")` once `at_limit`.

    The generation loop drives one of these per request; the server's scheduler drives one per
    sequence slot from the rows of a batched decode.
    """

    def __init__(self, tokenizer, sampler: Sampler, max_tokens: int | None = None, stops: Sequence[str] = (),
                 n_logprobs: int | None = None, keep_special: bool = False):
        self.sampler = sampler
        self.max_tokens = max_tokens
        self.n_logprobs = n_logprobs
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self._eog_ids = tokenizer.eog_ids
        self._decoder = tokenizer.stream_decoder(skip_special=not keep_special)
        self._matcher = StopMatcher(stops)
        self._pending: deque[TokenLogprob] = deque()
        self._n_received = 0  # characters decoded so far
        self._n_emitted = 0  # characters emitted so far

    def at_limit(self, context_full: bool) -> bool:
        """Whether no further token may be generated: max_tokens reached, or the context is full."""
        at_max = self.max_tokens is not None and len(self.tokens) >= self.max_tokens
        return at_max or (bool(self.tokens) and context_full)

    def step(self, logits: np.ndarray) -> Chunk:
        """Sample the next token from the logits after the last one; the text that is now safe to emit."""
        token = self.sampler.sample(logits)
        if token in self._eog_ids:
            return self.finish("stop")
        self.tokens.append(token)
        self.sampler.accept(token)
        if self.n_logprobs is not None:
            logprob, top = token_logprobs(logits, token, self.n_logprobs)
            self._pending.append(TokenLogprob(token, logprob, top, self._n_received))
        piece = self._decoder.feed(token)
        self._n_received += len(piece)
        text, stopped = self._matcher.feed(piece)
        self._n_emitted += len(text)
        if stopped:
            self.finish_reason = "stop"
        elif self.sampler.finished:
            last = self.finish("stop")
            return Chunk(text + last.text, last.logprobs)
        return Chunk(text, _released(self._pending, self._n_emitted, everything=False))

    def finish(self, reason: str) -> Chunk:
        """End the reply; the text held back (an incomplete character, a possible stop-string start)."""
        self.finish_reason = reason
        text, _ = self._matcher.feed(self._decoder.flush())
        return Chunk(text + self._matcher.flush(), _released(self._pending, self._n_received, everything=True))


def _released(pending: deque[TokenLogprob], n_emitted: int, everything: bool) -> list[TokenLogprob]:
    """The pending token logprobs whose text starts within the first n_emitted characters."""
    released = []
    while pending and (everything or pending[0].text_offset < n_emitted):
        released.append(pending.popleft())
    return released

