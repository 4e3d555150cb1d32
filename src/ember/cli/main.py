"""The `ember` command line: one parser per subcommand, each handled in the module that owns it.

Every handler is `handler(args) -> int | None`. An `EmberError` raised anywhere is printed as one
line (`ember: error: ...`) and becomes the exit status; no traceback for expected failures.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from ember.engine.sampling_params import DEFAULTS as D
from ember.errors import EmberError, EmberWarning

DEFAULT_MODEL = "smollm2-135m"


def _positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _int_from(low: int, meaning: str = ""):
    """A parser of integers >= low (`meaning` explains the lowest value)."""
    def parse(text: str) -> int:
        value = _int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}{meaning}, got {text}")
        return value

    return parse


_non_negative_int = _int_from(0)
_ctx_size = _int_from(0, " (0: the model's own context)")
_repeat_last_n = _int_from(-1, " (-1: the whole context)")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _unit_float(text: str) -> float:
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _port(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text}")
    return value


def _thread_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"thread counts must be positive: {text!r}")
    return values


def _depth_list(text: str) -> list[int]:
    try:
        depths = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected depths like 0,4096, got {text!r}") from None
    if any(d < 0 for d in depths):
        raise argparse.ArgumentTypeError(f"depths must be >= 0, got {text!r}")
    return depths


def _activations(text: str) -> str:
    from ember.engine.runtime import ACTIVATIONS

    if text not in ACTIVATIONS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(ACTIVATIONS)}, got {text!r}")
    return text


def _gpu_layers(text: str) -> str:
    if text in ("auto", "all"):
        return text
    value = _int(text)
    if value < -2:
        raise argparse.ArgumentTypeError(f"must be a number of layers, auto or all, got {text}")
    return text


# -fa takes an optional value, as in llama.cpp; argv is rewritten to --flash-attn=VALUE before
# parsing, so that `-fa "a prompt"` never eats the prompt.
FLASH_ATTN_FLAGS = ("-fa", "--flash-attn")
FLASH_ATTN_VALUES = ("on", "off", "auto", "enabled", "disabled", "true", "false", "1", "0", "-1")


def _normalized_argv(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return out + argv[i:]
        if arg in FLASH_ATTN_FLAGS:
            value = argv[i + 1] if i + 1 < len(argv) else None
            if value is not None and all(part in FLASH_ATTN_VALUES for part in value.split(",")):
                out.append(f"--flash-attn={value}")
                i += 2
                continue
            out.append("--flash-attn=on")
        elif arg.startswith("-fa="):
            out.append("--flash-attn=" + arg[len("-fa="):])
        else:
            out.append(arg)
        i += 1
    return out


def _add_version(p: argparse.ArgumentParser) -> None:
    from ember.version import __version__

    p.add_argument("--version", action="version", version=f"ember {__version__}", help="print the version and exit")


def _add_model(p: argparse.ArgumentParser, required: bool = False) -> None:
    """-m (a registry name, a path, or a Hugging Face repository) and llama.cpp's -hf / -hff."""
    p.add_argument("-m", "--model", default=None,
                   help="registry name (see `ember list`), path to a .gguf file, or Hugging Face repository "
                        "ORG/REPO[:QUANT]" + ("" if required else f" (default: {DEFAULT_MODEL})"))
    p.add_argument("-hf", "-hfr", "--hf-repo", default=None, metavar="ORG/REPO[:QUANT]",
                   help="a model from Hugging Face, as llama.cpp spells it (QUANT default: Q4_K_M)")
    p.add_argument("-hff", "--hf-file", default=None, metavar="FILE", help="the .gguf file of the -hf repository")
    p.set_defaults(_model_required=required)


def _add_runtime(p: argparse.ArgumentParser, threads: bool = True) -> None:
    if threads:
        p.add_argument("-t", "--threads", type=_positive_int, default=None,
                       help="compute threads (default: physical cores)")
        p.add_argument("-c", "--ctx-size", type=_ctx_size, default=None,
                       help="context length in tokens (default: min(model's, 4096); 0: the model's)")
    _add_loading(p)
    _add_activations(p)


