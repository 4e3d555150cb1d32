"""`ember chat`: a conversation through the model's chat template.

Replies stream as they are generated; the history is kept (and its KV cache reused) from turn
to turn. When the history no longer fits in the context, the oldest turns are dropped, with a
notice. Commands: /clear forgets the conversation, /exit (or Ctrl-D) leaves; Ctrl-C stops the
current reply. With a pipe on stdin, each line is one message and each reply one paragraph of
stdout. A reasoning model's thoughts (`<think>...</think>`, api/reasoning.py) are shown dimmed
on a terminal and left out of piped output; only the answer joins the history.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterator, TextIO

from ember.api.reasoning import ReasoningSplitter, check_format
from ember.engine.sampling import SamplingParams
from ember.errors import ContextFullError

EXIT_COMMANDS = ("/exit", "/quit", "/bye")
HELP = "/clear forgets the conversation, /exit or Ctrl-D leaves, Ctrl-C stops a reply"
DIM, NORMAL = "\x1b[2m", "\x1b[0m"


class Thought(str):
    """A piece of a reply that is the model's reasoning, not its answer."""


class ChatSession:
    """The messages of a conversation and how to continue it within the context.

    max_tokens: the most tokens of one reply (None: until the model stops or the context fills);
    that much room (at most half the context) is kept free for the reply when old turns are dropped.
    notice: where to say that turns were dropped. stop: strings that end a reply (-r, --stop).
    reasoning_format: "auto" / "deepseek" yield a reasoning model's thoughts as `Thought` pieces,
    "none" yields the reply as the model wrote it.
    """

    def __init__(self, llm, system: str | None = None, params: SamplingParams | None = None,
                 max_tokens: int | None = None, notice: Callable[[str], None] = lambda text: None,
                 stop: list[str] | None = None, reasoning_format: str = "auto"):
        self.llm = llm
        self.reasoning_format = check_format(reasoning_format)
        self.system = system
        self.params = params or SamplingParams()
        self.max_tokens = max_tokens
        self.stop = stop
        self.notice = notice
        self.messages: list[dict[str, str]] = []
        self.clear()

    def clear(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system is not None else []

    @property
    def turns(self) -> list[dict[str, str]]:
        """The messages after the system message."""
        return self.messages[1:] if self.system is not None else list(self.messages)

    def reply(self, text: str) -> Iterator[str]:
        """Stream the reply to a user message (thoughts as `Thought` pieces); the answer (as far as
        it got) joins the history."""
        self.messages.append({"role": "user", "content": text})
        try:
            tokens, thinking = self._fitted_prompt()
        except ContextFullError:
            self.messages.pop()
            raise
        generation = self.llm.generation(tokens, self.params, max_tokens=self.max_tokens, stop=self.stop)
        splitter = ReasoningSplitter(thinking) if self.reasoning_format != "none" else None
        thoughts, answer = [], []

        def pieces(reasoning: str, content: str) -> Iterator[str]:
            if reasoning:
                thoughts.append(reasoning)
                yield Thought(reasoning)
            if content:
                answer.append(content)
                yield content

        try:
            for chunk in generation:
                if chunk.text:
                    yield from pieces(*(splitter.feed(chunk.text) if splitter else ("", chunk.text)))
            if splitter:
                yield from pieces(*splitter.finish())
        finally:
            message = {"role": "assistant", "content": "".join(answer)}
            if thoughts:
                message["reasoning_content"] = "".join(thoughts)
            self.messages.append(message)

    def _fitted_prompt(self) -> tuple[list[int], bool]:
        """The prompt for the history, dropping the oldest turns until it leaves room for a reply."""
        n_ctx = self.llm.n_ctx
        room = min(self.max_tokens if self.max_tokens is not None else n_ctx // 4, n_ctx // 2)
        n_dropped = 0
        while True:
            prompt = self.llm.chat_prompt(self.messages)
            tokens = prompt.tokens
            if len(tokens) + room <= n_ctx or not self._drop_oldest_turn():
                break
            n_dropped += 1
        if n_dropped:
            self.notice(f"[context full: dropped the oldest {_turns(n_dropped)}]")
        if len(tokens) >= n_ctx:
            raise ContextFullError(
                f"this message needs {len(tokens)} tokens with the system message, but the context holds"
                f" {n_ctx}: send a shorter one or start ember chat with a larger -c")
        return tokens, prompt.thinking

    def _drop_oldest_turn(self) -> bool:
        """Remove the oldest user message and the reply to it; False when only the new message is left."""
        start = 1 if self.system is not None else 0
        if len(self.messages) - start <= 1:
            return False
        end = start + 1
        while end < len(self.messages) - 1 and self.messages[end]["role"] != "user":
            end += 1
        del self.messages[start:end]
        return True


def _turns(n: int) -> str:
    return "turn" if n == 1 else f"{n} turns"


def repl(session: ChatSession, stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    """Talk with a person (a terminal on stdin) or read one message per line (a pipe)."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    interactive = stdin.isatty()
    if interactive:
        _enable_line_editing()
        print(f"ember chat with {session.llm.name}: {HELP}", file=stderr, flush=True)
    while True:
        try:
            line = _read_message(stdin, stdout, interactive)
        except KeyboardInterrupt:
            print("\n(/exit or Ctrl-D to leave)", file=stderr, flush=True)
            continue
        if line is None:
            break
        text = line.strip()
        if not text:
            continue
        if text in EXIT_COMMANDS:
            break
        if text == "/clear":
            session.clear()
            print("(conversation cleared)", file=stderr, flush=True)
            continue
        if text.startswith("/") and " " not in text:
            print(f"unknown command {text}: {HELP}", file=stderr, flush=True)
            continue
        _stream_reply(session, text, stdout, stderr)
    if interactive:
        stdout.write("\n")
        stdout.flush()
    return 0


def _read_message(stdin: TextIO, stdout: TextIO, interactive: bool) -> str | None:
    if interactive and stdin is sys.stdin and stdout is sys.stdout:
        try:
            return input("> ")
        except EOFError:
            return None
    if interactive:
        stdout.write("> ")
        stdout.flush()
    line = stdin.readline()
    return line if line else None


def _stream_reply(session: ChatSession, text: str, stdout: TextIO, stderr: TextIO) -> None:
    pieces = session.reply(text)
    terminal = stdout.isatty()
    thinking = False  # dim text is being written
    try:
        for piece in pieces:
            if isinstance(piece, Thought) and not terminal:
                continue  # piped output: the answer only
            if terminal and isinstance(piece, Thought) != thinking:
                thinking = not thinking
                stdout.write(DIM if thinking else NORMAL + "\n")
            stdout.write(piece)
            stdout.flush()
    except KeyboardInterrupt:
        pieces.close()
        stdout.write("\n")
        print("(stopped)", file=stderr, flush=True)
    except ContextFullError as exc:
        print(f"ember: {exc}", file=stderr, flush=True)
        return
    finally:
        if thinking:
            stdout.write(NORMAL)
    stdout.write("\n")
    stdout.flush()


def _enable_line_editing() -> None:
    try:
        import readline  # noqa: F401  (input() then gets history and editing)
    except ImportError:
        pass


def cli_chat(args) -> int:
    from ember.cli.run import for_model, load_llm, sampling_from_args

    params = sampling_from_args(args)
    llm, _ = load_llm(args)
    session = ChatSession(llm, system=args.system, params=for_model(params, args, llm.tokenizer),
                          max_tokens=args.n_predict, notice=lambda text: print(text, file=sys.stderr, flush=True),
                          stop=args.stop, reasoning_format=args.reasoning_format)
    return repl(session)
