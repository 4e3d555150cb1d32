"""`ember chat`: history, commands, context overflow, piped input, and a person at a terminal."""

import io
import os
import pty
import re
import select
import signal
import sys
import time

import pytest

from ember.cli.chat import ChatSession, repl
from ember.engine.sampling import SamplingParams
from ember.errors import ContextFullError
from fake_llm import fake_llm
from paths import TESTS, ember_root

GREEDY = SamplingParams(temperature=0.0)
SRC = ember_root()


def session(n_ctx=256, system=None, notices=None, max_tokens=None):
    return ChatSession(fake_llm(n_ctx=n_ctx), system=system, params=GREEDY, max_tokens=max_tokens,
                       notice=(notices.append if notices is not None else lambda text: None))


def test_a_reply_streams_and_joins_the_history():
    chat = session()
    assert list(chat.reply("hi")) == list("You said: hi")
    assert chat.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "You said: hi"}]


def test_the_next_turn_sees_the_history():
    chat = session(system="Be brief.")
    "".join(chat.reply("one"))
    "".join(chat.reply("two"))
    text = chat.llm.tokenizer.decode(chat.llm.model.tokens)
    assert text.startswith("<s><|system|>Be brief.<|end|><|user|>one<|end|><|assistant|>You said: one<|end|>")
    assert "<|user|>two<|end|><|assistant|>You said: tw" in text


def test_clear_keeps_only_the_system_message():
    chat = session(system="Be brief.")
    "".join(chat.reply("one"))
    chat.clear()
    assert chat.messages == [{"role": "system", "content": "Be brief."}]


def test_a_full_context_drops_the_oldest_turns_with_a_notice():
    notices = []
    chat = session(n_ctx=70, notices=notices, max_tokens=20)  # the third turn needs 59 + 20
    for word in ("first", "second", "third"):
        assert "".join(chat.reply(word)) == f"You said: {word}"
    assert notices == ["[context full: dropped the oldest turn]"]
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["second", "third"]


def test_a_message_too_long_for_the_context_is_refused_and_forgotten():
    chat = session(n_ctx=32)
    with pytest.raises(ContextFullError, match="context holds 32"):
        "".join(chat.reply("x" * 40))
    assert chat.messages == []


def test_a_stopped_reply_keeps_what_was_said():
    chat = session()
    pieces = chat.reply("hello")
    assert [next(pieces) for _ in range(3)] == ["Y", "o", "u"]
    pieces.close()  # what Ctrl-C does
    assert chat.messages[-1] == {"role": "assistant", "content": "You"}
    assert "".join(chat.reply("again")) == "You said: again"


def test_piped_input_is_one_message_per_line():
    stdout, stderr = io.StringIO(), io.StringIO()
    repl(session(), stdin=io.StringIO("hi\n\nthere\n"), stdout=stdout, stderr=stderr)
    assert stdout.getvalue() == "You said: hi\nYou said: there\n"


def test_piped_commands_clear_and_exit():
    stdout, stderr = io.StringIO(), io.StringIO()
    chat = session()
    repl(chat, stdin=io.StringIO("hi\n/clear\n/exit\nnever\n"), stdout=stdout, stderr=stderr)
    assert stdout.getvalue() == "You said: hi\n"
    assert chat.messages == []
    assert "(conversation cleared)" in stderr.getvalue()


def test_unknown_commands_are_explained():
    stderr = io.StringIO()
    repl(session(), stdin=io.StringIO("/help\n"), stdout=io.StringIO(), stderr=stderr)
    assert "unknown command /help: /clear" in stderr.getvalue()


class Terminal:
    """A program on a pseudo-terminal, typed at like a person would."""

    def __init__(self, argv, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(argv[0], argv, env)
        self.output = ""

    def expect(self, pattern, timeout=30.0):
        """Read until `pattern` (a regex) appears after what earlier expects consumed; return
        the output up to the end of the match."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.output)
            if match:
                consumed, self.output = self.output[:match.end()], self.output[match.end():]
                return consumed
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                raise AssertionError(f"timed out waiting for {pattern!r}; got {self.output[-500:]!r}")
            try:
                data = os.read(self.fd, 4096)
            except OSError:  # the program exited
                data = b""
            if not data:
                raise AssertionError(f"the program ended before {pattern!r}; got {self.output[-500:]!r}")
            self.output += data.decode("utf-8", "replace")

    def type(self, text):
        os.write(self.fd, text.encode())

    def wait(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            try:
                os.read(self.fd, 4096)
            except OSError:
                time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("the program did not exit")


def terminal(argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)]), "TERM": "dumb"}
    return Terminal([sys.executable, *argv], env)


def test_a_person_at_a_terminal_chats_stops_a_reply_and_leaves():
    term = terminal([str(TESTS / "chat_tty_fake.py")])
    term.expect(r"/clear forgets the conversation")
    term.expect(r"> ")
    term.type("hello\n")
    term.expect(r"You said: hello")
    term.expect(r"> ")
    term.type("long\n")
    term.expect(r"(la ){5}")
    term.type("\x03")  # Ctrl-C
    term.expect(r"\(stopped\)")
    term.expect(r"> ")
    term.type("again\n")
    term.expect(r"You said: again")
    term.expect(r"> ")
    # A person presses Ctrl-C long after the prompt is drawn. CPython's readline checks for a
    # signal only when its select() is interrupted, so a SIGINT landing between drawing the
    # prompt and that select() waits for the next key: give the prompt a moment first.
    time.sleep(0.3)
    term.type("\x03")  # Ctrl-C at the prompt does not leave either
    term.expect(r"Ctrl-D to leave")
    term.type("/exit\n")
    assert term.wait() == 0


def test_ctrl_d_leaves():
    term = terminal([str(TESTS / "chat_tty_fake.py")])
    term.expect(r"> ")
    term.type("\x04")
    assert term.wait() == 0


def test_a_terminal_chat_drops_old_turns_when_the_context_fills():
    term = terminal([str(TESTS / "chat_tty_fake.py"), "100"])  # the fourth turn needs 85 tokens + 25 free
    shown = []
    for word in ("alpha", "bravo", "charlie", "delta"):
        term.expect(r"> ")
        term.type(f"{word}\n")
        shown.append(term.expect(f"You said: {word}"))
    assert ["[context full: dropped the oldest turn]" in text for text in shown] == [False, False, False, True]
    term.type("/exit\n")
    assert term.wait() == 0


@pytest.mark.model
def test_chatting_with_a_real_model_at_a_terminal():
    term = terminal(["-m", "ember", "chat", "-m", "smollm2-135m", "--temp", "0", "-n", "24", "-c", "1024"])
    term.expect(r"> ", timeout=120)
    term.type("What is the capital of France?\n")
    shown = term.expect(r"\n> ", timeout=120)
    reply = shown.split("France?", 1)[1]
    assert len(reply.strip()) > 3
    term.type("/exit\n")
    assert term.wait() == 0


@pytest.mark.model
def test_piped_chat_with_a_real_model(tmp_path):
    import subprocess

    result = subprocess.run([sys.executable, "-m", "ember", "chat", "--temp", "0", "-n", "16", "-c", "1024"],
                            input="Hi!\nWhat is 2+2?\n", capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    assert result.returncode == 0, result.stderr
    replies = result.stdout.splitlines()
    assert len([line for line in replies if line.strip()]) >= 2
