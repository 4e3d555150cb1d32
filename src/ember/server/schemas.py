"""The requests the server accepts, validated strictly, and OpenAI-style error bodies.

A field of the wrong type (a string for a number, a float for an integer, NaN), a value out
of range, a feature ember does not offer (n > 1, echo, store: true) or a field it does not know
is refused with 400 and `{"error": {"message", "type": "invalid_request_error", "param",
"code"}}`. Accepted and deliberately without effect (README lists them): `user`, `metadata`,
`store: false`, `service_tier` "auto"/"default", `stream_options.include_obfuscation`.

Constraints (engine/constraints.py): OpenAI's `response_format`, llama.cpp's `grammar` (GBNF)
and `json_schema`, and `regex` / `choice`; chat requests also take `tools`, `tool_choice` and
`parallel_tool_calls` (api/tool_calls.py), and `reasoning_format` (api/reasoning.py). Embeddings
take OpenAI's `input` (texts or token ids, up to 2048), `encoding_format` (float, base64) and
`dimensions` (only the model's own). Rerank takes llama-server's `query`, `documents` (or TEI's
`texts`), `top_n` and `model`, with Jina's `return_documents` and TEI's `return_text`.

Defaults are the Python API's (`LLM.create_completion`, `LLM.create_chat_completion`):
a completion stops after 16 tokens unless max_tokens says otherwise, a chat reply runs to
the end of the turn or of the context.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from ember.engine.sampling_params import CHAT_TEMPERATURE
from ember.engine.sampling_params import DEFAULTS as D

MAX_TOKENS_LIMIT = 2**31 - 1
MAX_STOPS = 16
MAX_LOGPROBS = 20
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit of inputs per embeddings request
SEED_RANGE = (-(2**63), 2**64 - 1)

Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)


def _prompt(value: Any) -> str | list[int]:
    """One prompt: a text or token ids, alone or as the only item of a list."""
    if isinstance(value, list) and len(value) == 1 and (isinstance(value[0], str) or _is_token_ids(value[0])):
        value = value[0]
    if isinstance(value, str) or _is_token_ids(value):
        return value
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, (str, list)) for v in value):
        raise ValueError("only one prompt per request is supported")
    raise ValueError("must be a string or a non-empty list of token ids")


def _embedding_input(value: Any) -> list[str | list[int]]:
    """OpenAI's embeddings input: a text, token ids, or a list of texts or of token id lists; as a list."""
    if isinstance(value, str) or _is_token_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ValueError("must be a string, a list of strings, or token ids (a list of integers or of lists of them)")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs per request are supported")
    for item in value:
        if not (isinstance(item, str) or _is_token_ids(item)):
            raise ValueError("each input must be a string or a non-empty list of token ids")
        if item == "":
            raise ValueError("an input must not be empty")
    return value


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if len(value) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings are supported")
        return value
    raise ValueError("must be a string or a list of strings")


