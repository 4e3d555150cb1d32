"""CPU time of one prompt evaluation at one thread: the least of several, in milliseconds.

    python benchmarks/prompt_cpu.py MODEL [-p 128] [--runs 8]

CPU time (not wall time) of the process, so another guest's load on a shared host moves it less;
for comparing two builds of ember on the same file, alternate them (PYTHONPATH=<tree>/src).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="registry name or .gguf path")
    parser.add_argument("-p", "--n-prompt", type=int, default=128)
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()

    from ember.api.llama import Llama
    from ember.hub import resolve_model

    llm = Llama(str(resolve_model(args.model)), n_threads=1, n_ctx=2 * args.n_prompt, verbose=False)
    tokens = [int(t) for t in np.random.default_rng(0).integers(100, 2000, args.n_prompt)]
    best = float("inf")
    for _ in range(args.runs):
        llm.reset()
        start = time.process_time()
        llm.eval(tokens)
        best = min(best, time.process_time() - start)
    print(f"{best * 1000:.1f}")


if __name__ == "__main__":
    main()
