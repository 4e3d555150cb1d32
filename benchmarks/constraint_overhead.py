"""Per-token cost of a JSON-schema constraint against unconstrained decoding, at batch 1 and in
the 4-stream server.

    python benchmarks/constraint_overhead.py [--models smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m]
                                             [--tokens 96] [--repeat 5] [--streams 4] [--record FILE]

Batch 1 (`LLM.generation`, in this process): the same prompt decoded --tokens tokens without a
constraint (end-of-generation tokens banned, so it runs to the limit) and under a JSON schema
that cannot be complete before the limit (an array of at least 200 objects with a bounded
string, an integer range and an enum array), greedy and with the default sampler. Runs
alternate, constrained and not, --repeat times; the report gives the median milliseconds per
generated token of each and the median of the rounds' own ratios (each constrained run against
the unconstrained run just before it), which a drift in the machine's load disturbs less.

"mask work" replays a constrained run's tokens through a fresh matcher without the model:
milliseconds per token to move the matcher on, compute the mask and apply it to a row of
logits. The constrained decode computes the next mask on a worker thread while the graph runs
the token, so its overhead can be below this figure.

Server: `ember serve --parallel N` and N concurrent streaming completions (temperature 0), all
unconstrained or all under the schema, alternating; aggregate generated tokens per second of
wall time, median of the rounds, and the median of the paired ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import threading
import time

import numpy as np

from server_concurrency import PROMPTS, client, end_of_generation_ids, start_server

SCHEMA = {
    "type": "array", "minItems": 200,
    "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False},
}
PROMPT = "A list of people with their ages and favourite colours, as JSON:"
MODES = {"greedy": {"temperature": 0.0}, "sampled": {"seed": 1}}


def batch1(model: str, tokens: int, repeat: int) -> dict:
    import ember
    from ember.engine.constraints import Constraint, Grammar, vocabulary

    llm = ember.LLM(model, n_ctx=1024)
    banned = {t: float("-inf") for t in llm.tokenizer.eog_ids}
    grammar = Grammar.json_schema(SCHEMA)
    prompt = llm.prompt_tokens(PROMPT)

    def per_token(mode: dict, constrained: bool) -> tuple[float, list[int]]:
        params = ember.SamplingParams(logit_bias=banned, grammar=grammar if constrained else None, **mode)
        generation = llm.generation(prompt, params, max_tokens=tokens)
        generation.text()
        if generation.n_generated != tokens:
            raise SystemExit(f"{model}: expected {tokens} tokens, got {generation.n_generated}")
        return generation.t_generate / generation.n_generated, generation.tokens

    start = time.perf_counter()
    vocabulary(llm.tokenizer, llm.n_vocab)
    t_vocabulary = time.perf_counter() - start
    result = {"n_vocab": llm.n_vocab, "vocabulary_s": t_vocabulary}
    for name, mode in MODES.items():
        per_token(mode, True)  # warm up
        plain, constrained, ids = [], [], []
        for _ in range(repeat):
            plain.append(per_token(mode, False)[0])
            seconds, ids = per_token(mode, True)
            constrained.append(seconds)
        result[name] = {"plain_ms": statistics.median(plain) * 1e3, "constrained_ms": statistics.median(constrained) * 1e3,
                        "ratio": statistics.median(c / p for c, p in zip(constrained, plain))}
    # the mask work alone, replaying the last constrained run's tokens
    logits = np.random.default_rng(0).normal(0, 1, llm.n_vocab).astype(np.float32)
    constraint = Constraint(grammar, vocabulary(llm.tokenizer, llm.n_vocab), llm.tokenizer)
    start = time.perf_counter()
    for token in ids:
        np.where(constraint.allowed(), logits, np.float32(-np.inf))
        constraint.accept(token)
    result["mask_ms"] = (time.perf_counter() - start) / len(ids) * 1e3
    llm.close()
    return result


def server_stream(url: str, prompt: str, tokens: int, banned: list[int], schema: dict | None, out: list, i: int) -> None:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "logit_bias": {str(t): -100 for t in banned}}
    if schema is not None:
        body["json_schema"] = schema
    with client().stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    out[i] = usage["completion_tokens"]


def server_speed(url: str, streams: int, tokens: int, banned: list[int], schema: dict | None) -> float:
    counts = [0] * streams
    threads = [threading.Thread(target=server_stream, args=(url, PROMPTS[i % len(PROMPTS)] + " As JSON:", tokens,
                                                            banned, schema, counts, i)) for i in range(streams)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    if counts != [tokens] * streams:
        raise SystemExit(f"expected {tokens} tokens per stream, got {counts}")
    return sum(counts) / seconds


def server(model: str, streams: int, tokens: int, repeat: int) -> dict:
    banned = end_of_generation_ids(model)
    process, url = start_server(model, streams, None, 1024)
    try:
        server_speed(url, streams, 8, banned, SCHEMA)  # warm up: the vocabulary, every slot
        plain, constrained = [], []
        for _ in range(repeat):
            plain.append(server_speed(url, streams, tokens, banned, None))
            constrained.append(server_speed(url, streams, tokens, banned, SCHEMA))
    finally:
        process.terminate()
        process.wait()
    return {"plain": statistics.median(plain), "constrained": statistics.median(constrained),
            "ratio": statistics.median(p / c for c, p in zip(constrained, plain))}


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def report(args, results: dict) -> str:
    lines = ["# JSON-schema constraint: per-token cost against unconstrained decoding", "",
             f"- CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; load average at the start {args.load:.1f}",
             f"- {args.tokens} generated tokens per run, median of {args.repeat} alternating rounds; "
             "slower = constrained time per token / unconstrained (the median of the paired rounds)", "",
             "| model | vocabulary | vocabulary to llguidance | batch 1 greedy ms/token (plain → constrained) | slower "
             "| batch 1 sampled ms/token | slower | mask work ms/token "
             f"| {args.streams}-stream server tokens/s (plain → constrained) | slower |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for model, r in results.items():
        g, s, srv = r["greedy"], r["sampled"], r["server"]
        lines.append(f"| {model} | {r['n_vocab']:,} | {r['vocabulary_s']:.2f} s | {g['plain_ms']:.1f} → "
                     f"{g['constrained_ms']:.1f} | {(g['ratio'] - 1) * 100:+.1f}% | {s['plain_ms']:.1f} → "
                     f"{s['constrained_ms']:.1f} | {(s['ratio'] - 1) * 100:+.1f}% | {r['mask_ms']:.2f} | "
                     f"{srv['plain']:.1f} → {srv['constrained']:.1f} | {(srv['ratio'] - 1) * 100:+.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--record", default=None, help="also write the report (markdown) to this file")
    args = parser.parse_args()
    args.load = os.getloadavg()[0]
    results = {}
    for model in args.models.split(","):
        results[model] = batch1(model, args.tokens, args.repeat)
        results[model]["server"] = server(model, args.streams, args.tokens, max(3, args.repeat // 2))
        print(json.dumps({model: results[model]}), flush=True)
    text = report(args, results)
    print(text)
    if args.record:
        with open(args.record, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
