"""`ember serve`: an OpenAI-compatible HTTP server with continuous batching.

    ember serve -m smollm2-135m --parallel 4          # http://127.0.0.1:8080
    curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "Hi!"}], "stream": true}'

`--parallel N` sequence slots share one model and one KV cache (each slot holds `-c` tokens);
the scheduler (scheduler.py) advances every running request by one token per batched graph
run. The chat page is at / .
"""

from __future__ import annotations

import logging
import socket
import sys

from ember.errors import EmberError


def build_server(model: str, n_ctx: int | None = None, n_threads: int | None = None, parallel: int = 4,
                 queue_size: int = 64, api_key: str | None = None, activations: str = "int8"):
    """The app and its scheduler (started) for a registry model name or .gguf path."""
    from ember.gguf import open_gguf
    from ember.hub import resolve_model
    from ember.llm import LLM, model_name
    from ember.runtime import Model
    from ember.server.app import create_app
    from ember.server.metrics import Metrics
    from ember.server.scheduler import Scheduler
    from ember.tokenizer import Tokenizer

    gguf = open_gguf(resolve_model(model))
    runtime = Model(gguf, n_ctx=n_ctx, n_threads=n_threads, n_seq=parallel, activations=activations)
    llm = LLM.from_components(runtime, Tokenizer.from_gguf(gguf), name=model_name(model))
    llm.chat_template  # parse the template now: a broken one fails at start, not per request
    metrics = Metrics()
    scheduler = Scheduler(runtime, llm.tokenizer, queue_size=queue_size, metrics=metrics).start()
    return create_app(llm, scheduler, metrics, api_key=api_key), scheduler


def cli_serve(args) -> int:
    try:
        import uvicorn
    except ImportError:
        raise EmberError("the server needs fastapi and uvicorn: pip install 'ember[server]'") from None
    sock = listening_socket(args.host, args.port)  # before loading: a busy port fails at once
    host, port = sock.getsockname()[:2]
    app, scheduler = build_server(args.model, n_ctx=args.ctx_size, n_threads=args.threads,
                                  parallel=args.parallel, queue_size=args.queue_size, api_key=args.api_key,
                                  activations=args.activations)
    try:
        model = scheduler.model
        activations = "" if model.activations == "int8" else f", {model.activations} activations"
        print(f"ember: serving {args.model} on http://{_url_host(host)}:{port} ({args.parallel} slots of "
              f"{model.n_ctx} tokens, {model.n_threads} threads{activations})", file=sys.stderr, flush=True)
        logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        scheduler.stop()
    return 0


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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
