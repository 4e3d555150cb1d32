"""ember.tokenizer.chat_template: chat templates render as transformers' apply_chat_template does, safely."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import jinja2
import numpy as np
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


# Templates that used to hang the process or take gigabytes: each must stop at a limit of its own,
# with an error naming the limit, and leave the calling process as it was.
HOSTILE = {
    "nested loops of 10^10 steps": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                                    "{% endfor %}", "did not finish within 0.5 s"),
    "~ doubling": ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                   "{% endfor %}{{ ns.s }}", "needs more than 64 MiB of memory"),
    "+ doubling": ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                   "{% endfor %}{{ ns.s }}", "needs more than 64 MiB of memory"),
    "ljust": ("{{ 'x'.ljust(2**30) }}", "needs more than 64 MiB of memory"),
    "rjust": ("{{ 'x'.rjust(2**40) }}", "needs more than 64 MiB of memory"),
    "center": ("{{ 'x'.center(2**31) }}", "needs more than 64 MiB of memory"),
    "center filter": ("{{ 'x'|center(2**31) }}", "needs more than 64 MiB of memory"),
    "str.format width": ("{{ '{:>1000000000}'.format(1) }}", "needs more than 64 MiB of memory"),
    "% width": ("{{ '%1000000000d' % 1 }}", "needs more than 64 MiB of memory"),
    "format filter": ("{{ '%1000000000d'|format(1) }}", "needs more than 64 MiB of memory"),
    "replace": ("{{ ('x' * 1000000).replace('x', 'y' * 1000) }}", "needs more than 64 MiB of memory"),
    "join": ("{{ ('y' * 1000000).join(['a'] * 1000) }}", "needs more than 64 MiB of memory"),
    "indent": ("{{ 'a\nb'|indent(2**30) }}", "needs more than 64 MiB of memory"),
    "a list printed whole": ("{{ [('x' * 1000000)] * 100000 }}", "needs more than 64 MiB of memory"),
    "1 MiB of output per iteration": ("{% for i in range(100000) %}{{ 'x' * 1048576 }}{% endfor %}",
                                      "output exceeds 4194304 characters"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    "an expression nested 10^5 deep": ("{{" + "(" * 100000 + "1" + ")" * 100000 + "}}", "RecursionError"),
}


@pytest.mark.parametrize("source, limit", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_template_over_its_budget_is_an_error_naming_the_limit(source, limit):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    time_limit = 0.5 if "did not finish" in limit else 30  # the others reach their limit first, even on a busy machine
    with pytest.raises(ChatTemplateError, match=re.escape(limit)):
        template = ChatTemplate(source, time_limit=time_limit, output_limit=4 << 20, memory_limit=64 << 20)
        template.render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - started < 60  # a limit stopped it, not the test's timeout
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 << 10  # KiB: this process stayed small


def test_rendering_goes_on_after_a_template_was_stopped():
    hostile = ChatTemplate(HOSTILE["ljust"][0], memory_limit=64 << 20)
    for _ in range(2):
        with pytest.raises(ChatTemplateError, match="memory"):
            hostile.render([])
    assert ChatTemplate(DEFAULT_TEMPLATE).render([{"role": "user", "content": "hi"}], add_generation_prompt=False) \
        == "<|im_start|>user\nhi<|im_end|>\n"


def test_long_conversations_fit_the_default_budget():
    long = [{"role": "user", "content": "x" * (8 << 20)}]  # the server's largest request body
    assert len(ChatTemplate(DEFAULT_TEMPLATE).render(long)) > 8 << 20


def test_templates_render_concurrently():
    from concurrent.futures import ThreadPoolExecutor

    template = ChatTemplate(DEFAULT_TEMPLATE)
    conversations = [[{"role": "user", "content": f"message {i}"}] for i in range(32)]
    with ThreadPoolExecutor(8) as pool:
        rendered = list(pool.map(template.render, conversations))
    assert rendered == [template.render(c) for c in conversations]


@pytest.mark.parametrize("value", [np.array([1, 2], np.int32), ["{{ a }}", "{{ b }}"], 7])
def test_a_chat_template_that_is_not_a_string_is_refused(value):
    with pytest.raises(ChatTemplateError, match="tokenizer.chat_template must be a string; the model file has"):
        ChatTemplate.from_metadata({"tokenizer.chat_template": value})


def test_bos_and_eos_ids_of_the_wrong_kind_give_no_token_text():
    template = ChatTemplate.from_metadata({"tokenizer.ggml.tokens": ["<s>", "</s>"],
                                           "tokenizer.ggml.bos_token_id": np.array([0, 1]),
                                           "tokenizer.ggml.eos_token_id": 1})
    assert (template.bos_token, template.eos_token) == ("", "</s>")
