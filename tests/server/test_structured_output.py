"""Constrained output and tool calling on `ember serve`, spoken to with the official openai client
(and raw httpx where a field is not the client's): JSON schemas, llama.cpp's grammar and
json_schema fields, regex and choice, tools with every tool_choice, a two-turn tool round trip,
streamed tool-call deltas, and the 400s for what ember does not implement."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pydantic
import pytest

from ember.hub import resolve_model
from ember_server import ServerProcess

pytestmark = pytest.mark.model

N_CTX = 2048
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
                   "required": ["zone"], "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,15}$"},
    "age": {"type": "integer", "minimum": 1, "maximum": 120},
    "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "minItems": 1, "maxItems": 3}},
    "required": ["name", "age", "languages"], "additionalProperties": False}


def serve(model: str) -> ServerProcess:
    resolve_model(model)
    return ServerProcess("-m", model, "-c", str(N_CTX), "--parallel", "4").wait_ready()


@pytest.fixture(scope="module")
def smollm():
    process = serve("smollm2-135m")
    yield process.url
    process.stop()


@pytest.fixture(scope="module")
def qwen():
    process = serve("qwen2.5-coder-0.5b")
    yield process.url
    process.stop()


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


# -- constrained output ------------------------------------------------------------------------------


def test_response_format_json_schema_through_the_openai_client(smollm):
    reply = client_of(smollm).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Describe a person as JSON."}], temperature=0,
        max_tokens=120, response_format={"type": "json_schema",
                                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)


def test_the_clients_parse_helper_gets_its_pydantic_model(smollm):
    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=30)
        country: str = pydantic.Field(max_length=30)
        population: int = pydantic.Field(ge=0, le=100_000_000)

    completion = client_of(smollm).chat.completions.parse(
        model="x", messages=[{"role": "user", "content": "Tell me about Lyon."}], response_format=City,
        temperature=0, max_tokens=100)
    city = completion.choices[0].message.parsed
    assert isinstance(city, City) and isinstance(city.population, int)


def test_json_object_and_a_sampled_stream(smollm):
    stream = client_of(smollm).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Give me a JSON object about dogs."}],
        response_format={"type": "json_object"}, temperature=0.8, seed=11, max_tokens=300, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert isinstance(json.loads(text), dict)


def test_llama_cpp_grammar_and_json_schema_fields_on_both_endpoints(smollm):
    client = client_of(smollm)
    gbnf = 'root ::= "The answer is " ("yes" | "no") "."'
    reply = client.chat.completions.create(model="x", messages=ASK_WEATHER, max_tokens=20,
                                           extra_body={"grammar": gbnf})
    assert re.fullmatch(r"The answer is (yes|no)\.", reply.choices[0].message.content)
    completion = client.completions.create(model="x", prompt="A list of numbers:", max_tokens=40, temperature=0.9,
                                           seed=1, extra_body={"json_schema": {"type": "array", "maxItems": 4,
                                                                               "items": {"type": "integer"}}})
    assert all(isinstance(n, int) for n in json.loads(completion.choices[0].text))
    assert completion.choices[0].finish_reason == "stop"


def test_regex_and_choice_fields(smollm):
    client = client_of(smollm)
    phone = client.completions.create(model="x", prompt="My number is", max_tokens=20, temperature=1.0, seed=3,
                                      extra_body={"regex": r" \d{3}-\d{4}"}).choices[0].text
    assert re.fullmatch(r" \d{3}-\d{4}", phone)
    answer = client.chat.completions.create(model="x", messages=ASK_WEATHER, max_tokens=5,
                                            extra_body={"choice": ["sunny", "rainy"]}).choices[0].message.content
    assert answer in ("sunny", "rainy")


def test_four_constrained_streams_at_once_all_match(smollm):
    client = client_of(smollm)

    def one(seed: int) -> dict:
        reply = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": f"Invent person number {seed} as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}},
            temperature=1.0, seed=seed, max_tokens=120)
        return json.loads(reply.choices[0].message.content)

    with ThreadPoolExecutor(4) as pool:
        for person in pool.map(one, range(4)):
            jsonschema.validate(person, PERSON)


def test_a_schema_llguidance_cannot_compile_is_a_400_with_its_reason(smollm):
    client = client_of(smollm)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="x", messages=ASK_WEATHER, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                   "schema": {"type": "array", "uniqueItems": True}}})
    assert "uniqueItems" in error.value.message and error.value.param == "response_format"
    with pytest.raises(openai.BadRequestError, match="unclosed"):
        client.completions.create(model="x", prompt="x", extra_body={"regex": "(a"})
    with pytest.raises(openai.BadRequestError, match="one constraint"):
        client.completions.create(model="x", prompt="x", extra_body={"regex": "a", "choice": ["a"]})


# -- nothing silently ignored ------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("n", 2), ("functions", [{"name": "f"}]), ("store", True), ("reasoning_effort", "high"),
    ("logit_bias", {"99999999": 1}), ("logit_bias", {"-3": 1}), ("service_tier", "flex"),
    ("audio", {"voice": "alloy"}), ("web_search_options", {}),
])
def test_what_ember_does_not_implement_is_a_400_naming_it(smollm, field, value):
    answer = httpx.post(f"{smollm}/v1/chat/completions", json={"messages": ASK_WEATHER, field: value}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert field in error["message"] or error["param"] == field, error


def test_an_unknown_field_of_a_message_is_a_400(smollm):
    answer = httpx.post(f"{smollm}/v1/chat/completions", timeout=60,
                        json={"messages": [{"role": "user", "content": "hi", "mood": "happy"}]})
    assert answer.status_code == 400 and "mood" in answer.json()["error"]["message"]


def test_harmless_fields_clients_send_are_accepted(smollm):
    reply = client_of(smollm).chat.completions.create(
        model="x", messages=ASK_WEATHER, max_tokens=4, user="user-42", metadata={"app": "test"}, store=False,
        service_tier="auto", stream=True, stream_options={"include_usage": True})
    chunks = list(reply)
    assert chunks[-1].usage.completion_tokens == 4


# -- tools ---------------------------------------------------------------------------------------------


def round_trip(url: str, stream: bool = False):
    """Turn 1: the model must call a tool; turn 2: it answers from the tool's result."""
    client = client_of(url)
    first = client.chat.completions.create(model="x", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                           tool_choice="required", parallel_tool_calls=False, temperature=0,
                                           max_tokens=60)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id
    assert call.function.name in ("get_weather", "get_time")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"])
    history = ASK_WEATHER + [choice.message, {"role": "tool", "tool_call_id": call.id,
                                              "content": "18 degrees Celsius and sunny"}]
    second = client.chat.completions.create(model="x", messages=history, tools=[WEATHER, TIME], tool_choice="none",
                                            temperature=0, max_tokens=40)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content
    return call, second.choices[0].message.content


