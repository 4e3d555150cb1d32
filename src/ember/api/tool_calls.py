"""Tool calling: OpenAI's `tools` / `tool_choice` into a chat prompt, and the model's reply back
into OpenAI `tool_calls`, in the format of the model's family.

    tools = ToolRequest.from_openai(tools, tool_choice, parallel_tool_calls)   # validated
    style = tool_style(chat_template_source)       # which family's format the template speaks
    messages, template_tools = style.prompt(messages, tools)
    grammar = style.grammar(tools)                 # the constraint for tool_choice required / a name
    content, calls = style.parse(reply_text)

The formats (what the model writes to call a tool):

- hermes (Qwen 2.5/3, Hermes, many fine-tunes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- llama3 (Llama 3.1-3.3): `{"name": ..., "parameters": {...}}`, possibly after `<|python_tag|>`,
  several separated by `;`;
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or `[TOOL_CALLS]name[ARGS]{...}`;
- deepseek (V2.5, V3, R1): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`
  (V3.1: `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`);
- functionary: v3.2 `>>>name\\n{...}` (`>>>all\\n` is text), v3.1 `<function=name>{...}</function>`;
- generic, for templates that know no tools: the tools and the answer format go into the system
  message and the reply is one JSON object, `{"tool_calls": [{"name": ..., "arguments": {...}}]}`
  or `{"response": "text"}`, constrained to that shape (llama.cpp's generic format).

Templates with their own tool support get `tools` as the jinja variable and the history as
OpenAI sends it (tool calls' arguments parsed into objects, as transformers' templates expect);
the generic format writes past tool calls and tool results into the messages as JSON text.
With tool_choice "required" or a named function the reply is constrained to the format with
each function's arguments constrained to its JSON schema, so it always parses.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any, Sequence

from ember.engine.constraints import JSON_OPTIONS, Grammar
from ember.errors import EmberError

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class ToolError(EmberError, ValueError):
    """A `tools`, `tool_choice` or `parallel_tool_calls` value ember cannot use."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Function:
    name: str
    description: str | None
    parameters: dict

    def openai(self) -> dict:
        spec = {"name": self.name, "parameters": self.parameters}
        if self.description:
            spec["description"] = self.description
        return {"type": "function", "function": spec}


@dataclass
class ToolRequest:
    """A request's tools, which of them the reply must call ("auto", "required" or a name) and
    whether it may call several."""

    functions: list[Function]
    choice: str
    parallel: bool

    @classmethod
    def from_openai(cls, tools: Sequence[dict] | None, tool_choice: Any = None,
                    parallel_tool_calls: bool | None = None) -> ToolRequest | None:
        """Validated OpenAI fields; None when there are no tools or tool_choice is "none"."""
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise ToolError("parallel_tool_calls must be true or false", "parallel_tool_calls")
        if tools is None or (isinstance(tools, list) and not tools):
            if tool_choice not in (None, "none", "auto"):
                raise ToolError("tool_choice needs tools", "tool_choice")
            return None
        if not isinstance(tools, list):
            raise ToolError("tools must be a list of {\"type\": \"function\", \"function\": {...}}", "tools")
        functions = [_function(tool, i) for i, tool in enumerate(tools)]
        names = [f.name for f in functions]
        if len(set(names)) != len(names):
            raise ToolError("tools has two functions of the same name", "tools")
        choice = _choice(tool_choice, names)
        if choice == "none":
            return None
        return cls(functions, choice, True if parallel_tool_calls is None else parallel_tool_calls)

    @property
    def constrained(self) -> bool:
        return self.choice != "auto"

    @property
    def callable(self) -> list[Function]:
        """The functions the reply may call."""
        return self.functions if self.choice in ("auto", "required") else [
            f for f in self.functions if f.name == self.choice]

    def openai(self) -> list[dict]:
        return [f.openai() for f in self.functions]


def _function(tool: Any, index: int) -> Function:
    where = f"tools.{index}"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ToolError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}", where)
    unknown = set(tool) - {"type", "function"}
    if unknown:
        raise ToolError(f"{where} has unsupported fields: {', '.join(sorted(unknown))}", where)
    spec = tool["function"]
    unknown = set(spec) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise ToolError(f"{where}.function has unsupported fields: {', '.join(sorted(unknown))}", where)
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolError(f"{where}.function.name must be 1-64 letters, digits, '_', '-' or '.'", where)
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolError(f"{where}.function.description must be a string", where)
    parameters = spec.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise ToolError(f"{where}.function.parameters must be a JSON schema object", where)
    if spec.get("strict") not in (None, True, False):
        raise ToolError(f"{where}.function.strict must be true or false", where)
    return Function(name, description, parameters)


