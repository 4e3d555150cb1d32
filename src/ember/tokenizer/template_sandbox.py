"""The Jinja environment chat templates render in, and the loop of the process that renders them.

A chat template is code from an untrusted model file. It runs in jinja2's
ImmutableSandboxedEnvironment (no reaching into Python internals), with the helpers
transformers' `apply_chat_template` offers, and only ever in a separate worker process
(template_worker.py starts it: an isolated interpreter that loads this file): there its output is capped,
its memory is capped by RLIMIT_AS, and the parent kills it when its time is up, so no template
can hang, exhaust memory or crash the process that serves a model. This module imports nothing
from ember, so the worker starts with only jinja2 loaded.

Protocol (binary, on the worker's stdin and stdout): once started, the worker replies "ready"; a
request is a u64 length and a pickled
(source, context, output_limit) tuple, context None meaning "only compile"; a reply is a status
byte, a u64 length and UTF-8 text (the rendering, or an error message for people).
"""

from __future__ import annotations

import json
import pickle
import struct
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_REPEAT = 1 << 20  # longest string or list a template may build with * (1 Mi items)
OK, FAILED, OUTPUT_LIMIT, MEMORY_LIMIT = b"o", b"f", b"l", b"m"
_LENGTH = struct.Struct("<Q")
_CACHE_SIZE = 8  # compiled templates a worker keeps


class Failure(Exception):
    """A template that does not parse or fails while rendering; `status` says which limit, if any."""

    def __init__(self, message: str, status: bytes = FAILED):
        super().__init__(message)
        self.status = status


class _SandboxedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, plus a cap on `"x" * n` and on powers (the worker's memory cap covers the rest)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "*" and _repeat_length(left, right) > MAX_REPEAT:
            raise SecurityError(f"the template builds a sequence longer than {MAX_REPEAT} items")
        if operator == "**" and isinstance(right, int) and abs(right) > 1024:
            raise SecurityError("the template raises a number to a power above 1024")
        return super().call_binop(context, operator, left, right)


def _repeat_length(left, right) -> int:
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
            return len(sequence) * count
    return 0


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text in transformers): renders its body."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _TemplateDict:
    """`dict(...)` for templates, without the type's other attributes."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja2's `namespace(...)`, refusing underscore names (no way to store into internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a template namespace cannot hold the name {name!r}")


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # unlike jinja2's own tojson: no HTML escaping, and json.dumps' options
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


def environment() -> ImmutableSandboxedEnvironment:
    env = _SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def compile_template(env: ImmutableSandboxedEnvironment, source: str) -> jinja2.Template:
    try:
        return env.from_string(source)
    except TemplateSyntaxError as error:
        raise Failure(f"the chat template does not parse: {error.message} (line {error.lineno})") from None
    except (RecursionError, MemoryError, SyntaxError, ValueError, OverflowError) as error:
        raise Failure(f"the chat template cannot be compiled: {type(error).__name__}: {error}") from None


def render(template: jinja2.Template, context: dict, output_limit: int) -> str:
    """The template's output; a Failure when it fails, is unsafe, or outgrows output_limit characters."""
    pieces, size = [], 0
    try:
        for piece in template.generate(**context):
            size += len(piece)
            if size > output_limit:
                raise Failure(f"the chat template's output exceeds {output_limit} characters "
                              "(ember's limit for a rendered chat)", OUTPUT_LIMIT)
            pieces.append(piece)
        return "".join(pieces)
    except Failure:
        raise
    except MemoryError:
        raise Failure("", MEMORY_LIMIT) from None  # the worker reports its limit
    except SecurityError as error:
        raise Failure(f"the chat template was stopped doing something unsafe: {error}") from None
    except TemplateError as error:
        raise Failure(f"the chat template failed: {error}") from None
    except Exception as error:  # noqa: BLE001 - a template bug raises anything, e.g. TypeError
        raise Failure(f"the chat template failed: {type(error).__name__}: {error}") from None


# -- the worker process ----------------------------------------------------------------------

def _read_exactly(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        part = stream.read(n - len(data))
        if not part:
            return None
        data += part
    return data


def _reply(stream, status: bytes, text: str) -> None:
    payload = text.encode("utf-8", errors="surrogatepass")
    stream.write(status + _LENGTH.pack(len(payload)) + payload)
    stream.flush()


def _cap_memory(limit: int) -> None:
    """Let this process use `limit` bytes of address space beyond what it holds now."""
    import resource

    with open("/proc/self/statm") as statm:
        in_use = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (in_use + limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def serve(stdin, stdout, memory_limit: int) -> None:
    """Answer requests until stdin closes. After a memory failure the process exits (its state is
    not to be trusted); the parent starts a fresh one."""
    env = environment()
    cache: dict[str, jinja2.Template] = {}
    _cap_memory(memory_limit)
    _reply(stdout, OK, "ready")  # the parent's clock starts with the first request, not with the start-up
    while True:
        header = _read_exactly(stdin, _LENGTH.size)
        if header is None:
            return
        body = _read_exactly(stdin, _LENGTH.unpack(header)[0])
        if body is None:
            return
        source, context, output_limit = pickle.loads(body)
        try:
            template = cache.get(source)
            if template is None:
                template = compile_template(env, source)
                if len(cache) >= _CACHE_SIZE:
                    cache.pop(next(iter(cache)))
                cache[source] = template
            _reply(stdout, OK, "" if context is None else render(template, context, output_limit))
        except Failure as failure:
            _reply(stdout, failure.status, str(failure))
            if failure.status == MEMORY_LIMIT:
                return
        except MemoryError:
            _reply(stdout, MEMORY_LIMIT, "")
            return

