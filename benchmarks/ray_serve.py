"""ember on Ray Serve against as many plain `ember serve` processes on the same cores.

    python benchmarks/ray_serve.py [--model smollm2-135m] [--replicas 1,2] [--clients 8] [--tokens 32]
                                   [--repeat 3] [--latency 20] [--parallel 4] [--plain-ray] [--stream-interval MS]
                                   [--record FILE]

For each replica count n: n `ember serve` processes (-t 1, --parallel P, each on its own port; the
clients take them in turn, as a round-robin load balancer would) and a local Ray cluster of
n CPUs without a dashboard serving ember.server.ray's application with n replicas of one thread
and P slots, behind Ray Serve's proxy. Then, alternating direct and Ray round by round so that a
change in the machine's load touches both alike:

- aggregate speed: --clients streaming completions at once (greedy, end-of-generation banned, so
  each makes exactly --tokens tokens), generated tokens per second of wall time;
- overhead per request: --latency sequential requests of each kind, median seconds: GET /health
  (no model work: what the proxy and the router add), a 1-token and a 64-token completion
  (not streamed; greedy, end-of-generation banned; the 64-token one a fifth as many times).

The Ray cluster runs in ember's cluster_environment (what `ember serve --ray` starts a local
cluster with: the proxy's middleware, Ray's gRPC path from the proxy to the replicas, one event
loop each); `--plain-ray` leaves Ray's defaults.

Medians of --repeat rounds are reported, and each round's Ray / direct ratio.

`--chats N` measures the cache affinity instead: on 2 replicas, N chats of --turns turns each
(greedy, 16 tokens a reply) sent once with an X-Session-ID header per chat and once without;
reported are the prompt tokens the replicas evaluated (ember_prompt_tokens_total, summed over
both) against the prompt tokens the requests carried, and how many turns changed replica.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from runner import run_at_once
from server_concurrency import PROMPTS, client, end_of_generation_ids, free_port, start_server, stream

from ember.server.ray import REPLICA_HEADER, SESSION_HEADER, STREAM_INTERVAL
from ember.sysinfo import cpu_name


def aggregate_speed(urls: list[str], n_clients: int, n_tokens: int, banned: list[int]) -> float:
    """Generated tokens per second of wall time, n_clients streams at once spread over urls."""
    counts = [0] * n_clients
    seconds = run_at_once([partial(stream, urls[i % len(urls)], PROMPTS[i % len(PROMPTS)], n_tokens, banned, counts, i)
                           for i in range(n_clients)])
    if counts != [n_tokens] * n_clients:
        raise SystemExit(f"expected {n_tokens} tokens per stream, got {counts}")
    return sum(counts) / seconds


def latencies(url: str, n: int, banned: list[int]) -> dict[str, float]:
    """Median seconds of a GET /health and of a 1-token and a 64-token completion, n sequential
    requests each (n // 5 of the 64-token one)."""
    found = {}
    for name, method, route, body, count in (
            ("health", "GET", "/health", None, n),
            *((f"{tokens}-token completion", "POST", "/v1/completions",
               {"prompt": "Hi", "max_tokens": tokens, "temperature": 0, "logit_bias": {str(t): -100 for t in banned}},
               n if tokens == 1 else max(1, n // 5)) for tokens in (1, 64))):
        times = []
        for _ in range(count):
            start = time.perf_counter()
            client().request(method, f"{url}{route}", json=body).raise_for_status()
            times.append(time.perf_counter() - start)
        found[name] = statistics.median(times)
    return found


def start_ray(n_replicas: int, model: str, parallel: int, n_ctx: int, plain: bool = False,
              stream_interval_ms: float | None = None) -> str:
    import ray
    from ray import serve

    from ember.server.ray import cluster_environment, ember_app

    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent / "src"),
                                                os.environ.get("PYTHONPATH", "")])
    for name in cluster_environment():
        os.environ.pop(name, None)
    if not plain:
        os.environ.update(cluster_environment())
    ray.init(num_cpus=n_replicas, include_dashboard=False, logging_level="warning", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    interval = {} if stream_interval_ms is None else {"stream_interval": stream_interval_ms / 1000}
    serve.run(ember_app(model, replicas=n_replicas, threads=1, parallel=parallel, n_ctx=n_ctx, **interval),
              name="ember", route_prefix="/")
    return f"http://127.0.0.1:{port}"


def stop_ray() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def measure(args, n: int, banned: list[int]) -> dict:
    direct = [start_server(args.model, args.parallel, 1, args.ctx, args.stream_interval) for _ in range(n)]
    direct_urls = [url for _, url in direct]
    try:
        ray_url = start_ray(n, args.model, args.parallel, args.ctx, args.plain_ray, args.stream_interval)
        try:
            for urls in (direct_urls, [ray_url]):  # warm up every slot
                aggregate_speed(urls, n * args.parallel, 4, banned)
            found = {"direct": {"speed": [], "latency": []}, "ray": {"speed": [], "latency": []}}
            for _ in range(args.repeat):
                for kind, urls in (("direct", direct_urls), ("ray", [ray_url])):
                    found[kind]["speed"].append(aggregate_speed(urls, args.clients, args.tokens, banned))
                    found[kind]["latency"].append(latencies(urls[0], args.latency, banned))
            return found
        finally:
            stop_ray()
    finally:
        for process, _ in direct:
            process.terminate()
            process.wait()


def replica_metrics(url: str, n_replicas: int) -> dict[str, float]:
    """ember_prompt_tokens_total of every replica (each reached through a session that lands on it)."""
    found: dict[str, float] = {}
    for i in range(1000):
        response = client().get(f"{url}/metrics", headers={SESSION_HEADER: f"probe-{i}"})
        line = next(line for line in response.text.splitlines() if line.startswith("ember_prompt_tokens_total "))
        found[response.headers[REPLICA_HEADER]] = float(line.split()[1])
        if len(found) == n_replicas:
            return found
    raise SystemExit(f"found {len(found)} of {n_replicas} replicas")


def chats(url: str, n_chats: int, n_turns: int, sessions: bool) -> dict:
    """Evaluated and sent prompt tokens over n_chats chats of n_turns, and the turns that moved."""
    before = replica_metrics(url, 2)
    sent, moved = 0, 0
    histories = [[] for _ in range(n_chats)]
    last: list[str | None] = [None] * n_chats
    for turn in range(n_turns):
        for chat, messages in enumerate(histories):
            messages.append({"role": "user", "content": f"Chat {chat} ({sessions=}), question {turn}: "
                                                        f"tell me about {PROMPTS[turn % len(PROMPTS)]}"})
            headers = {SESSION_HEADER: f"chat-{chat}"} if sessions else {}
            response = client().post(f"{url}/v1/chat/completions", headers=headers,
                                     json={"messages": messages, "max_tokens": 16, "temperature": 0})
            response.raise_for_status()
            answer = response.json()
            messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            sent += answer["usage"]["prompt_tokens"]
            replica = response.headers[REPLICA_HEADER]
            moved += last[chat] is not None and replica != last[chat]
            last[chat] = replica
    after = replica_metrics(url, 2)
    return {"sent": sent, "evaluated": sum(after[r] - before[r] for r in after), "moved": moved}


def affinity_report(args) -> str:
    url = start_ray(2, args.model, args.parallel, args.ctx, args.plain_ray)
    try:
        found = {"with X-Session-ID": chats(url, args.chats, args.turns, True),
                 "without": chats(url, args.chats, args.turns, False)}
    finally:
        stop_ray()
    lines = [f"# ember on Ray Serve: cache affinity of growing chats ({args.model})", "",
             f"- 2 replicas (1 thread, --parallel {args.parallel}); {args.chats} chats of {args.turns} turns, "
             "16 greedy tokens a reply", "",
             "| requests | prompt tokens sent | evaluated by the replicas | evaluated / sent | turns that changed replica |",
             "|---|---:|---:|---:|---:|"]
    for name, result in found.items():
        lines.append(f"| {name} | {result['sent']} | {result['evaluated']:.0f} | "
                     f"{result['evaluated'] / result['sent']:.2f} | {result['moved']} of {args.chats * (args.turns - 1)} |")
    return "\n".join(lines) + "\n"


def stream_intervals(args) -> str:
    if args.stream_interval is not None:
        return f"{args.stream_interval:g} ms on both"
    return f"0 ms direct, {STREAM_INTERVAL * 1000:g} ms on Ray (the defaults)"


def report(args, results: dict[int, dict]) -> str:
    lines = [f"# ember on Ray Serve against plain `ember serve` ({args.model})", "",
             f"- machine: {cpu_name()} ({platform.machine()}), {os.cpu_count()} logical CPUs, "
             f"load average at the start {args.load_before:.1f}, at the end {os.getloadavg()[0]:.1f}",
             f"- Ray cluster: {'Ray defaults (--plain-ray)' if args.plain_ray else 'ember cluster_environment'}",
             f"- stream interval: {stream_intervals(args)}",
             f"- each engine: 1 thread, --parallel {args.parallel}, -c {args.ctx}; {args.clients} streaming clients "
             f"of {args.tokens} tokens; {args.latency} sequential requests per latency; median of {args.repeat} "
             "alternating rounds", "",
             "| engines | direct tokens/s | Ray Serve tokens/s | Ray / direct (median of rounds) | rounds (direct / Ray) |",
             "|---:|---:|---:|---:|---|"]
    for n, found in sorted(results.items()):
        direct, ray = found["direct"]["speed"], found["ray"]["speed"]
        ratio = statistics.median(r / d for r, d in zip(ray, direct))
        rounds = "; ".join(f"{d:.1f} / {r:.1f}" for d, r in zip(direct, ray))
        lines.append(f"| {n} | {statistics.median(direct):.1f} | {statistics.median(ray):.1f} | {ratio:.2f} | "
                     f"{rounds} |")
    lines += ["", "| engines | request | direct ms | Ray Serve ms | added ms | Ray / direct |",
              "|---:|---|---:|---:|---:|---:|"]
    for n, found in sorted(results.items()):
        for name in found["direct"]["latency"][0]:
            direct = statistics.median(r[name] for r in found["direct"]["latency"]) * 1e3
            ray = statistics.median(r[name] for r in found["ray"]["latency"]) * 1e3
            lines.append(f"| {n} | {name} | {direct:.1f} | {ray:.1f} | {ray - direct:+.1f} | {ray / direct:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--replicas", default="1,2", help="comma-separated engine counts")
    parser.add_argument("--clients", type=int, default=8, help="streams at once")
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per stream")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency", type=int, default=20, help="sequential requests per latency measurement")
    parser.add_argument("--parallel", type=int, default=4, help="slots per engine")
    parser.add_argument("--ctx", type=int, default=512, help="context per slot")
    parser.add_argument("--chats", type=int, default=0, help="measure the cache affinity of this many chats instead")
    parser.add_argument("--turns", type=int, default=4, help="turns per chat (with --chats)")
    parser.add_argument("--plain-ray", action="store_true", help="Ray's defaults, not ember's cluster_environment")
    parser.add_argument("--stream-interval", type=float, default=None, metavar="MS",
                        help="both servers' --stream-interval (default: each one's own, 0 direct, "
                             "ember.server.ray.STREAM_INTERVAL on Ray)")
    parser.add_argument("--record", default=None, help="also write the report (markdown) to this file")
    args = parser.parse_args()
    args.load_before = os.getloadavg()[0]
    if args.chats:
        text = affinity_report(args)
    else:
        banned = end_of_generation_ids(args.model)
        results = {n: measure(args, n, banned) for n in sorted({int(n) for n in args.replicas.split(",")})}
        text = report(args, results)
    print(text)
    if args.record:
        Path(args.record).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
