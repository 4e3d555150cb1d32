"""The HTTP routes: OpenAI's completions, chat completions, embeddings and models, llama-server's
rerank, tokenize, detokenize, props and slots, health, Prometheus metrics and the chat page at /.

Embeddings and reranking run on a thread of their own, one request at a time, all of a request's
inputs batched through the runtime (engine/embed.py); an encoder model (BERT) serves only them, a
reranker (a cross-encoder, pooling type rank) only /v1/rerank (and its aliases /rerank,
/v1/reranking, /reranking, as llama-server's).

Every error is answered with an OpenAI-style body (see schemas.APIError): 400 for bad input,
401 for a missing or wrong API key, 404 for unknown routes, 413 for a body over the limit,
503 with Retry-After when every slot is busy and the queue is full. A client that goes away
while it sends its request is counted as status 499 and not logged as an error. Every answered
request is one log line (client, method, path, status, seconds). Browsers on other origins are
let in as `cors_origins` says (see cors.py).

Chat templates render on threads of their own (each waits on a worker process that renders
under a time, output and memory budget, see tokenizer/chat_template.py), so requests whose
template runs into its limit never hold up tokenization or the event loop.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ember.api.openai_format import ResponseFormat, rerank_response
from ember.api.tool_calls import ToolError
from ember.engine.constraints import ConstraintError, grammar_from_request
from ember.engine.rerank import ranked
from ember.engine.sampling import SamplingParams
from ember.engine.sampling_params import CHAT_TEMPERATURE
from ember.engine.sampling_params import DEFAULTS as SAMPLING_DEFAULTS
from ember.errors import ContextFullError, EmberError
from ember.server.cors import DEFAULT_CORS_ORIGINS, add_cors
from ember.server.metrics import Metrics
from ember.server.scheduler import QueueFull, Scheduler
from ember.server.schemas import (
    APIError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    RerankRequest,
    TokenizeRequest,
    error_body,
    parse,
)
from ember.server.streaming import JobEvents, event_stream, whole_response
from ember.tokenizer.chat_template import RenderingStopped, stop_rendering
from ember.version import __version__

log = logging.getLogger("ember.server")

MAX_BODY_BYTES = 8 << 20
RETRY_AFTER_SECONDS = 1
TEMPLATE_THREADS = 4  # chat templates rendering at once; more requests wait for one of these
CLIENT_CLOSED = 499  # nginx's status for a request its client abandoned
RERANK_ROUTES = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")
ROUTES = ("/", "/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings",
          *RERANK_ROUTES, "/tokenize", "/detokenize", "/metrics", "/props", "/slots")


def create_app(llm, scheduler: Scheduler, metrics: Metrics, api_key: str | None = None,
               cors_origins: str = DEFAULT_CORS_ORIGINS, slots_endpoint: bool = True,
               stream_interval: float = 0.0) -> FastAPI:
    """The app serving `llm` (an ember.LLM: its tokenizer, chat template and name) through `scheduler`.

    cors_origins: "localhost" (default: pages served from this machine), "*" (any page), or a
    comma-separated list of origins; "" sends no CORS headers. slots_endpoint=False hides /slots.
    stream_interval: a stream sends its tokens at most this often (seconds; 0: each step's as it
    comes), those of the steps between in one piece.
    """
    templates = ThreadPoolExecutor(TEMPLATE_THREADS, thread_name_prefix="ember-template")
    embedding = threading.Lock()  # one embeddings or rerank request at a time on the embedding graph

    @asynccontextmanager
    async def lifespan(app):
        yield
        stop_rendering()  # a render still running ends now, not at its time limit
        templates.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="ember", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    authorized = [Depends(_api_key_check(api_key))]
    started = int(time.time())
    _add_error_handlers(app)
    add_cors(app, cors_origins)
    app.add_middleware(_CountRequests, metrics=metrics)  # outermost: preflights are counted and logged too

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def chat_page():
        return resources.files("ember.server").joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    def model_card() -> dict:
        hp = llm.model.hp
        return {"id": llm.name, "object": "model", "created": started, "owned_by": "ember",
                "meta": {"n_ctx": llm.n_ctx, "n_ctx_train": hp.n_ctx_train, "n_vocab": llm.n_vocab,
                         "n_embd": hp.n_embd, "n_slots": len(scheduler.slots)}}

    @app.get("/v1/models", dependencies=authorized)
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}", dependencies=authorized)
    async def model(model_id: str):
        if model_id != llm.name:
            raise APIError(404, f"the model '{model_id}' does not exist: this server serves '{llm.name}'",
                           param="model", code="model_not_found")
        return model_card()

    @app.get("/props", dependencies=authorized)
    async def props():
        template = await asyncio.get_running_loop().run_in_executor(templates, lambda: llm.chat_template)
        tokenizer = llm.tokenizer
        return {"default_generation_settings": {"n_ctx": llm.n_ctx, "params": default_generation_settings()},
                "total_slots": len(scheduler.slots), "model_alias": llm.name,
                "model_path": str(llm.model.gguf.path),
                "modalities": {"vision": False, "audio": False, "video": False},
                "endpoint_slots": slots_endpoint, "endpoint_props": False, "endpoint_metrics": True,
                "chat_template": template.source,
                "bos_token": _token_text(tokenizer, tokenizer.bos_id),
                "eos_token": _token_text(tokenizer, tokenizer.eos_id),
                "build_info": f"ember {__version__}"}

    @app.get("/slots", dependencies=authorized)
    async def slots():
        if not slots_endpoint:
            raise APIError(501, "the slots endpoint is off (ember serve --slots turns it on)",
                           kind="not_supported_error", code="not_supported")
        return scheduler.slot_states()

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(request: Request):
        body = parse(CompletionRequest, await _read_json(request))
        _generative(llm)
        grammar = await asyncio.to_thread(_constraint, body) if body.constraint_field else None
        prompt = body.prompt
        tokens = list(prompt) if isinstance(prompt, list) else await asyncio.to_thread(llm.prompt_tokens, prompt)
        response = ResponseFormat(False, llm.name, llm.tokenizer, logprobs=body.logprobs is not None)
        return await _generate(request, scheduler, tokens, body, response, grammar, stream_interval=stream_interval)

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(request: Request):
        body = parse(ChatRequest, await _read_json(request))
        _generative(llm)
        grammar = await asyncio.to_thread(_constraint, body) if body.constraint_field else None
        messages = [m.plain() for m in body.messages]
        try:
            prompt = await asyncio.get_running_loop().run_in_executor(
                templates, llm.chat_prompt, messages, body.tools, body.tool_choice, body.parallel_tool_calls, grammar)
        except ToolError as error:
            raise APIError(400, str(error), param=error.param) from None
        thinking = None if body.reasoning_format == "none" else prompt.thinking
        response = ResponseFormat(True, llm.name, llm.tokenizer, logprobs=body.logprobs, tools=prompt.tools,
                                  thinking=thinking)
        return await _generate(request, scheduler, prompt.tokens, body, response, prompt.grammar,
                               keep_special=prompt.tools is not None, stream_interval=stream_interval)

    @app.post("/v1/embeddings", dependencies=authorized)
    async def embeddings(request: Request):
        body = parse(EmbeddingRequest, await _read_json(request))
        if _reranks(llm):
            raise APIError(400, f"{llm.name} is a reranker: it serves /v1/rerank, not embeddings", param="model",
                           code="model_not_supported")

        def embed():
            with embedding:
                n_embd = llm.embedder.n_embd
                if body.dimensions is not None and body.dimensions != n_embd:
                    raise APIError(400, f"'dimensions' {body.dimensions} is not supported: this model's embeddings "
                                        f"have {n_embd} dimensions and ember does not shorten them", param="dimensions")
                try:
                    return llm.create_embedding(body.input, model=llm.name, encoding_format=body.encoding_format)
                except EmberError as error:
                    raise APIError(400, str(error), param="input") from None

        return await asyncio.to_thread(embed)

    async def rerank(request: Request):
        body = parse(RerankRequest, await _read_json(request))
        documents = body.texts if body.tei else body.documents
        if documents is None:
            raise APIError(400, "missing required field 'documents'", param="documents")
        if body.tei and body.documents is not None:
            raise APIError(400, "give 'documents' or 'texts', not both", param="texts")
        if not _reranks(llm):
            raise APIError(400, f"{llm.name} is not a reranker: it serves no /v1/rerank (a cross-encoder with a "
                                "classification head does)", param="model", code="model_not_supported")

        def run():
            with embedding:
                try:
                    scores = llm.reranker.score(body.query, documents, truncate=True)
                except EmberError as error:
                    raise APIError(400, str(error), param="documents") from None
            return rerank_response(ranked(scores, body.top_n), documents, body.model or llm.name,
                                   sum(s.n_tokens for s in scores), body.return_text if body.tei
                                   else body.return_documents, tei=body.tei)

        return JSONResponse(await asyncio.to_thread(run))

    for path in RERANK_ROUTES:
        app.add_api_route(path, rerank, methods=["POST"], dependencies=authorized)

    @app.post("/tokenize", dependencies=authorized)
    async def tokenize(request: Request):
        body = parse(TokenizeRequest, await _read_json(request))
        ids = await asyncio.to_thread(llm.tokenizer.encode, body.content, add_special=body.add_special,
                                      parse_special=body.parse_special)
        if body.with_pieces:
            return {"tokens": [{"id": i, "piece": _piece(llm.tokenizer.token_bytes(i))} for i in ids]}
        return {"tokens": ids}

    @app.post("/detokenize", dependencies=authorized)
    async def detokenize(request: Request):
        body = parse(DetokenizeRequest, await _read_json(request))
        bad = [t for t in body.tokens if not 0 <= t < llm.n_vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {llm.n_vocab})", param="tokens")
        return {"content": llm.detokenize(body.tokens, special=True)}

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=authorized)
    async def prometheus():
        text = metrics.render(len(scheduler.slots), scheduler.n_waiting, scheduler.n_running)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return app


def default_generation_settings() -> dict:
    """The sampling a request gets when it names nothing, under llama-server's names."""
    return {"temperature": SAMPLING_DEFAULTS.temperature, "chat_temperature": CHAT_TEMPERATURE,
            "top_k": SAMPLING_DEFAULTS.top_k, "top_p": SAMPLING_DEFAULTS.top_p, "min_p": SAMPLING_DEFAULTS.min_p,
            "typical_p": SAMPLING_DEFAULTS.typical_p, "repeat_penalty": SAMPLING_DEFAULTS.repeat_penalty,
            "repeat_last_n": SAMPLING_DEFAULTS.repeat_last_n,
            "frequency_penalty": SAMPLING_DEFAULTS.frequency_penalty,
            "presence_penalty": SAMPLING_DEFAULTS.presence_penalty, "mirostat": SAMPLING_DEFAULTS.mirostat_mode,
            "mirostat_tau": SAMPLING_DEFAULTS.mirostat_tau, "mirostat_eta": SAMPLING_DEFAULTS.mirostat_eta,
            "n_predict": CompletionRequest.DEFAULT_MAX_TOKENS, "seed": -1}


