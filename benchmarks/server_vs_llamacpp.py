"""`ember serve` beside `llama-server` with many concurrent streams: aggregate tokens/s and time
to first token, same model file, cores, slots and client, in one run.

    python benchmarks/server_vs_llamacpp.py [--model smollm2-135m] [--streams 8,16] [--tokens 64]
        [--rounds 3] [-t 2] [--ctx 512] [--llama-bin DIR] [--record FILE]

Both servers run on 127.0.0.1 with --parallel = the largest stream count (llama-server with
continuous batching, -cb, and a total context of slots x --ctx, since its -c is shared by the
slots where ember's is per slot). For each round and each stream count, each engine in turn
gets that many streaming completions at once (a different prompt each, temperature 0, the
end-of-generation tokens banned through logit_bias so that every stream runs to --tokens), from
the same client: generated tokens per second of wall time from the first request sent to the
last stream's end, and each stream's time to its first token. Only one server has work at a
time. The report gives medians over the rounds, the median of the rounds' own ember/llama.cpp
ratios, and the time to first token at p50 and p95 over every stream of every round.

Target (issue: many streams): ember >= 1.2x llama-server's aggregate tokens/s at 8 and 16 streams.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from functools import partial


from runner import ember_version, llama_binary, llama_version, machine_summary, print_and_record, run_at_once
from server_concurrency import PROMPTS, client, end_of_generation_ids, launch_server, start_server

ENGINES = ("ember", "llama.cpp")


def start_llama_server(path: str, parallel: int, threads: int, n_ctx: int):
    return launch_server("llama-server", lambda port: [
        llama_binary("llama-server"), "-m", path, "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(parallel), "-cb", "-c", str(parallel * n_ctx), "-t", str(threads), "--no-webui"])


def stream(url: str, prompt: str, n_tokens: int, banned: list[int], out: list, index: int) -> None:
    """One streaming completion: (tokens generated, seconds to the first text)."""
    body = {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "logit_bias": {str(t): -100 for t in banned}}
    start = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    with client().stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            choices = chunk.get("choices") or []
            if choices and choices[0].get("text"):
                chunks += 1
                if first is None:
                    first = time.perf_counter() - start
    # the tokens the server counted where it says (a chunk may carry several tokens' text)
    out[index] = (usage["completion_tokens"] if usage else chunks, first)


def one_load(url: str, n_streams: int, n_tokens: int, banned: list[int]) -> tuple[float, list[float], int]:
    """n_streams completions at once: aggregate tokens per second, each stream's time to first
    token, and the fewest tokens a stream gave."""
    results: list = [None] * n_streams
    seconds = run_at_once([partial(stream, url, PROMPTS[i % len(PROMPTS)] + f" ({i})", n_tokens, banned, results, i)
                           for i in range(n_streams)])
    if any(r is None or r[1] is None for r in results):
        raise SystemExit(f"a stream gave no text: {results}")
    return sum(r[0] for r in results) / seconds, [r[1] for r in results], min(r[0] for r in results)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def report(args, path: str, speeds, firsts, fewest) -> str:
    lines = [f"# ember serve beside llama-server, concurrent streams ({args.model})", "",
             f"- {machine_summary()}; load average at the start {args.load_before:.1f}",
             f"- ember {ember_version()}; llama.cpp {llama_version(llama_binary('llama-server'))}",
             f"- file: {os.path.basename(path)}; -t {args.threads}; --parallel {max(args.counts)} slots of "
             f"{args.ctx} tokens each; {args.tokens} tokens per stream (fewest seen: "
             + ", ".join(f"{e} {fewest[e]}" for e in ENGINES) + f"), temperature 0; {args.rounds} rounds", "",
             "| streams | ember tokens/s | llama-server tokens/s | ember / llama (median of rounds) | "
             "TTFT p50 / p95 ember (ms) | TTFT p50 / p95 llama (ms) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for n in args.counts:
        e, ll = speeds["ember"][n], speeds["llama.cpp"][n]
        ratio = statistics.median(a / b for a, b in zip(e, ll))
        ttft = {engine: (percentile(firsts[engine][n], 50) * 1e3, percentile(firsts[engine][n], 95) * 1e3)
                for engine in ENGINES}
        lines.append(f"| {n} | {statistics.median(e):.1f} | {statistics.median(ll):.1f} | {ratio:.2f}x | "
                     f"{ttft['ember'][0]:.0f} / {ttft['ember'][1]:.0f} | "
                     f"{ttft['llama.cpp'][0]:.0f} / {ttft['llama.cpp'][1]:.0f} |")
    lines += ["", "Rounds (tokens/s): " + "; ".join(
        f"{n} streams: ember {', '.join(f'{v:.1f}' for v in speeds['ember'][n])} / llama "
        f"{', '.join(f'{v:.1f}' for v in speeds['llama.cpp'][n])}" for n in args.counts)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="registry name, ORG/REPO[:QUANT] or .gguf path")
    parser.add_argument("--streams", default="8,16", help="comma-separated stream counts")
    parser.add_argument("--tokens", type=int, default=64, help="generated tokens per stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=512, help="context per slot")
    parser.add_argument("--llama-bin", default=None, help="folder of llama-server (else $LLAMA_CPP_BIN, PATH)")
    parser.add_argument("--record", default=None, help="also write the report (markdown) to this file")
    args = parser.parse_args()
    if args.llama_bin:
        os.environ["LLAMA_CPP_BIN"] = args.llama_bin
    from ember.hub import resolve_model

    path = str(resolve_model(args.model))
    args.counts = sorted({int(n) for n in args.streams.split(",")})
    args.load_before = os.getloadavg()[0]
    banned = end_of_generation_ids(path)
    servers = {}
    try:
        servers["ember"] = start_server(path, max(args.counts), args.threads, args.ctx)
        servers["llama.cpp"] = start_llama_server(path, max(args.counts), args.threads, args.ctx)
        for engine in ENGINES:  # warm up every slot
            one_load(servers[engine][1], max(args.counts), 4, banned)
        speeds = {e: {n: [] for n in args.counts} for e in ENGINES}
        firsts = {e: {n: [] for n in args.counts} for e in ENGINES}
        fewest = {e: args.tokens for e in ENGINES}
        for _ in range(args.rounds):
            for n in args.counts:
                for engine in ENGINES:  # alternate, so a change in machine load touches both alike
                    speed, ttfts, least = one_load(servers[engine][1], n, args.tokens, banned)
                    speeds[engine][n].append(speed)
                    firsts[engine][n].extend(ttfts)
                    fewest[engine] = min(fewest[engine], least)
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait()
    print_and_record(report(args, path, speeds, firsts, fewest), args.record)


if __name__ == "__main__":
    main()
