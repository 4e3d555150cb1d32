"""Time to open a GGUF file and read all its metadata: ember.gguf against gguf.GGUFReader.

    python benchmarks/gguf_open.py [MODEL ...]      (registry names or paths; default: the three)

Prints a markdown table (paste it into benchmarks/gguf_open.md). Each measurement is the best and
the median of several runs in this process, after one warm-up run, so the file is in the page
cache for both readers and the numbers compare parsing, not the disk.

- "ember open": open_gguf + every metadata value looked up (for string arrays: their length, and
  so every string's length and bounds checked), every tensor info parsed and validated.
- "ember + strings": the same, then every string of every string array decoded to a list of str
  (what building a tokenizer from the vocabulary costs on top).
- "gguf.GGUFReader": the gguf package's reader constructed (it parses every field and tensor).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from functools import partial

from ember.gguf import StringArray, open_gguf
from ember.hub import resolve_model

DEFAULT_MODELS = ["qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"]


def ember_open(path, decode_strings: bool) -> int:
    with open_gguf(path) as f:
        n = 0
        for key in f.metadata:
            value = f.metadata[key]
            if isinstance(value, StringArray):
                n += len(value.tolist() if decode_strings else value)
        return n + len(f.tensors)


def gguf_open(path) -> int:
    import gguf

    reader = gguf.GGUFReader(path)
    return len(reader.fields) + len(reader.tensors)


def timed(action, runs: int) -> dict[str, float]:
    """Best and median wall-clock time, and best CPU time of this process, over `runs` runs."""
    action()  # warm-up: page cache, imports
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        action()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"best": min(walls), "median": statistics.median(walls), "cpu": min(cpus)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--runs", type=int, default=20, help="runs of the ember reader")
    parser.add_argument("--gguf-runs", type=int, default=3, help="runs of gguf.GGUFReader")
    args = parser.parse_args()

    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}\n")
    print("| model | vocabulary | ember open: wall best / median (CPU) | + every string decoded: "
          "wall best (CPU) | gguf.GGUFReader: wall best / median (CPU) | ratio of medians |")
    print("|---|---|---|---|---|---|")
    for model in args.models:
        path = resolve_model(model)
        with open_gguf(path) as f:
            n_tokens = len(f.metadata.get("tokenizer.ggml.tokens", []))
        ember = timed(partial(ember_open, path, False), args.runs)
        decoded = timed(partial(ember_open, path, True), max(3, args.runs // 4))
        reference = timed(partial(gguf_open, path), args.gguf_runs)
        print(f"| {model} | {n_tokens:,} | {ms(ember['best'])} / {ms(ember['median'])} ({ms(ember['cpu'])}) "
              f"| {ms(decoded['best'])} ({ms(decoded['cpu'])}) "
              f"| {ms(reference['best'])} / {ms(reference['median'])} ({ms(reference['cpu'])}) "
              f"| {reference['median'] / ember['median']:.0f}x |")
        sys.stdout.flush()


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"


if __name__ == "__main__":
    main()
