"""`ember serve`: an OpenAI-compatible HTTP server with continuous batching.

    ember serve -m smollm2-135m --parallel 4          # http://127.0.0.1:8080
    curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "Hi!"}], "stream": true}'

`ember serve` (ember.cli.serve) runs it under uvicorn. `--parallel N` sequence slots share one
model and one KV cache (each slot holds `-c` tokens); the scheduler (scheduler.py) advances
every running request by one token per batched graph run. The chat page is at / .
"""

from __future__ import annotations

from ember.api.llm import LLM
from ember.engine.load import load
from ember.server.app import create_app
from ember.server.cors import DEFAULT_CORS_ORIGINS
from ember.server.metrics import Metrics
from ember.server.scheduler import Scheduler


def build_server(model: str, n_ctx: int | None = None, n_threads: int | None = None, parallel: int = 4,
                 queue_size: int = 64, api_key: str | None = None, activations: str = "int8", n_batch: int = 512,
                 use_mmap: bool = True, use_mlock: bool = False, chat_template: str | None = None,
                 cors_origins: str = DEFAULT_CORS_ORIGINS, slots_endpoint: bool = True,
                 type_k: str | None = None, type_v: str | None = None, huge_pages: bool = True,
                 stream_interval: float = 0.0):
    """The app and its scheduler (started) for a model name or path (see create_app for CORS and /slots)."""
    loaded = load(model, n_ctx=n_ctx, n_threads=n_threads, n_seq=parallel, activations=activations, n_batch=n_batch,
                  use_mmap=use_mmap, use_mlock=use_mlock, chat_template=chat_template, type_k=type_k, type_v=type_v,
                  huge_pages=huge_pages)
    llm = LLM.from_loaded(loaded)  # parses the chat template now: a broken one fails at start, not per request
    metrics = Metrics()
    scheduler = Scheduler(loaded.model, loaded.tokenizer, queue_size=queue_size, metrics=metrics).start()
    app = create_app(llm, scheduler, metrics, api_key=api_key, cors_origins=cors_origins,
                     slots_endpoint=slots_endpoint, stream_interval=stream_interval)
    return app, scheduler
