"""What reranking 32 documents against one query costs in one call (the pairs packed into shared
graph runs) against 32 calls of one document each, on a cross-encoder of ms-marco-MiniLM-L-6-v2's
shape: all-MiniLM-L6-v2's weights (from its package) under a BertForSequenceClassification head
drawn at random, converted by `ember convert` (the scores mean nothing; the work is a real
reranker's).

    PYTHONPATH=src python benchmarks/rerank.py [--documents 32] [--repeat 5] [--threads N]
                                               [--outtype f32|q8_0] [--model FILE.gguf]

Both ways score the same pairs through engine.rerank.Reranker; the scores are checked equal
(within 1e-5 of the largest) before anything is timed. Wall and CPU time are medians over --repeat
rounds; each round times the batched call and the single calls back to back, so a busy machine
slows both alike. The CPU, the thread count and the load average are printed with the results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from ember.engine.embed import Embedder  # noqa: E402
from ember.engine.rerank import Reranker  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402
from ember.sysinfo import cpu_name  # noqa: E402
from ember.tokenizer.tokenizer import Tokenizer  # noqa: E402
from runner import timed  # noqa: E402

QUERY = "how do I keep bread fresh for longer?"
TOPICS = ["bread", "the weather", "a train timetable", "mountain hikes", "jazz", "tax forms", "the moon", "cats"]


def documents(n: int) -> list[str]:
    return [f"Document {i} is about {TOPICS[i % len(TOPICS)]}. It says a few sentences on the subject, "
            f"gives an example or two and ends with a short summary of what {TOPICS[i % len(TOPICS)]} means "
            f"to most readers." for i in range(n)]


def minilm_reranker(folder: Path, outtype: str) -> Path:
    """all-MiniLM-L6-v2 with a random one-score classifier (and pooler), converted to `outtype`."""
    import torch
    import transformers
    from encoder_models import minilm_folder

    from ember.convert import convert

    source = minilm_folder()
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification.from_pretrained(source, num_labels=1)
    hf.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(source / name, folder / name)
    return convert(folder, folder / f"reranker-{outtype}.gguf", outtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--outtype", default="f32", choices=("f32", "q8_0"))
    parser.add_argument("--model", default=None, help="a reranker GGUF (default: MiniLM with a random head, converted)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ember-rerank-bench-") as work:
        path = args.model or str(minilm_reranker(Path(work), args.outtype))
        model = Model(path, n_threads=args.threads)
        reranker = Reranker(Embedder(model, Tokenizer.from_gguf(model.gguf)))
        docs = documents(args.documents)
        batched = np.array([s.score for s in reranker.score(QUERY, docs)])
        single = np.array([reranker.score(QUERY, [d])[0].score for d in docs])
        assert np.abs(batched - single).max() <= 1e-5 * max(np.abs(single).max(), 1e-30)
        pairs = [reranker.pair(QUERY, d)[0] for d in docs]
        runs = len(reranker.embedder._groups([np.array(ids) for ids in pairs]))
        rounds = []
        for _ in range(args.repeat):
            one_call = timed(lambda: reranker.score(QUERY, docs))
            many_calls = timed(lambda: [reranker.score(QUERY, [d]) for d in docs])
            rounds.append((one_call, many_calls))
        model.close()
    wall_one, cpu_one = (statistics.median(r[0][k] for r in rounds) for k in (0, 1))
    wall_many, cpu_many = (statistics.median(r[1][k] for r in rounds) for k in (0, 1))
    n = args.documents
    print(f"model {Path(path).name} ({model.hp.arch}, {model.hp.n_layer} layers, n_embd {model.hp.n_embd}); "
          f"{n} documents, {sum(map(len, pairs))} tokens with the query; {model.n_threads} threads on {cpu_name()} "
          f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}); median of {args.repeat} rounds")
    print("| way | graph runs | wall ms | CPU ms | documents/s (wall) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| one call, {n} documents | {runs} | {wall_one * 1e3:.1f} | {cpu_one * 1e3:.1f} | {n / wall_one:.0f} |")
    print(f"| {n} calls, 1 document each | {n} | {wall_many * 1e3:.1f} | {cpu_many * 1e3:.1f} | {n / wall_many:.0f} |")
    print(f"batched is {wall_many / wall_one:.1f}x faster (wall), {cpu_many / cpu_one:.1f}x (CPU)")


if __name__ == "__main__":
    main()
