"""Prompt-lookup decoding against plain decoding on an editing-style prompt (a code file, then
the start of the same file with a small change asked for), greedy, in this process.

    python benchmarks/lookup_speed.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--tokens 192]
        [--rounds 5] [-t THREADS] [--ngram-min 2] [--ngram-max 4] [--draft-max 10] [--json FILE]

Each round generates --tokens tokens from the same prompt twice, plain then with lookup (the
order alternates between rounds), after a reset of the KV cache, so both evaluate the whole
prompt; only the generation part is timed. Reported per model: the median generated tokens/s
of each (wall time, and CPU time of this process: every compute thread counts, so a machine
shared with other work disturbs it less), their ratio, the median of the rounds' own ratios,
the draft tokens accepted / drafted, and tokens per forward pass. Every round checks that the
two outputs are the same token ids (temperature 0); a difference is printed and fails the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from runner import ember_version, machine_summary

CODE = '''\
class Inventory:
    """Items in stock, by name, with their unit price."""

    def __init__(self):
        self.items = {}

    def add(self, name, quantity, price):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        item = self.items.setdefault(name, {"quantity": 0, "price": price})
        item["quantity"] += quantity
        item["price"] = price

    def remove(self, name, quantity):
        item = self.items.get(name)
        if item is None or item["quantity"] < quantity:
            raise KeyError(f"not enough {name} in stock")
        item["quantity"] -= quantity
        if item["quantity"] == 0:
            del self.items[name]

    def value(self):
        return sum(item["quantity"] * item["price"] for item in self.items.values())

    def report(self):
        lines = []
        for name, item in sorted(self.items.items()):
            lines.append(f"{name}: {item['quantity']} at {item['price']:.2f}")
        lines.append(f"total: {self.value():.2f}")
        return "\\n".join(lines)
'''

PROMPT = ("Below is inventory.py, then the same file with one change: `report` prints the names in "
          "upper case.\n\n### inventory.py\n```python\n" + CODE + "```\n\n### inventory.py (changed)\n```python\n")


def one_run(llm, tokens: list[int], n_tokens: int, lookup) -> dict:
    """One greedy generation: its ids, tokens/s (wall, and CPU after the first chunk, which
    holds the prompt's evaluation) and draft counts."""
    from ember.engine.sampling import SamplingParams

    llm.reset()
    generation = llm.generation(tokens, SamplingParams(temperature=0.0), max_tokens=n_tokens, lookup=lookup)
    chunks = iter(generation)
    next(chunks)
    n_first, cpu = generation.n_generated, time.process_time()
    for _ in chunks:
        pass
    cpu = time.process_time() - cpu
    n = generation.n_generated
    return {"ids": list(generation.tokens), "n": n, "wall_tps": n / generation.t_generate,
            "cpu_tps": (n - n_first) / cpu if cpu > 0 else float("nan"),
            "drafted": generation.n_drafted, "accepted": generation.n_accepted,
            "passes": n - 1 - generation.n_accepted}  # forward passes after the prompt's


def measure(model: str, args) -> dict:
    from ember.api.llm import LLM
    from ember.engine.lookup import Lookup

    llm = LLM(model, n_ctx=2048, n_threads=args.threads)
    lookup = Lookup(ngram_min=args.ngram_min, ngram_max=args.ngram_max, n_draft=args.draft_max)
    tokens = llm.prompt_tokens(PROMPT)
    runs = {"plain": [], "lookup": []}
    mismatches = 0
    one_run(llm, tokens, 8, False)  # warm-up: page cache, first-call costs
    for r in range(args.rounds):
        order = ("plain", "lookup") if r % 2 == 0 else ("lookup", "plain")
        done = {mode: one_run(llm, tokens, args.tokens, lookup if mode == "lookup" else False) for mode in order}
        for mode in order:
            runs[mode].append(done[mode])
        if done["plain"]["ids"] != done["lookup"]["ids"]:
            mismatches += 1
            print(f"{model}: round {r}: the outputs differ", file=sys.stderr)
        print(f"{model}: round {r}: plain {done['plain']['wall_tps']:.1f} tok/s, lookup "
              f"{done['lookup']['wall_tps']:.1f} tok/s", file=sys.stderr, flush=True)
    text = llm.detokenize(runs["plain"][0]["ids"])
    llm.close()
    return {"prompt_tokens": len(tokens), "runs": {m: [{k: v for k, v in run.items() if k != "ids"} for run in rs]
                                                   for m, rs in runs.items()},
            "mismatches": mismatches, "text": text}


def summary(model: str, result: dict) -> str:
    runs = result["runs"]
    med = {m: {k: statistics.median(run[k] for run in runs[m]) for k in ("wall_tps", "cpu_tps")} for m in runs}
    paired = statistics.median(lk["wall_tps"] / pl["wall_tps"] for pl, lk in zip(runs["plain"], runs["lookup"]))
    drafted = sum(run["drafted"] for run in runs["lookup"])
    accepted = sum(run["accepted"] for run in runs["lookup"])
    per_pass = sum(run["n"] - 1 for run in runs["lookup"]) / sum(run["passes"] for run in runs["lookup"])
    same = "yes" if not result["mismatches"] else f"NO ({result['mismatches']} rounds)"
    return (f"| {model} | {result['prompt_tokens']} | {med['plain']['wall_tps']:.1f} | {med['lookup']['wall_tps']:.1f} "
            f"| {med['lookup']['wall_tps'] / med['plain']['wall_tps']:.2f} | {paired:.2f} "
            f"| {med['plain']['cpu_tps']:.1f} | {med['lookup']['cpu_tps']:.1f} "
            f"| {med['lookup']['cpu_tps'] / med['plain']['cpu_tps']:.2f} "
            f"| {accepted}/{drafted} ({100 * accepted / max(drafted, 1):.0f}%) | {per_pass:.2f} | {same} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--tokens", type=int, default=192, help="tokens generated per run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--ngram-min", type=int, default=2)
    parser.add_argument("--ngram-max", type=int, default=4)
    parser.add_argument("--draft-max", type=int, default=10)
    parser.add_argument("--json", default=None, help="also write the raw figures to this JSON file")
    args = parser.parse_args(argv)
    header = [f"machine: {machine_summary()}", f"ember: {ember_version()}",
              f"lookup: n-grams {args.ngram_min}-{args.ngram_max}, at most {args.draft_max} draft tokens; "
              f"{args.tokens} tokens per run, {args.rounds} rounds, greedy"]
    print("\n".join(header), file=sys.stderr, flush=True)
    results = {model: measure(model, args) for model in args.models.split(",")}
    lines = header + [f"load average at the end: {machine_summary().rsplit('load average ', 1)[1]}", "",
                      "| model | prompt tokens | plain tok/s | lookup tok/s | ratio | paired ratio | plain tok/CPU-s "
                      "| lookup tok/CPU-s | CPU ratio | drafts accepted | tokens per pass | same output |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines += [summary(model, r) for model, r in results.items()]
    print("\n".join(lines))
    for model, r in results.items():
        print(f"\n{model}'s output:\n{r['text']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"header": header, "results": results}, fh, indent=2)
    if any(r["mismatches"] for r in results.values()):
        raise SystemExit("lookup_speed: the outputs with and without lookup differ")


if __name__ == "__main__":
    main()
