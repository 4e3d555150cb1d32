"""The `ember` command line: one parser per subcommand, each handled in the module that owns it.

Every handler is `handler(args) -> int | None`. An `EmberError` raised anywhere is printed as one
line (`ember: error: ...`) and becomes the exit status; no traceback for expected failures.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ember.engine.sampling_params import DEFAULTS as D
from ember.errors import EmberError

DEFAULT_MODEL = "smollm2-135m"


def _positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


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


def _unit_float(text: str) -> float:
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _thread_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"thread counts must be positive: {text!r}")
    return values


def _activations(text: str) -> str:
    from ember.engine.runtime import ACTIVATIONS

    if text not in ACTIVATIONS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(ACTIVATIONS)}, got {text!r}")
    return text


def _add_model(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("-m", "--model", default=None if required else DEFAULT_MODEL, required=required,
                   help="registry name (see `ember list`) or path to a .gguf file"
                   + ("" if required else f" (default: {DEFAULT_MODEL})"))


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--threads", type=_positive_int, default=None,
                   help="compute threads (default: physical cores)")
    p.add_argument("-c", "--ctx-size", type=_positive_int, default=None,
                   help="context length in tokens (default: min(model's, 4096))")
    _add_activations(p)


def _add_activations(p: argparse.ArgumentParser) -> None:
    p.add_argument("--activations", type=_activations, default="int8", metavar="{int8,f32}",
                   help="int8 (default): 8-bit activations and integer dot products, as llama.cpp; "
                        "f32: dequantized weights and unrounded activations (slower, closest to a float reference)")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=_non_negative_int, default=256, help="tokens to generate")
    p.add_argument("--temp", type=_non_negative_float, default=D.temperature, help="temperature (0 = greedy)")
    p.add_argument("--top-k", type=_non_negative_int, default=D.top_k, help="top-k (0 = off)")
    p.add_argument("--top-p", type=_unit_float, default=D.top_p, help="top-p (1 = off)")
    p.add_argument("--min-p", type=_unit_float, default=D.min_p, help="min-p (0 = off)")
    p.add_argument("--repeat-penalty", type=_non_negative_float, default=D.repeat_penalty,
                   help=f"repetition penalty over the last {D.repeat_last_n} tokens (1 = off)")
    p.add_argument("-s", "--seed", type=_int, default=None, help="random seed (default: random)")


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

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ember", description="Local LLM inference on the CPU.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="generate text from a prompt")
    p.add_argument("prompt_arg", nargs="?", metavar="PROMPT", help="the prompt")
    _add_model(p)
    p.add_argument("-p", "--prompt", default=None, help="the prompt (instead of PROMPT)")
    p.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    _add_runtime(p)
    _add_sampling(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (implies --chat)")
    _add_constraints(p)
    p.set_defaults(handler="ember.cli.run:cli_run")

    p = sub.add_parser("chat", help="interactive conversation")
    _add_model(p)
    _add_runtime(p)
    _add_sampling(p)
    p.add_argument("--system", default=None, help="system message")
    p.set_defaults(handler="ember.cli.chat:cli_chat")

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    _add_model(p)
    _add_runtime(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_non_negative_int, default=8080, help="port (0: any free port, printed)")
    p.add_argument("--parallel", type=_positive_int, default=4, help="sequence slots")
    p.add_argument("--queue-size", type=_non_negative_int, default=64, help="waiting requests before 503")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    p.set_defaults(handler="ember.cli.serve:cli_serve")

    p = sub.add_parser("bench", help="measure prompt processing and generation speed")
    _add_model(p)
    p.add_argument("-p", "--n-prompt", type=_non_negative_int, default=512)
    p.add_argument("-n", "--n-gen", type=_non_negative_int, default=128)
    p.add_argument("-t", "--threads", type=_thread_list, default=None, help="e.g. 1,2")
    p.add_argument("-r", "--repetitions", type=_positive_int, default=5)
    p.add_argument("-o", "--output", choices=["md", "json", "csv"], default="md")
    _add_activations(p)
    p.set_defaults(handler="ember.cli.bench:cli_bench")

    p = sub.add_parser("perplexity", help="perplexity of a model on a text file")
    _add_model(p)
    p.add_argument("-f", "--file", required=True, help="text file")
    p.add_argument("-c", "--ctx-size", type=_positive_int, default=512)
    p.add_argument("-b", "--batch-size", type=_positive_int, default=None)
    p.add_argument("-t", "--threads", type=_positive_int, default=None)
    p.add_argument("--chunks", type=_positive_int, default=None, help="score at most this many chunks")
    _add_activations(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler="ember.cli.perplexity:cli_perplexity")

    p = sub.add_parser("tokenize", help="show the token ids of a text")
    _add_model(p)
    p.add_argument("text")
    p.add_argument("--ids", action="store_true", help="print only the ids, as a JSON list")
    p.add_argument("--parse-special", action="store_true", help="parse special-token text as special")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS")
    p.set_defaults(handler="ember.cli.tokenize:cli_tokenize")

    p = sub.add_parser("info", help="describe a model file, or the system")
    p.add_argument("model", nargs="?", help="registry name or .gguf path")
    p.add_argument("--system", action="store_true", help="ISA, threads and versions")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    p.add_argument("--memory", action="store_true", help="planned memory use")
    p.add_argument("-c", "--ctx-size", type=_positive_int, default=None,
                   help="context length for --memory (default: min(model's, 4096))")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler="ember.cli.info:cli_info")

    p = sub.add_parser("quantize", help="quantize a GGUF file")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("type", help="Q4_0 Q4_1 Q8_0 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S "
                                "Q5_K_M Q6_K (llama-quantize's presets)")
    p.add_argument("-t", "--threads", type=_positive_int, default=None)
    p.add_argument("--allow-requantize", action="store_true")
    p.set_defaults(handler="ember.cli.quantize:cli_quantize")

    p = sub.add_parser("convert", help="Hugging Face safetensors model -> GGUF")
    p.add_argument("hf_dir")
    p.add_argument("output")
    p.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"], default="f16")
    p.set_defaults(handler="ember.cli.convert:cli_convert")

    p = sub.add_parser("pull", help="download a registry model into the cache")
    p.add_argument("name")
    p.set_defaults(handler="ember.cli.pull:cli_pull")

    p = sub.add_parser("list", help="registry models and whether they are cached")
    p.set_defaults(handler="ember.cli.pull:cli_list")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    module_name, func_name = args.handler.split(":")
    if os.environ.get("EMBER_ISA"):
        from ember import _core
        try:
            _core.isa()  # EMBER_ISA names the kernel table; a bad one is a one-line error, not a traceback
        except ValueError as exc:
            print(f"ember: error: {exc}", file=sys.stderr)
            return 2
    try:
        handler = getattr(importlib.import_module(module_name), func_name)
        return int(handler(args) or 0)
    except EmberError as exc:
        print(f"ember: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
