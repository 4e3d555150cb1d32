"""Quantized matmul throughput per weight type: matrix-vector (decode) as GB/s of weight bytes
beside the STREAM-triad bandwidth measured in the same run, and matrix-matrix (prefill) GFLOP/s.

    python benchmarks/matvec.py [--shapes 4096x4096,576x1536] [--threads 1,2] [--types Q4_0,Q8_0]
                                [--runs 5] [--stream-mb 1024] [--mm-tokens 512] [--json FILE]

A shape is ROWSxCOLS: output rows x input columns (576x1536 is SmolLM2-135M's ffn_down; the
K-quants need COLS to be a multiple of 256). Weights are random blocks with sane f16 scales.
Each measurement is one single-matmul ember._core graph (activation quantization included),
timed by the graph's per-node profiler; the median of --runs runs is reported.

- matvec hot: 1 token, the same weight 8 times per run (cache-resident when it fits).
- matvec stream: 1 token through distinct copies of the weight totalling --stream-mb MiB
  (at most 1024 copies), so the weights come from memory as in a decode step of a large model.
  "/ triad" divides by the triad bandwidth at the same thread count.
- mm: --mm-tokens tokens through one weight, 2 x tokens x rows x cols flops.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
from membw import triad_table

from ember import _core
from ember.gguf.types import TYPES, GGMLType

WEIGHT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS"]
# Byte offsets of the f16 scale fields inside one block: random bytes elsewhere are valid quants.
SCALE_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
                "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0]}
HOT_REPEATS = 8
MAX_COPIES = 1024


def ggml_type(name: str) -> GGMLType:
    return GGMLType[name]


def row_bytes(name: str, n_cols: int) -> int:
    info = TYPES[ggml_type(name)]
    return n_cols // info.block_size * info.type_size


def random_rows(name: str, n_rows: int, n_cols: int, seed: int = 0) -> np.ndarray:
    """Raw bytes of n_rows random rows of the type, shape (n_rows, row_bytes)."""
    rng = np.random.default_rng(seed)
    if name == "F32":
        return rng.standard_normal((n_rows, n_cols), dtype=np.float32).view(np.uint8)
    if name == "F16":
        return rng.standard_normal((n_rows, n_cols), dtype=np.float32).astype(np.float16).view(np.uint8)
    if name == "BF16":
        bits = rng.standard_normal((n_rows, n_cols), dtype=np.float32).view(np.uint32)
        return (bits >> 16).astype(np.uint16).view(np.uint8)
    info = TYPES[ggml_type(name)]
    n_blocks = n_rows * n_cols // info.block_size
    blocks = rng.integers(0, 256, size=(n_blocks, info.type_size), dtype=np.uint8)
    for off in SCALE_FIELDS[name]:
        scales = (rng.uniform(0.5, 2.0, n_blocks) * rng.choice([-1, 1], n_blocks) / 64).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(n_rows, -1)


def matmul_graph(name: str, weights: list[np.ndarray], n_rows: int, n_cols: int, n_threads: int, n_tokens: int):
    """A graph that multiplies one input by each weight in turn (the same array may repeat)."""
    g = _core.Graph(n_threads)
    x = g.input(n_cols)
    ids = {}
    y = None
    for w in weights:
        if id(w) not in ids:
            ids[id(w)] = g.weight(int(ggml_type(name)), n_cols, n_rows, w.reshape(-1))
        y = g.matmul(ids[id(w)], x)
    g.set_output(y)
    g.plan(n_tokens, 1, n_tokens)  # positions 0..n_tokens-1 must lie in the (unused) context
    return g


def matmul_seconds(g, n_tokens: int, n_cols: int, runs: int) -> float:
    """Median over runs of the profiled time of all matmul nodes in one run."""
    x = np.random.default_rng(1).standard_normal((n_tokens, n_cols), dtype=np.float32)
    args = (np.zeros(n_tokens, np.int32), np.arange(n_tokens, dtype=np.int32), np.zeros(n_tokens, np.int32),
            np.zeros(1, np.int32), [x])
    g.run(*args)  # warm-up
    samples = []
    for _ in range(runs):
        g.set_profiling(True)  # resets the per-node sums
        g.run(*args)
        samples.append(sum(ns for op, _, ns in g.profile() if op == "matmul") * 1e-9)
    g.set_profiling(False)
    return statistics.median(samples)


def stream_copies(w: np.ndarray, stream_mb: int) -> list[np.ndarray]:
    n = min(MAX_COPIES, max(2, math.ceil(stream_mb * 2**20 / w.nbytes)))
    block = np.empty((n, *w.shape), np.uint8)
    block[:] = w  # every page written: resident before timing
    return list(block)


def bench_shape(name: str, n_rows: int, n_cols: int, thread_counts, args) -> list[dict]:
    w = random_rows(name, n_rows, n_cols)
    copies = stream_copies(w, args.stream_mb) if args.stream_mb else []
    results = []
    for n_threads in thread_counts:
        r = {"type": name, "rows": n_rows, "cols": n_cols, "n_threads": n_threads, "weight_bytes": w.nbytes,
             "n_copies": len(copies)}
        hot = matmul_seconds(matmul_graph(name, [w] * HOT_REPEATS, n_rows, n_cols, n_threads, 1), 1, n_cols,
                             args.runs)
        r["matvec_hot_gbs"] = HOT_REPEATS * w.nbytes / hot / 1e9
        if copies:
            cold = matmul_seconds(matmul_graph(name, copies, n_rows, n_cols, n_threads, 1), 1, n_cols, args.runs)
            r["matvec_stream_gbs"] = len(copies) * w.nbytes / cold / 1e9
        if args.mm_tokens:
            mm = matmul_seconds(matmul_graph(name, [w], n_rows, n_cols, n_threads, args.mm_tokens), args.mm_tokens,
                                n_cols, args.runs)
            r["mm_gflops"] = 2 * args.mm_tokens * n_rows * n_cols / mm / 1e9
        results.append(r)
    return results


def supported(name: str, n_cols: int) -> str | None:
    """Why the type cannot be measured at this width, or None."""
    if name not in _core.types_with_kernels():
        return "no kernels in this build"
    if n_cols % TYPES[ggml_type(name)].block_size:
        return f"{n_cols} columns is not a multiple of the block size"
    return None


def format_table(results: list[dict], triad: dict[int, float], mm_tokens: int) -> str:
    lines = [(f"| type | rows x cols | weight MiB | threads | matvec hot GB/s | matvec stream GB/s | stream / triad "
              f"| mm{mm_tokens} GFLOP/s |"), "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        stream = r.get("matvec_stream_gbs")
        ratio = stream / triad[r["n_threads"]] if stream and r["n_threads"] in triad else None
        lines.append(f"| {r['type']} | {r['rows']}x{r['cols']} | {r['weight_bytes'] / 2**20:.2f} | {r['n_threads']} "
                     f"| {r['matvec_hot_gbs']:.1f} | {_num(stream, 1)} | {_num(ratio, 2)} "
                     f"| {_num(r.get('mm_gflops'), 1)} |")
    return "\n".join(lines)


def _num(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes, default=parse_shapes("4096x4096,576x1536"))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--types", default=",".join(WEIGHT_TYPES))
    parser.add_argument("--runs", type=int, default=5, help="timed runs per measurement (median)")
    parser.add_argument("--stream-mb", type=int, default=1024, help="working set of the stream test (0: skip)")
    parser.add_argument("--mm-tokens", type=int, default=512, help="tokens of the matrix-matrix test (0: skip)")
    parser.add_argument("--triad-mb", type=int, default=512, help="MiB per triad array (0: skip the probe)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]
    started = time.perf_counter()

    print(f"ember matmul benchmark, ISA {_core.isa()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    triad = triad_table(thread_counts, args.triad_mb, 10) if args.triad_mb else {}
    for n_threads, gbs in triad.items():
        print(f"memory bandwidth (STREAM triad, {args.triad_mb} MiB arrays), {n_threads} thread(s): {gbs:.1f} GB/s",
              flush=True)
    results, skipped = [], []
    for n_rows, n_cols in args.shapes:
        for name in args.types.split(","):
            reason = supported(name, n_cols)
            if reason:
                skipped.append(f"{name} {n_rows}x{n_cols}: {reason}")
                continue
            print(f"{name} {n_rows}x{n_cols}...", file=sys.stderr, flush=True)
            results.extend(bench_shape(name, n_rows, n_cols, thread_counts, args))
    print()
    print(format_table(results, triad, args.mm_tokens))
    for line in skipped:
        print(f"skipped {line}")
    print(f"\n({time.perf_counter() - started:.0f} s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"isa": _core.isa(), "triad_gbs": triad, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
