"""ember.api.reasoning: a reasoning model's thoughts apart from its answer, whole and streamed, in
the Python API and in `ember chat` (the server's side is in tests/server/test_server.py)."""

from __future__ import annotations

import io

import pytest

from ember.api.llm import LLM
from ember.api.reasoning import ReasoningSplitter, prompt_opens_thoughts, split_reasoning
from ember.cli.chat import DIM, NORMAL, ChatSession, Thought, _stream_reply
from ember.engine.sampling import SamplingParams
from ember.errors import EmberError
from fake_llm import ByteTokenizer, FakeModel, TagTemplate, continuation

QUESTION = [{"role": "user", "content": "Is 17 prime?"}]
THOUGHTS = "Check 2, 3 and 4: none divides 17."
ANSWER = "Yes, 17 is prime."

SPLITS = {
    "thoughts, then the answer": ("<think>\nA.\n</think>\n\nB.", False, ("A.", "B.")),
    "leading whitespace before the tag": ("\n <think>A</think>B", False, ("A", "B")),
    "the prompt opened the thoughts": ("A.\n</think>\n\nB.", True, ("A.", "B.")),
    "thoughts never closed": ("<think>\nstill thinking ", False, ("still thinking", "")),
    "opened by the prompt, never closed": ("still thinking", True, ("still thinking", "")),
    "no thoughts": ("Just an answer.", False, (None, "Just an answer.")),
    "a tag later in the answer stays text": ("Use <think> tags.", False, (None, "Use <think> tags.")),
    "empty thoughts": ("<think></think>B", False, ("", "B")),
    "inner whitespace kept": ("<think>a\n\nb  c</think>d\n e", False, ("a\n\nb  c", "d\n e")),
}


@pytest.mark.parametrize("case", SPLITS)
def test_split_reasoning(case):
    text, thinking, expected = SPLITS[case]
    assert split_reasoning(text, thinking) == expected


@pytest.mark.parametrize("case", SPLITS)
def test_streamed_pieces_join_to_the_whole_split_at_any_cut(case):
    text, thinking, (reasoning, content) = SPLITS[case]
    for size in (1, 2, 3, 5):
        splitter = ReasoningSplitter(thinking)
        pieces = [splitter.feed(text[i:i + size]) for i in range(0, len(text), size)] + [splitter.finish()]
        assert "".join(r for r, _ in pieces) == (reasoning or "")
        assert "".join(c for _, c in pieces) == content


def test_a_prompt_ending_in_think_opens_the_thoughts():
    assert prompt_opens_thoughts("<｜User｜>Hi<｜Assistant｜><think>\n")
    assert not prompt_opens_thoughts("<｜User｜>Hi<｜Assistant｜>")
    assert not prompt_opens_thoughts("<think>x</think><｜Assistant｜>")


class ThinkingTemplate(TagTemplate):
    """The generation prompt opens the thoughts, as DeepSeek-R1's template does."""

    source = "... <think> ... </think> ..."

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        return super().render(messages, add_generation_prompt) + ("<think>\n" if add_generation_prompt else "")


def thinking_llm(reply: str, template=None) -> LLM:
    template = template or ThinkingTemplate()
    tokenizer = ByteTokenizer()
    prompt = tokenizer.encode(template.render(QUESTION), add_special=False, parse_special=True)
    model = FakeModel(continuation(prompt, list(reply.encode())))
    return LLM.from_components(model, tokenizer, template, name="fake")


REPLY = f"{THOUGHTS}\n</think>\n\n{ANSWER}"


def test_chat_completion_gives_the_thoughts_as_reasoning_content():
    result = thinking_llm(REPLY).create_chat_completion(QUESTION, temperature=0)
    message = result["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHTS}
    assert result["choices"][0]["finish_reason"] == "stop"


def test_streamed_deltas_carry_the_thoughts_then_the_answer():
    chunks = list(thinking_llm(REPLY).create_chat_completion(QUESTION, temperature=0, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == THOUGHTS
    assert "".join(d.get("content", "") for d in deltas) == ANSWER
    last_thought = max(i for i, d in enumerate(deltas) if d.get("reasoning_content"))
    first_answer = min(i for i, d in enumerate(deltas) if d.get("content"))
    assert last_thought <= first_answer
    assert len([d for d in deltas if d.get("reasoning_content")]) > 1  # it streams
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_reasoning_format_none_leaves_the_reply_as_written():
    result = thinking_llm(REPLY).create_chat_completion(QUESTION, temperature=0, reasoning_format="none")
    assert result["choices"][0]["message"] == {"role": "assistant", "content": REPLY}


def test_a_reply_that_opens_its_own_thoughts_is_split_without_a_thinking_template():
    result = thinking_llm(f"<think>{THOUGHTS}</think>{ANSWER}", TagTemplate()).create_chat_completion(
        QUESTION, temperature=0)
    assert result["choices"][0]["message"]["reasoning_content"] == THOUGHTS
    assert result["choices"][0]["message"]["content"] == ANSWER


def test_an_unknown_reasoning_format_is_refused():
    with pytest.raises(EmberError, match="reasoning_format"):
        thinking_llm(REPLY).create_chat_completion(QUESTION, reasoning_format="hidden")


# -- ember chat ---------------------------------------------------------------------------------


def chat_session(reply: str = REPLY, **kwargs) -> ChatSession:
    return ChatSession(thinking_llm(reply), params=SamplingParams(temperature=0.0), **kwargs)


def test_chat_yields_thoughts_as_thought_pieces_and_keeps_the_answer():
    session = chat_session()
    pieces = list(session.reply(QUESTION[0]["content"]))
    assert "".join(p for p in pieces if isinstance(p, Thought)) == THOUGHTS
    assert "".join(p for p in pieces if not isinstance(p, Thought)) == ANSWER
    assert session.messages[-1] == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHTS}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_chat_dims_thoughts_on_a_terminal_and_leaves_them_out_of_a_pipe():
    terminal, pipe = Terminal(), io.StringIO()
    _stream_reply(chat_session(), QUESTION[0]["content"], terminal, io.StringIO())
    _stream_reply(chat_session(), QUESTION[0]["content"], pipe, io.StringIO())
    assert terminal.getvalue() == f"{DIM}{THOUGHTS}{NORMAL}\n{ANSWER}\n"
    assert pipe.getvalue() == f"{ANSWER}\n"


def test_chat_with_reasoning_format_none_prints_the_reply_as_written():
    pipe = io.StringIO()
    _stream_reply(chat_session(reasoning_format="none"), QUESTION[0]["content"], pipe, io.StringIO())
    assert pipe.getvalue() == f"{REPLY}\n"
