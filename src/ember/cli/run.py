"""`ember run`: generate from one prompt. Only the generated text goes to stdout; the timings
go to stderr, as llama.cpp prints them.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from ember.cli.main import batch_size
from ember.engine.sampling import SamplingParams
from ember.errors import EmberError


def sampling_from_args(args) -> SamplingParams:
    return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          typical_p=args.typical_p, repeat_penalty=args.repeat_penalty,
                          repeat_last_n=args.repeat_last_n, presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty, mirostat_mode=args.mirostat,
                          mirostat_tau=args.mirostat_ent, mirostat_eta=args.mirostat_lr, seed=args.seed,
                          grammar=grammar_from_args(args))


def grammar_from_args(args):
    """The constraint of --grammar, --grammar-file, --json-schema or --json-schema-file (None without)."""
    grammar = getattr(args, "grammar", None)
    schema = getattr(args, "json_schema", None)
    if getattr(args, "grammar_file", None) is not None:
        grammar = _read_text(args.grammar_file, "grammar")
    if getattr(args, "json_schema_file", None) is not None:
        schema = _read_text(args.json_schema_file, "JSON schema")
    if grammar is None and schema is None:
        return None
    from ember.engine.constraints import grammar_from_request

    return grammar_from_request(grammar=grammar, json_schema=schema)


def lookup_from_args(args):
    """The Lookup of --lookup and its sizes (None without --lookup)."""
    if not getattr(args, "lookup", False):
        return None
    from ember.engine.lookup import Lookup

    return Lookup(ngram_min=args.lookup_ngram_min, ngram_max=args.lookup_ngram_max, n_draft=args.draft_max)


def for_model(params: SamplingParams, args, tokenizer) -> SamplingParams:
    """The options that need the model's vocabulary: --ignore-eos bans its end-of-generation tokens."""
    if not args.ignore_eos:
        return params
    return replace(params, logit_bias={**(params.logit_bias or {}), **{t: float("-inf") for t in tokenizer.eog_ids}})


def load_llm(args):
    """The LLM the flags name, and how long loading took (seconds, a pull excluded)."""
    from ember.api.llm import LLM
    from ember.hub import resolve_model

    path = resolve_model(args.model)
    start = time.perf_counter()
    llm = LLM(path, n_ctx=args.ctx_size, n_threads=args.threads, n_batch=batch_size(args), activations=args.activations,
              use_mmap=args.mmap, use_mlock=args.mlock, chat_template=args.chat_template, type_k=args.cache_type_k,
              type_v=args.cache_type_v, huge_pages=args.huge_pages)
    return llm, time.perf_counter() - start


def prompt_text(args, stdin=None) -> str:
    """The prompt from PROMPT, -p or -f (one of them), or else from a pipe on stdin."""
    stdin = stdin or sys.stdin
    given = [text for text in (args.prompt_arg, args.prompt) if text is not None]
    if args.file is not None:
        given.append(_read_prompt_file(args.file))
    if len(given) > 1:
        raise EmberError("give the prompt once: as PROMPT, with -p or with -f")
    if given:
        return given[0]
    if not stdin.isatty():
        return _strip_one_newline(stdin.read())
    raise EmberError("no prompt: give PROMPT, -p TEXT or -f FILE, or pipe it on stdin")


def _read_prompt_file(path: str) -> str:
    return _strip_one_newline(_read_text(path, "prompt"))


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise EmberError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise EmberError(f"the {what} file {path} is not UTF-8 text") from None


def _strip_one_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def cli_run(args, stdout=None, stderr=None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    prompt = prompt_text(args)
    params = sampling_from_args(args)
    lookup = lookup_from_args(args)
    llm, t_load = load_llm(args)
    params = for_model(params, args, llm.tokenizer)
    if args.chat or args.system is not None:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        tokens = llm.chat_tokens(messages + [{"role": "user", "content": prompt}])
    else:
        tokens = llm.prompt_tokens(prompt)
    generation = llm.generation(tokens, params, max_tokens=args.n_predict, stop=args.stop, lookup=lookup or False)
    if not params.greedy:
        print(f"ember: seed = {generation.seed}", file=stderr, flush=True)
    last = ""
    for chunk in generation:
        if chunk.text:
            stdout.write(chunk.text)
            stdout.flush()
            last = chunk.text
    if stdout.isatty() and not last.endswith("\n"):
        stdout.write("\n")
    stdout.flush()
    print_timings(t_load, generation, stderr)
    return 0


def print_timings(t_load: float, generation, stderr) -> None:
    def rate(n: int, seconds: float) -> str:
        return f"{n / seconds:8.2f} tokens per second" if seconds > 0 and n else "       - tokens per second"

    print(f"ember: load time   = {t_load * 1e3:10.2f} ms", file=stderr)
    print(f"ember: prompt eval = {generation.t_prompt * 1e3:10.2f} ms / {generation.n_prompt_evaluated:5d} tokens"
          f" ({rate(generation.n_prompt_evaluated, generation.t_prompt)})", file=stderr)
    print(f"ember: generation  = {generation.t_generate * 1e3:10.2f} ms / {generation.n_generated:5d} tokens"
          f" ({rate(generation.n_generated, generation.t_generate)})", file=stderr)
    if getattr(generation, "lookup", None) is not None:
        accepted = f"{100 * generation.n_accepted / generation.n_drafted:.1f}%" if generation.n_drafted else "-"
        print(f"ember: lookup      = {generation.n_drafted:5d} drafted, {generation.n_accepted:5d} accepted "
              f"({accepted})", file=stderr)
    stderr.flush()