def _content(value: Any) -> str:
    """Message content: a string, or text parts (joined by newlines)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        if any(p.get("type") != "text" for p in value):
            raise ValueError("only text content parts are supported")
        if not all(isinstance(p.get("text"), str) for p in value):
            raise ValueError("a text part needs a string 'text'")
        return "\n".join(p["text"] for p in value)
    raise ValueError("must be a string or a list of text parts")


class APIError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Request):
    include_usage: StrictBool = False
    include_obfuscation: StrictBool | None = None  # accepted: ember's chunks carry no obfuscation padding


class Sampling(_Request):
    """Fields shared by completions and chat completions."""

    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=0, le=MAX_TOKENS_LIMIT)
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number = Field(D.top_p, ge=0, le=1)
    top_k: StrictInt = Field(D.top_k, ge=0, le=MAX_TOKENS_LIMIT)
    min_p: Number = Field(D.min_p, ge=0, le=1)
    seed: StrictInt | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: Annotated[Any, AfterValidator(_stop), Field(validate_default=True)] = None
    presence_penalty: Number = Field(D.presence_penalty, ge=-2, le=2)
    frequency_penalty: Number = Field(D.frequency_penalty, ge=-2, le=2)
    repeat_penalty: Number = Field(D.repeat_penalty, gt=0, le=10)
    logit_bias: dict[StrictStr, Annotated[Number, Field(ge=-100, le=100)]] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(1, ge=1, le=1)
    # accepted, without effect: end-user ids and stored-completion metadata (nothing is stored)
    user: StrictStr | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    store: Literal[False] | None = None
    service_tier: Literal["auto", "default"] | None = None
    # constraints: at most one (engine.constraints.grammar_from_request)
    response_format: dict[StrictStr, Any] | None = None
    grammar: StrictStr | None = None
    json_schema: dict[StrictStr, Any] | StrictBool | None = None
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None

    CONSTRAINTS: ClassVar[tuple[str, ...]] = ("response_format", "grammar", "json_schema", "regex", "choice")

    @property
    def constraint_field(self) -> str | None:
        """The name of the constraint field the request gives (the first, if several)."""
        return next((name for name in self.CONSTRAINTS if getattr(self, name) is not None), None)

    def sampling_kwargs(self, default_temperature: float) -> dict:
        temperature = default_temperature if self.temperature is None else self.temperature
        return {"temperature": temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
                "repeat_penalty": self.repeat_penalty, "frequency_penalty": self.frequency_penalty,
                "presence_penalty": self.presence_penalty, "logit_bias": self.logit_bias, "seed": self.seed}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Sampling):
    prompt: Annotated[Any, AfterValidator(_prompt)]
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: Literal[False] = False
    best_of: StrictInt = Field(1, ge=1, le=1)

    DEFAULT_MAX_TOKENS: ClassVar[int] = 16
    DEFAULT_TEMPERATURE: ClassVar[float] = D.temperature

    @property
    def max_new_tokens(self) -> int:
        return self.DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def n_logprobs(self) -> int | None:
        return self.logprobs


class FunctionCall(_Request):
    name: StrictStr
    arguments: StrictStr


class ToolCallMessage(_Request):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[Any, AfterValidator(_content), Field(validate_default=True)] = None
    name: StrictStr | None = None
    tool_calls: list[ToolCallMessage] | None = None  # an assistant's past calls
    tool_call_id: StrictStr | None = None  # a tool result: the call it answers
    refusal: None = None  # sent back by clients as the response had it
    reasoning_content: StrictStr | None = None  # an assistant's past thoughts, as the response had them

    def plain(self) -> dict:
        message = {"role": self.role, "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: StrictInt | None = Field(None, ge=0, le=MAX_TOKENS_LIMIT)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[StrictStr, Any]] | None = None
    tool_choice: StrictStr | dict[StrictStr, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    reasoning_format: Literal["auto", "deepseek", "none"] = "auto"  # llama-server's (api/reasoning.py)

    DEFAULT_TEMPERATURE: ClassVar[float] = CHAT_TEMPERATURE

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    @property
    def n_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(_Request):
    content: StrictStr
    add_special: StrictBool = True
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class EmbeddingRequest(_Request):
    input: Annotated[Any, AfterValidator(_embedding_input)]
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=1)
    user: StrictStr | None = None  # accepted, without effect


def _documents(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError("must be a non-empty list of strings")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} documents per request are supported")
    return value


class RerankRequest(_Request):
    query: StrictStr
    documents: Annotated[Any, AfterValidator(_documents)] = None
    texts: Annotated[Any, AfterValidator(_documents)] = None  # TEI's name: its response form
    top_n: StrictInt | None = Field(None, ge=0)
    model: StrictStr | None = None
    return_documents: StrictBool = False  # Jina's: each result carries {"document": {"text"}}
    return_text: StrictBool = False  # TEI's: each result carries "text"

    @property
    def tei(self) -> bool:
        return self.texts is not None


class DetokenizeRequest(_Request):
    tokens: list[StrictInt]


def parse(model: type[BaseModel], payload: Any):
    """The validated request, or an APIError(400) naming the first bad field."""
    if not isinstance(payload, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "missing":
            message = f"missing required field '{param}'"
        elif first["type"] == "extra_forbidden":
            message = f"'{param}' is not supported by ember"
        elif param:
            message = f"invalid '{param}': {message}"
        raise APIError(400, message, param=param) from None
