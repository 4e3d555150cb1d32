"""What sampling one token costs over Qwen2.5's 151,936-token vocabulary, against a decode step.

    python benchmarks/sampling_speed.py [--vocab 151936] [--model qwen2.5-coder-0.5b]
                                        [--decode-ms 33.6] [--repeat 300] [--record FILE]

Logits: real ones from ember's runtime when it can run --model (a code prompt, every
position), otherwise synthetic ones shaped like a decoder's (a broad low background and a few
dozen strong candidates). Decode step: measured with ember's runtime when it can run --model,
otherwise --decode-ms (default 33.6 ms: llama.cpp's best tg128 for qwen2.5-coder-0.5b on the
2-core reference machine, 29.8 tok/s). The budget is 2% of a decode step.

Each configuration is timed per call (minimum, median and 90th percentile over --repeat calls,
cycling through the logit rows; on a busy machine the minimum is the cost without contention); a penalty window is filled with 64 earlier tokens where penalties
are on. "worst case" feeds logits whose strided sample misleads the top-k threshold, so the
selection falls back to a partition of the whole vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from ember.engine.sampling import Sampler, SamplingParams, token_logprobs

BUDGET = 0.02
CONFIGS = [
    ("defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8", dict()),
    ("defaults + repeat penalty 1.1 (last 64)", dict(repeat_penalty=1.1)),
    ("greedy (temp 0)", dict(temperature=0.0)),
    ("top-k off: top-p 0.95 + min-p 0.05", dict(top_k=0)),
    ("top-p 0.95 only", dict(top_k=0, min_p=0.0)),
    ("temperature only (no filter)", dict(top_k=0, top_p=1.0, min_p=0.0)),
]
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'


def synthetic_logits(n_vocab: int, n_rows: int = 16) -> np.ndarray:
    rng = np.random.default_rng(0)
    rows = rng.normal(-2.0, 2.0, (n_rows, n_vocab)).astype(np.float32)
    for row in rows:
        head = rng.choice(n_vocab, 30, replace=False)
        row[head] += rng.uniform(6.0, 14.0, head.size).astype(np.float32)
    return rows


def adversarial_logits(n_vocab: int) -> np.ndarray:
    logits = np.zeros((1, n_vocab), np.float32)
    logits[0, ::37] = 100 + np.arange(logits[0, ::37].size, dtype=np.float32)
    return logits


def real_logits_and_decode_ms(model_name: str, n_steps: int = 8):
    """(logits [n_positions, n_vocab], median decode ms), or None when the runtime cannot run it."""
    try:
        from ember.engine.runtime import Model
        from ember.tokenizer.tokenizer import Tokenizer

        model = Model(model_name, n_ctx=512)
        tokens = Tokenizer.from_gguf(model.gguf).encode(PROMPT)
        logits = model.eval(tokens, logits="all")
        steps = []
        token = int(logits[-1].argmax())
        for _ in range(n_steps):
            start = time.perf_counter()
            token = int(model.eval([token]).argmax())
            steps.append(time.perf_counter() - start)
        return logits, statistics.median(steps) * 1e3
    except Exception as exc:  # no model file, no kernels for its types yet, ...
        print(f"(no real logits from {model_name}: {exc})", file=sys.stderr)
        return None


def time_calls(call, rows: np.ndarray, repeat: int) -> list[float]:
    for row in rows[:3]:
        call(row)  # warm up
    times = []
    for i in range(repeat):
        row = rows[i % len(rows)]
        start = time.perf_counter_ns()
        call(row)
        times.append((time.perf_counter_ns() - start) / 1e3)
    return times


def measure(rows: np.ndarray, repeat: int) -> list[tuple[str, list[float]]]:
    n_vocab = rows.shape[1]
    history = list(np.random.default_rng(1).integers(0, n_vocab, 64))
    results = []
    for name, options in CONFIGS:
        sampler = Sampler(SamplingParams(seed=0, **options), n_vocab, history=history)
        results.append((name, time_calls(sampler.sample, rows, repeat)))
    sampler = Sampler(SamplingParams(seed=0), n_vocab)
    results.append(("defaults + logprobs (top 5)",
                    time_calls(lambda row: token_logprobs(row, sampler.sample(row), 5), rows, repeat)))
    worst = Sampler(SamplingParams(seed=0), n_vocab)
    results.append(("worst case: defaults, top-k threshold misled",
                    time_calls(worst.sample, adversarial_logits(n_vocab), repeat)))
    return results


def report(results, n_vocab: int, decode_ms: float, decode_source: str, logits_source: str) -> str:
    lines = [
        f"Sampling one token over a {n_vocab:,}-token vocabulary; decode step {decode_ms:.1f} ms ({decode_source});"
        f" budget {BUDGET:.0%} = {decode_ms * BUDGET * 1e3:.0f} µs.",
        f"Logits: {logits_source}. Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs,"
        f" load average {os.getloadavg()[0]:.1f}; numpy {np.__version__}, Python {platform.python_version()}.",
        "",
        "| configuration | min µs | median µs | p90 µs | median, % of decode step |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, times in results:
        median = statistics.median(times)
        p90 = statistics.quantiles(times, n=10)[-1]
        lines.append(f"| {name} | {min(times):.0f} | {median:.0f} | {p90:.0f} | {median / (decode_ms * 1e3):.2%} |")
    default_median = statistics.median(results[0][1])
    verdict = "within" if default_median <= decode_ms * BUDGET * 1e3 else "OVER"
    lines += ["", f"Default chain: {default_median:.0f} µs, {default_median / (decode_ms * 1e3):.2%} of a decode step"
              f" ({verdict} the {BUDGET:.0%} budget)."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size for synthetic logits")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="model for real logits and decode timing")
    parser.add_argument("--decode-ms", type=float, default=33.6, help="decode step when the runtime cannot run --model")
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--no-model", action="store_true", help="synthetic logits and --decode-ms only")
    parser.add_argument("--record", default=None, help="also write the report (markdown) to this file")
    parser.add_argument("--json", action="store_true", help="print raw medians as JSON instead")
    args = parser.parse_args()

    real = None if args.no_model else real_logits_and_decode_ms(args.model)
    if real is not None:
        rows, decode_ms = real
        logits_source = f"{args.model}, ember runtime, {len(rows)} positions of a code prompt"
        decode_source = f"{args.model}, ember runtime, measured"
    else:
        rows, decode_ms = synthetic_logits(args.vocab), args.decode_ms
        logits_source = "synthetic (normal background, 30 strong candidates)"
        decode_source = "llama.cpp tg128, qwen2.5-coder-0.5b, 2 threads" if args.decode_ms == 33.6 else "given"
    results = measure(rows, args.repeat)
    if args.json:
        print(json.dumps({name: statistics.median(times) for name, times in results}, indent=2))
        return 0
    text = report(results, rows.shape[1], decode_ms, decode_source, logits_source)
    print(text)
    if args.record:
        with open(args.record, "w") as out:
            command = "python benchmarks/sampling_speed.py --record benchmarks/sampling_speed.md"
            out.write(f"# Sampling speed\n\n`{command}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
