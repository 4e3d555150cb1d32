"""Tool calling: OpenAI's tools and tool_choice validated, each family's reply format parsed from
exact strings, the forced-call grammars, and the streamed split into content and calls."""

import json

import pytest

from ember.api.tool_calls import (
    ChatTools,
    DeepSeek,
    Functionary,
    Generic,
    Hermes,
    Llama3,
    Mistral,
    ToolError,
    ToolRequest,
    tool_style,
)
from ember.engine.constraints import Constraint, vocabulary
from fake_llm import ByteTokenizer, N_VOCAB

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"],
    "additionalProperties": False}}}


def request(choice=None, parallel=None, tools=(WEATHER, TIME)):
    return ToolRequest.from_openai(list(tools), choice, parallel)


def calls_of(style, text):
    content, calls = style.parse(text)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


# -- the families' formats, from exact strings ----------------------------------------------------


def test_hermes_and_qwen():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
    assert calls_of(Hermes(), text) == ("Let me check.", [("get_weather", {"city": "Paris", "unit": "C"}),
                                                          ("get_time", {"zone": "CET"})])


def test_hermes_without_a_call_is_content():
    assert calls_of(Hermes(), "It is sunny.") == ("It is sunny.", [])


def test_llama3_json_with_parameters():
    text = '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "F"}}'
    assert calls_of(Llama3(), text) == (None, [("get_weather", {"city": "Oslo", "unit": "F"})])
    assert calls_of(Llama3(), "<|python_tag|>" + text + '; {"name": "get_time", "parameters": {"zone": "UTC"}}') == (
        None, [("get_weather", {"city": "Oslo", "unit": "F"}), ("get_time", {"zone": "UTC"})])
    assert calls_of(Llama3(), "Hello {there}") == ("Hello {there}", [])


def test_mistral_list_and_named_forms():
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome", "unit": "C"}, "id": "abcDEF123"}]'
    content, calls = Mistral().parse(text)
    assert content is None and calls[0].id == "abcDEF123" and calls[0].name == "get_weather"
    assert calls_of(Mistral(), '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}') == (None, [("get_time", {"zone": "CET"})])
    assert len(Mistral().new_id()) == 9 and Mistral().new_id().isalnum()


def test_deepseek_v3_and_v3_1():
    v3 = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
          '{"city": "Lima", "unit": "C"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    assert calls_of(DeepSeek(), v3) == (None, [("get_weather", {"city": "Lima", "unit": "C"})])
    v31 = ('Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "PST"}<｜tool▁call▁end｜>'
           '<｜tool▁calls▁end｜>')
    assert calls_of(DeepSeek(), v31) == ("Sure.", [("get_time", {"zone": "PST"})])


def test_functionary_v3_2_and_v3_1():
    v32 = '>>>all\nChecking.\n>>>get_weather\n{"city": "Kyiv", "unit": "C"}'
    assert calls_of(Functionary(), v32) == ("Checking.", [("get_weather", {"city": "Kyiv", "unit": "C"})])
    v31 = '<function=get_time>{"zone": "EET"}</function>'
    assert calls_of(Functionary(), v31) == (None, [("get_time", {"zone": "EET"})])


def test_generic_json_calls_and_response():
    text = '{"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}'
    assert calls_of(Generic(), text) == (None, [("get_time", {"zone": "UTC"})])
    assert calls_of(Generic(), '{"tool_call": {"name": "get_time", "arguments": {"zone": "A"}}}')[1] == [
        ("get_time", {"zone": "A"})]
    assert calls_of(Generic(), '{"response": "Hello!"}') == ("Hello!", [])


def test_call_ids_are_openai_shaped_and_unique():
    _, calls = Generic().parse('{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]}')
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert calls[0].openai() == {"id": calls[0].id, "type": "function", "function": {"name": "a", "arguments": "{}"}}


@pytest.mark.parametrize("source, style", [
    ("{% for tool in tools %}{{ tool }}{% endfor %}<tool_call>", "hermes"),
    ("{{ tools }} <|python_tag|> ipython", "llama3"),
    ("{{ tools }}[TOOL_CALLS]", "mistral"),
    ("{{ tools }}<｜tool▁calls▁begin｜>", "deepseek"),
    ("{{ tools }}>>>all", "functionary"),
    ("{{ tools }} something else", "generic"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "generic"),
])
def test_the_format_is_chosen_from_the_template(source, style):
    assert tool_style(source).name == style


# -- the request -----------------------------------------------------------------------------------


def test_tool_choice_forms():
    assert request().choice == "auto" and not request().constrained
    assert request("required").constrained
    named = request({"type": "function", "function": {"name": "get_time"}})
    assert named.choice == "get_time" and [f.name for f in named.callable] == ["get_time"]
    assert request("none") is None
    assert ToolRequest.from_openai(None) is None


@pytest.mark.parametrize("tools, choice, parallel, param", [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, None, "tool_choice"),
    ([WEATHER], "sometimes", None, "tool_choice"),
    (None, "required", None, "tool_choice"),
    ([{"type": "retrieval"}], None, None, "tools.0"),
    ([{"type": "function", "function": {"name": "has space"}}], None, None, "tools.0"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, None, "tools.0"),
    ([{"type": "function", "function": {"name": "f", "extra": 1}}], None, None, "tools.0"),
    ([WEATHER, WEATHER], None, None, "tools"),
    ([WEATHER], None, "yes", "parallel_tool_calls"),
])
def test_bad_tool_fields_are_errors_naming_them(tools, choice, parallel, param):
    with pytest.raises(ToolError) as error:
        ToolRequest.from_openai(tools, choice, parallel)
    assert error.value.param == param