def _choice(tool_choice: Any, names: list[str]) -> str:
    if tool_choice is None:
        return "auto"
    if tool_choice in ("auto", "none", "required"):
        return tool_choice
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and set(tool_choice) == {"type", "function"}:
        function = tool_choice["function"]
        if isinstance(function, dict) and set(function) == {"name"}:
            if function["name"] not in names:
                raise ToolError(f"tool_choice names {function['name']!r}, which is not among the tools", "tool_choice")
            return function["name"]
    raise ToolError("tool_choice must be \"auto\", \"none\", \"required\" or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")


# -- the formats -------------------------------------------------------------------------------


def _arguments_text(value: Any) -> str:
    """Arguments as OpenAI sends them: JSON text of an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def _call_schema(function: Function, arguments_key: str = "arguments") -> dict:
    return {"type": "object", "properties": {"name": {"const": function.name}, arguments_key: function.parameters},
            "required": ["name", arguments_key], "additionalProperties": False}


def _one_of_calls(request: ToolRequest, arguments_key: str = "arguments") -> dict:
    schemas = [_call_schema(f, arguments_key) for f in request.callable]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _json_values(text: str, whole: bool = False) -> list[Any]:
    """The JSON values written one after another at the start of text (separated by whitespace,
    ',' or ';'); with whole=True, none unless they are all of the text."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n,;":
            i += 1
        if i >= len(text):
            return values
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return [] if whole else values
        values.append(value)


_NL = '"\\n"'  # a newline in a Lark rule


def _lark_literal(text: str) -> str:
    return json.dumps(text)


def _lark_json(schema: dict) -> str:
    """A JSON schema inside a Lark rule, generated as compactly as a whole-reply schema."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS})


class ToolStyle:
    """How one family writes tool calls; `markers` are the texts a call starts with."""

    name = "generic"
    markers: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()  # the markers a forced call writes

    def __init__(self, special_ids: dict[str, int] | None = None):
        self._special_ids = special_ids or {}

    # the prompt
    def prompt(self, messages: list[dict], request: ToolRequest | None) -> tuple[list[dict], list[dict] | None]:
        """The messages for the template, and its `tools` variable."""
        converted = [self._message(dict(m)) for m in messages]
        return converted, request.openai() if request is not None else None

    def _message(self, message: dict) -> dict:
        calls = message.get("tool_calls")
        if calls:
            message["tool_calls"] = [_template_call(call) for call in calls]
        return message

    # the reply
    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The reply's text outside tool calls (None when there is none) and its calls."""
        raise NotImplementedError

    def grammar(self, request: ToolRequest | None) -> Grammar | None:
        """The constraint of the reply: calls only, when tool_choice is required or a name."""
        if request is None or not request.constrained:
            return None
        return Grammar.lark(self._calls_lark(request))

    def _calls_lark(self, request: ToolRequest) -> str:
        raise NotImplementedError

    def _token(self, text: str) -> str:
        """A marker in a Lark rule: its special token where the vocabulary has one, else its text."""
        token = self._special_ids.get(text)
        return f"<[{token}]>" if token is not None else _lark_literal(text)

    def new_id(self) -> str:
        return "call_" + secrets.token_hex(12)


def _template_call(call: Any) -> Any:
    """A past call as templates read it: {"id", "type", "function": {"name", "arguments": {...}}}."""
    if not isinstance(call, dict):
        return call
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except ValueError:
            pass
    return {**call, "function": function}


class Hermes(ToolStyle):
    name = "hermes"
    markers = ("<tool_call>",)
    tokens = ("<tool_call>", "</tool_call>")
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

    def parse(self, text):
        calls = []
        for body in self._CALL.findall(text):
            calls += _calls_from_objects(_json_values(body), self)
        if not calls:
            return text, []
        return _outside(text, text.find("<tool_call>")), calls

    def _calls_lark(self, request):
        call = " ".join([self._token("<tool_call>"), _NL, _lark_json(_one_of_calls(request)), _NL,
                         self._token("</tool_call>")])
        return _calls_rule(request, _NL, call)


