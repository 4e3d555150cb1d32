"""The expert matmul (matmul_id) of one decode token beside a plain matmul over the same bytes:
the k chosen experts' N x K matrices against one matrix of k N rows, so the difference is what
choosing experts costs (grouping the slots, converting the token's row once per slot, k separate
weight regions).

    python benchmarks/expert_matmul.py [--shape 2048x1024x64x8] [--type Q4_K] [--threads 1,2]
                                       [--layers 8] [--runs 7]

A shape is KxNxEXPERTSxUSED (OLMoE-1B-7B's gate and up projections by default). Each graph
multiplies one token by --layers weights in turn: "hot" repeats one weight (cache-resident at
this size), "stream" uses --layers distinct ones (one stacked expert tensor each, the chosen
experts differing per layer), so the weights come from memory as in a decode step. Times are the
graph profiler's per-node sums (barriers included, the thread pool's wake-up not), medians of
--runs runs; GB/s counts the bytes of the chosen experts only.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from matvec import ggml_type, matmul_graph, matmul_seconds, random_rows

from ember import _core


def expert_graph(weights: list[np.ndarray], K: int, N: int, E: int, k: int, n_threads: int, t: str):
    """One token through the expert matmul of each stacked expert tensor in turn (as matvec's
    matmul_graph does for plain weights)."""
    g = _core.Graph(n_threads)
    x, ids = g.input(K), g.input(k)
    handles = {}
    for w in weights:
        if id(w) not in handles:
            handles[id(w)] = g.weight(int(ggml_type(t)), K, E * N, w.reshape(-1))
        y = g.matmul_id(handles[id(w)], x, ids, E)
    g.set_output(y)
    g.plan(1, 1, 1)
    return g


def expert_seconds(g, K: int, k: int, E: int, runs: int) -> float:
    """Median over runs of the profiled time of all matmul_id nodes in one run."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, K), dtype=np.float32)
    ids = rng.permutation(E)[:k].astype(np.float32)[None]
    args = (np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32), [x, ids])
    g.run(*args)
    samples = []
    for _ in range(runs):
        g.set_profiling(True)
        g.run(*args)
        samples.append(sum(ns for op, _, ns in g.profile() if op == "matmul_id") * 1e-9)
    g.set_profiling(False)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2048x1024x64x8")
    parser.add_argument("--type", default="Q4_K")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    K, N, E, k = (int(v) for v in args.shape.split("x"))
    chosen_bytes = random_rows(args.type, k * N, K).nbytes
    experts = [random_rows(args.type, E * N, K, seed=s) for s in range(args.layers)]
    dense = [w[:k * N] for w in experts]
    print(f"{args.type} {K}x{N}, {E} experts, {k} used: {chosen_bytes / 1e6:.1f} MB per op; ISA {_core.isa()}")
    print("| threads | weights | matmul_id µs | matmul µs (same bytes) | matmul_id GB/s | matmul GB/s | ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n_threads in (int(v) for v in args.threads.split(",")):
        for label, ws, ds in (("hot", [experts[0]] * args.layers, [dense[0]] * args.layers), ("stream", experts, dense)):
            a = expert_seconds(expert_graph(ws, K, N, E, k, n_threads, args.type), K, k, E, args.runs) / args.layers
            b = matmul_seconds(matmul_graph(args.type, ds, k * N, K, n_threads, 1), 1, K, args.runs) / args.layers
            print(f"| {n_threads} | {label} | {a * 1e6:.0f} | {b * 1e6:.0f} | {chosen_bytes / a / 1e9:.1f} | "
                  f"{chosen_bytes / b / 1e9:.1f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
