"""`ember serve`: the OpenAI-compatible server (ember.server) under uvicorn."""

from __future__ import annotations

import logging
import socket
import sys

from ember.cli.main import batch_size
from ember.errors import EmberError


def cli_serve(args) -> int:
    try:
        import uvicorn
    except ImportError:
        raise EmberError("the server needs fastapi and uvicorn: pip install 'ember[server]'") from None
    sock = listening_socket(args.host, args.port)  # before loading: a busy port fails at once
    host, port = sock.getsockname()[:2]
    from ember.server import build_server

    app, scheduler = build_server(args.model, n_ctx=args.ctx_size, n_threads=args.threads,
                                  parallel=args.parallel, queue_size=args.queue_size, api_key=args.api_key,
                                  activations=args.activations, n_batch=batch_size(args), use_mmap=args.mmap,
                                  use_mlock=args.mlock, chat_template=args.chat_template,
                                  cors_origins=args.cors_origins, slots_endpoint=args.slots)
    try:
        model = scheduler.model
        activations = "" if model.activations == "int8" else f", {model.activations} activations"
        print(f"ember: serving {args.model} on http://{_url_host(host)}:{port} ({args.parallel} slots of "
              f"{model.n_ctx} tokens, {model.n_threads} threads{activations})", file=sys.stderr, flush=True)
        logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
        _server_class()(config).run(sockets=[sock])
    finally:
        scheduler.stop()
    return 0


def _server_class():
    import uvicorn

    from ember.tokenizer.chat_template import stop_rendering

    class Server(uvicorn.Server):
        """uvicorn's server; Ctrl-C (or SIGTERM) also ends the chat templates being rendered, at once."""

        def handle_exit(self, sig, frame):
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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