class Llama3(ToolStyle):
    name = "llama3"
    markers = ("<|python_tag|>", "{")

    def parse(self, text):
        body = text.strip()
        body = body.removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        calls = _calls_from_objects(_json_values(body), self, arguments_keys=("parameters", "arguments"))
        return (None, calls) if calls else (text, [])

    def _calls_lark(self, request):
        return _calls_rule(request, _lark_literal("; "), _lark_json(_one_of_calls(request, "parameters")))


class Mistral(ToolStyle):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    tokens = ("[TOOL_CALLS]",)
    _NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]")

    def parse(self, text):
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return text, []
        body = text[start + len("[TOOL_CALLS]"):]
        calls = []
        for value in _json_values(body):
            calls += _calls_from_objects(value if isinstance(value, list) else [value], self)
        if not calls:  # [TOOL_CALLS]name[ARGS]{...}, repeated
            for part in body.split("[TOOL_CALLS]"):
                named = self._NAMED.match(part)
                if named:
                    args = _json_values(part[named.end():])
                    if args and isinstance(args[0], dict):
                        calls.append(ToolCall(named.group(1), _arguments_text(args[0]), self.new_id()))
        return (_outside(text, start), calls) if calls else (text, [])

    def _calls_lark(self, request):
        schema = {"type": "array", "items": _one_of_calls(request), "minItems": 1}
        if not request.parallel:
            schema["maxItems"] = 1
        return f"start: {self._token('[TOOL_CALLS]')} {_lark_json(schema)}\n"

    def new_id(self) -> str:  # Mistral's templates require 9 letters and digits
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN, _DS_CALL_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class DeepSeek(ToolStyle):
    name = "deepseek"
    markers = (_DS_CALLS_BEGIN, _DS_CALL_BEGIN)
    tokens = (_DS_CALLS_BEGIN, _DS_CALLS_END, _DS_CALL_BEGIN, _DS_CALL_END, _DS_SEP)
    _CALL = re.compile(re.escape(_DS_CALL_BEGIN) + r"(?:function)?(?:" + re.escape(_DS_SEP) + r")?\s*(.*?)"
                       r"(?:" + re.escape(_DS_SEP) + r"|\n)\s*(?:```(?:json)?\s*)?(.*?)\s*(?:```\s*)?"
                       + re.escape(_DS_CALL_END), re.S)

    def parse(self, text):
        calls = []
        for name, body in self._CALL.findall(text):
            args = _json_values(body)
            if name.strip() and args and isinstance(args[0], dict):
                calls.append(ToolCall(name.strip(), _arguments_text(args[0]), self.new_id()))
        if not calls:
            return text, []
        starts = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        return _outside(text, min(starts)), calls

    def _calls_lark(self, request):
        calls = " | ".join(
            f"{self._token(_DS_CALL_BEGIN)} {_lark_literal('function')} {self._token(_DS_SEP)} {_lark_literal(f.name)} "
            f"\"\\n```json\\n\" {_lark_json(f.parameters)} \"\\n```\" {self._token(_DS_CALL_END)}"
            for f in request.callable)
        return _calls_rule(request, _NL, calls, self._token(_DS_CALLS_BEGIN), self._token(_DS_CALLS_END))


class Functionary(ToolStyle):
    name = "functionary"
    markers = (">>>", "<function=")
    _V31 = re.compile(r"<function=([A-Za-z0-9_.\-]+)>(.*?)(?:</function>|$)", re.S)
    _V32 = re.compile(r"(?:^|\n)>>>([A-Za-z0-9_.\-]+)\n")

    def parse(self, text):
        calls, content = [], []
        if "<function=" in text:
            for name, body in self._V31.findall(text):
                args = _json_values(body)
                if args and isinstance(args[0], dict):
                    calls.append(ToolCall(name, _arguments_text(args[0]), self.new_id()))
            return (_outside(text, text.find("<function=")), calls) if calls else (text, [])
        parts = self._V32.split(("\n" if text.startswith(">>>") else "") + text)
        content.append(parts[0])
        for name, body in zip(parts[1::2], parts[2::2]):
            if name == "all":
                content.append(body)
                continue
            args = _json_values(body)
            if args and isinstance(args[0], dict):
                calls.append(ToolCall(name, _arguments_text(args[0]), self.new_id()))
        text_part = "".join(content).strip()
        return (text_part or None, calls) if calls else (text, [])

    def _calls_lark(self, request):
        calls = " | ".join(f"{_lark_literal('>>>')} {_lark_literal(f.name)} {_NL} {_lark_json(f.parameters)}"
                           for f in request.callable)
        return _calls_rule(request, _NL, calls)


