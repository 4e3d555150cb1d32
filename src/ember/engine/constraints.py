"""Constrained output: a grammar, JSON schema, regex or choice list that every generated token
must keep the text within, compiled by llguidance into a per-step token mask.

    grammar = Grammar.json_schema({"type": "object", "properties": {...}})
    params = SamplingParams(temperature=0, grammar=grammar)      # the sampler applies the mask

- `Grammar` is what a request asks for, checked when it is made (a schema or grammar llguidance
  cannot compile raises `ConstraintError` with llguidance's reason).
- `vocabulary(tokenizer, n_vocab)` hands every token's bytes to llguidance once per tokenizer
  (special tokens marked with a leading 0xFF byte, so no grammar text can match them; the
  end-of-generation tokens are its EOS set) and keeps the result.
- `Constraint` is one request's matcher. `accept(token)` moves it on and computes the next
  mask, on a worker thread where a core is free for it (llguidance computes masks without the
  GIL), so the mask is built while the model's graph runs the token; `allowed()` waits for it.
  Once the grammar is complete and admits nothing more (`finished`), generation ends.

JSON is generated compactly by default (`{"a": 1, "b": [2, 3]}`: one space after `:` and `,`,
no other whitespace), so that a model cannot wander into endless whitespace; a schema's own
top-level "x-guidance" options override that (llguidance's JSON options).
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import llguidance
import numpy as np

from ember.errors import EmberError
from ember.sysinfo import physical_cores

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_SPECIAL_PREFIX = b"\xff"  # llguidance's mark of a special token in the vocabulary
_MAX_CHOICES = 4096


class ConstraintError(EmberError, ValueError):
    """A grammar, schema, regex or choice list that cannot constrain generation."""


@dataclass(frozen=True)
class Grammar:
    """A constraint on generated text, as llguidance's grammar (`source`) plus what it came from.

    Build one with `json_schema`, `json_object`, `gbnf` (llama.cpp's GBNF, or Lark), `lark`,
    `regex` or `choice`; each checks that llguidance can compile it.
    """

    kind: str
    source: str

    @classmethod
    def json_schema(cls, schema: dict | str, strict: bool = True) -> Grammar:
        """Text that is JSON matching the schema. strict=True: every keyword of the schema is
        enforced (one llguidance does not implement is an error); strict=False: those are
        skipped (OpenAI's non-strict schemas)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as error:
                raise ConstraintError(f"the JSON schema is not valid JSON: {error}") from None
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError(f"a JSON schema must be an object, got {type(schema).__name__}")
        options = {**JSON_OPTIONS, "lenient": not strict}
        try:
            source = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        except (ValueError, TypeError) as error:
            raise ConstraintError(f"the JSON schema cannot be used: {error}") from None
        return cls._checked("json_schema", source, "JSON schema")

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def gbnf(cls, text: str) -> Grammar:
        """A llama.cpp GBNF grammar (its root rule is `root`); Lark syntax is accepted too."""
        _check_text("grammar", text)
        try:
            source = llguidance.grammar_from("gbnf", text)
        except ValueError as error:
            raise ConstraintError(f"the grammar cannot be used: {error}") from None
        return cls._checked("grammar", source, "grammar")

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """A grammar in llguidance's Lark syntax (its root rule is `start`)."""
        _check_text("grammar", text)
        return cls._checked("grammar", llguidance.LLMatcher.grammar_from_lark(text), "grammar")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """Text that the regular expression matches as a whole (Rust regex syntax)."""
        _check_text("regex", pattern)
        return cls._checked("regex", llguidance.LLMatcher.grammar_from_regex(pattern), "regex")

    @classmethod
    def choice(cls, options: Sequence[str]) -> Grammar:
        """Exactly one of the strings."""
        if isinstance(options, str) or not options or not all(isinstance(o, str) and o for o in options):
            raise ConstraintError("a choice needs a non-empty list of non-empty strings")
        if len(options) > _MAX_CHOICES:
            raise ConstraintError(f"a choice has at most {_MAX_CHOICES} options, got {len(options)}")
        lark = "start: " + " | ".join(json.dumps(option) for option in options)
        return cls._checked("choice", llguidance.LLMatcher.grammar_from_lark(lark), "choice")

    @classmethod
    def _checked(cls, kind: str, source: str, what: str) -> Grammar:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source)
        if is_error:
            raise ConstraintError(f"the {what} cannot be compiled: {_one_line(messages[0])}")
        return cls(kind, source)


def _check_text(what: str, text: object) -> None:
    if not isinstance(text, str) or not text.strip():
        raise ConstraintError(f"the {what} must be a non-empty string")


def _one_line(message: str) -> str:
    return " ".join(message.split())


# -- the vocabulary, once per tokenizer ---------------------------------------------------------

_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_VOCABULARIES_LOCK = threading.Lock()


class _TokenizerView(llguidance.TokenizerWrapper):
    """What llguidance asks of a tokenizer: every token's bytes, EOS, and encoding of text."""

    def __init__(self, tokenizer, n_vocab: int):
        is_special = getattr(tokenizer, "is_special", None)
        tokens = []
        for token in range(min(n_vocab, tokenizer.n_vocab)):
            data = tokenizer.token_bytes(token)
            tokens.append(_SPECIAL_PREFIX + data if is_special is not None and is_special(token) else data)
        tokens += [b""] * (n_vocab - len(tokens))  # rows of the model's output past the vocabulary
        self.tokens = tokens
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i, data in enumerate(tokens) if data.startswith(_SPECIAL_PREFIX)]
        self.is_tokenizer_wrapper = True
        self._tokenizer = weakref.ref(tokenizer)  # the cache of vocabularies must not keep the tokenizer alive

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        tokenizer = self._tokenizer()
        return [] if tokenizer is None else tokenizer.encode(text, add_special=False)


