"""Chat templates: the model's `tokenizer.chat_template`, rendered as transformers renders it.

A template is Jinja code from an untrusted model file, so it runs in jinja2's
ImmutableSandboxedEnvironment (template_sandbox.py): it can read the messages and call the
helpers transformers offers, but not reach Python internals (`().__class__.__subclasses__()`
and the like stop with an error). The environment, helpers and message clean-up mirror
transformers' `apply_chat_template`, so a template renders to the same text in both.

And it renders under a budget, in a worker process of its own (an isolated Python that loads
only jinja2): `time_limit` seconds of wall time (the worker is killed when they are up),
`output_limit` characters of output and `memory_limit` bytes of memory (RLIMIT_AS in the
worker). A template that exceeds one is a ChatTemplateError naming the limit, and the process
that asked (a server, a chat) goes on; a loop of 10^10 iterations, a string doubled forty
times or `'x'.ljust(2**40)` cannot hang it, exhaust its memory or crash it.

    template = ChatTemplate.from_metadata(gguf_file.metadata)
    prompt = template.render([{"role": "user", "content": "Hi"}])   # ends ready for the reply
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ember.errors import EmberError
from ember.tokenizer.chat_formats import BUILTIN, FALLBACK
from ember.tokenizer.template_sandbox import MEMORY_LIMIT, OK

# ChatML: the last resort for a model whose file has no template (chat_formats picks the family's)
DEFAULT_TEMPLATE = BUILTIN[FALLBACK]

TIME_LIMIT = 5.0  # seconds a template may take to render
OUTPUT_LIMIT = 32 << 20  # characters it may output
MEMORY_LIMIT_BYTES = 256 << 20  # memory it may use (beyond the worker's own ~20 MB)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(EmberError):
    """A chat template that does not parse, fails while rendering, tries something unsafe, or
    exceeds its time, output or memory budget."""


class RenderingStopped(ChatTemplateError):
    """Rendering was stopped from outside (`stop_rendering`: the server is shutting down)."""


class ChatTemplate:
    """A compiled template; `origin` says where it came from (the model file, a built-in format, ...)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", origin: str = "", *,
                 time_limit: float = TIME_LIMIT, output_limit: int = OUTPUT_LIMIT,
                 memory_limit: int = MEMORY_LIMIT_BYTES):
        if not isinstance(source, str):
            raise ChatTemplateError(f"a chat template is a string, got {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin
        self.time_limit = time_limit
        self.output_limit = output_limit
        self.memory_limit = memory_limit
        self._rendered(None)  # compiled in a worker now, so a template that does not parse fails here

    @classmethod
    def from_metadata(cls, metadata: dict, source: str | None = None, origin: str = "") -> ChatTemplate:
        """`source` (default: the model's template, ChatML when it has none) with the model's BOS
        and EOS texts."""
        if source is None:
            source = file_template(metadata) or DEFAULT_TEMPLATE
        return cls(source, _token_text(metadata, "bos"), _token_text(metadata, "eos"), origin)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The conversation as one prompt string; `extra` reaches the template as variables
        (tools=[...], documents=[...], enable_thinking=False, ...)."""
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **_plain(extra)}
        context.setdefault("tools", None)
        context.setdefault("documents", None)
        context.update(messages=_plain_messages(messages), add_generation_prompt=bool(add_generation_prompt))
        return self._rendered(context)

    def _rendered(self, context: dict | None) -> str:
        status, text = _WORKERS.run(self.memory_limit, (self.source, context, self.output_limit), self.time_limit)
        if status == OK:
            return text
        if status == MEMORY_LIMIT:
            raise ChatTemplateError(f"the chat template needs more than {self.memory_limit >> 20} MiB of memory "
                                    "(ember's limit for rendering a chat template)")
        raise ChatTemplateError(text)


def file_template(metadata: dict) -> str | None:
    """The model file's tokenizer.chat_template; one that is not a string is a ChatTemplateError."""
    source = metadata.get("tokenizer.chat_template")
    if source is not None and not isinstance(source, str):
        raise ChatTemplateError("tokenizer.chat_template must be a string; the model file has "
                                f"{'an array' if hasattr(source, '__len__') else type(source).__name__}")
    return source


def _token_text(metadata: dict, name: str) -> str:
    token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(token_id, bool) or not isinstance(token_id, int) or tokens is None:
        return ""
    if not hasattr(tokens, "__len__") or not 0 <= token_id < len(tokens):
        return ""
    text = tokens[token_id]
    return text if isinstance(text, str) else ""


# -- the worker processes ----------------------------------------------------------------------

_SANDBOX = Path(__file__).with_name("template_sandbox.py")
# The worker: an isolated interpreter (no PYTHON* variables, no user site, not this package)
# that finds jinja2 where this process found it and runs template_sandbox.serve.
_BOOT = ("import sys; sys.path[:0] = sys.argv[3:]; import importlib.util as u; "
         "spec = u.spec_from_file_location('template_sandbox', sys.argv[1]); "
         "module = u.module_from_spec(spec); spec.loader.exec_module(module); "
         "module.serve(sys.stdin.buffer, sys.stdout.buffer, int(sys.argv[2]))")
_LENGTH_BYTES = 8
_MAX_IDLE = 4  # idle workers kept per memory limit
_START_TIMEOUT = 60.0  # seconds a worker may take to start (a loaded machine)


class _WorkerGone(Exception):
    """The worker exited (or was killed) before it answered."""


class _Worker:
    def __init__(self, memory_limit: int):
        self.stopped = False  # set when the pool is closed
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, str(_SANDBOX), str(memory_limit), *_library_paths()],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                start_new_session=True)  # its own process group: Ctrl-C in a terminal stops only the parent
        except OSError as error:
            raise ChatTemplateError(f"cannot start a process to render the chat template: {error}") from None
        try:
            self._reply(time.monotonic() + _START_TIMEOUT)
        except (TimeoutError, _WorkerGone):
            self.kill()
            raise ChatTemplateError("the process that renders chat templates did not start "
                                    f"(within {_START_TIMEOUT:g} s)") from None

    def ask(self, request: bytes, time_limit: float) -> tuple[bytes, str]:
        """Send one request; the reply (status, text). TimeoutError when time_limit passes first."""
        try:
            self.process.stdin.write(len(request).to_bytes(_LENGTH_BYTES, "little") + request)
        except (BrokenPipeError, ValueError, OSError):
            raise _WorkerGone from None
        return self._reply(time.monotonic() + time_limit)

    def _reply(self, deadline: float) -> tuple[bytes, str]:
        header = self._read(1 + _LENGTH_BYTES, deadline)
        text = self._read(int.from_bytes(header[1:], "little"), deadline)
        return header[:1], text.decode("utf-8", errors="surrogatepass")

    def _read(self, n: int, deadline: float) -> bytes:
        fd = self.process.stdout.fileno()
        parts, missing = [], n
        while missing:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            part = os.read(fd, min(missing, 1 << 20))
            if not part:
                raise _WorkerGone
            parts.append(part)
            missing -= len(part)
        return b"".join(parts)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()


