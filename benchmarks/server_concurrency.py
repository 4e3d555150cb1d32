"""Aggregate generation speed of `ember serve` with concurrent streams, against one stream.

    python benchmarks/server_concurrency.py [--model smollm2-135m] [--streams 1,4] [--tokens 128]
                                            [--repeat 3] [--threads N] [--record FILE]

Starts the real server on 127.0.0.1 (--parallel = the largest stream count), then for each
stream count sends that many streaming completions at once (a different prompt each,
temperature 0, end-of-generation tokens banned so that each generates exactly --tokens
tokens) and measures generated tokens per second of wall time, from the first request sent
to the last `data: [DONE]`. Each count is run --repeat times, the counts interleaved; the
median is reported, and the median of the rounds' own ratios (each round's n streams against
the single stream run just before it), which a drift in the machine's speed disturbs less.

Continuous batching advances every stream by one token per graph run, reading each weight
once per step for all of them, so the aggregate speed grows with the streams. The target:
4 streams >= 2.5x the speed of one.

Before the server starts, the same batch sizes are timed on the runtime alone
(`Model.decode_batch`, in this process, wall and CPU time per step, median of 30), so the
report shows how much of the speed-up the core's batched decode allows and what the server
adds on top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial

import httpx
from runner import print_and_record, run_at_once

PROMPTS = ["Once upon a time, in a small village,", "The history of the Roman empire", "Here is a recipe for bread:",
           "The best advice I ever got was", "In the year 2100, cities", "A letter to my younger self:",
           "The rules of chess are", "Deep in the ocean there"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_server(name: str, command_on_port) -> tuple[subprocess.Popen, str]:
    """Start command_on_port(port) on a free port of 127.0.0.1 and wait until GET /health
    answers 200 (two minutes at most); the process and its URL. name is for the errors."""
    port = free_port()
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(command_on_port(port), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if process.poll() is not None:
            log.seek(0)
            raise SystemExit(f"{name} exited:\n{log.read().decode(errors='replace')[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"{name} did not start")


def start_server(model: str, parallel: int, threads: int | None, n_ctx: int, stream_interval_ms: float | None = None):
    return launch_server("ember serve", lambda port: [
        sys.executable, "-m", "ember", "serve", "-m", model, "--port", str(port), "--parallel", str(parallel),
        "-c", str(n_ctx)] + (["-t", str(threads)] if threads else [])
        + ([] if stream_interval_ms is None else ["--stream-interval", str(stream_interval_ms)]))


def end_of_generation_ids(model: str) -> list[int]:
    from ember.gguf import open_gguf
    from ember.hub import resolve_model
    from ember.tokenizer.tokenizer import Tokenizer

    return sorted(Tokenizer.from_gguf(open_gguf(resolve_model(model))).eog_ids)


_client: httpx.Client | None = None


def client() -> httpx.Client:
    """One client for every request (thread-safe; its connections are kept alive): a fresh one
    per request would spend the shared cores on building an SSL context and a connection."""
    global _client
    if _client is None:
        _client = httpx.Client(timeout=600)
    return _client


def stream(url: str, prompt: str, n_tokens: int, banned: list[int], out: list, index: int) -> None:
    body = {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "logit_bias": {str(t): -100 for t in banned}}
    n_generated = 0
    with client().stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            # only the usage chunk is parsed: the client shares the server's cores
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    n_generated = usage["completion_tokens"]
    out[index] = n_generated


def aggregate_speed(url: str, n_streams: int, n_tokens: int, banned: list[int]) -> float:
    """Generated tokens per second of wall time with n_streams at once."""
    counts = [0] * n_streams
    seconds = run_at_once([partial(stream, url, PROMPTS[i % len(PROMPTS)], n_tokens, banned, counts, i)
                           for i in range(n_streams)])
    if counts != [n_tokens] * n_streams:
        raise SystemExit(f"expected {n_tokens} tokens per stream, got {counts}")
    return sum(counts) / seconds


def decode_step_times(model_name: str, counts: list[int], threads: int | None, n_ctx: int,
                      repeat: int = 30) -> dict[int, tuple[float, float]]:
    """Median (wall, CPU) seconds of one Model.decode_batch step of each batch size."""
    from ember.engine.runtime import Model
    from ember.hub import resolve_model

    model = Model(resolve_model(model_name), n_ctx=n_ctx, n_seq=max(counts), n_threads=threads)
    prompt = list(range(100, 116))
    for seq in range(max(counts)):
        model.eval(prompt, seq=seq)
    times = {}
    for n in counts:
        walls, cpus = [], []
        for _ in range(repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            model.decode_batch([(seq, 200 + seq) for seq in range(n)])
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            for seq in range(n):
                model.truncate(len(prompt), seq)
        times[n] = (statistics.median(walls), statistics.median(cpus))
    model.close()
    return times


def report(args, speeds: dict[int, list[float]], steps: dict[int, tuple[float, float]]) -> str:
    base = statistics.median(speeds[min(speeds)])
    lines = [f"# ember serve: aggregate generation speed with concurrent streams ({args.model})", "",
             f"- machine: {platform.machine()}, {os.cpu_count()} logical CPUs, "
             f"load average at the start {args.load_before:.1f}; ember threads: {args.threads or 'default'}",
             f"- {args.tokens} generated tokens per stream, temperature 0, median of {args.repeat} rounds",
             f"- server: --parallel {max(speeds)}, -c {args.ctx}", "",
             "| streams | aggregate tokens/s (median) | rounds | vs 1 stream |", "|---:|---:|---|---:|"]
    for n, values in sorted(speeds.items()):
        rounds = ", ".join(f"{v:.1f}" for v in values)
        lines.append(f"| {n} | {statistics.median(values):.1f} | {rounds} | {statistics.median(values) / base:.2f}x |")
    single = speeds[min(speeds)]
    for n, values in sorted(speeds.items()):
        if n != min(speeds):  # each round's n streams against the single stream measured just before
            paired = sorted(v / s for v, s in zip(values, single))
            lines += ["", f"{n} streams against 1, round by round: median {statistics.median(paired):.2f}x "
                          f"(from {paired[0]:.2f}x to {paired[-1]:.2f}x)"]
    one_wall, one_cpu = steps[min(steps)]
    lines += ["", "The runtime alone (`Model.decode_batch`, one step of n sequences):", "",
              "| sequences | wall ms / step | CPU ms / step | tokens/s vs 1 (wall) | tokens/s vs 1 (CPU) |",
              "|---:|---:|---:|---:|---:|"]
    for n, (wall, cpu) in sorted(steps.items()):
        lines.append(f"| {n} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | {n * one_wall / wall:.2f}x | "
                     f"{n * one_cpu / cpu:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--streams", default="1,4", help="comma-separated stream counts")
    parser.add_argument("--tokens", type=int, default=128, help="generated tokens per stream")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="ember compute threads (default: physical cores)")
    parser.add_argument("--ctx", type=int, default=512, help="context per slot")
    parser.add_argument("--record", default=None, help="also write the report (markdown) to this file")
    args = parser.parse_args()
    counts = sorted({int(n) for n in args.streams.split(",")})
    args.load_before = os.getloadavg()[0]
    banned = end_of_generation_ids(args.model)
    steps = decode_step_times(args.model, counts, args.threads, args.ctx)
    process, url = start_server(args.model, max(counts), args.threads, args.ctx)
    try:
        aggregate_speed(url, max(counts), 8, banned)  # warm up every slot
        speeds: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(args.repeat):
            for n in counts:  # interleaved, so a change in machine load touches every count alike
                speeds[n].append(aggregate_speed(url, n, args.tokens, banned))
    finally:
        process.terminate()
        process.wait()
    print_and_record(report(args, speeds, steps), args.record)


if __name__ == "__main__":
    main()