class Generic(ToolStyle):
    """Templates without tool support: the tools are described in the system message and the
    reply is JSON, constrained to `{"tool_calls": [...]}` or `{"response": "..."}`."""

    name = "generic"
    markers = ("{",)

    def prompt(self, messages, request):
        names = {call.get("id"): (call.get("function") or {}).get("name") for m in messages
                 for call in (m.get("tool_calls") or []) if isinstance(call, dict)}
        converted = [self._message(dict(m), names) for m in messages]
        if request is not None:
            instruction = self._instruction(request)
            if converted and converted[0].get("role") == "system":
                converted[0] = {**converted[0], "content": f"{converted[0].get('content') or ''}\n\n{instruction}"}
            else:
                converted.insert(0, {"role": "system", "content": instruction})
        return converted, None

    def _message(self, message, names=None):
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls:
            text = {"tool_calls": [_generic_call(call) for call in calls]}
            return {"role": "assistant", "content": json.dumps(text, ensure_ascii=False)}
        if message.get("role") == "tool":  # a user turn that says which call it answers
            name = message.get("name") or (names or {}).get(message.get("tool_call_id")) or "the tool"
            return {"role": "user", "content": f"The result of {name}: {message.get('content') or ''}"}
        return message

    @staticmethod
    def _instruction(request: ToolRequest) -> str:
        tools = json.dumps([f.openai()["function"] for f in request.callable], ensure_ascii=False)
        how = ('{"tool_calls": [{"name": "<function name>", "arguments": {<its arguments>}}]}')
        text = (f"You can call these tools (JSON schemas of their arguments):\n{tools}\n\n"
                f"To call a tool, answer with only a JSON object: {how}")
        if request.choice == "auto":
            text += '\nTo answer without a tool, answer with only {"response": "<your answer>"}.'
        return text

    def parse(self, text):
        values = _json_values(text.strip())
        if not values or not isinstance(values[0], dict):
            return text, []
        value = values[0]
        calls = value.get("tool_calls") if isinstance(value.get("tool_calls"), list) else (
            [value["tool_call"]] if isinstance(value.get("tool_call"), dict) else [])
        found = _calls_from_objects(calls, self)
        if found:
            return None, found
        if isinstance(value.get("response"), str):
            return value["response"], []
        return text, []

    def grammar(self, request):
        if request is None:
            return None
        calls = {"type": "array", "items": _one_of_calls(request), "minItems": 1}
        if not request.parallel:
            calls["maxItems"] = 1
        with_calls = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
                      "additionalProperties": False}
        if request.constrained:
            return Grammar.json_schema(with_calls)
        response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                    "additionalProperties": False}
        return Grammar.json_schema({"anyOf": [with_calls, response]})


def _generic_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    function = _template_call(call).get("function", {})
    return {"name": function.get("name"), "arguments": function.get("arguments"), "id": call.get("id")}


def _calls_rule(request: ToolRequest, separator: str, call: str, before: str = "", after: str = "") -> str:
    """A Lark grammar of one call, or (parallel calls allowed) of calls separated by `separator`."""
    more = f" ({separator} call)*" if request.parallel else ""
    return f"start: {before} call{more} {after}\ncall: {call}\n"


def _calls_from_objects(objects: list, style: ToolStyle, arguments_keys=("arguments", "parameters")) -> list[ToolCall]:
    calls = []
    for value in objects:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            continue
        if isinstance(value.get("function"), dict):  # {"type": "function", "function": {...}}
            value = value["function"]
        key = next((k for k in arguments_keys if k in value), None)
        arguments = value.get(key) if key else {}
        call_id = value.get("id") if isinstance(value.get("id"), str) and value.get("id") else style.new_id()
        calls.append(ToolCall(value["name"], _arguments_text(arguments), call_id))
    return calls


def _outside(text: str, start: int) -> str | None:
    """The text before the first call, or None when it is only whitespace."""
    before = text[:start].strip()
    return before or None


_STYLES = [
    (DeepSeek, ("tool▁calls▁begin", "tool▁call▁begin")),
    (Mistral, ("[TOOL_CALLS]",)),
    (Functionary, (">>>", "<function=")),
    (Hermes, ("<tool_call>",)),
    (Llama3, ("<|python_tag|>", "ipython")),
]


