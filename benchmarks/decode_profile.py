"""Where a decode step's time goes, per registry model and thread count, and how far the step is
from the memory-bandwidth bound (weight bytes read per token / STREAM-triad bandwidth).

    python benchmarks/decode_profile.py [--models smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m]
        [-t 1,2] [--prompt-tokens 128] [--steps 64] [--triad-mb 512] [--rounds 1] [--json FILE]

Each step is what `ember run` does per token: Model.eval([token]) (one graph run), then the
sampler (ember run's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05) and the
streaming detokenizer with stop matching. The prompt is the start of the committed
public-domain text. Graph nodes are timed by the graph's profiler (thread 0, barrier included);
"Python" is the rest of the eval call (argument checks, the thread pool's wake-up, the logits
copy). Weight bytes per token count every weight a decode step multiplies by; the embedding
tables read one row (the token embedding counts in full when it is also the output matrix).
The triad is measured just before and just after each profile, and the bound uses their mean,
since this kind of host's bandwidth moves by a fifth from one minute to the next; a profile
whose two triads differ by more than a tenth is marked (the host moved during it). --rounds
repeats every model and thread count in turn and reports the median of bound / step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from membw import triad_gbs

from ember.errors import EmberError
from ember.engine.generate import Continuation
from ember.engine.runtime import Model
from ember.engine.sampling import Sampler, SamplingParams
from ember.tokenizer.tokenizer import Tokenizer

DEFAULT_MODELS = "smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m"
TEXT = Path(__file__).resolve().parent / "data" / "public-domain-en.txt"
OP_GROUPS = {"rms_norm": "norms", "layer_norm": "norms", "attention": "attention", "rope": "rope",
             "get_rows": "embedding rows", "add": "elementwise", "mul": "elementwise", "scale": "elementwise",
             "silu": "elementwise", "gelu": "elementwise", "swiglu": "elementwise", "geglu": "elementwise",
             "softcap": "elementwise", "softmax": "routing", "sigmoid": "routing", "top_k": "routing",
             "take": "routing", "sum_normalize": "routing", "weighted_sum": "routing"}
WARMUP_STEPS = 4


def op_group(op: str, weight_type: str) -> str:
    if op in ("matmul", "matmul_id"):
        return f"{op} {weight_type}"
    return OP_GROUPS.get(op, "other ops")


def matmul_bytes_by_type(gguf) -> dict[str, int]:
    """Bytes of the weights one decode step multiplies by, per tensor type; of a mixture of experts'
    stacked expert tensors (ffn_*_exps) only the expert_used_count chosen of expert_count."""
    tied = "output.weight" not in gguf.tensors
    used = gguf.metadata.get(f"{gguf.arch}.expert_used_count", 1)
    experts = gguf.metadata.get(f"{gguf.arch}.expert_count", 1)
    by_type = Counter()
    for name, t in gguf.tensors.items():
        if len(t.shape) < 2 or name == "position_embd.weight" or (name == "token_embd.weight" and not tied):
            continue
        by_type[t.type.name] += t.n_bytes * used // experts if name.endswith("_exps.weight") else t.n_bytes
    return dict(by_type)


class TimedSampler:
    """Wraps a Sampler and sums the time spent in sample()."""

    def __init__(self, sampler: Sampler):
        self.inner = sampler
        self.seconds = 0.0

    def sample(self, logits):
        start = time.perf_counter()
        token = self.inner.sample(logits)
        self.seconds += time.perf_counter() - start
        return token

    def accept(self, token):
        self.inner.accept(token)

    def __getattr__(self, name):  # the rest of the Sampler's interface (finished, ...)
        return getattr(self.inner, name)


def profile_decode(path: str, n_threads: int, prompt: list[int], n_steps: int) -> dict:
    model = Model(path, n_ctx=len(prompt) + n_steps + WARMUP_STEPS + 1, n_threads=n_threads)
    tokenizer = Tokenizer.from_gguf(model.gguf)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)
    sampler = TimedSampler(Sampler(params, model.n_vocab, history=prompt))
    reply = Continuation(tokenizer, sampler)
    logits = model.eval(prompt)
    token = prompt[-1]
    eval_s = step_s = 0.0
    for step in range(WARMUP_STEPS + n_steps):
        if step == WARMUP_STEPS:
            model.graph.set_profiling(True)
            sampler.seconds = eval_s = step_s = 0.0
        start = time.perf_counter()
        logits = model.eval([token])
        evaluated = time.perf_counter()
        reply.step(logits)
        if reply.finish_reason:  # an end token: keep decoding with a fresh reply
            reply = Continuation(tokenizer, sampler)
        token = reply.tokens[-1] if reply.tokens else token
        eval_s += evaluated - start
        step_s += time.perf_counter() - start
    parts = Counter()
    for op, weight_type, ns in model.graph.profile():
        parts[op_group(op, weight_type)] += ns * 1e-9
    graph_s = sum(parts.values())
    parts["Python (eval call)"] = eval_s - graph_s
    parts["sampling"] = sampler.seconds
    parts["detokenize, stops"] = step_s - eval_s - sampler.seconds
    bytes_by_type = matmul_bytes_by_type(model.gguf)
    model.close()
    return {"n_threads": n_threads, "steps": n_steps, "position": len(prompt),
            "step_us": step_s / n_steps * 1e6, "parts_us": {k: v / n_steps * 1e6 for k, v in parts.items()},
            "weight_bytes": bytes_by_type}


def model_report(model: str, runs: list[dict]) -> list[str]:
    """The table of the median-step run at each thread count, then every run's step against the
    bound (from the mean of the triads measured just before and after it) and, with several rounds,
    the median ratio."""
    by_threads = defaultdict(list)
    for r in runs:
        by_threads[r["n_threads"]].append(r)
    shown = [sorted(rs, key=lambda r: r["step_us"])[(len(rs) - 1) // 2] for rs in by_threads.values()]
    names = sorted({k for r in shown for k in r["parts_us"]}, key=lambda k: -shown[0]["parts_us"].get(k, 0))
    head = " | ".join(f"t={r['n_threads']} µs/token | %" for r in shown)
    lines = [f"### {model}: decode step at position {runs[0]['position']}, {runs[0]['steps']} steps", "",
             f"| part | {head} |", "|---|" + "---:|---:|" * len(shown)]
    for name in names:
        cells = " | ".join(f"{r['parts_us'].get(name, 0):.0f} | {100 * r['parts_us'].get(name, 0) / r['step_us']:.1f}"
                           for r in shown)
        lines.append(f"| {name} | {cells} |")
    lines.append("| **step** | " + " | ".join(f"**{r['step_us']:.0f}** | 100" for r in shown) + " |")
    lines.append("")
    total_bytes = sum(runs[0]["weight_bytes"].values())
    by_type = ", ".join(f"{t} {b / 1e6:.1f} MB" for t, b in sorted(runs[0]["weight_bytes"].items()))
    lines.append(f"weights read per token: {total_bytes / 1e6:.1f} MB ({by_type})")
    for n_threads, rs in by_threads.items():
        ratios = []
        for r in rs:
            matmul_us = sum(v for k, v in r["parts_us"].items() if k.startswith("matmul"))
            line = (f"- t={n_threads}: step {r['step_us'] / 1e3:.2f} ms, matmuls {matmul_us / 1e3:.2f} ms "
                    f"= {total_bytes / matmul_us / 1e3:.1f} GB/s of weights")
            if r.get("triad_gbs"):
                before, after = r["triad_before_gbs"], r["triad_after_gbs"]
                bound_us = total_bytes / r["triad_gbs"] / 1e3
                ratios.append(bound_us / r["step_us"])
                moved = " (the host moved)" if abs(after - before) > 0.1 * max(before, after) else ""
                line += (f"; bandwidth bound {bound_us / 1e3:.2f} ms at {r['triad_gbs']:.1f} GB/s triad "
                         f"({before:.1f} before, {after:.1f} after{moved}) -> bound / step {ratios[-1]:.2f}")
            lines.append(line)
        if len(ratios) > 1:
            lines.append(f"- t={n_threads}: median bound / step over {len(ratios)} rounds: "
                         f"{statistics.median(ratios):.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="registry names or .gguf paths, comma-separated")
    parser.add_argument("-t", "--threads", default="1,2")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="tokens in the cache before the steps")
    parser.add_argument("--steps", type=int, default=64, help="decode steps profiled (after 4 warm-up steps)")
    parser.add_argument("--triad-mb", type=int, default=512, help="MiB per triad array (0: skip the probe)")
    parser.add_argument("--rounds", type=int, default=1, help="profile every model and thread count this many times, in turn")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    from ember import _core
    from ember.hub import resolve_model

    thread_counts = [int(t) for t in args.threads.split(",")]
    print(f"ember decode profile, ISA {_core.isa()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    text = TEXT.read_text(encoding="utf-8")
    models = args.models.split(",")
    paths = {model: str(resolve_model(model)) for model in models}
    results = defaultdict(list)
    failed = set()

    def triad(n_threads: int) -> float | None:
        """The bandwidth of the moment (taken before and after each profile: this host's level moves)."""
        return triad_gbs(args.triad_mb, n_threads, 10) if args.triad_mb else None

    for _ in range(args.rounds):
        for model in models:
            for n_threads in thread_counts:
                if model in failed:
                    break
                print(f"{model}, {n_threads} thread(s)...", file=sys.stderr, flush=True)
                before = triad(n_threads)
                try:
                    prompt = _prompt(paths[model], text, args.prompt_tokens)
                    run = profile_decode(paths[model], n_threads, prompt, args.steps)
                except (EmberError, ValueError, RuntimeError, OSError) as exc:  # one failing model hides no other
                    print(f"\n{model}, {n_threads} thread(s): failed: {type(exc).__name__}: {exc}", flush=True)
                    failed.add(model)
                    break
                after = triad(n_threads)
                mean = None if before is None else (before + after) / 2
                results[model].append(dict(run, triad_gbs=mean, triad_before_gbs=before, triad_after_gbs=after))
    for model in models:
        if results[model]:
            print()
            print("\n".join(model_report(model, results[model])), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"isa": _core.isa(), "triad_mb": args.triad_mb, "results": results}, fh, indent=2)


def _prompt(path: str, text: str, n_tokens: int) -> list[int]:
    from ember.gguf import open_gguf

    with open_gguf(path) as gguf:
        return Tokenizer.from_gguf(gguf).encode(text, add_special=True)[:n_tokens]


if __name__ == "__main__":
    main()