class Vocabulary:
    """A tokenizer's tokens as llguidance holds them, and the end-of-generation ids."""

    def __init__(self, tokenizer, n_vocab: int):
        self.n_vocab = n_vocab
        eog = sorted(getattr(tokenizer, "eog_ids", ()) or [tokenizer.eos_id])
        self.ll_tokenizer = llguidance.LLTokenizer(_TokenizerView(tokenizer, n_vocab), n_vocab=n_vocab,
                                                   eos_token=eog)


def vocabulary(tokenizer, n_vocab: int) -> Vocabulary:
    """The llguidance vocabulary of a tokenizer, built on first use and kept while it lives."""
    with _VOCABULARIES_LOCK:
        by_size = _VOCABULARIES.setdefault(tokenizer, {})
        if n_vocab not in by_size:
            by_size[n_vocab] = Vocabulary(tokenizer, n_vocab)
        return by_size[n_vocab]


# -- one request -------------------------------------------------------------------------------

_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ember-mask")


class Constraint:
    """The matcher of one request: which tokens may come next, and whether the grammar is done.

    `overlap`: compute each next mask on a worker thread, so it is built while the model's graph
    runs the token. That pays where a core is free for it: by default where the CPU has more
    logical CPUs than physical cores (the graph's threads take one per core). Without a spare
    one, a worker would take a core from the graph's threads, which wait for each other at
    every op, so the mask is computed in line (tens of microseconds).
    """

    overlap: bool = (os.cpu_count() or 1) > physical_cores()

    def __init__(self, grammar: Grammar, vocab: Vocabulary, tokenizer):
        self.grammar = grammar
        self.n_vocab = vocab.n_vocab
        self._tokenizer = tokenizer  # llguidance encodes text through it while the matcher lives
        self._matcher = llguidance.LLMatcher(vocab.ll_tokenizer, grammar.source, log_level=0)
        self._check()
        self._bits = np.zeros((vocab.n_vocab + 31) // 32, dtype=np.int32)
        self._allowed: np.ndarray | None = None
        self._allowed_ids: np.ndarray | None = None
        self._finished = False
        self._pending: Future | None = None
        self._start_mask()

    @property
    def finished(self) -> bool:
        """The text is complete and nothing may follow (only an end-of-generation token)."""
        return self._finished

    def is_allowed(self, token: int) -> bool:
        self._wait()
        return bool((int(self._bits[token >> 5]) >> (token & 31)) & 1)

    def allowed(self) -> np.ndarray:
        """A bool per token: whether it may come next."""
        self._wait()
        if self._allowed is None:
            bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.n_vocab]
            self._allowed = bits.view(np.bool_)
        return self._allowed

    def allowed_ids(self) -> np.ndarray:
        """The ids of the tokens that may come next, ascending."""
        if self._allowed_ids is None:
            self._allowed_ids = np.flatnonzero(self.allowed())
        return self._allowed_ids

    def accept(self, token: int) -> None:
        """Move past a generated token, and start computing the next mask."""
        self._wait()
        if not self._matcher.consume_token(token):
            raise ConstraintError(f"token {token} does not fit the {self.grammar.kind}: {self._matcher.get_error()}")
        self._allowed = self._allowed_ids = None
        self._finished = self._matcher.is_stopped()
        if not self._finished:
            self._start_mask()

    def _start_mask(self) -> None:
        if self.overlap:  # the matcher is the worker's until _wait
            self._pending = _WORKERS.submit(self._compute)
        else:
            self._compute()
            self._check()

    def _compute(self) -> None:
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
            self._check()

    def _check(self) -> None:
        if self._matcher.is_error():
            raise ConstraintError(f"the {self.grammar.kind} cannot be followed: {_one_line(self._matcher.get_error())}")