def tool_style(template_source: str, tokenizer=None) -> ToolStyle:
    """The tool-call format a chat template speaks (generic when it knows no tools). The
    tokenizer tells which of the format's markers are special tokens: a forced call writes
    those as the tokens."""
    source = template_source or ""
    chosen = Generic
    if "tools" in source:
        chosen = next((style for style, signs in _STYLES if any(sign in source for sign in signs)), Generic)
    special = {}
    if tokenizer is not None:
        for marker in chosen.tokens:
            token = _special_token(tokenizer, marker)
            if token is not None:
                special[marker] = token
    return chosen(special)


def _special_token(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special=False, parse_special=True)
    is_special = getattr(tokenizer, "is_special", None)
    return ids[0] if len(ids) == 1 and is_special is not None and is_special(ids[0]) else None


class ToolStream:
    """A reply's text as it streams, split into content and tool calls: text that is surely
    outside a call passes at once; from a call's marker on, or from the start of a reply that
    opens with '{' or '[' (JSON calls), the text is held and parsed at the end."""

    def __init__(self, tools: ChatTools):
        self.tools = tools
        self._markers = [m for m in tools.style.markers if m != "{"]
        self._held = ""
        self._holding = False
        self._emitted_any = False

    def feed(self, text: str) -> str:
        """The content that is safe to emit now."""
        if self._holding:
            self._held += text
            return ""
        buffer = self._held + text
        if not self._emitted_any and buffer.lstrip()[:1] in ("{", "["):
            self._holding, self._held = True, buffer
            return ""
        found = [i for i in (buffer.find(m) for m in self._markers) if i >= 0]
        if found:
            start = min(found)
            self._holding, self._held = True, buffer[start:]
            return self._emit(buffer[:start])
        keep = _partial_marker(buffer, self._markers)
        if not self._emitted_any and not buffer.strip():
            keep = len(buffer)  # leading whitespace waits: the reply may turn out to be JSON
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return self._emit(buffer[:len(buffer) - keep])

    def _emit(self, text: str) -> str:
        if text:
            self._emitted_any = True
        return text

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content still held and the calls, at the end of the reply."""
        held, self._held = self._held, ""
        if not self._holding:
            return held, []
        content, calls = self.tools.parse(held)
        return content or "", calls


def _partial_marker(buffer: str, markers: list[str]) -> int:
    """How many characters at the end of buffer could begin a marker."""
    for n in range(min(len(buffer), max((len(m) for m in markers), default=0)), 0, -1):
        if any(m.startswith(buffer[-n:]) for m in markers):
            return n
    return 0


@dataclass
class ChatTools:
    """A chat request's tools and the format its model calls them in: how to read its reply."""

    style: ToolStyle
    request: ToolRequest

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole reply's content and calls. Calls in the family's format come first; a reply
        that is only JSON calls ({"name", "arguments" or "parameters"}, alone, in a list or one
        after another) is read as calls in any format. Only calls of the request's functions
        count (a reply naming another is content), and only the first without parallel calls."""
        content, calls = self.style.parse(text)
        if not calls:
            calls = _bare_calls(text, self.style)
            if not calls and (self.request.constrained or isinstance(self.style, Generic)):
                calls = _complete_calls(text, self.style)  # a constrained reply cut short by max_tokens
            if not calls:
                return content, []
            content = None
        names = {f.name for f in self.request.callable}
        if any(call.name not in names for call in calls):
            return text, []
        return content, calls if self.request.parallel else calls[:1]

    def stream(self) -> ToolStream:
        return ToolStream(self)


def _complete_calls(text: str, style: ToolStyle) -> list[ToolCall]:
    """The calls written out whole in a reply that ends before its JSON does."""
    decoder, objects = json.JSONDecoder(), []
    for start in (m.start() for m in re.finditer(r'\{\s*"name"', text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict) and ("arguments" in value or "parameters" in value):
            objects.append(value)
    return _calls_from_objects(objects, style)


def _bare_calls(text: str, style: ToolStyle) -> list[ToolCall]:
    values = _json_values(text.strip(), whole=True)
    objects = [item for value in values for item in (value if isinstance(value, list) else [value])]
    if not objects or not all(isinstance(o, dict) and "name" in o and ("arguments" in o or "parameters" in o)
                              for o in objects):
        return []
    return _calls_from_objects(objects, style)
