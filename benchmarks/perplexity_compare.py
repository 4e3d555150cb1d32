"""Perplexity of each registry model on a committed public-domain text, ember beside llama.cpp.

    python benchmarks/perplexity_compare.py [--models smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m]
        [-f benchmarks/data/public-domain-en.txt] [-c 512] [-t 2] [--chunks N] [--json FILE]

Runs `ember perplexity --json` and `llama-perplexity` (on PATH, or in $LLAMA_CPP_BIN) with the
same file, context and chunk limit; both use llama.cpp's method (chunks of -c tokens, BOS first,
the second half of each chunk scored). Target: |ember - llama.cpp| <= 0.5% of llama.cpp's PPL.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
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
DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "public-domain-en.txt"
LLAMA_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
LLAMA_CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks")


def ember_perplexity(path: str, args) -> dict:
    cmd = [*ember_command(), "perplexity", "-m", path, "-f", str(args.file), "-c", str(args.ctx_size),
           "-t", str(args.threads), "--json"] + (["--chunks", str(args.chunks)] if args.chunks else [])
    run = run_measured(cmd)
    if not run.ok:
        return {"error": run.error()}
    out = json.loads(run.stdout)
    return {"ppl": out["ppl"], "ppl_error": out["ppl_error"], "n_chunks": out["n_chunks"], "seconds": run.seconds}


def llama_perplexity(path: str, args) -> dict:
    cmd = [llama_binary("llama-perplexity"), "-m", path, "-f", str(args.file), "-c", str(args.ctx_size),
           "-t", str(args.threads)] + (["--chunks", str(args.chunks)] if args.chunks else [])
    run = run_measured(cmd)
    text = run.stdout + run.stderr
    final, chunks = LLAMA_FINAL.search(text), LLAMA_CHUNKS.search(text)
    if not run.ok or not final:
        return {"error": run.error() if not run.ok else "no 'Final estimate' in its output"}
    return {"ppl": float(final.group(1)), "ppl_error": float(final.group(2)),
            "n_chunks": int(chunks.group(1)) if chunks else None, "seconds": run.seconds}


def row(model: str, ember: dict, llama: dict) -> str:
    def cell(r):
        return r["error"] if "error" in r else f"{r['ppl']:.4f} ± {r['ppl_error']:.4f}"

    diff = ok = ""
    if "ppl" in ember and "ppl" in llama:
        rel = (ember["ppl"] - llama["ppl"]) / llama["ppl"]
        diff, ok = f"{100 * rel:+.2f}%", "yes" if abs(rel) <= 0.005 else "NO"
    chunks = "/".join(str(r.get("n_chunks", "?")) for r in (ember, llama))
    seconds = "/".join(f"{r['seconds']:.0f}" if "seconds" in r else "-" for r in (ember, llama))
    return f"| {model} | {chunks} | {cell(ember)} | {cell(llama)} | {diff} | {ok} | {seconds} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="registry names or .gguf paths, comma-separated")
    parser.add_argument("-f", "--file", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("-c", "--ctx-size", type=int, default=512)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=None, help="score at most this many chunks")
    parser.add_argument("--llama-commit", default=None, help="llama.cpp commit to print in the header")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    from ember.hub import resolve_model

    started = time.perf_counter()
    header = [f"machine: {machine_summary()}", f"ember: {ember_version()}",
              f"llama.cpp: {llama_version(llama_binary('llama-perplexity'))}"
              + (f", commit {args.llama_commit}" if args.llama_commit else ""),
              f"text: {args.file.name} ({args.file.stat().st_size:,} bytes), -c {args.ctx_size}, -t {args.threads}"
              + (f", at most {args.chunks} chunks" if args.chunks else "")]
    results = {}
    for model in args.models.split(","):
        path = str(resolve_model(model))
        print(f"{model}...", file=sys.stderr, flush=True)
        results[model] = {"ember": ember_perplexity(path, args), "llama.cpp": llama_perplexity(path, args)}
    lines = [*header, "", ("| model | chunks (ember/llama.cpp) | ember PPL | llama.cpp PPL | difference | within 0.5% "
                           "| seconds (ember/llama.cpp) |"), "|---|---|---:|---:|---:|---|---|"]
    lines += [row(model, r["ember"], r["llama.cpp"]) for model, r in results.items()]
    lines.append(f"\n({time.perf_counter() - started:.0f} s)")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"header": header, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
