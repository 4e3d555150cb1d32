"""A reasoning model's thoughts apart from its answer, as llama-server returns them.

DeepSeek-R1 (and its distills, QwQ, Qwen3) think before they answer: `<think>thoughts</think>
answer`. Newer templates end the prompt with `<think>\\n`, so the reply starts inside the
thoughts and only closes them. With reasoning_format "auto" (or "deepseek") the thoughts go to
`message.reasoning_content` (streamed as `reasoning_content` deltas) and the answer to
`content`; "none" leaves the reply as it came, all in `content`.

The thoughts are taken where the reply opens with `<think>` (after whitespace) or where the
prompt ended inside one; they run to `</think>`, or to the end of a reply that never closes
them. Whitespace around the thoughts and before the answer is dropped, as llama.cpp does.
"""

from __future__ import annotations

from ember.errors import EmberError

OPEN = "<think>"
CLOSE = "</think>"
FORMATS = ("auto", "deepseek", "none")


def check_format(reasoning_format: str) -> str:
    if reasoning_format not in FORMATS:
        raise EmberError(f"reasoning_format must be one of {', '.join(FORMATS)}, got {reasoning_format!r}")
    return reasoning_format


def prompt_opens_thoughts(prompt_text: str) -> bool:
    """Whether a rendered chat prompt ends inside `<think>` (the reply continues the thoughts)."""
    text = prompt_text.rstrip()
    return text.endswith(OPEN)


def split_reasoning(text: str, thinking: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole reply; thinking: the prompt opened the thoughts."""
    splitter = ReasoningSplitter(thinking)
    reasoning, content = splitter.feed(text)
    more_reasoning, more_content = splitter.finish()
    reasoning += more_reasoning
    return (reasoning if splitter.had_reasoning else None), content + more_content


class ReasoningSplitter:
    """A reply's text as it streams, split into (reasoning, content) pieces. Text that may still
    turn out to be part of a tag, or whitespace that may turn out to be trailing, is held until
    the text that follows decides; the pieces put together equal `split_reasoning`."""

    def __init__(self, thinking: bool = False):
        self._state = "thinking" if thinking else "start"  # start -> thinking -> answer
        self._held = ""
        self._started = False  # some reasoning or content text has been emitted (leading space dropped)
        self.had_reasoning = thinking

    def feed(self, text: str) -> tuple[str, str]:
        buffer = self._held + text
        self._held = ""
        reasoning = content = ""
        while buffer:
            if self._state == "start":
                stripped = buffer.lstrip()
                if not stripped or OPEN.startswith(stripped):
                    self._held = buffer  # may still open the thoughts
                    break
                if stripped.startswith(OPEN):
                    self._state, self.had_reasoning = "thinking", True
                    buffer = stripped[len(OPEN):]
                    continue
                self._state = "answer"
                continue
            if self._state == "thinking":
                end = buffer.find(CLOSE)
                if end < 0:
                    keep = _partial_tag(buffer, CLOSE)
                    body, self._held = buffer[:len(buffer) - keep], buffer[len(buffer) - keep:]
                    reasoning += self._thought(body)
                    break
                reasoning += self._thought(buffer[:end], closing=True)
                self._state, self._started = "answer", False
                buffer = buffer[end + len(CLOSE):]
                continue
            content += self._answer(buffer)
            break
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is still held, at the end of the reply."""
        held, self._held = self._held, ""
        if self._state == "thinking":
            return self._thought(held, closing=True), ""
        if self._state == "start":
            return "", held
        return "", self._answer(held)

    def _thought(self, text: str, closing: bool = False) -> str:
        """Reasoning text without leading whitespace; trailing whitespace waits for what follows
        (dropped when the thoughts end)."""
        if not self._started:
            text = text.lstrip()
        if not closing:
            body = text.rstrip()
            self._held = text[len(body):] + self._held
            text = body
        else:
            text = text.rstrip()
        if text:
            self._started = True
        return text

    def _answer(self, text: str) -> str:
        if not self._started:
            text = text.lstrip() if self.had_reasoning else text
            if text:
                self._started = True
        return text


def _partial_tag(buffer: str, tag: str) -> int:
    """How many characters at the end of buffer could begin tag."""
    for n in range(min(len(buffer), len(tag) - 1), 0, -1):
        if tag.startswith(buffer[-n:]):
            return n
    return 0
