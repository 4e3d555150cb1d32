"""What 32 short texts cost to embed in one call (packed into shared graph runs) against 32 calls
of one text each, on all-MiniLM-L6-v2 (converted from its package by `ember convert`).

    PYTHONPATH=src python benchmarks/embeddings.py [--texts 32] [--repeat 5] [--threads N]
                                                   [--model FILE.gguf]

Both ways embed the same texts through engine.embed.Embedder; the vectors are checked equal
(cosine > 0.99999) before anything is timed. Wall and CPU time are medians over --repeat rounds;
each round times the batched call and the 32 single calls back to back, so a busy machine slows
both alike. The CPU, the thread count and the load average are printed with the results.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from ember.engine.embed import Embedder  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402
from ember.sysinfo import cpu_name  # noqa: E402
from ember.tokenizer.tokenizer import Tokenizer  # noqa: E402
from runner import timed  # noqa: E402

TOPICS = ["cats", "the weather", "a train timetable", "bread recipes", "mountain hikes", "jazz", "tax forms",
          "the moon"]


def texts(n: int) -> list[str]:
    return [f"Question {i}: what should I know about {TOPICS[i % len(TOPICS)]}?" for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", default=None, help="an embedding GGUF (default: all-MiniLM-L6-v2, converted)")
    args = parser.parse_args()
    if args.model is None:
        from encoder_models import minilm_gguf

        args.model = str(minilm_gguf())
    model = Model(args.model, n_threads=args.threads)
    embedder = Embedder(model, Tokenizer.from_gguf(model.gguf))
    inputs = [embedder.tokenize(t) for t in texts(args.texts)]
    batched = [e.vector for e in embedder.embed_tokens(inputs)]
    single = [embedder.embed_tokens([ids])[0].vector for ids in inputs]
    assert min(float(np.dot(a, b)) for a, b in zip(batched, single)) > 0.99999
    runs = len(embedder._groups([np.array(ids) for ids in inputs]))

    rounds = []
    for _ in range(args.repeat):
        one_call = timed(lambda: embedder.embed_tokens(inputs))
        many_calls = timed(lambda: [embedder.embed_tokens([ids]) for ids in inputs])
        rounds.append((one_call, many_calls))
    wall_one = statistics.median(r[0][0] for r in rounds)
    wall_many = statistics.median(r[1][0] for r in rounds)
    cpu_one = statistics.median(r[0][1] for r in rounds)
    cpu_many = statistics.median(r[1][1] for r in rounds)
    n_tokens = sum(len(ids) for ids in inputs)
    print(f"model {Path(args.model).name} ({model.hp.arch}, {model.hp.n_layer} layers, n_embd {model.hp.n_embd}); "
          f"{args.texts} texts, {n_tokens} tokens; {model.n_threads} threads on {cpu_name()} "
          f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}); median of {args.repeat} rounds")
    print("| way | graph runs | wall ms | CPU ms | texts/s (wall) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| one call, {args.texts} texts | {runs} | {wall_one * 1e3:.1f} | {cpu_one * 1e3:.1f} | "
          f"{args.texts / wall_one:.0f} |")
    print(f"| {args.texts} calls, 1 text each | {args.texts} | {wall_many * 1e3:.1f} | {cpu_many * 1e3:.1f} | "
          f"{args.texts / wall_many:.0f} |")
    print(f"batched is {wall_many / wall_one:.1f}x faster (wall), {cpu_many / cpu_one:.1f}x (CPU)")


if __name__ == "__main__":
    main()
