"""ember.tokenizer.chat_formats: the built-in formats render what llama.cpp's built-in formats
render (its own expectations, tests/fixtures/chat_formats.json), and a file without a template
gets its family's format."""

from __future__ import annotations

import json

import pytest

from ember.tokenizer.chat_formats import BUILTIN, builtin_template, detect_format
from ember.tokenizer.chat_template import ChatTemplate
from paths import FIXTURES

FIXTURE = json.loads((FIXTURES / "chat_formats.json").read_text(encoding="utf-8"))
CONVERSATION = FIXTURE["conversation"]


def render(name: str, messages, add_generation_prompt: bool = True) -> str:
    return ChatTemplate(BUILTIN[name]).render(messages, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda case: case["format"])
def test_a_builtin_format_renders_what_llama_cpp_renders(case):
    assert render(case["format"], CONVERSATION) == case["expected"]


# Formats llama.cpp's tests do not cover: the expectations follow llm_chat_apply_template's code.
@pytest.mark.parametrize("name, expected", [
    ("llama2-sys", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are "
                   "you [/INST]   I am an assistant   </s>[INST] Another question [/INST]"),
    ("zephyr", "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\n"
               "Hi there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   "
               "<|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n"),
    ("falcon3", "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there\n<|user|>\nWho are "
                "you\n<|assistant|>\n   I am an assistant   \n<|user|>\nAnother question\n<|assistant|>\n"),
    ("deepseek3", "You are a helpful assistant\n\n<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>"
                  "Who are you<｜Assistant｜>   I am an assistant   <｜end▁of▁sentence｜><｜User｜>Another question"
                  "<｜Assistant｜>"),
    ("exaone3", "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there[|endofturn|]\n"
                "[|user|]Who are you\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]Another question\n"
                "[|assistant|]"),
    ("mistral-v7-tekken", "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>"
                          "[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"),
])
def test_formats_without_a_llama_cpp_case(name, expected):
    assert render(name, CONVERSATION) == expected


def test_every_builtin_is_checked():
    covered = {case["format"] for case in FIXTURE["cases"]}
    covered |= {"llama2-sys", "zephyr", "falcon3", "deepseek3", "exaone3", "mistral-v7-tekken"}
    assert covered == set(BUILTIN)


def test_without_a_generation_prompt_the_last_turn_ends_the_text():
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert render("llama3", messages, add_generation_prompt=False) == (
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>")


def test_an_assistant_turn_without_content_renders_empty():
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}]
    assert render("chatml", messages, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")


def test_llama_cpp_python_names_are_aliases():
    assert builtin_template("llama-3") == BUILTIN["llama3"]
    assert builtin_template("llama-2") == BUILTIN["llama2-sys"]
    assert builtin_template("no-such-format") is None


def vocabulary(*specials, arch="llama", model="gpt2", pre=None):
    metadata = {"general.architecture": arch, "tokenizer.ggml.model": model,
                "tokenizer.ggml.tokens": ["a", "b", *specials]}
    if pre:
        metadata["tokenizer.ggml.pre"] = pre
    return metadata


@pytest.mark.parametrize("metadata, name", [
    (vocabulary("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "llama3"),
    (vocabulary("<start_of_turn>", "<end_of_turn>"), "gemma"),
    (vocabulary(arch="gemma3", model="llama"), "gemma"),
    (vocabulary("<|im_start|>", "<|im_end|>", arch="qwen2"), "chatml"),
    (vocabulary("<|im_start|>", "<|im_sep|>", "<|im_end|>", arch="phi3"), "phi4"),
    (vocabulary("[INST]", "[/INST]", "[SYSTEM_PROMPT]", pre="tekken"), "mistral-v7-tekken"),
    (vocabulary("[INST]", "[/INST]"), "mistral-v3"),
    (vocabulary("<|user|>", "<|assistant|>", "<|end|>", arch="phi3"), "phi3"),
    (vocabulary("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", arch="command-r"), "command-r"),
    (vocabulary("<｜User｜>", "<｜Assistant｜>", arch="deepseek2"), "deepseek3"),
    (vocabulary(arch="deepseek2"), "deepseek2"),
    (vocabulary("<|start_of_role|>", "<|end_of_role|>", arch="granite"), "granite"),
    (vocabulary("<|EOT|>"), "deepseek"),
    (vocabulary("<s>", "</s>", model="llama"), "llama2-sys"),
    (vocabulary("<|endoftext|>", arch="gpt2"), "chatml"),
    ({}, "chatml"),
])
def test_the_format_follows_the_familys_special_tokens(metadata, name):
    assert detect_format(metadata) == name
