"""ember beside llama.cpp on GGUF files: speed (pp/tg), peak RSS and start-up time.

    python benchmarks/compare_llamacpp.py [--models smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m]
        [-p 512] [-n 128] [-t 1,2] [--rounds 3] [--reps 2] [-c 512] [--gen 128]
        [--mem-rounds 2] [--start-rounds 5] [--only speed,memory,start] [--json FILE]
        [--llama-bin DIR]

--models takes registry names, Hugging Face names (ORG/REPO[:QUANT]) and paths of .gguf files
(such as those synthetic_models.py writes), comma-separated; a file is labelled by its name in
the tables. Every model is resolved, and every path checked to be a GGUF file, before anything
is measured.

Needs llama.cpp's llama-bench (speed) and llama-completion (memory, start) in the folder
--llama-bin, else $LLAMA_CPP_BIN, else on PATH; only the binaries of the parts asked for.
The two engines run alternately (ember, llama.cpp, ember, llama.cpp, ...) and every figure is
the median over all runs of an engine, so a change in machine load hits both.

- speed: `ember bench` and `llama-bench` with the same -p/-n/-t, --reps repetitions each per
  round (after each tool's own warm-up run), --rounds rounds; tokens/s and ember/llama.cpp.
  Target: >= 1.0 at 2 threads.
- memory: peak RSS (the child's own, from wait4) of `ember run` and `llama-completion`
  generating --gen tokens greedily at context -c with the most threads of -t.
  Target: ember <= 1.1 x llama.cpp.
- start: wall time from spawning `ember run -n 1` / `llama-completion -n 1` (same prompt,
  context and threads) until it exits with its first token printed. One untimed run of each
  first puts the model file in the page cache. Target: ember <= 1.5 x llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from runner import (
    ember_command,
    ember_version,
    llama_binary,
    llama_version,
    machine_summary,
    run_measured,
)

DEFAULT_MODELS = "smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m"
PROMPT = "The history of the printing press begins"
ENGINES = ("ember", "llama.cpp")


def bench_commands(path: str, args) -> dict[str, list[str]]:
    common = ["-p", str(args.n_prompt), "-n", str(args.n_gen), "-t", args.threads, "-r", str(args.reps),
              "-o", "json"]
    return {"ember": [*ember_command(), "bench", "-m", path, *common],
            "llama.cpp": [llama_binary("llama-bench"), "-m", path, *common]}


def generate_commands(path: str, n_predict: int, args) -> dict[str, list[str]]:
    common = ["-m", path, "-c", str(args.ctx_size), "-t", str(args.run_threads), "-n", str(n_predict),
              "--temp", "0", "-s", "1"]
    llama_extra = ["-no-cnv", "--no-display-prompt"] + (["--no-warmup"] if args.llama_no_warmup else [])
    return {"ember": [*ember_command(), "run", *common, "-p", PROMPT],
            "llama.cpp": [llama_binary("llama-completion"), *common, "-p", PROMPT, *llama_extra]}


def alternate(commands: dict[str, list[str]], rounds: int, on_run) -> dict[str, list[str]]:
    """Run the engines' commands in turn, rounds times; on_run(engine, Run) collects figures.
    Returns the errors of failed runs, per engine."""
    errors = defaultdict(list)
    for _ in range(rounds):
        for engine in ENGINES:
            run = run_measured(commands[engine])
            try:
                if not run.ok:
                    raise RuntimeError(run.error())
                on_run(engine, run)
            except (RuntimeError, ValueError, KeyError) as exc:  # a failed run or output we cannot read
                errors[engine].append(str(exc))
                print(f"  {engine} failed: {exc}", file=sys.stderr, flush=True)
    return dict(errors)


def measure_speed(path: str, args) -> dict:
    samples = defaultdict(list)  # (engine, test, threads) -> tokens/s

    def collect(engine, run):
        for row in json.loads(run.stdout):
            test = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
            samples[(engine, test, row["n_threads"])].extend(row["samples_ts"])

    errors = alternate(bench_commands(path, args), args.rounds, collect)
    return {"samples": {"|".join(map(str, k)): v for k, v in samples.items()}, "errors": errors}


def measure_memory(path: str, args) -> dict:
    rss = defaultdict(list)
    errors = alternate(generate_commands(path, args.gen, args), args.mem_rounds,
                       lambda engine, run: rss[engine].append(run.peak_rss_bytes))
    return {"peak_rss_bytes": dict(rss), "errors": errors}


def measure_start(path: str, args) -> dict:
    commands = generate_commands(path, 1, args)
    alternate(commands, 1, lambda engine, run: None)  # page cache warm-up, untimed
    seconds = defaultdict(list)
    errors = alternate(commands, args.start_rounds, lambda engine, run: seconds[engine].append(run.seconds))
    return {"seconds": dict(seconds), "errors": errors}


def resolve_models(names: str) -> dict[str, str]:
    """Label -> path of each model named in --models (a file's label is its name, or its whole
    path where two files share a name). Exits with one line for a model that cannot be found
    or a file that is not GGUF."""
    from ember.errors import EmberError
    from ember.gguf.format import MAGIC
    from ember.hub import resolve_model

    resolved = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        try:
            path = resolve_model(name)
        except EmberError as exc:
            raise SystemExit(f"compare_llamacpp: {exc}") from None
        with open(path, "rb") as fh:
            if fh.read(4) != MAGIC:
                raise SystemExit(f"compare_llamacpp: {path} is not a GGUF file")
        is_file = Path(name).expanduser().is_file()
        resolved.append((Path(name).name if is_file else name, name, str(path)))
    if not resolved:
        raise SystemExit("compare_llamacpp: --models names no model")
    labels = [label for label, _, _ in resolved]
    return {(label if labels.count(label) == 1 else name): path for label, name, path in resolved}


def median(values):
    return statistics.median(values) if values else None


def verdict(ratio, target: float, higher_is_better: bool) -> str:
    if ratio is None:
        return ""
    ok = ratio >= target if higher_is_better else ratio <= target
    return "yes" if ok else "NO"


def speed_table(results: dict, args) -> list[str]:
    lines = ["| model | test | threads | ember t/s | llama.cpp t/s | ember / llama.cpp | >= 1.0 at 2 threads |",
             "|---|---|---:|---:|---:|---:|---|"]
    for model, r in results.items():
        samples = {tuple(k.split("|")): v for k, v in r["speed"]["samples"].items()}
        # A test of 0 tokens (-p 0 or -n 0) is one neither engine runs.
        tests = [f"pp{args.n_prompt}"] * (args.n_prompt > 0) + [f"tg{args.n_gen}"] * (args.n_gen > 0)
        for test in tests:
            for threads in args.threads.split(","):
                ember = median(samples.get(("ember", test, threads), []))
                llama = median(samples.get(("llama.cpp", test, threads), []))
                ratio = ember / llama if ember and llama else None
                target = verdict(ratio, 1.0, True) if threads == "2" else ""
                lines.append(f"| {model} | {test} | {threads} | {_fmt(ember, 1)} | {_fmt(llama, 1)} "
                             f"| {_fmt(ratio, 2, '-')} | {target} |")
    return lines


def ratio_table(results: dict, key: str, field: str, unit: str, scale: float, target: float) -> list[str]:
    lines = [f"| model | ember {unit} | llama.cpp {unit} | ember / llama.cpp | <= {target} |", "|---|---:|---:|---:|---|"]
    for model, r in results.items():
        values = r[key][field]
        ember, llama = median(values.get("ember", [])), median(values.get("llama.cpp", []))
        ratio = ember / llama if ember and llama else None
        lines.append(f"| {model} | {_fmt(ember and ember * scale, 0)} | {_fmt(llama and llama * scale, 0)} "
                     f"| {_fmt(ratio, 2, '-')} | {verdict(ratio, target, False)} |")
    return lines


def _fmt(value, digits: int, missing: str = "failed") -> str:
    return missing if value is None else f"{value:.{digits}f}"


def report(results: dict, args, header: list[str]) -> str:
    out = header[:]
    if "speed" in args.only:
        out += ["", f"### Speed: tokens/s, median of {args.rounds * args.reps} runs per engine", ""]
        out += speed_table(results, args)
    if "memory" in args.only:
        out += ["", (f"### Peak RSS: -c {args.ctx_size}, {args.gen} tokens generated, -t {args.run_threads}, "
                     f"median of {args.mem_rounds} runs"), ""]
        out += ratio_table(results, "memory", "peak_rss_bytes", "MiB", 1 / 2**20, 1.1)
    if "start" in args.only:
        out += ["", (f"### Start to first token: `run -n 1`, -c {args.ctx_size}, -t {args.run_threads}, "
                     f"process start to exit, median of {args.start_rounds} runs"), ""]
        out += ratio_table(results, "start", "seconds", "ms", 1000, 1.5)
    failures = [f"- {model} {part} {engine}: {msgs[0]} ({len(msgs)} failed runs)"
                for model, r in results.items() for part, v in r.items()
                for engine, msgs in v.get("errors", {}).items()]
    if failures:
        out += ["", "Failures:", *failures]
    return "\n".join(out)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help="registry names, Hugging Face names or .gguf paths, comma-separated")
    parser.add_argument("-p", "--n-prompt", type=int, default=512)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-t", "--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two engines")
    parser.add_argument("--reps", type=int, default=2, help="repetitions per engine per round")
    parser.add_argument("-c", "--ctx-size", type=int, default=512, help="context of the memory and start runs")
    parser.add_argument("--gen", type=int, default=128, help="tokens generated in the memory runs")
    parser.add_argument("--mem-rounds", type=int, default=2)
    parser.add_argument("--start-rounds", type=int, default=5)
    parser.add_argument("--only", default="speed,memory,start", help="which parts to run")
    parser.add_argument("--llama-no-warmup", action="store_true", help="pass --no-warmup to llama-completion")
    parser.add_argument("--llama-commit", default=None, help="llama.cpp commit to print in the header")
    parser.add_argument("--json", default=None, help="also write the raw figures to this JSON file")
    parser.add_argument("--llama-bin", default=None,
                        help="folder of llama.cpp's binaries (default: $LLAMA_CPP_BIN, else PATH)")
    args = parser.parse_args(argv)
    if args.llama_bin:
        os.environ["LLAMA_CPP_BIN"] = args.llama_bin
    args.only = set(args.only.split(","))
    args.run_threads = max(int(t) for t in args.threads.split(","))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    needed = (["llama-bench"] if "speed" in args.only else []) + \
        (["llama-completion"] if args.only & {"memory", "start"} else [])
    binaries = [llama_binary(name) for name in needed]
    models = resolve_models(args.models)
    version = llama_version(binaries[0]) if binaries else "not run"
    header = [f"machine: {machine_summary()}", f"ember: {ember_version()}",
              f"llama.cpp: {version}" + (f", commit {args.llama_commit}" if args.llama_commit else "")]
    header += [f"{label}: {path}" for label, path in models.items() if label != path]
    print("\n".join(header), file=sys.stderr, flush=True)
    results = {}
    for model, path in models.items():
        results[model] = {}
        for part, measure in (("speed", measure_speed), ("memory", measure_memory), ("start", measure_start)):
            if part in args.only:
                print(f"{model}: {part}...", file=sys.stderr, flush=True)
                results[model][part] = measure(path, args)
    header.append(f"load average at the end: {machine_summary().rsplit('load average ', 1)[1]}; "
                  f"{time.perf_counter() - started:.0f} s in all")
    print(report(results, args, header))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"header": header, "args": {k: v if not isinstance(v, set) else sorted(v)
                                                  for k, v in vars(args).items()}, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
