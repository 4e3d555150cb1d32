"""Per-token cost of a JSON-schema constraint against unconstrained decoding, at batch 1 and in
the 4-stream server.

    python benchmarks/constraint_overhead.py [--models smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m]
                                             [--tokens 96] [--repeat 5] [--streams 4] [--server-rounds N]
                                             [--only batch1,server] [--record FILE]

Batch 1 (`LLM.generation`, in this process): the same prompt decoded --tokens tokens without a
constraint (end-of-generation tokens banned, so it runs to the limit) and under a JSON schema
that cannot be complete before the limit (an array of at least 200 objects with a bounded
string, an integer range and an enum array), greedy and with the default sampler. Runs
alternate, constrained and not, --repeat times; the report gives the median milliseconds per
generated token of each and the median of the rounds' own ratios (each constrained run against
the unconstrained run just before it), which a drift in the machine's load disturbs less.

Each constrained run is made twice per round: with the mask computed in line (after the token
is sampled, before the graph runs it) and on a worker thread while the graph runs the token
(`Constraint.overlap`; ember's default is the worker only where the CPU has more logical CPUs
than physical cores, and the server runs with the default).

"mask work" replays a constrained run's tokens through a fresh matcher without the model:
milliseconds per token to move the matcher on, compute the mask and apply it to a row of
logits.

Server: `ember serve --parallel N` and N concurrent streaming completions (temperature 0), all
unconstrained or all under the schema, alternating; wall milliseconds per generated token (of
all streams together), median of the rounds, and the median of the paired ratios.

Each figure is given in wall time and in CPU time (this process's, or the server process's,
every thread): on a machine shared with other work the CPU time per token still counts the work
a constraint adds, where wall time also counts the waits for the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import numpy as np

from runner import print_and_record
from server_concurrency import PROMPTS, client, end_of_generation_ids, start_server

from ember.sysinfo import cpu_name

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

    def per_token(mode: dict, constrained: bool) -> tuple[tuple[float, float], list[int]]:
        params = ember.SamplingParams(logit_bias=banned, grammar=grammar if constrained else None, **mode)
        generation = llm.generation(prompt, params, max_tokens=tokens)
        next(generation)  # the prompt and the first token: not decoding
        cpu = time.process_time()
        generation.text()
        cpu = time.process_time() - cpu
        if generation.n_generated != tokens:
            raise SystemExit(f"{model}: expected {tokens} tokens, got {generation.n_generated}")
        return (generation.t_generate / generation.n_generated, cpu / (generation.n_generated - 1)), generation.tokens

    default_overlap = Constraint.overlap
    start = time.perf_counter()
    vocabulary(llm.tokenizer, llm.n_vocab)
    t_vocabulary = time.perf_counter() - start
    result = {"n_vocab": llm.n_vocab, "vocabulary_s": t_vocabulary}
    for name, mode in MODES.items():
        per_token(mode, True)  # warm up
        plain, in_line, threaded, ids = [], [], [], []
        for _ in range(repeat):
            plain.append(per_token(mode, False)[0])
            for overlap, times in ((False, in_line), (True, threaded)):
                Constraint.overlap = overlap
                seconds, ids = per_token(mode, True)
                times.append(seconds)
        Constraint.overlap = default_overlap
        result[name] = compared(plain, in_line)
        result[name + ", mask on a worker thread"] = compared(plain, threaded)
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


def compared(plain: list[tuple[float, float]], constrained: list[tuple[float, float]]) -> dict:
    """Medians of (wall, CPU) seconds per token, in ms, and the medians of the paired ratios."""
    out = {}
    for i, clock in enumerate(("wall", "cpu")):
        out[clock] = {"plain_ms": statistics.median(p[i] for p in plain) * 1e3,
                      "constrained_ms": statistics.median(c[i] for c in constrained) * 1e3,
                      "ratio": statistics.median(c[i] / p[i] for c, p in zip(constrained, plain))}
    return out


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) a process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def server_speed(url: str, streams: int, tokens: int, banned: list[int], schema: dict | None,
                 pid: int) -> tuple[float, float]:
    """(wall, server CPU) seconds per generated token with `streams` concurrent streams."""
    counts = [0] * streams
    threads = [threading.Thread(target=server_stream, args=(url, PROMPTS[i % len(PROMPTS)] + " As JSON:", tokens,
                                                            banned, schema, counts, i)) for i in range(streams)]
    start, cpu = time.perf_counter(), process_cpu(pid)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds, cpu = time.perf_counter() - start, process_cpu(pid) - cpu
    if counts != [tokens] * streams:
        raise SystemExit(f"expected {tokens} tokens per stream, got {counts}")
    return seconds / sum(counts), cpu / sum(counts)


def server(model: str, streams: int, tokens: int, repeat: int) -> dict:
    banned = end_of_generation_ids(model)
    process, url = start_server(model, streams, None, 1024)
    try:
        server_speed(url, streams, 8, banned, SCHEMA, process.pid)  # warm up: the vocabulary, every slot
        plain, constrained = [], []
        for _ in range(repeat):
            plain.append(server_speed(url, streams, tokens, banned, None, process.pid))
            constrained.append(server_speed(url, streams, tokens, banned, SCHEMA, process.pid))
    finally:
        process.terminate()
        process.wait()
    return compared(plain, constrained)


def report(args, results: dict) -> str:
    lines = ["# JSON-schema constraint: per-token cost against unconstrained decoding", "",
             f"- CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; load average at the start {args.load:.1f}",
             f"- {args.tokens} generated tokens per run, median of {args.repeat} alternating rounds (server: "
             f"{args.server_rounds}); slower: constrained / unconstrained per token, the median of the paired rounds",
             "", "| model (vocabulary) | vocabulary to llguidance | mask work ms/token | decode | wall ms/token "
             "(plain → constrained) | slower | CPU ms/token (plain → constrained) | slower |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for model, r in results.items():
        first = f"{model} ({r['n_vocab']:,})" if "n_vocab" in r else model
        for setting, key in (("batch 1, greedy", "greedy"), ("batch 1, greedy, mask on a worker thread",
                                                               "greedy, mask on a worker thread"),
                             ("batch 1, sampled", "sampled"), ("batch 1, sampled, mask on a worker thread",
                                                               "sampled, mask on a worker thread"),
                             (f"{args.streams}-stream server, greedy", "server")):
            if key not in r:  # not measured (--only)
                continue
            w, c = r[key]["wall"], r[key]["cpu"]
            head = (f"| {first} | {r['vocabulary_s']:.2f} s | {r['mask_ms']:.2f} " if "mask_ms" in r else
                    f"| {first} | – | – ") if first else "| | | "
            lines.append(f"{head}| {setting} | {w['plain_ms']:.2f} → {w['constrained_ms']:.2f} | "
                         f"{(w['ratio'] - 1) * 100:+.1f}% | {c['plain_ms']:.2f} → {c['constrained_ms']:.2f} | "
                         f"{(c['ratio'] - 1) * 100:+.1f}% |")
            first = ""
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--server-rounds", type=int, default=None, help="server rounds (default: --repeat / 2, >= 3)")
    parser.add_argument("--only", default="batch1,server", help="what to measure: batch1, server or both")
    parser.add_argument("--record", default=None, help="also write the report (markdown) to this file")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    if not parts or parts - {"batch1", "server"}:
        parser.error(f"--only takes batch1 and/or server, not {args.only!r}")
    args.server_rounds = args.server_rounds or max(3, args.repeat // 2)
    args.load = os.getloadavg()[0]
    results = {}
    for model in args.models.split(","):
        results[model] = batch1(model, args.tokens, args.repeat) if "batch1" in parts else {}
        if "server" in parts:
            results[model]["server"] = server(model, args.streams, args.tokens, args.server_rounds)
        print(json.dumps({model: results[model]}), flush=True)
    print_and_record(report(args, results), args.record)


if __name__ == "__main__":
    main()
