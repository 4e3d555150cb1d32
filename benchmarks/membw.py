"""Memory bandwidth probe: STREAM triad (a = b + s*c) on arrays far larger than the caches.

    python benchmarks/membw.py [--mb 512] [--threads 1,2] [--runs 10]

Bandwidth counts the bytes STREAM counts (read b, read c, write a: 3 x array size) and is the best
of `runs` passes, as STREAM reports it. numpy would evaluate `b + s*c` in two full passes, so each
thread walks its share in 1 MiB blocks: `s*c` lands in a cache-resident scratch buffer and only the
three arrays travel to and from memory. numpy releases the GIL inside each call, so Python
threads run the blocks in parallel.

The other benchmark scripts import `triad_gbs` to print this figure beside their own.
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np
from runner import run_at_once

BLOCK_ELEMS = (1 << 20) // 8  # 1 MiB of float64


def _triad_part(a, b, c, scalar, begin, end):
    scratch = np.empty(BLOCK_ELEMS)
    for lo in range(begin, end, BLOCK_ELEMS):
        hi = min(lo + BLOCK_ELEMS, end)
        tmp = scratch[:hi - lo]
        np.multiply(c[lo:hi], scalar, out=tmp)
        np.add(b[lo:hi], tmp, out=a[lo:hi])


def _one_pass(a, b, c, n_threads: int) -> float:
    n = a.size
    bounds = [n * i // n_threads for i in range(n_threads + 1)]
    return run_at_once([partial(_triad_part, a, b, c, 3.0, bounds[i], bounds[i + 1]) for i in range(n_threads)])


def triad_gbs(array_mb: int = 512, n_threads: int = 1, runs: int = 10) -> float:
    """Best triad bandwidth in GB/s (1e9 bytes/s) over `runs` passes on three arrays of array_mb MiB."""
    n = array_mb * (1 << 20) // 8
    a, b, c = np.zeros(n), np.full(n, 1.0), np.full(n, 2.0)  # written: every page is mapped now
    _one_pass(a, b, c, n_threads)  # warm-up
    best = min(_one_pass(a, b, c, n_threads) for _ in range(runs))
    return 3 * a.nbytes / best / 1e9


def triad_table(thread_counts, array_mb: int, runs: int) -> dict[int, float]:
    return {t: triad_gbs(array_mb, t, runs) for t in thread_counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="MiB per array (three arrays)")
    parser.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    for n_threads, gbs in triad_table([int(t) for t in args.threads.split(",")], args.mb, args.runs).items():
        print(f"triad, {args.mb} MiB arrays, {n_threads} thread(s): {gbs:.1f} GB/s")


if __name__ == "__main__":
    main()
