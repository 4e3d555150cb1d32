"""Built-in chat formats, for model files that carry no `tokenizer.chat_template`, and the choice
of one from what the file does carry (its architecture and special tokens).

The formats are llama.cpp's built-in list (`llm_chat_apply_template` in its llama-chat.cpp),
each written here as a Jinja template that renders the same text, so they run through the same
sandboxed ChatTemplate as a model's own template. `--chat-template NAME` (and `chat_format=` in
the Python API) picks one by name; `detect_format` picks the family's format for a file without
a template:

    <|start_header_id|> and <|eot_id|> -> llama3      <start_of_turn>, gemma*     -> gemma
    <|im_start|> (+ <|im_sep|>)        -> chatml (phi4)  [SYSTEM_PROMPT] / [INST]  -> mistral-v7 / -v3
    <|assistant|> and <|end|>          -> phi3        <|START_OF_TURN_TOKEN|>      -> command-r
    <｜User｜> and <｜Assistant｜>       -> deepseek3   <|start_of_role|>           -> granite
    <|end_of_turn|> -> openchat, <|EOT|> -> deepseek, architecture deepseek2 -> deepseek2,
    a SentencePiece llama (Llama 2, Mistral v0.1) -> llama2-sys; anything else -> chatml
    (llama.cpp's fallback).
"""

from __future__ import annotations

from typing import Mapping

# Each template sees `messages` (role, content; content may be missing) and add_generation_prompt.
_C = "{%- set c = message['content'] or '' -%}"


def _each(body: str, generation: str = "", before: str = "") -> str:
    """A template that renders `body` per message (with `c` its content, `role` its role) and,
    when asked for a reply, `generation`."""
    prompt = f"{{%- if add_generation_prompt -%}}{generation}{{%- endif -%}}" if generation else ""
    return (before + "{%- for message in messages -%}{%- set role = message['role'] -%}" + _C + body
            + "{%- endfor -%}" + prompt)


def _by_role(**parts: str) -> str:
    """Per-role Jinja: parts are system=..., user=..., assistant=..., other=... (other: any role
    not named; empty when absent)."""
    branches, first = [], True
    for role in ("system", "user", "assistant"):
        if role in parts:
            branches.append(f"{{%- {'if' if first else 'elif'} role == '{role}' -%}}{parts[role]}")
            first = False
    if "other" in parts:
        branches.append(f"{{%- else -%}}{parts['other']}")
    return "".join(branches) + "{%- endif -%}"


def _llama2(system: bool, bos_inside: bool, strip: bool) -> str:
    content = "(c | trim)" if strip else "c"
    system_part = "{{ '<<SYS>>\\n' + " + content + " + '\\n<</SYS>>\\n\\n' }}" if system else \
        "{{ " + content + " + '\\n' }}"
    reopen = "'<s>[INST] '" if bos_inside else "'[INST] '"
    return ("{{- '[INST] ' -}}{%- set ns = namespace(inside=true) -%}"
            + _each("{%- if not ns.inside -%}{%- set ns.inside = true -%}{{ " + reopen + " }}{%- endif -%}"
                    + _by_role(system=system_part, user="{{ " + content + " + ' [/INST]' }}",
                               other="{{ " + content + " + '</s>' }}{%- set ns.inside = false -%}")))


def _mistral(leading: str, trailing: str, trim_assistant: bool) -> str:
    answer = "(c | trim)" if trim_assistant else "c"
    return ("{%- set ns = namespace(inside=false) -%}"
            + _each("{%- if not ns.inside -%}{{ '" + leading + "[INST]" + trailing + "' }}"
                    "{%- set ns.inside = true -%}{%- endif -%}"
                    + _by_role(system="{{ c + '\\n\\n' }}", user="{{ c + '" + leading + "[/INST]' }}",
                               other="{{ '" + trailing + "' + " + answer + " + '</s>' }}"
                                     "{%- set ns.inside = false -%}")))


def _mistral_v7(space: str) -> str:
    return _each(_by_role(system="{{ '[SYSTEM_PROMPT]" + space + "' + c + '[/SYSTEM_PROMPT]' }}",
                          user="{{ '[INST]" + space + "' + c + '[/INST]' }}",
                          other="{{ '" + space + "' + c + '</s>' }}"))


