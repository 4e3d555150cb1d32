"""Chat templates: the model's `tokenizer.chat_template`, rendered as transformers renders it.

A template is Jinja code from an untrusted model file, so it runs in jinja2's
ImmutableSandboxedEnvironment: it can read the messages and call the helpers below, but not
reach Python internals (`().__class__.__subclasses__()` and the like stop with an error).
The environment, helpers and message clean-up mirror transformers' `apply_chat_template`, so
a template renders to the same text in both.

    template = ChatTemplate.from_metadata(gguf_file.metadata)
    prompt = template.render([{"role": "user", "content": "Hi"}])   # ends ready for the reply
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ember.errors import EmberError
from ember.tokenizer.chat_formats import BUILTIN, FALLBACK

# ChatML: the last resort for a model whose file has no template (chat_formats picks the family's)
DEFAULT_TEMPLATE = BUILTIN[FALLBACK]

_MAX_REPEAT = 1 << 20  # longest string or list a template may build with * (1 Mi items)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(EmberError):
    """A chat template that does not parse, fails while rendering, or tries something unsafe."""


class ChatTemplate:
    """A compiled template; `origin` says where it came from (the model file, a built-in format, ...)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", origin: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin
        try:
            self._template = _environment().from_string(source)
        except TemplateSyntaxError as error:
            raise ChatTemplateError(
                f"the chat template does not parse: {error.message} (line {error.lineno})") from None

    @classmethod
    def from_metadata(cls, metadata: dict, source: str | None = None, origin: str = "") -> ChatTemplate:
        """`source` (default: the model's template, ChatML when it has none) with the model's BOS
        and EOS texts."""
        if source is None:
            source = metadata.get("tokenizer.chat_template") or DEFAULT_TEMPLATE
        return cls(str(source), _token_text(metadata, "bos"), _token_text(metadata, "eos"), origin)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The conversation as one prompt string; `extra` reaches the template as variables
        (tools=[...], documents=[...], enable_thinking=False, ...)."""
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **_plain(extra)}
        context.setdefault("tools", None)
        context.setdefault("documents", None)
        try:
            return self._template.render(messages=_plain_messages(messages),
                                         add_generation_prompt=add_generation_prompt, **context)
        except SecurityError as error:
            raise ChatTemplateError(
                f"the chat template was stopped doing something unsafe: {error}") from None
        except TemplateError as error:
            raise ChatTemplateError(f"the chat template failed: {error}") from None
        except Exception as error:  # noqa: BLE001 - a template bug raises anything, e.g. TypeError
            raise ChatTemplateError(
                f"the chat template failed: {type(error).__name__}: {error}") from None


def _token_text(metadata: dict, name: str) -> str:
    token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if token_id is None or tokens is None or not 0 <= int(token_id) < len(tokens):
        return ""
    return str(tokens[int(token_id)])


class _SandboxedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, plus a cap on `"x" * n` so a template cannot exhaust memory."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "*" and _repeat_length(left, right) > _MAX_REPEAT:
            raise SecurityError(f"the template builds a sequence longer than {_MAX_REPEAT} items")
        if operator == "**" and isinstance(right, int) and abs(right) > 1024:
            raise SecurityError("the template raises a number to a power above 1024")
        return super().call_binop(context, operator, left, right)


def _repeat_length(left, right) -> int:
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
            return len(sequence) * count
    return 0


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text in transformers): renders its body."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _TemplateDict:
    """`dict(...)` for templates, without the type's other attributes."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja2's `namespace(...)`, refusing underscore names (no way to store into internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a template namespace cannot hold the name {name!r}")


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # unlike jinja2's own tojson: no HTML escaping, and json.dumps' options
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _plain_messages(messages) -> list[dict]:
    # as transformers: keys whose value is None are dropped, reasoning is offered under all its names
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    plain = []
    for message in _plain(list(messages)):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"each message must be a dict, got {message!r}")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        plain.append(message)
    return plain


def _plain(value: Any) -> Any:
    """Only JSON-like data reaches a template; any other object becomes "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return _plain(value.item())  # numpy scalars
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"