def constraint_for(grammar: Grammar | None, tokenizer, n_vocab: int) -> Constraint | None:
    """The request's matcher over the tokenizer's vocabulary (None without a grammar)."""
    if grammar is None:
        return None
    if not isinstance(grammar, Grammar):
        raise ConstraintError(f"grammar must be an ember Grammar, got {type(grammar).__name__}")
    if tokenizer is None:
        raise ConstraintError("a grammar needs the tokenizer of the model")
    return Constraint(grammar, vocabulary(tokenizer, n_vocab), tokenizer)


def grammar_from_request(grammar: str | Grammar | None = None, json_schema: dict | str | None = None,
                         regex: str | None = None, choice: Sequence[str] | None = None,
                         response_format: dict | None = None) -> Grammar | None:
    """The one Grammar a request's options ask for (at most one of them may be given).

    grammar: GBNF (or Lark) text, or a Grammar; json_schema: a schema (dict or JSON text);
    regex: a pattern; choice: strings; response_format: OpenAI's {"type": "text" |
    "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}.
    """
    from_format = _response_format(response_format)
    given = [name for name, value in (("grammar", grammar), ("json_schema", json_schema), ("regex", regex),
                                      ("choice", choice), ("response_format", from_format)) if value is not None]
    if len(given) > 1:
        raise ConstraintError(f"give one constraint, not {' and '.join(given)}")
    if grammar is not None:
        return grammar if isinstance(grammar, Grammar) else Grammar.gbnf(grammar)
    if json_schema is not None:
        return Grammar.json_schema(json_schema)
    if regex is not None:
        return Grammar.regex(regex)
    if choice is not None:
        return Grammar.choice(choice)
    return from_format


def _response_format(response_format: Any) -> Grammar | None:
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ConstraintError("response_format must be an object with a 'type'")
    kind = response_format.get("type")
    unknown = set(response_format) - {"type", "json_schema", "schema"}
    if unknown:
        raise ConstraintError(f"response_format has unsupported fields: {', '.join(sorted(unknown))}")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")  # llama-cpp-python's {"type": "json_object", "schema": {...}}
        return Grammar.json_object() if schema is None else Grammar.json_schema(schema)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ConstraintError("response_format of type json_schema needs json_schema: {\"name\", \"schema\"}")
        unknown = set(spec) - {"name", "schema", "strict", "description"}
        if unknown:
            raise ConstraintError(f"response_format.json_schema has unsupported fields: {', '.join(sorted(unknown))}")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ConstraintError("response_format.json_schema.strict must be true or false")
        return Grammar.json_schema(spec["schema"], strict=bool(strict))
    raise ConstraintError(f"response_format type must be text, json_object or json_schema, got {kind!r}")