def _vicuna(orca: bool) -> str:
    system = "{{ 'SYSTEM: ' + c + '\\n' }}" if orca else "{{ c + '\\n\\n' }}"
    return _each(_by_role(system=system, user="{{ 'USER: ' + c + '\\n' }}",
                          assistant="{{ 'ASSISTANT: ' + c + '</s>\\n' }}"), "{{ 'ASSISTANT:' }}")


BUILTIN: dict[str, str] = {
    "chatml": _each("{{ '<|im_start|>' + role + '\\n' + c + '<|im_end|>\\n' }}", "{{ '<|im_start|>assistant\\n' }}"),
    "llama2": _llama2(system=False, bos_inside=False, strip=False),
    "llama2-sys": _llama2(system=True, bos_inside=False, strip=False),
    "llama2-sys-bos": _llama2(system=True, bos_inside=True, strip=False),
    "llama2-sys-strip": _llama2(system=True, bos_inside=False, strip=True),
    "mistral-v1": _mistral(" ", " ", trim_assistant=False),
    "mistral-v3": _mistral("", " ", trim_assistant=True),
    "mistral-v3-tekken": _mistral("", "", trim_assistant=False),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _each("{{ '<|' + role + '|>\\n' + c + '<|end|>\\n' }}", "{{ '<|assistant|>\\n' }}"),
    "phi4": _each("{{ '<|im_start|>' + role + '<|im_sep|>' + c + '<|im_end|>' }}",
                  "{{ '<|im_start|>assistant<|im_sep|>' }}"),
    "falcon3": _each("{{ '<|' + role + '|>\\n' + c + '\\n' }}", "{{ '<|assistant|>\\n' }}"),
    "zephyr": _each("{{ '<|' + role + '|>\\n' + c + '<|endoftext|>\\n' }}", "{{ '<|assistant|>\\n' }}"),
    "monarch": _each("{{ ('' if loop.first else '<s>') + role + '\\n' + c + '</s>\\n' }}", "{{ '<s>assistant\\n' }}"),
    "gemma": "{%- set ns = namespace(system='') -%}" + _each(
        "{%- if role == 'system' -%}{%- set ns.system = ns.system + (c | trim) -%}{%- else -%}"
        "{%- set role = 'model' if role == 'assistant' else role -%}{{ '<start_of_turn>' + role + '\\n' }}"
        "{%- if ns.system and role != 'model' -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}"
        "{{ (c | trim) + '<end_of_turn>\\n' }}{%- endif -%}", "{{ '<start_of_turn>model\\n' }}"),
    "orion": "{%- set ns = namespace(system='') -%}" + _each(_by_role(
        system="{%- set ns.system = ns.system + c -%}",
        user="{{ 'Human: ' }}{%- if ns.system -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}"
             "{{ c + '\\n\\nAssistant: </s>' }}",
        other="{{ c + '</s>' }}")),
    "openchat": _each(_by_role(system="{{ c + '<|end_of_turn|>' }}",
                               other="{{ 'GPT4 Correct ' + role[:1] | upper }}{{ role[1:] + ': ' + c + '<|end_of_turn|>' }}"),
                      "{{ 'GPT4 Correct Assistant:' }}"),
    "vicuna": _vicuna(orca=False),
    "vicuna-orca": _vicuna(orca=True),
    "deepseek": _each(_by_role(system="{{ c }}", user="{{ '### Instruction:\\n' + c + '\\n' }}",
                               assistant="{{ '### Response:\\n' + c + '\\n<|EOT|>\\n' }}"), "{{ '### Response:\\n' }}"),
    "deepseek2": _each(_by_role(system="{{ c + '\\n\\n' }}", user="{{ 'User: ' + c + '\\n\\n' }}",
                                assistant="{{ 'Assistant: ' + c + '<｜end▁of▁sentence｜>' }}"), "{{ 'Assistant:' }}"),
    "deepseek3": _each(_by_role(system="{{ c + '\\n\\n' }}", user="{{ '<｜User｜>' + c }}",
                                assistant="{{ '<｜Assistant｜>' + c + '<｜end▁of▁sentence｜>' }}"),
                       "{{ '<｜Assistant｜>' }}"),
    "command-r": _each(_by_role(
        system="{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + (c | trim) + '<|END_OF_TURN_TOKEN|>' }}",
        user="{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + (c | trim) + '<|END_OF_TURN_TOKEN|>' }}",
        assistant="{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + (c | trim) + '<|END_OF_TURN_TOKEN|>' }}"),
        "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}"),
    "llama3": _each("{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + (c | trim) + '<|eot_id|>' }}",
                    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"),
    "chatglm3": _each("{{ '<|' + role + '|>\\n ' + c }}", "{{ '<|assistant|>' }}", before="{{- '[gMASK]sop' -}}"),
    "chatglm4": _each("{{ '<|' + role + '|>\\n' + c }}", "{{ '<|assistant|>\\n' }}", before="{{- '[gMASK]<sop>' -}}"),
    "glmedge": _each("{{ '<|' + role + '|>\\n' + c }}", "{{ '<|assistant|>' }}"),
    "minicpm": _each(_by_role(user="{{ '<用户>' + (c | trim) + '<AI>' }}", other="{{ c | trim }}")),
    "exaone3": _each(_by_role(system="{{ '[|system|]' + (c | trim) + '[|endofturn|]\\n' }}",
                              user="{{ '[|user|]' + (c | trim) + '\\n' }}",
                              assistant="{{ '[|assistant|]' + (c | trim) + '[|endofturn|]\\n' }}"),
                     "{{ '[|assistant|]' }}"),
    "granite": _each("{{ '<|start_of_role|>' + role + '<|end_of_role|>' }}"
                     "{%- if role == 'assistant_tool_call' -%}{{ '<|tool_call|>' }}{%- endif -%}"
                     "{{ c + '<|end_of_text|>\\n' }}", "{{ '<|start_of_role|>assistant<|end_of_role|>' }}"),
}

# llama-cpp-python's chat_format names for the same formats
ALIASES = {"llama-2": "llama2-sys", "llama-3": "llama3", "mistral-instruct": "mistral-v1"}

FALLBACK = "chatml"


def builtin_names() -> list[str]:
    return list(BUILTIN)


def builtin_template(name: str) -> str | None:
    """The Jinja source of a built-in format (by its name or a llama-cpp-python alias), or None."""
    return BUILTIN.get(ALIASES.get(name, name))


def canonical_name(name: str) -> str:
    return ALIASES.get(name, name)


def detect_format(metadata: Mapping) -> str:
    """The built-in format of a model's family, from its architecture and special tokens."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab = set(tokens) if tokens is not None else set()
    arch = str(metadata.get("general.architecture") or "")
    tekken = metadata.get("tokenizer.ggml.pre") == "tekken"

    def has(*texts: str) -> bool:
        return all(text in vocab for text in texts)

    if has("<|start_header_id|>", "<|eot_id|>"):
        return "llama3"
    if arch.startswith("gemma") or has("<start_of_turn>"):
        return "gemma"
    if has("<|im_start|>"):
        return "phi4" if has("<|im_sep|>") else "chatml"
    if has("[SYSTEM_PROMPT]"):
        return "mistral-v7-tekken" if tekken else "mistral-v7"
    if has("[INST]"):
        return "mistral-v3-tekken" if tekken else "mistral-v3"
    if has("<|assistant|>", "<|end|>"):
        return "phi3"
    if has("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"):
        return "command-r"
    if has("<｜User｜>", "<｜Assistant｜>"):
        return "deepseek3"
    if has("<|start_of_role|>"):
        return "granite"
    if has("<|end_of_turn|>"):
        return "openchat"
    if has("<|EOT|>"):
        return "deepseek"
    if arch == "deepseek2":
        return "deepseek2"
    if arch == "llama" and metadata.get("tokenizer.ggml.model") == "llama":
        return "llama2-sys"
    return FALLBACK
