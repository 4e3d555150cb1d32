"""`ember serve`: the OpenAI-compatible server (ember.server) under uvicorn, or with --ray its
replicas behind Ray Serve's proxy (ember.server.ray)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading

from ember.cli.main import batch_size
from ember.errors import EmberError


def cli_serve(args) -> int:
    if args.ray:
        return serve_on_ray(args)
    ray_only = [flag for flag, value in (("--replicas", args.replicas), ("--min-replicas", args.min_replicas),
                                         ("--max-replicas", args.max_replicas),
                                         ("--target-ongoing-requests", args.target_ongoing_requests))
                if value is not None]
    if ray_only:
        raise EmberError(f"{ray_only[0]} needs --ray (replicas run on Ray Serve)")
    try:
        import uvicorn
    except ImportError:
        raise EmberError("the server needs fastapi and uvicorn: pip install fastapi uvicorn") from None
    sock = listening_socket(args.host, args.port)  # before loading: a busy port fails at once
    host, port = sock.getsockname()[:2]
    from ember.server import build_server

    app, scheduler = build_server(args.model, n_threads=args.threads, parallel=args.parallel, **server_options(args))
    try:
        model = scheduler.model
        activations = "" if model.activations == "int8" else f", {model.activations} activations"
        print(f"ember: serving {args.model} on http://{_url_host(host)}:{port} ({args.parallel} slots of "
              f"{model.n_ctx} tokens, {model.n_threads} threads{activations})", file=sys.stderr, flush=True)
        logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
        server = _server_class()(config)
        server.run(sockets=[sock])
    finally:
        scheduler.stop()
    if server.stopped_by == signal.SIGINT:
        # Ctrl-C ends `ember serve` with 130 whether or not uvicorn's re-raise of the signal
        # reached asyncio's runner before the serving task finished.
        raise KeyboardInterrupt
    return 0


def serve_on_ray(args) -> int:
    """The model's replicas on the Ray cluster at RAY_ADDRESS (or a local one started here, of this
    machine's CPUs), behind Ray Serve's proxy on --host/--port, until Ctrl-C or SIGTERM; then the
    application is deleted (and a local cluster shut down)."""
    app = ray_application(args)  # first: it says so when Ray Serve is missing
    import ray
    from ray import serve

    host, port = args.host, args.port
    if port == 0:
        with listening_socket(host, 0) as sock:  # Ray's proxy needs a port number: a free one
            port = sock.getsockname()[1]
    threads = args.threads or 1
    existing = bool(os.environ.get("RAY_ADDRESS"))
    if not existing:
        from ember.hub import resolve_model
        from ember.server.ray import cluster_environment

        resolve_model(args.model)  # pulled once here, not by every local replica at once
        for name, value in cluster_environment().items():  # the local cluster's processes inherit them
            os.environ.setdefault(name, value)
    ray.init(**({} if existing else {"include_dashboard": False}), logging_level=logging.WARNING,
             log_to_driver=False)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # after ray.init, whose own handler aborts
    try:
        n_replicas, replicas = _replica_plan(args)
        n_cpus = ray.cluster_resources().get("CPU", 0)
        if not existing and n_replicas * threads > n_cpus:
            raise EmberError(f"{_count(n_replicas, 'replica')} of {_count(threads, 'thread')} need "
                             f"{n_replicas * threads} CPUs; this machine's Ray cluster has {n_cpus:g}: "
                             "use fewer --replicas or -t")
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(app, name="ember", route_prefix="/")
            where = f"the Ray cluster at {os.environ['RAY_ADDRESS']}" if existing else "a local Ray cluster"
            print(f"ember: serving {args.model} on http://{_url_host(host)}:{port} through Ray Serve on {where} "
                  f"({replicas}, each {_count(args.parallel, 'slot')} and {_count(threads, 'thread')})",
                  file=sys.stderr, flush=True)
            try:
                while not stop.wait(0.5):
                    pass
            except KeyboardInterrupt:
                pass
        finally:
            if existing:
                serve.delete("ember")
            else:
                serve.shutdown()
    finally:
        ray.shutdown()
    return 0


def server_options(args) -> dict:
    """build_server's options from `ember serve`'s flags (all but the model, threads and slots),
    the same for one process and for every Ray replica (--stream-interval only where given: the
    two defaults differ)."""
    return dict(n_ctx=args.ctx_size, queue_size=args.queue_size, api_key=args.api_key, activations=args.activations,
                n_batch=batch_size(args), use_mmap=args.mmap, use_mlock=args.mlock, chat_template=args.chat_template,
                cors_origins=args.cors_origins, slots_endpoint=args.slots, type_k=args.cache_type_k,
                type_v=args.cache_type_v, huge_pages=args.huge_pages,
                **({} if args.stream_interval is None else {"stream_interval": args.stream_interval / 1000}))


def ray_application(args):
    """The Ray Serve application `ember serve --ray` runs: replicas of build_server with every
    option `ember serve` takes."""
    try:
        from ember.server.ray import ember_app
    except ImportError:
        raise EmberError("--ray needs Ray Serve: pip install 'ember[ray]'") from None
    return ember_app(args.model, replicas=args.replicas or 1, threads=args.threads or 1, parallel=args.parallel,
                     min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                     target_ongoing_requests=args.target_ongoing_requests, **server_options(args))


def _server_class():
    import uvicorn

    from ember.tokenizer.chat_template import stop_rendering

    class Server(uvicorn.Server):
        """uvicorn's server; Ctrl-C (or SIGTERM) also ends the chat templates being rendered, at once,
        and the first signal that stopped it is kept in `stopped_by`."""

        stopped_by: int | None = None

        def handle_exit(self, sig, frame):
            if self.stopped_by is None:
                self.stopped_by = sig
            stop_rendering()
            super().handle_exit(sig, frame)

    return Server


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: any free port)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        raise EmberError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def _replica_plan(args) -> tuple[int, str]:
    """The replicas started first, and how the replicas are counted (fixed or autoscaled)."""
    from ember.server.ray import autoscaling_range

    scaling = autoscaling_range(args.min_replicas, args.max_replicas)
    if scaling is None:
        return args.replicas or 1, _count(args.replicas or 1, "replica")
    return max(scaling[0], 1), f"{scaling[0]} to {scaling[1]} replicas"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