def _add_loading(p: argparse.ArgumentParser, batch: bool = True) -> None:
    """llama.cpp's loading and device flags: the ones that mean something on a CPU act, the
    others are accepted with a note (see NOTES)."""
    if batch:
        p.add_argument("-b", "--batch-size", type=_positive_int, default=None,
                       help="prompt tokens per graph run (default: 512)")
        p.add_argument("-ub", "--ubatch-size", type=_positive_int, default=None,
                       help="the same batch (ember has one batch size; with -b, the smaller is used)")
    p.add_argument("--no-mmap", dest="mmap", action="store_false",
                   help="read the model into memory instead of mapping the file")
    p.add_argument("--mmap", dest="mmap", action="store_true", default=True, help=argparse.SUPPRESS)
    p.add_argument("--mlock", action="store_true", help="keep the model's bytes locked in RAM (mlock)")
    p.add_argument("--no-huge-pages", dest="huge_pages", action="store_false",
                   help="keep the weights in 4 KiB pages (default: ask the kernel for 2 MiB pages, mapped or read)")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=_gpu_layers, default=None,
                   metavar="N", help="accepted for llama.cpp's sake; ember runs on the CPU")
    p.add_argument("-fa", "--flash-attn", dest="flash_attn", default=None, metavar="on|off|auto",
                   help="accepted for llama.cpp's sake; ember has one attention kernel")
    _add_cache_types(p)


def _add_cache_types(p: argparse.ArgumentParser) -> None:
    p.add_argument("-ctk", "--cache-type-k", default=None, metavar="TYPE",
                   help="KV cache type for K: f16 (default), q8_0 (about half the memory) or f32")
    p.add_argument("-ctv", "--cache-type-v", default=None, metavar="TYPE",
                   help="KV cache type for V: f16 (default), q8_0 or f32")


def _add_chat_template(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                   help="chat template instead of the model's: a built-in format (chatml, llama3, gemma, "
                        "mistral-v7, phi3, ...; an unknown name lists them all), a Jinja file, or Jinja text")
    p.add_argument("--chat-template-file", dest="chat_template", default=None, metavar="FILE",
                   help="a Jinja chat template file")
    p.add_argument("--jinja", action="store_true", help="accepted for llama.cpp's sake: templates always run in Jinja")


def _add_activations(p: argparse.ArgumentParser) -> None:
    p.add_argument("--activations", type=_activations, default="int8", metavar="{int8,f32}",
                   help="int8: 8-bit activations and integer dot products, as llama.cpp; "
                        "f32: dequantized weights and unrounded activations (slower, closest to a float reference)")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=_non_negative_int, default=256, help="tokens to generate")
    p.add_argument("--temp", type=_non_negative_float, default=D.temperature, help="temperature (0 = greedy)")
    p.add_argument("--top-k", type=_non_negative_int, default=D.top_k, help="top-k (0 = off)")
    p.add_argument("--top-p", type=_unit_float, default=D.top_p, help="top-p (1 = off)")
    p.add_argument("--min-p", type=_unit_float, default=D.min_p, help="min-p (0 = off)")
    p.add_argument("--typical", "--typical-p", dest="typical_p", type=_unit_float, default=D.typical_p,
                   help="locally typical sampling (1 = off)")
    p.add_argument("--repeat-penalty", type=_non_negative_float, default=D.repeat_penalty,
                   help="repetition penalty over the last --repeat-last-n tokens (1 = off)")
    p.add_argument("--repeat-last-n", type=_repeat_last_n, default=D.repeat_last_n,
                   help="tokens the penalties look back over (0 = off, -1 = all)")
    p.add_argument("--presence-penalty", type=_float, default=D.presence_penalty, help="presence penalty (0 = off)")
    p.add_argument("--frequency-penalty", type=_float, default=D.frequency_penalty,
                   help="frequency penalty (0 = off)")
    p.add_argument("--mirostat", type=_int, choices=(0, 1, 2), default=D.mirostat_mode,
                   help="mirostat sampling: 0 = off, 1 = mirostat, 2 = mirostat 2.0 (replaces top-k/p, min-p, typical)")
    p.add_argument("--mirostat-lr", type=_non_negative_float, default=D.mirostat_eta, help="mirostat learning rate, eta")
    p.add_argument("--mirostat-ent", type=_non_negative_float, default=D.mirostat_tau,
                   help="mirostat target entropy, tau")
    p.add_argument("-s", "--seed", type=_int, default=None, help="random seed (default: random)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-generation tokens")
    p.add_argument("-r", "--reverse-prompt", dest="stop", action="append", default=None, metavar="TEXT",
                   help="stop when the text appears (repeatable)")
    p.add_argument("--stop", dest="stop", action="append", metavar="TEXT", help="the same as -r")


