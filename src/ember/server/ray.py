"""Scale-out on Ray Serve: replicas that are ember engines behind Ray Serve's HTTP proxy.

Each replica builds exactly what `ember serve` runs (build_server: the model, its continuous-
batching scheduler and the FastAPI app with every route and error), and Ray Serve's proxy hands
it whole HTTP requests (`@serve.ingress`), so clients see the same API on one machine or many.
Ray brings the rest: placing replicas on nodes (`threads` CPUs each), restarting dead ones
(a replica is unhealthy once its scheduler thread has ended), autoscaling on ongoing requests.

    ember serve --ray -m smollm2-135m --replicas 2 -t 1 --parallel 4    # ember.cli.serve
    serve run ember.server.ray:build_app model=smollm2-135m replicas=2 threads=1
    serve run ember.config.yaml                                        # see CONFIG_EXAMPLE

Routing keeps a conversation's KV cache warm: requests carrying the same `X-Session-ID`
header go to the same replica (SessionAffinityRouter), whose scheduler then reuses the cached
prefix of the growing chat; requests without one go to the replica with the fewest under way.
A stream's tokens go to the proxy at most every STREAM_INTERVAL seconds (one Ray message each).
Every answer names its replica in the `X-Ember-Replica` header.

A replica that dies mid-request (its process killed, its node lost) leaves Ray's proxy with
no answer to give, which it sends as a plain-text 500 or a stream cut short. The proxy's
middleware (proxy_middlewares, which Ray's proxies load from RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH:
see cluster_environment) sends such a request once more, to another replica, if nothing of its
answer was sent yet; else it answers as `ember serve` does: a 503 with Retry-After and an
OpenAI-style error body, or for a stream already under way an error event, then `[DONE]`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import random
import time

from ray import serve
from ray.serve.request_router import RequestRouter

from ember.errors import EmberError
from ember.server.schemas import error_body

PROXY_CALLBACK = "ember.server.ray:proxy_middlewares"
SESSION_HEADER = "X-Session-ID"  # Ray Serve's session header (RAY_SERVE_SESSION_ID_HEADER_KEY)
REPLICA_HEADER = "x-ember-replica"
DEFAULT_PARALLEL = 4
RETRY_AFTER_SECONDS = 1
BODY_KEY = "ember.body"  # a request's body, read by the proxy, travels in its ASGI scope under this key
MAX_SCOPE_BODY = 64 << 10  # bodies up to this size travel so (larger ones the replica reads from the proxy)
CHOICE_LIFETIME = 3600.0  # seconds a routing choice counts as an ongoing request at most
ENDED_KEPT = 4096  # ended request ids the router remembers, so that a late report of their routing is not counted
STREAM_INTERVAL = 0.05  # seconds: a replica's streams send their tokens at most this often (one Ray message each)

CONFIG_EXAMPLE = """\
# serve run ember.config.yaml   (or: serve deploy ember.config.yaml on a running cluster)
applications:
  - name: ember
    route_prefix: /
    import_path: ember.server.ray:build_app
    args:
      model: smollm2-135m      # a registry name, a path on every node, or a Hugging Face repo
      replicas: 2              # or min_replicas / max_replicas / target_ongoing_requests
      threads: 1               # compute threads (and Ray CPUs) per replica
      parallel: 4              # sequence slots per replica
