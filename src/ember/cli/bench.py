"""`ember bench`: prompt processing (pp) and text generation (tg) speed, llama-bench style.

pp N: one batch of N random tokens. tg N: N tokens decoded one at a time. Both start from a
context holding n_depth random tokens (llama-bench's -d; 0: an empty cache), filled once and
kept: each run forgets what the one before it appended. Each test runs once to warm up, then
`repetitions` times; tokens/s are reported as mean ± sample standard deviation, with
llama-bench's JSON field names and test names ("pp512 @ d4096").
"""

from __future__ import annotations

import csv
import io
import json
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ember.cli.main import batch_size
from ember.hub import resolve_model
from ember.sysinfo import checked_threads, physical_cores


@dataclass
class BenchResult:
    model: str
    type: str
    model_size: int
    model_n_params: int
    n_threads: int
    n_prompt: int
    n_gen: int
    test: str
    avg_ts: float
    stddev_ts: float
    samples_ts: list = field(default_factory=list)
    load_ms: float = 0.0
    peak_rss_bytes: int = 0
    isa: str = ""
    activations: str = "int8"
    n_depth: int = 0
    type_k: str = "f16"
    type_v: str = "f16"


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _random_tokens(n: int, n_vocab: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, size=n).tolist()


def fill_depth(model, n_depth: int) -> None:
    """The context holds n_depth tokens: what it held up to there, random tokens after that."""
    model.truncate(n_depth)
    if model.n_past() < n_depth:
        model.eval(_random_tokens(n_depth - model.n_past(), model.n_vocab, 3 + model.n_past()))


def prompt_speeds(model, n_prompt: int, repetitions: int, n_depth: int = 0) -> list[float]:
    tokens = _random_tokens(n_prompt, model.n_vocab, 1)
    fill_depth(model, n_depth)

    def once():
        model.truncate(n_depth)
        model.eval(tokens)

    once()  # warm-up
    return [n_prompt / _timed(once) for _ in range(repetitions)]


def generation_speeds(model, n_gen: int, repetitions: int, n_depth: int = 0) -> list[float]:
    tokens = _random_tokens(n_gen, model.n_vocab, 2)
    fill_depth(model, n_depth)

    def once():
        model.truncate(n_depth)
        for t in tokens:
            model.eval([t])

    once()
    return [n_gen / _timed(once) for _ in range(repetitions)]


def run_bench(model_ref: str, n_prompt: int = 512, n_gen: int = 128, threads=None, repetitions: int = 5,
              progress=None, activations: str = "int8", n_batch: int | None = None, use_mmap: bool = True,
              use_mlock: bool = False, depths=(0,), type_k: str | None = None,
              type_v: str | None = None, huge_pages: bool = True) -> list[BenchResult]:
    """n_batch: tokens per graph run of the pp test (default: the whole prompt in one run);
    depths: the context depths each test runs at; type_k / type_v: the KV cache's types."""
    from ember.cli.info import describe
    from ember.engine.load import load
    from ember.engine.runtime import kv_cache_type_name

    path = resolve_model(model_ref)  # a pull is not part of the load time
    results = []
    for n_threads in [checked_threads(n) for n in threads] if threads else [physical_cores()]:
        start = time.perf_counter()
        loaded = load(path, n_ctx=max(depths) + max(n_prompt, n_gen, 1), n_threads=n_threads,
                      n_batch=min(n_batch, max(n_prompt, 1)) if n_batch else max(n_prompt, 1),
                      activations=activations, use_mmap=use_mmap, use_mlock=use_mlock, type_k=type_k, type_v=type_v,
                      huge_pages=huge_pages)
        model = loaded.model
        load_ms = (time.perf_counter() - start) * 1000
        summary = describe(loaded.gguf)
        base = dict(model=summary.get("name") or path.stem, type=summary.get("file_type", ""),
                    model_size=path.stat().st_size, model_n_params=int(summary.get("parameters", 0)),
                    n_threads=n_threads, load_ms=load_ms, isa=model.graph.isa, activations=activations,
                    type_k=kv_cache_type_name(model.type_k), type_v=kv_cache_type_name(model.type_v))
        for depth in depths:
            for test, n, measure in (("pp", n_prompt, prompt_speeds), ("tg", n_gen, generation_speeds)):
                if n <= 0:
                    continue
                name = f"{test}{n}" + (f" @ d{depth}" if depth else "")
                if progress:
                    progress(f"{name} with {n_threads} thread(s)...")
                speeds = measure(model, n, repetitions, depth)
                results.append(BenchResult(
                    **base, n_prompt=n if test == "pp" else 0, n_gen=n if test == "tg" else 0, test=name,
                    avg_ts=statistics.fmean(speeds), stddev_ts=statistics.stdev(speeds) if len(speeds) > 1 else 0.0,
                    samples_ts=speeds, peak_rss_bytes=peak_rss_bytes(), n_depth=depth))
        model.close()
    return results


def format_markdown(results: list[BenchResult]) -> str:
    lines = ["| model | size | params | isa | threads | test | t/s |", "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in results:
        isa = r.isa if r.activations == "int8" else f"{r.isa}, {r.activations} activations"
        if (r.type_k, r.type_v) != ("f16", "f16"):
            isa += f", KV {r.type_k}/{r.type_v}"
        lines.append(f"| {r.model} {r.type} | {r.model_size / 2**20:.2f} MiB | {r.model_n_params / 1e6:.2f} M | {isa} "
                     f"| {r.n_threads} | {r.test} | {r.avg_ts:.2f} ± {r.stddev_ts:.2f} |")
    if results:
        lines.append("")
        lines.append(f"load: {results[0].load_ms:.0f} ms, peak RSS: {max(r.peak_rss_bytes for r in results) / 2**20:.0f} MiB")
    return "\n".join(lines)


def format_csv(results: list[BenchResult]) -> str:
    out = io.StringIO()
    rows = [{k: v for k, v in asdict(r).items() if k != "samples_ts"} for r in results]
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def cli_bench(args) -> int:
    def progress(msg):
        print(msg, file=sys.stderr, flush=True)

    given_batch = args.batch_size or args.ubatch_size
    results = run_bench(args.model, args.n_prompt, args.n_gen, args.threads, args.repetitions, progress,
                        args.activations, batch_size(args) if given_batch else None, args.mmap, args.mlock,
                        args.n_depth, args.cache_type_k, args.cache_type_v, args.huge_pages)
    if args.output == "json":
        print(json.dumps([asdict(r) for r in results], indent=2))
    elif args.output == "csv":
        print(format_csv(results), end="")
    else:
        print(format_markdown(results))
    return 0