def _token_text(tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def _generative(llm) -> None:
    if getattr(llm.model, "is_encoder", False) or _reranks(llm):
        serves = "a reranker: it serves /v1/rerank" if _reranks(llm) else "an embedding model: it serves /v1/embeddings"
        raise APIError(400, f"{llm.name} is {serves}, not text generation", param="model", code="model_not_supported")


def _reranks(llm) -> bool:
    return bool(getattr(llm.model, "ranks", False))


def _constraint(body):
    """The request's constraint (compiled by llguidance: run it off the event loop)."""
    try:
        return grammar_from_request(body.grammar, body.json_schema, body.regex, body.choice, body.response_format)
    except ConstraintError as error:
        raise APIError(400, str(error), param=body.constraint_field) from None


async def _generate(request: Request, scheduler: Scheduler, tokens: list[int], body, response: ResponseFormat,
                    grammar=None, keep_special: bool = False, stream_interval: float = 0.0):
    params = SamplingParams(**body.sampling_kwargs(body.DEFAULT_TEMPERATURE), grammar=grammar)
    events = JobEvents()
    job_args = (tokens, params, body.max_new_tokens, body.stop or [], body.n_logprobs, events.deliver, keep_special)
    try:  # a grammar's matcher (and, once per model, its vocabulary) is built off the event loop
        job = await asyncio.to_thread(scheduler.job, *job_args) if grammar is not None else scheduler.job(*job_args)
    except ConstraintError as error:
        raise APIError(400, str(error), param=body.constraint_field or "tool_choice") from None
    scheduler.submit(job)
    if body.stream:
        return StreamingResponse(event_stream(scheduler, job, events, response, body.include_usage, stream_interval),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await whole_response(request, scheduler, job, events, response)


def _piece(data: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 characters (as llama.cpp answers)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


async def _read_json(request: Request):
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise _too_large()
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as error:
        raise APIError(400, f"the request body is not valid JSON: {error}") from None


def _too_large() -> APIError:
    return APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")


def _api_key_check(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                           code="invalid_api_key", kind="authentication_error",
                           headers={"WWW-Authenticate": "Bearer"})

    return check


def _add_error_handlers(app: FastAPI) -> None:
    def answer(error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return answer(error)

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, error: QueueFull):
        return answer(APIError(503, f"the server is busy ({error}); retry later", kind="server_busy",
                               code="server_busy", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}))

    @app.exception_handler(ContextFullError)
    async def context_full(request: Request, error: ContextFullError):
        return answer(APIError(400, str(error), param="messages" if "chat" in request.url.path else "prompt",
                               code="context_length_exceeded"))

    @app.exception_handler(EmberError)
    async def bad_request(request: Request, error: EmberError):
        return answer(APIError(400, str(error)))

    @app.exception_handler(RenderingStopped)
    async def shutting_down(request: Request, error: RenderingStopped):
        return answer(APIError(503, "the server is shutting down", kind="server_busy", code="shutting_down"))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, error: ClientDisconnect):
        log.debug("the client of %s went away while sending its request", request.url.path)
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it; the metrics count it

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        return answer(APIError(400, "invalid request"))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        if error.status_code == 404:
            message = f"there is no route {request.method} {request.url.path}"
        elif error.status_code == 405:
            message = f"{request.url.path} does not accept {request.method}"
        else:
            message = str(error.detail)
        return JSONResponse(error_body(message, code="not_found" if error.status_code == 404 else None),
                            status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return answer(APIError(500, "internal server error", kind="server_error"))


class _CountRequests:
    """ASGI middleware counting answered requests by route and status, and logging each one
    when its answer has been sent (a stream: at its end)."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in ROUTES else "other"
        start, status = time.perf_counter(), None

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.metrics.on_request(route, status)
            await send(message)

        try:
            await self.app(scope, receive, send=counting_send)
        finally:
            client = scope.get("client") or ("-", 0)
            log.info('%s "%s %s" %s %.3fs', client[0], scope["method"], scope["path"],
                     status if status is not None else CLIENT_CLOSED, time.perf_counter() - start)
