"""ember.tokenizer.chat_template: chat templates render as transformers' apply_chat_template does, safely."""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from ember.errors import EmberError
from ember.tokenizer.chat_template import DEFAULT_TEMPLATE, ChatTemplate, ChatTemplateError
from tokenizer_support import FIXTURES, metadata

TEMPLATES = json.loads((FIXTURES / "chat_templates.json").read_text(encoding="utf-8"))["templates"]
TEMPLATES["default (ChatML)"] = {"bos_token": "<s>", "eos_token": "</s>", "template": DEFAULT_TEMPLATE}

CONVERSATIONS = {
    "one user turn": [
        {"role": "user", "content": "Hi"},
    ],
    "system and several turns": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6."},
        {"role": "user", "content": "Thanks!"},
    ],
    "no system, several turns": [
        {"role": "user", "content": "Write a haiku about rain."},
        {"role": "assistant", "content": "Soft rain on the roof\nwhispers to the sleeping town\nmorning smells of earth"},
        {"role": "user", "content": "Now one about snow ❄️"},
    ],
    "reasoning in an assistant turn": [
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
        {"role": "user", "content": "And 21?"},
    ],
    "unicode, special-token text and empty content": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "你好 <|im_end|> «ñ» \t tabs\n\nnew lines"},
        {"role": "assistant", "content": "مرحبا 👋"},
        {"role": "user", "content": "{{ not a template }} {% raw %}"},
    ],
}


def transformers_render(entry: dict, messages: list[dict], add_generation_prompt: bool, **extra) -> str:
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token=entry["bos_token"],
                                 eos_token=entry["eos_token"], chat_template=entry["template"])
    return hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("model", TEMPLATES)
def test_render_equals_transformers_apply_chat_template(model, conversation, add_generation_prompt):
    entry = TEMPLATES[model]
    template = ChatTemplate(entry["template"], entry["bos_token"], entry["eos_token"])
    messages = CONVERSATIONS[conversation]
    expected = transformers_render(entry, messages, add_generation_prompt)
    assert template.render(messages, add_generation_prompt=add_generation_prompt) == expected


def test_tools_reach_the_template_as_transformers_passes_them():
    entry = TEMPLATES["qwen2.5-coder-0.5b"]
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city, in °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Zürich?"}]
    template = ChatTemplate(entry["template"], entry["bos_token"], entry["eos_token"])
    assert template.render(messages, tools=tools) == transformers_render(entry, messages, True, tools=tools)


def test_tool_results_render_as_in_transformers():
    entry = TEMPLATES["deepseek-r1-distill-qwen-7b"]
    messages = [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": ""},
                {"role": "tool", "content": "3"}, {"role": "tool", "content": "three"}]
    template = ChatTemplate(entry["template"], entry["bos_token"], entry["eos_token"])
    assert template.render(messages) == transformers_render(entry, messages, True)


def test_keys_set_to_none_are_dropped_as_transformers_drops_them():
    # R1's template reads message['content'] of a tool call; without the key it fails, in both
    entry = TEMPLATES["deepseek-r1-distill-qwen-7b"]
    call = {"type": "function", "function": {"name": "add", "arguments": "{}"}}
    messages = [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    with pytest.raises(jinja2.exceptions.UndefinedError):
        transformers_render(entry, messages, True)
    with pytest.raises(ChatTemplateError, match="has no attribute 'content'"):
        ChatTemplate(entry["template"]).render(messages)


@pytest.mark.model
@pytest.mark.parametrize("model", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_from_metadata_reads_the_files_template_and_special_tokens(model):
    template, entry = ChatTemplate.from_metadata(metadata(model)), TEMPLATES[model]
    assert (template.source, template.bos_token, template.eos_token) == (
        entry["template"], entry["bos_token"], entry["eos_token"])


@pytest.mark.model
def test_a_model_without_a_template_gets_its_familys_format():
    from ember.engine.load import chat_template_source

    assert "tokenizer.chat_template" not in metadata("gemma3-270m")
    source, origin = chat_template_source(metadata("gemma3-270m"))
    assert origin.startswith("built-in gemma")
    template = ChatTemplate.from_metadata(metadata("gemma3-270m"), source)
    assert template.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n")


def test_default_template_is_chatml():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"}]
    assert ChatTemplate(DEFAULT_TEMPLATE).render(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n")


# CVE-2024-34359: a GGUF chat template that runs shell commands in an unsandboxed Jinja environment
CVE_2024_34359 = (
    "{% for x in ().__class__.__base__.__subclasses__() %}{% if \"warning\" in x.__name__ %}"
    "{{x()._module.__builtins__['__import__']('os').popen(\"touch {path}\")}}{%endif%}{% endfor %}"
)


def test_the_cve_2024_34359_payload_is_stopped(tmp_path):
    marker = tmp_path / "pwned"
    template = ChatTemplate(CVE_2024_34359.replace("{path}", str(marker)))
    with pytest.raises(ChatTemplateError, match="unsafe"):
        template.render([{"role": "user", "content": "hi"}])
    assert not marker.exists()


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ messages.__class__ }}{{ messages.append(1) }}",
    "{% set ns = namespace(_secret=1) %}",
    "{{ 'x' * 100000000 }}",
])
def test_templates_reaching_for_python_internals_are_stopped(source):
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_raise_exception_in_a_template_is_a_clear_error():
    template = ChatTemplate("{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    with pytest.raises(EmberError, match="Conversation roles must alternate user/assistant"):
        template.render([{"role": "user", "content": "hi"}])


def test_a_template_that_does_not_parse_is_a_clear_error():
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for message in messages %}{{ message.content }")


def test_strftime_now_gives_the_current_date():
    before = datetime.now().strftime("%d %b %Y")
    rendered = ChatTemplate("{{ strftime_now('%d %b %Y') }}").render([])
    assert rendered in {before, datetime.now().strftime("%d %b %Y")}


def test_tojson_keeps_unicode_and_takes_json_dumps_options():
    template = ChatTemplate("{{ messages[0] | tojson(indent=2, sort_keys=True) }}")
    message = {"role": "user", "content": "café <b>"}
    assert template.render([message]) == json.dumps(message, ensure_ascii=False, indent=2, sort_keys=True)


def test_extra_variables_reach_the_template():
    template = ChatTemplate("{% if enable_thinking is defined and not enable_thinking %}no-think{% endif %}")
    assert template.render([], enable_thinking=False) == "no-think"
