"""Prompt processing and generation at context depth: ember beside llama.cpp (flash attention off
and on) and, optionally, beside another ember checkout (the attention before a change).

    python benchmarks/long_context.py [--model smollm2-135m] [-p 512] [-n 64] [-d 0,4096,8192]
        [-t 2] [--rounds 2] [--cache-types f16,q8_0] [--fa 0,1] [--llama-cache-types f16,q8_0]
        [--baseline SRC] [--json FILE]

llama.cpp runs with each --fa setting and an F16 cache, and with flash attention on and each
other --llama-cache-types type for K and V (llama.cpp quantizes the V cache only with flash
attention). Every test starts from a context of d tokens (llama-bench's -d): `ember bench -d` fills it once
and forgets what each run appended; llama-bench refills it before each run (untimed either way).
--baseline names the src/ folder of another ember checkout with its own built core; it runs the
same method through ember.engine.runtime.Model (older trees have no `bench -d`), f16 cache.
The engines run alternately, one run each per round, and every figure is the median of an
engine's runs; a second table gives each engine's decode time per token at each depth over
its time at the first depth (the issue's measure for long contexts). Needs llama-bench in $LLAMA_CPP_BIN or on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

from runner import ember_command, ember_version, llama_binary, llama_version, machine_summary, run_measured

# The baseline's measurement: ember bench's method over the Model API that every tree has.
BASELINE = r"""
import json, sys, time
import numpy as np
from ember.engine.runtime import Model
path, n_prompt, n_gen, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
depths = [int(d) for d in sys.argv[5].split(",")]
model = Model(path, n_ctx=max(depths) + max(n_prompt, n_gen), n_threads=threads, n_batch=n_prompt)
rng = np.random.default_rng(1)
rows = []
for depth in depths:
    model.truncate(depth)
    if model.n_past() < depth:
        model.eval(rng.integers(0, model.n_vocab, depth - model.n_past()).tolist())
    for test, n in (("pp", n_prompt), ("tg", n_gen)):
        tokens = rng.integers(0, model.n_vocab, n).tolist()
        def once():
            model.truncate(depth)
            start = time.perf_counter()
            if test == "pp":
                model.eval(tokens)
            else:
                for t in tokens:
                    model.eval([t])
            return n / (time.perf_counter() - start)
        once()
        rows.append({"n_prompt": n if test == "pp" else 0, "n_gen": n if test == "tg" else 0, "n_depth": depth,
                     "samples_ts": [once()]})
print(json.dumps(rows))
"""


def commands(path: str, args) -> dict[str, list[str]]:
    common = ["-p", str(args.n_prompt), "-n", str(args.n_gen), "-t", str(args.threads), "-r", "1", "-o", "json"]
    out = {}
    for cache in args.cache_types.split(","):
        out[f"ember {cache}"] = [*ember_command(), "bench", "-m", path, *common, "-d", args.depths, "-ctk", cache,
                                 "-ctv", cache]
    llama = [llama_binary("llama-bench"), "-m", path, *common, "-d", args.depths]
    for fa in args.fa.split(","):
        out[f"llama.cpp fa{fa}"] = [*llama, "-fa", fa]
    for cache in args.llama_cache_types.split(","):
        if cache and cache != "f16":
            out[f"llama.cpp fa1 {cache}"] = [*llama, "-fa", "1", "-ctk", cache, "-ctv", cache]
    if args.baseline:
        out["ember before"] = ["env", f"PYTHONPATH={args.baseline}", sys.executable, "-c", BASELINE, path,
                               str(args.n_prompt), str(args.n_gen), str(args.threads), args.depths]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-d", "--depths", default="0,4096,8192")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cache-types", default="f16,q8_0")
    ap.add_argument("--fa", default="0,1")
    ap.add_argument("--llama-cache-types", default="f16,q8_0")
    ap.add_argument("--baseline", default=None, metavar="SRC")
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()

    from ember.hub import resolve_model

    path = str(resolve_model(args.model))
    print(f"# {args.model}: {machine_summary()}", file=sys.stderr)
    print(f"# ember {ember_version()}; llama.cpp {llama_version(llama_binary('llama-bench'))}", file=sys.stderr)
    samples = defaultdict(list)  # (engine, test, depth) -> tokens/s
    cmds = commands(path, args)
    for r in range(args.rounds):
        for engine, cmd in cmds.items():
            print(f"round {r + 1}: {engine}", file=sys.stderr, flush=True)
            run = run_measured(cmd, timeout=3600)
            if not run.ok:
                print(f"  {engine} failed: {run.error()}", file=sys.stderr)
                continue
            for row in json.loads(run.stdout):
                test = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
                samples[(engine, test, int(row.get("n_depth", 0)))].extend(row["samples_ts"])
            if args.json:  # after every run, so that an interrupted measurement keeps what it has
                with open(args.json, "w") as fh:
                    json.dump({"|".join(map(str, k)): v for k, v in samples.items()}, fh, indent=1)
    print(table(samples, list(cmds), args))
    print()
    print(depth_cost(samples, list(cmds), args))
    print(f"\nmedians of {args.rounds} runs per engine; load average now {os.getloadavg()[0]:.1f}")
    return 0


def table(samples: dict, engines: list[str], args) -> str:
    lines = [f"| test | depth | {' | '.join(engines)} |", "|---|---:|" + "---:|" * len(engines)]
    for test in [f"pp{args.n_prompt}"] * (args.n_prompt > 0) + [f"tg{args.n_gen}"] * (args.n_gen > 0):
        for depth in (int(d) for d in args.depths.split(",")):
            cells = [samples.get((e, test, depth)) for e in engines]
            lines.append(f"| {test} | {depth} | " + " | ".join(
                f"{statistics.median(c):.1f}" if c else "-" for c in cells) + " |")
    return "\n".join(lines)


def depth_cost(samples: dict, engines: list[str], args) -> str:
    """Decode time per token at each depth over the time at the first depth, per engine."""
    depths = [int(d) for d in args.depths.split(",")]
    test = f"tg{args.n_gen}"
    lines = [f"| {test} time per token / at d{depths[0]} | " + " | ".join(f"d{d}" for d in depths[1:]) + " |",
             "|---|" + "---:|" * (len(depths) - 1)]
    for e in engines:
        base = samples.get((e, test, depths[0]))
        cells = [samples.get((e, test, d)) for d in depths[1:]]
        lines.append(f"| {e} | " + " | ".join(
            f"{statistics.median(base) / statistics.median(c):.2f}" if base and c else "-" for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