# -- forced calls always parse ---------------------------------------------------------------------


def forced_text(style, req, wanted: str) -> str:
    """What a byte-level model that wants to write `wanted` writes under the style's grammar."""
    tokenizer = ByteTokenizer()
    constraint = Constraint(style.grammar(req), vocabulary(tokenizer, N_VOCAB), tokenizer)
    out = []
    for byte in wanted.encode():
        if constraint.finished:
            break
        token = byte if constraint.is_allowed(byte) else int(constraint.allowed().argmax())
        constraint.accept(token)
        out.append(token)
    while not constraint.finished:  # complete it with the first allowed byte
        allowed = constraint.allowed()[:256]
        token = int(allowed.argmax())
        constraint.accept(token)
        out.append(token)
    return bytes(out).decode()


@pytest.mark.parametrize("style", [Hermes(), Llama3(), Mistral(), DeepSeek(), Functionary(), Generic()])
def test_a_required_call_is_constrained_to_the_function_schemas(style):
    req = request("required", parallel=False)
    text = forced_text(style, req, "I will not call anything!")
    content, calls = ChatTools(style, req).parse(text)
    assert len(calls) == 1, text
    assert calls[0].name in ("get_weather", "get_time")
    arguments = json.loads(calls[0].arguments)
    assert set(arguments) == ({"city", "unit"} if calls[0].name == "get_weather" else {"zone"})


def test_a_named_function_is_the_one_called():
    req = request({"type": "function", "function": {"name": "get_time"}}, parallel=False)
    text = forced_text(Hermes(), req, '<tool_call>\n{"name": "get_weather"')
    assert ChatTools(Hermes(), req).parse(text)[1][0].name == "get_time"


def test_generic_auto_replies_are_calls_or_a_response():
    req = request()
    text = forced_text(Generic(), req, '{"response": "Hi"}')
    assert Generic().parse(text) == ("Hi", [])


def test_parallel_calls_off_keeps_one():
    text = ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "A"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"zone": "B"}}\n</tool_call>')
    assert len(ChatTools(Hermes(), request(parallel=False)).parse(text)[1]) == 1
    assert len(ChatTools(Hermes(), request()).parse(text)[1]) == 2


# -- the prompt ------------------------------------------------------------------------------------

HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
]


def test_native_templates_get_tools_and_parsed_arguments():
    messages, tools = Hermes().prompt(HISTORY, request())
    assert tools == [WEATHER, TIME]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "C"}
    assert messages[2] == HISTORY[2]


def test_generic_templates_get_the_tools_in_the_system_message_and_the_history_as_json():
    messages, tools = Generic().prompt(HISTORY, request())
    assert tools is None
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert json.loads(messages[2]["content"]) == {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}, "id": "call_1"}]}
    assert messages[3]["role"] == "user"
    assert messages[3]["content"] == "The result of get_weather: 21 C, sunny"


# -- streaming -------------------------------------------------------------------------------------


def stream(style, pieces, req=None):
    s = ChatTools(style, req or request()).stream()
    content = "".join(s.feed(p) for p in pieces)
    rest, calls = s.finish()
    return content, rest, [(c.name, json.loads(c.arguments)) for c in calls]


def test_text_before_a_call_streams_and_the_call_comes_at_the_end():
    pieces = ["Let", " me", " see.", "\n<tool", "_call>\n{\"name\": \"get_time\", ", "\"arguments\": {\"zone\": \"A\"}}",
              "\n</tool_call>"]
    assert stream(Hermes(), pieces) == ("Let me see.\n", "", [("get_time", {"zone": "A"})])


def test_a_marker_prefix_that_is_not_a_marker_is_released():
    assert stream(Hermes(), ["a <to", "y> b"]) == ("a <toy> b", "", [])


def test_json_replies_are_held_until_the_end():
    assert stream(Generic(), ['{"response', '": "Hi"}']) == ("", "Hi", [])
    assert stream(Llama3(), ['{"name": "get_time", ', '"parameters": {"zone": "B"}}']) == (
        "", "", [("get_time", {"zone": "B"})])


def test_bare_json_calls_count_in_any_format():
    # Qwen2.5-Coder answers without the <tool_call> tags
    text = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
    content, calls = ChatTools(Hermes(), request()).parse(text)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "C"})]
    assert stream(Hermes(), [text[:10], text[10:]]) == ("", "", [("get_weather", {"city": "Paris", "unit": "C"})])


def test_a_call_of_a_function_not_offered_is_content():
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert ChatTools(Hermes(), request()).parse(text) == (text, [])


def test_the_whole_calls_of_a_forced_reply_cut_short_are_kept():
    text = ('{"tool_calls": [{"name": "get_time", "arguments": {"zone": "A"}}, '
            '{"name": "get_time", "arguments": {"zone": "B"}}, {"name": "get_time", "argu')
    content, calls = ChatTools(Generic(), request("required")).parse(text)
    assert content is None and [json.loads(c.arguments)["zone"] for c in calls] == ["A", "B"]
    assert ChatTools(Hermes(), request()).parse('{"name": "get_time", "arguments": {"zone": "A"}} and {"na') == (
        '{"name": "get_time", "arguments": {"zone": "A"}} and {"na', [])