class _HelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default, where it has one worth showing."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default is None
                or isinstance(action.default, bool) or action.default is argparse.SUPPRESS
                or isinstance(action, argparse._VersionAction)):
            return text
        return text + " (default: %(default)s)"


def _add_lookup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lookup", action="store_true",
                   help="prompt-lookup decoding: check tokens guessed from the prompt and output in one batched "
                        "step (same output; faster where the output repeats the prompt)")
    p.add_argument("--lookup-ngram-min", type=_positive_int, default=2, metavar="N",
                   help="shortest n-gram of the last tokens to look up (default: %(default)s)")
    p.add_argument("--lookup-ngram-max", type=_positive_int, default=4, metavar="N",
                   help="longest n-gram of the last tokens to look up (default: %(default)s)")
    p.add_argument("--draft-max", "--draft", dest="draft_max", type=_positive_int, default=10, metavar="N",
                   help="most draft tokens per step with --lookup (default: %(default)s)")


def _add_constraints(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--grammar", default=None, metavar="GBNF",
                       help="constrain the output to a GBNF grammar (llama.cpp's; Lark syntax works too)")
    group.add_argument("--grammar-file", default=None, metavar="FILE", help="the grammar from a file")
    group.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                       help="constrain the output to JSON matching a JSON schema (e.g. '{}' for any JSON value)")
    group.add_argument("--json-schema-file", default=None, metavar="FILE", help="the JSON schema from a file")