def test_a_two_turn_tool_round_trip_generic_format(smollm):
    round_trip(smollm)


def test_a_two_turn_tool_round_trip_hermes_format(qwen):
    call, _ = round_trip(qwen)
    assert call.function.name == "get_weather" and "Paris" in json.loads(call.function.arguments)["city"]


@pytest.mark.parametrize("url_fixture", ["smollm", "qwen"])
def test_streamed_tool_call_deltas_add_up_to_the_whole_reply(url_fixture, request):
    url = request.getfixturevalue(url_fixture)
    client = client_of(url)
    kwargs = dict(model="x", messages=ASK_WEATHER, tools=[WEATHER, TIME], temperature=0, max_tokens=60,
                  tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
    whole = client.chat.completions.create(**kwargs).choices[0]
    names, arguments, finish = [], "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            assert part.index == 0
            if part.function.name:
                names.append(part.function.name)
            arguments += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_time"] == [whole.message.tool_calls[0].function.name]
    assert arguments == whole.message.tool_calls[0].function.arguments
    assert json.loads(arguments)["zone"] in ("UTC", "CET", "PST")
    assert finish == whole.finish_reason == "tool_calls"


def test_tool_choice_none_calls_nothing_and_auto_returns_content_or_calls(smollm):
    client = client_of(smollm)
    none = client.chat.completions.create(model="x", messages=ASK_WEATHER, tools=[WEATHER], tool_choice="none",
                                          temperature=0, max_tokens=20).choices[0]
    assert none.message.tool_calls is None and none.message.content
    auto = client.chat.completions.create(model="x", messages=ASK_WEATHER, tools=[WEATHER], temperature=0,
                                          max_tokens=80, parallel_tool_calls=False).choices[0]
    assert (auto.finish_reason == "tool_calls") == bool(auto.message.tool_calls)
    assert auto.message.tool_calls or auto.message.content


@pytest.mark.parametrize("body, param", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools.0"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "sometimes"}, "parallel_tool_calls"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_tool_requests_are_400s_naming_the_field(smollm, body, param):
    answer = httpx.post(f"{smollm}/v1/chat/completions", json={"messages": ASK_WEATHER, **body}, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