"""


class SessionAffinityRouter(RequestRouter):
    """Ray Serve request router: a request with a session id (Ray's proxy takes it from the
    X-Session-ID header) prefers the replicas in the order of their rendezvous hash with it,
    so a session keeps its replica while that one lives and accepts work, and only the sessions
    of a replica that went away move; a request without one prefers the replicas with the
    fewest requests this router gave them that have not ended (ties in random order).

    The router counts those itself, from the moment it chooses: Ray's own queue lengths go stale
    after a pause (RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S), and then requests that arrive together
    are all routed on the same probe's answer, so that 8 streams on 2 replicas of 4 slots split
    5 and 3 and one waits for a whole answer. A choice counts for the request it was made for
    until Ray reports (on_request_routed) which replica took which request: Ray hands a chosen
    replica to the oldest waiting request, not always to the one it was chosen for."""

    def initialize_state(self, **kwargs):
        # request id -> (replica id, when): the replica Ray sent the request to, or until then the
        # one this router last chose for it
        self._chosen: dict[str, tuple[str, float]] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()  # the latest ENDED_KEPT

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if not candidate_replicas:
            return []
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        session = pending_request.metadata.session_id if pending_request is not None else ""
        request = pending_request.metadata.internal_request_id if pending_request is not None else None
        order = (preferred_replicas(session, list(by_id)) if session
                 else least_busy(self._ongoing(leaving_out=request), list(by_id)))
        if request is not None:
            self._chosen[request] = (order[0], time.monotonic())
        return [[by_id[replica]] for replica in order]

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        request = pending_request.metadata.internal_request_id
        if request not in self._ended:  # its end may be reported first
            self._chosen[request] = (replica_id.unique_id, time.monotonic())

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self._chosen.pop(internal_request_id, None)
        self._ended[internal_request_id] = None
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _ongoing(self, leaving_out: str | None = None) -> dict[str, int]:
        """Requests per replica id that this router chose and that have not ended, but for
        `leaving_out` (the request being routed again: its earlier choice went to another request
        or was refused). Entries of requests that were never sent, as when their client left while
        they waited, lapse after CHOICE_LIFETIME seconds."""
        now = time.monotonic()
        for request, (_, when) in list(self._chosen.items()):
            if now - when > CHOICE_LIFETIME:
                del self._chosen[request]
        return collections.Counter(replica for request, (replica, _) in self._chosen.items() if request != leaving_out)


def least_busy(ongoing: dict[str, int], replicas: list[str]) -> list[str]:
    """The replica ids by their count of ongoing requests, fewest first, ties in random order."""
    return sorted(random.sample(replicas, len(replicas)), key=lambda replica: ongoing.get(replica, 0))


def preferred_replicas(session: str, replicas: list[str]) -> list[str]:
    """The replica ids in a session's order of preference: by rendezvous (highest random weight)
    hashing, so removing a replica moves only the sessions that preferred it."""
    def weight(replica: str) -> bytes:
        return hashlib.blake2b(f"{session}\0{replica}".encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)


@serve.ingress()
class EmberReplica:
    """One Ray Serve replica: an ember engine (see build_server for `server_options`)."""

    def __init__(self, model: str, server_options: dict):
        from ember.server import build_server

        self.asgi_app, self.scheduler = build_server(model, **server_options)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.asgi_app.add_middleware(_NameReplica, replica=self.replica)
        self.asgi_app.add_middleware(_BodyFromScope)

    def __serve_build_asgi_app__(self):
        return self.asgi_app

    def engine_options(self) -> dict:
        """What the replica's engine runs with, and the replica's id (a Ray call, not a route)."""
        from ember.engine.runtime import kv_cache_type_name

        model = self.scheduler.model
        return {"replica": self.replica, "n_ctx": model.n_ctx, "n_threads": model.n_threads, "n_seq": model.n_seq, "n_batch": model.n_batch,
                "activations": model.activations, "type_k": kv_cache_type_name(model.type_k),
                "type_v": kv_cache_type_name(model.type_v)}

    def check_health(self) -> None:
        """Ray restarts a replica whose health check raises."""
        if not self.scheduler.alive:
            raise RuntimeError("the ember scheduler thread has ended")

    def __del__(self):
        self.scheduler.stop()


class _BodyFromScope:
    """ASGI middleware: a request whose body came in its scope (see CleanReplicaErrors) reads it
    from there, not through a Ray call back to the proxy; the proxy's copy that Ray fetches
    anyway is passed over, the messages after it (the client's disconnect) are not."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        body = scope.get(BODY_KEY) if scope["type"] == "http" else None
        if body is None:
            return await self.app(scope, receive, send)
        first = [{"type": "http.request", "body": body, "more_body": False}]

        async def scoped_receive():
            if first:
                return first.pop()
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return message

        return await self.app(scope, scoped_receive, send)


class _NameReplica:
    """ASGI middleware: each answer's X-Ember-Replica header names the replica that gave it."""

    def __init__(self, app, replica: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope, receive, send):
        async def named_send(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        return await self.app(scope, receive, named_send if scope["type"] == "http" else send)


def cluster_environment() -> dict[str, str]:
    """The environment variables the processes of a Ray cluster serving ember start with (set
    before `ray start`, or before ray.init starts a local cluster): Ray Serve's HTTP proxies
    load proxy_middlewares; and Ray's shorter paths for a request (those of its
    RAY_SERVE_THROUGHPUT_OPTIMIZED, less its direct ingress, which would bypass the proxy and
    its request router): the proxy sends requests to replicas over gRPC rather than as Ray
    actor calls, routes them on its own event loop, and a replica runs the app on its main
    event loop rather than on a thread of its own (ember's routes do their blocking work on
    threads of their own)."""
    return {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": PROXY_CALLBACK, "RAY_SERVE_PROXY_USE_GRPC": "1",
            "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0", "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}


def proxy_middlewares() -> list:
    """The ASGI middlewares of Ray Serve's HTTP proxy (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH)."""
    from starlette.middleware import Middleware

    return [Middleware(CleanReplicaErrors)]


class CleanReplicaErrors:
    """ASGI middleware around Ray Serve's HTTP proxy: what the proxy cannot answer (its replica
    died mid-request, no replica is there, Ray's own back-pressure or timeout) is answered in
    ember's error shape.

    - the proxy gave no answer at all: the request goes once more through the proxy (its body
      replayed), which routes it to a live replica; if that one gives none either, 503 with
      Retry-After and an OpenAI-style error body;
    - a stream of server-sent events that ended before its last part: an error event, then
      `data: [DONE]`, as `ember serve` ends a stream whose request failed;
    - Ray's own plain-text error answers (408, 429, 500, 503): the same status and headers, the
      message in an OpenAI-style error body.

    A request whose client went away is left alone. A body of up to MAX_SCOPE_BODY bytes is read
    before the request goes on and travels in its scope (BODY_KEY), so the replica does not wait
    on a Ray call back to the proxy for it."""

    def __init__(self, app, retries: int = 1):
        self.app = app
        self.retries = retries

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        received, gone = [], False  # the request's body messages, for a second try

        async def recording_receive():
            nonlocal gone
            message = await receive()
            if message["type"] == "http.request":
                received.append(message)
            elif message["type"] == "http.disconnect":
                gone = True
            return message

        body = await _small_body(recording_receive, received) if scope.get("method") in ("POST", "PUT", "PATCH") else None
        if body is not None:
            scope = {**scope, BODY_KEY: body}
        for attempt in range(1 + self.retries):
            replay = list(received)

            async def attempt_receive():
                return replay.pop(0) if replay else await recording_receive()

            answer = _Answer(send)
            await self.app({**scope, "headers": list(scope.get("headers", []))}, attempt_receive, answer.send)
            if answer.complete or gone:
                return
            if answer.started:
                return await answer.end_stream()
        await _send_error(send, 503, "the replica serving this request stopped before it answered; retry",
                          "replica_unavailable", [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])


async def _small_body(receive, received: list) -> bytes | None:
    """The request's whole body if it is at most MAX_SCOPE_BODY bytes, else None (what was read
    of it stays in `received`, as every message `receive` gives)."""
    size = 0
    while not received or received[-1].get("more_body", False):
        count = len(received)
        message = await receive()
        if len(received) == count:  # not a body part: the client went away
            return None
        size += len(message.get("body", b""))
        if size > MAX_SCOPE_BODY:
            return None
    return b"".join(message.get("body", b"") for message in received)


_RAY_ERRORS = (408, 429, 500, 503)  # the statuses Ray's proxy answers with a message of its own


class _Answer:
    """One try's answer on its way to the client: whether it started and ended; Ray's plain-text
    error answers turned into error bodies."""

    def __init__(self, send):
        self._send = send
        self.started = self.complete = self.events = False
        self._held: dict | None = None  # a plain-text error's start, sent with its body

    async def send(self, message):
        kind = message["type"]
        if kind == "http.response.start":
            headers = dict(message.get("headers", []))
            content_type = headers.get(b"content-type", b"")
            if message["status"] in _RAY_ERRORS and content_type.startswith(b"text/plain"):
                self._held = message
                return
            self.events = content_type.startswith(b"text/event-stream")
            self.started = True
        elif kind == "http.response.body":
            if self._held is not None:
                held, self._held = self._held, None
                headers = [(k, v) for k, v in held.get("headers", []) if k.lower() not in (b"content-type",
                                                                                          b"content-length")]
                self.started = self.complete = True
                message_text = bytes(message.get("body", b"")).decode("utf-8", errors="replace").strip()
                return await _send_error(self._send, held["status"], message_text or "the request failed",
                                         None, headers)
            self.complete = not message.get("more_body", False)
        await self._send(message)

    async def end_stream(self) -> None:
        """End a stream that was cut short: an error event and [DONE] for server-sent events;
        any other body is left cut (its client sees a broken connection, not a whole answer)."""
        if not self.events:
            return
        error = error_body("the replica serving this stream stopped; retry the request", "server_error",
                           code="replica_unavailable")
        await self._send({"type": "http.response.body", "more_body": False,
                          "body": f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()})


async def _send_error(send, status: int, message: str, code: str | None, headers: list) -> None:
    kind = "server_busy" if status in (429, 503) else "server_error"
    body = json.dumps(error_body(message, kind, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def deployment_options(replicas: int | None = 1, threads: int = 1, parallel: int = DEFAULT_PARALLEL,
                       min_replicas: int | None = None, max_replicas: int | None = None,
                       target_ongoing_requests: float | None = None, queue_size: int | None = None) -> dict:
    """Ray Serve options for the replicas: a fixed number, or autoscaling between min and max
    replicas on `target_ongoing_requests` per replica (default: its `parallel` slots).

    A replica takes its `parallel` requests at once and as many more (at most its scheduler's
    `queue_size`) waiting in its own queue, so a slot that frees takes the next request at the
    scheduler's next step, as in `ember serve`; more wait in Ray's queue for a replica with room.
    (Ray's router tries again a request that no replica took after a pause that doubles each
    time, from 25 ms to 0.5 s: a replica with no request of its own waiting would sit idle that
    long between requests.)"""
    for name, value in (("replicas", replicas), ("threads", threads), ("parallel", parallel),
                        ("min_replicas", min_replicas), ("max_replicas", max_replicas)):
        if value is not None and (not isinstance(value, int) or value < (0 if name == "min_replicas" else 1)):
            raise EmberError(f"{name} must be a positive whole number, not {value!r}")
    waiting = parallel if queue_size is None else min(parallel, queue_size)
    options = {"ray_actor_options": {"num_cpus": threads}, "max_ongoing_requests": parallel + waiting,
               "request_router_config": {"request_router_class": SessionAffinityRouter}}
    scaling = autoscaling_range(min_replicas, max_replicas)
    if scaling is None:
        options["num_replicas"] = replicas
        return options
    low, high = scaling
    options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
                                     "target_ongoing_requests": target_ongoing_requests or parallel}
    return options


def autoscaling_range(min_replicas: int | None, max_replicas: int | None) -> tuple[int, int] | None:
    """(min, max) replicas to autoscale between, None for a fixed number (neither given);
    min defaults to 1, max to min."""
    if min_replicas is None and max_replicas is None:
        return None
    low = 1 if min_replicas is None else min_replicas
    high = max(low, 1) if max_replicas is None else max_replicas
    if high < low:
        raise EmberError(f"max_replicas ({high}) is below min_replicas ({low})")
    return low, high


def ember_app(model: str, replicas: int | None = 1, threads: int = 1, parallel: int = DEFAULT_PARALLEL,
              min_replicas: int | None = None, max_replicas: int | None = None,
              target_ongoing_requests: float | None = None, **server_options):
    """The Ray Serve application serving `model` (server_options: build_server's, such as n_ctx,
    queue_size, api_key, activations, type_k; n_threads and parallel are `threads` and `parallel`;
    stream_interval defaults to STREAM_INTERVAL here)."""
    server_options.setdefault("stream_interval", STREAM_INTERVAL)
    interval = server_options["stream_interval"]
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < float("inf"):
        raise EmberError(f"stream_interval must be a number of seconds >= 0, not {interval!r}")
    taken = sorted(set(server_options) & {"n_threads", "parallel"})
    if taken:
        raise EmberError(f"{taken[0]} is set by the Ray application's threads and parallel, not as a server option")
    options = deployment_options(replicas, threads, parallel, min_replicas, max_replicas, target_ongoing_requests,
                                 server_options.get("queue_size"))
    deployment = serve.deployment(EmberReplica, name="ember", **options)
    return deployment.bind(model, {**server_options, "n_threads": threads, "parallel": parallel})


APP_ARGS = {"model": str, "replicas": int, "threads": int, "parallel": int, "min_replicas": int, "max_replicas": int,
            "target_ongoing_requests": float, "n_ctx": int, "queue_size": int, "api_key": str, "activations": str,
            "n_batch": int, "use_mmap": bool, "use_mlock": bool, "huge_pages": bool, "chat_template": str, "cors_origins": str,
            "slots_endpoint": bool, "type_k": str, "type_v": str, "stream_interval": float}


def build_app(args: dict):
    """The application builder for `serve run ember.server.ray:build_app key=value ...` and for
    config files (their `args`): APP_ARGS are the keys it takes; `model` is required."""
    unknown = sorted(set(args) - set(APP_ARGS))
    if unknown:
        raise EmberError(f"unknown argument {unknown[0]!r}: ember's Ray app takes {', '.join(APP_ARGS)}")
    if "model" not in args:
        raise EmberError("the argument 'model' is required (a registry name, a path or a Hugging Face repo)")
    return ember_app(**{key: _typed(key, value) for key, value in args.items()})


def _typed(key: str, value):
    kind = APP_ARGS[key]
    if kind is bool and isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise EmberError(f"{key} must be true or false, not {value!r}")
        return value.lower() in ("true", "1")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise EmberError(f"{key} must be {_KIND_NAMES[kind]}, not {value!r}") from None


_KIND_NAMES = {int: "a whole number", float: "a number", str: "a string"}