class _Parser(argparse.ArgumentParser):
    """Bad flags are one line (and exit 2), not a usage block; subparsers inherit this class."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _EmberParser(_Parser):
    """The top-level parser: rewrites -fa for argparse and settles which model the flags name."""

    def parse_known_args(self, args=None, namespace=None):
        args = _normalized_argv(list(sys.argv[1:] if args is None else args))
        namespace, extras = super().parse_known_args(args, namespace)
        if hasattr(namespace, "_model_required"):
            namespace.model = self._model_named(namespace)
        return namespace, extras

    def _model_named(self, args) -> str | None:
        given = [text for text in (args.model, getattr(args, "model_arg", None)) if text is not None]
        if args.hf_repo is not None:
            given.append(args.hf_repo + (f":{args.hf_file}" if args.hf_file else ""))
        elif args.hf_file is not None:
            self.error("-hff/--hf-file needs -hf/--hf-repo")
        if len(given) > 1:
            self.error("give the model once: with -m, -hf or as MODEL")
        if given:
            return given[0]
        if args._model_required:
            return None
        return DEFAULT_MODEL


def build_parser() -> argparse.ArgumentParser:
    parser = _EmberParser(prog="ember", description="Local LLM inference on the CPU.")
    _add_version(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str, handler: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".")
        p.set_defaults(handler=handler)
        _add_version(p)
        return p

    p = command("run", "generate text from a prompt", "ember.cli.run:cli_run")
    p.add_argument("prompt_arg", nargs="?", metavar="PROMPT", help="the prompt")
    _add_model(p)
    p.add_argument("-p", "--prompt", default=None, help="the prompt (instead of PROMPT)")
    p.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    _add_runtime(p)
    _add_sampling(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (implies --chat)")
    _add_lookup(p)
    _add_constraints(p)
    _add_chat_template(p)

    p = command("chat", "interactive conversation", "ember.cli.chat:cli_chat")
    _add_model(p)
    _add_runtime(p)
    _add_sampling(p)
    p.add_argument("--system", default=None, help="system message")
    _add_chat_template(p)
    p.add_argument("--reasoning-format", choices=["auto", "deepseek", "none"], default="auto",
                   help="a reasoning model's <think> part: dimmed apart from the answer (auto, deepseek) or as written")

    p = command("serve", "OpenAI-compatible HTTP server", "ember.cli.serve:cli_serve")
    _add_model(p)
    _add_runtime(p)
    _add_chat_template(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=8080, help="port (0: any free port, printed)")
    p.add_argument("--parallel", "-np", type=_positive_int, default=4, help="sequence slots")
    p.add_argument("--queue-size", type=_non_negative_int, default=64, help="waiting requests before 503")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    p.add_argument("--cors-origins", default="localhost", metavar="ORIGINS",
                   help="web pages allowed to call the server from a browser: localhost (pages on this machine), "
                        "* (any), a comma-separated list, or '' (none)")
    p.add_argument("--slots", action=argparse.BooleanOptionalAction, default=True,
                   help="the /slots monitoring endpoint")
    p.add_argument("--stream-interval", type=_non_negative_float, default=None, metavar="MS",
                   help="a stream sends its new tokens at most every MS milliseconds, those of the steps between "
                        "in one piece (default: 0, each step's at once; on Ray replicas 50)")
    ray = p.add_argument_group("scale-out on Ray Serve (pip install 'ember[ray]'; RAY_ADDRESS names a cluster)")
    ray.add_argument("--ray", action="store_true",
                     help="serve through Ray Serve's proxy on --host/--port, each replica an ember engine of "
                          "-t threads (default 1) and --parallel slots, on the cluster at RAY_ADDRESS or a local one")
    ray.add_argument("--replicas", type=_positive_int, default=None, help="replicas (default 1)")
    ray.add_argument("--min-replicas", type=_non_negative_int, default=None, help="autoscale from this many replicas")
    ray.add_argument("--max-replicas", type=_positive_int, default=None, help="autoscale up to this many replicas")
    ray.add_argument("--target-ongoing-requests", type=_positive_float, default=None, metavar="N",
                     help="autoscaling aims at N requests per replica (default: --parallel)")

    p = command("bench", "measure prompt processing and generation speed", "ember.cli.bench:cli_bench")
    _add_model(p)
    p.add_argument("-p", "--n-prompt", type=_non_negative_int, default=512, help="prompt tokens (pp test)")
    p.add_argument("-n", "--n-gen", type=_non_negative_int, default=128, help="generated tokens (tg test)")
    p.add_argument("-t", "--threads", type=_thread_list, default=None, help="e.g. 1,2 (default: physical cores)")
    p.add_argument("-d", "--n-depth", type=_depth_list, default=[0], metavar="N[,N...]",
                   help="tokens already in the context before each test, e.g. 0,4096 (llama-bench's -d)")
    p.add_argument("-r", "--repetitions", type=_positive_int, default=5, help="runs of each test")
    p.add_argument("-o", "--output", choices=["md", "json", "csv"], default="md", help="output format")
    _add_runtime(p, threads=False)

    p = command("perplexity", "perplexity of a model on a text file", "ember.cli.perplexity:cli_perplexity")
    _add_model(p)
    p.add_argument("-f", "--file", required=True, help="text file")
    p.add_argument("-c", "--ctx-size", type=_ctx_size, default=512, help="tokens per chunk (0: the model's context)")
    p.add_argument("-t", "--threads", type=_positive_int, default=None, help="compute threads (default: physical cores)")
    p.add_argument("--chunks", type=_positive_int, default=None, help="score at most this many chunks")
    _add_runtime(p, threads=False)
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = command("embed", "embeddings of texts, a JSON line each", "ember.cli.embed:cli_embed")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed (default: the lines of -f or stdin)")
    _add_model(p)
    p.add_argument("-f", "--file", default=None, help="a file of texts, one a line ('-': stdin)")
    p.add_argument("--pooling", choices=["none", "mean", "cls", "last"], default=None,
                   help="how token states become one vector (default: the model's, else mean)")
    p.add_argument("--no-normalize", action="store_true", help="do not scale embeddings to unit length")
    p.add_argument("--truncate", action="store_true", help="cut texts longer than the model embeds at once")
    _add_runtime(p)

    p = command("rerank", "documents by relevance to a query (a reranker), a JSON line each, best first",
                "ember.cli.rerank:cli_rerank")
    p.add_argument("query", help="the query")
    p.add_argument("texts", nargs="*", metavar="DOCUMENT", help="documents (default: the lines of -f or stdin)")
    _add_model(p)
    p.add_argument("-f", "--file", default=None, help="a file of documents, one a line ('-': stdin)")
    p.add_argument("--top-n", type=_non_negative_int, default=None, help="only the best N documents")
    _add_runtime(p)

    p = command("tokenize", "show the token ids of a text", "ember.cli.tokenize:cli_tokenize")
    _add_model(p)
    p.add_argument("text")
    p.add_argument("--ids", action="store_true", help="print only the ids, as a JSON list")
    p.add_argument("--parse-special", action="store_true", help="parse special-token text as special")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS")

    p = command("info", "describe a model file, or the system", "ember.cli.info:cli_info")
    p.add_argument("model_arg", nargs="?", metavar="MODEL", help="registry name, .gguf path or ORG/REPO[:QUANT]")
    _add_model(p, required=True)
    p.add_argument("--system", action="store_true", help="ISA, threads and versions")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    p.add_argument("--memory", action="store_true", help="planned memory use")
    _add_cache_types(p)
    p.add_argument("-c", "--ctx-size", type=_ctx_size, default=None,
                   help="context length for --memory (default: min(model's, 4096); 0: the model's)")
    _add_chat_template(p)
    p.add_argument("--json", action="store_true", help="print the facts as JSON")

    p = command("quantize", "quantize a GGUF file", "ember.cli.quantize:cli_quantize")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("type", help="Q4_0 Q4_1 Q8_0 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S "
                                "Q5_K_M Q6_K IQ4_NL IQ4_XS (llama-quantize's presets)")
    p.add_argument("-t", "--threads", type=_positive_int, default=None, help="threads (default: physical cores)")
    p.add_argument("--allow-requantize", action="store_true", help="requantize already quantized tensors")

    p = command("convert", "Hugging Face safetensors model -> GGUF", "ember.cli.convert:cli_convert")
    p.add_argument("hf_dir")
    p.add_argument("output")
    p.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"], default="f16", help="tensor type")

    p = command("pull", "download a registry model or a Hugging Face model into the cache", "ember.cli.pull:cli_pull")
    p.add_argument("name", metavar="NAME", help="registry name or ORG/REPO[:QUANT]")

    command("list", "registry and cached models, with their sizes", "ember.cli.pull:cli_list")

    p = command("rm", "remove a cached model", "ember.cli.pull:cli_rm")
    p.add_argument("name", metavar="NAME", help="a name `ember list` shows")
    return parser


NOTES = {
    "n_gpu_layers": lambda v: None if v in ("0", None) else f"-ngl {v} is ignored: ember runs on the CPU",
    "flash_attn": lambda v: None if v is None else
    f"--flash-attn {v} is ignored: ember has one attention kernel (fused, over the KV cache)",
}


def print_notes(args, stderr=None) -> None:
    """One line per llama.cpp flag that was given but means nothing here."""
    for name, note in NOTES.items():
        text = note(getattr(args, name, None))
        if text:
            print(f"ember: note: {text}", file=stderr or sys.stderr)


def batch_size(args, default: int = 512) -> int:
    """-b and -ub: ember's one batch size (the smaller of those given)."""
    given = [n for n in (getattr(args, "batch_size", None), getattr(args, "ubatch_size", None)) if n]
    return min(given) if given else default


def one_line(text: object) -> str:
    """A message as one line: control characters (newlines, ones from a model file's names) escaped."""
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in str(text))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    print_notes(args)
    module_name, func_name = args.handler.split(":")
    if os.environ.get("EMBER_ISA"):
        from ember import _core
        try:
            _core.isa()  # EMBER_ISA names the kernel table; a bad one is a one-line error, not a traceback
        except ValueError as exc:
            print(f"ember: error: {one_line(exc)}", file=sys.stderr)
            return 2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", EmberWarning)
            warnings.showwarning = _one_line_warning
            handler = getattr(importlib.import_module(module_name), func_name)
            return int(handler(args) or 0)
    except EmberError as exc:
        print(f"ember: error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, EmberWarning):
        print(f"ember: warning: {one_line(message)}", file=file or sys.stderr, flush=True)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=file or sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