class _WorkerPool:
    """Idle workers, by memory limit; each request takes one (or starts one) and gives it back."""

    def __init__(self):
        self._idle: dict[int, list[_Worker]] = {}
        self._busy: set[_Worker] = set()
        self._lock = threading.Lock()
        atexit.register(self.close)

    def run(self, memory_limit: int, request: tuple, time_limit: float) -> tuple[bytes, str]:
        payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        for attempt in range(2):
            worker, fresh = self._take(memory_limit)
            healthy = False
            try:
                status, text = worker.ask(payload, time_limit)
                healthy = status != MEMORY_LIMIT  # after a memory failure the worker exits
                return status, text
            except TimeoutError:
                raise ChatTemplateError(f"the chat template did not finish within {time_limit:g} s "
                                        "(ember's limit for rendering a chat template)") from None
            except _WorkerGone:
                if worker.stopped:
                    raise RenderingStopped("rendering the chat template was stopped: ember is shutting down") from None
                if fresh or attempt:  # not a stale worker: the template itself brought it down
                    raise ChatTemplateError("the chat template crashed the process rendering it "
                                            f"(exit status {worker.process.wait()})") from None
            finally:
                self._give_back(memory_limit, worker, healthy)
        raise AssertionError("unreachable")

    def _take(self, memory_limit: int) -> tuple[_Worker, bool]:
        with self._lock:
            idle = self._idle.get(memory_limit)
            worker, fresh = (idle.pop(), False) if idle else (None, True)
        if worker is None:
            worker = _Worker(memory_limit)
        with self._lock:
            self._busy.add(worker)
        return worker, fresh

    def _give_back(self, memory_limit: int, worker: _Worker, healthy: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            idle = self._idle.setdefault(memory_limit, [])
            if healthy and not worker.stopped and len(idle) < _MAX_IDLE:
                idle.append(worker)
                return
        worker.kill()

    def close(self) -> None:
        """Stop every worker, idle or rendering (a render in progress ends with a ChatTemplateError)."""
        with self._lock:
            idle = [w for workers in self._idle.values() for w in workers]
            busy = list(self._busy)
            self._idle.clear()
        for worker in idle:
            worker.kill()
        for worker in busy:  # its thread sees the pipe close, fails the render and cleans up
            worker.stopped = True
            if worker.process.poll() is None:
                worker.process.kill()


def _library_paths() -> list[str]:
    """The folders jinja2 and markupsafe are imported from in this process."""
    paths = []
    for name in ("jinja2", "markupsafe"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            folder = str(Path(spec.origin).parent.parent)
            if folder not in paths:
                paths.append(folder)
    return paths


_WORKERS = _WorkerPool()


def stop_rendering() -> None:
    """Stop every template worker now (a server shutting down): renders in progress fail at once,
    later ones start fresh workers."""
    _WORKERS.close()


def _plain_messages(messages) -> list[dict]:
    # as transformers: keys whose value is None are dropped, reasoning is offered under all its names
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    plain = []
    for message in _plain(list(messages)):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"each message must be a dict, got {message!r}")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        plain.append(message)
    return plain


def _plain(value: Any) -> Any:
    """Only JSON-like data reaches a template; any other object becomes "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return _plain(value.item())  # numpy scalars
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"
