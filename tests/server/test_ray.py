"""ember on Ray Serve (ember.server.ray, `ember serve --ray`), on a real local Ray cluster.

The test starts a two-CPU Ray cluster without a dashboard (its processes in ember's
cluster_environment), runs `ember serve --ray` against it (RAY_ADDRESS) with two replicas of one
thread each, and tears both down at the end. The oracle is a plain `ember serve` process
answering the same greedy requests: through Ray Serve's proxy every answer, schema and error
must be the same. The proxy's middleware is also tested on its own, around fake proxies.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from types import SimpleNamespace

import httpx
import psutil
import pytest
import yaml

from ember.hub import resolve_model
from ember_server import ServerProcess, without_ids
from paths import REPO, TESTS, ember_root

import ray
from ray import serve


from ember.cli.main import build_parser, main
from ember.cli.serve import ray_application
from ember.errors import EmberError
from ember.server import build_server
from ember.server.ray import (
    APP_ARGS,
    CONFIG_EXAMPLE,
    REPLICA_HEADER,
    BODY_KEY,
    MAX_SCOPE_BODY,
    RETRY_AFTER_SECONDS,
    CHOICE_LIFETIME,
    SESSION_HEADER,
    STREAM_INTERVAL,
    CleanReplicaErrors,
    SessionAffinityRouter,
    _BodyFromScope,
    build_app,
    cluster_environment,
    deployment_options,
    least_busy,
    preferred_replicas,
)


MODEL = "smollm2-135m"
N_CTX = 512
SERVE_FLAGS = ("-m", MODEL, "-c", str(N_CTX), "--parallel", "4", "-t", "1", "-ctk", "q8_0", "-ctv", "q8_0")
N_CLIENTS = 16
TIMEOUT = 300


def requests_of_16_clients() -> list[tuple[str, dict]]:
    """Greedy chat and text completions, some streamed, each different."""
    requests = []
    for i in range(N_CLIENTS):
        if i % 2:
            body = {"messages": [{"role": "user", "content": f"Name {i} fruits, one per line."}]}
            route = "/v1/chat/completions"
        else:
            body = {"prompt": f"{i} + {i} equals"}
            route = "/v1/completions"
        requests.append((route, {**body, "max_tokens": 12, "temperature": 0, "stream": i % 4 in (2, 3)}))
    return requests


def ask(url: str, route: str, body: dict, headers: dict | None = None) -> dict:
    """The answer's status, the replica that gave it, and its text, finish reason and usage
    (a stream's text put together from its chunks; `complete` once it ended with [DONE]); an
    error answer's body and Retry-After, a stream's error event (`error`)."""
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        if not body.get("stream"):
            response = client.post(route, json=body, headers=headers)
            answer = {"status": response.status_code, "replica": response.headers.get(REPLICA_HEADER)}
            if response.status_code != 200:
                return {**answer, "body": response.text, "retry_after": response.headers.get("retry-after")}
            choice = response.json()["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            return {**answer, "text": text, "finish_reason": choice["finish_reason"],
                    "usage": response.json()["usage"], "complete": True}
        with client.stream("POST", route, json={**body, "stream_options": {"include_usage": True}},
                           headers=headers) as response:
            answer = {"status": response.status_code, "replica": response.headers.get(REPLICA_HEADER)}
            if response.status_code != 200:
                return {**answer, "body": response.read().decode(), "retry_after": response.headers.get("retry-after")}
            text, finish_reason, usage, complete = "", None, None, False
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    complete = True
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    answer["error"] = chunk["error"]
                    continue
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    text += choice.get("delta", {}).get("content") or choice.get("text") or ""
                    finish_reason = choice.get("finish_reason") or finish_reason
            return {**answer, "text": text, "finish_reason": finish_reason, "usage": usage, "complete": complete}


STREAMS = (("/v1/completions", {"prompt": "Count: one, two,", "max_tokens": 16, "temperature": 0, "stream": True,
                                 "stream_options": {"include_usage": True}}),
           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16,
                                      "temperature": 0, "stream": True, "logprobs": True, "top_logprobs": 2}))


def stream_events(url: str, route: str, body: dict) -> list[bytes]:
    """A stream's server-sent events as the bytes that came, without the answer's own id and
    creation time."""
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client, client.stream("POST", route, json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(response.iter_bytes())
    raw = without_ids(raw)
    assert raw.endswith(b"\n\n")
    return raw.split(b"\n\n")[:-1]


def ask_all(url: str, requests: list[tuple[str, dict]]) -> list[dict]:
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda request: ask(url, *request), requests))


def without_replica(answer: dict) -> dict:
    return {key: value for key, value in answer.items() if key != "replica"}


# -- without a cluster ---------------------------------------------------------------------


def test_a_session_keeps_its_replica_and_only_a_lost_replicas_sessions_move():
    replicas = [f"replica{i}" for i in range(4)]
    sessions = [f"chat-{i}" for i in range(400)]
    first = {session: preferred_replicas(session, replicas)[0] for session in sessions}
    assert first == {session: preferred_replicas(session, list(reversed(replicas)))[0] for session in sessions}
    assert all(60 <= list(first.values()).count(replica) <= 140 for replica in replicas)  # spread evenly
    after = {session: preferred_replicas(session, replicas[1:])[0] for session in sessions}
    assert {session for session in sessions if after[session] != first[session]} == \
        {session for session in sessions if first[session] == "replica0"}
    assert all(after[session] == preferred_replicas(session, replicas)[1]
               for session in sessions if first[session] == "replica0")  # to their second choice


class _Replica:
    def __init__(self, name: str):
        self.replica_id = SimpleNamespace(unique_id=name)


def _request(request_id: str, session: str = "") -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(internal_request_id=request_id, session_id=session))


def _router() -> SessionAffinityRouter:
    router = object.__new__(SessionAffinityRouter)  # Ray's constructor wants a running Serve; the policy does not
    router.initialize_state()
    return router


def test_requests_that_arrive_together_are_spread_over_the_replicas_by_their_ongoing_requests():
    router, replicas = _router(), [_Replica(f"r{i}") for i in range(3)]

    def first_choice(request_id: str, session: str = "") -> str:
        ranks = asyncio.run(router.choose_replicas(replicas, _request(request_id, session)))
        assert sorted(rank[0].replica_id.unique_id for rank in ranks) == ["r0", "r1", "r2"]  # all, one a rank
        return ranks[0][0].replica_id.unique_id

    chosen = [first_choice(f"q{i}") for i in range(9)]  # none has ended yet
    assert sorted(chosen.count(r) for r in ("r0", "r1", "r2")) == [3, 3, 3]
    for i in range(9):
        if chosen[i] == "r1":
            router.on_request_completed(SimpleNamespace(unique_id="r1"), f"q{i}")
    assert [first_choice(f"p{i}") for i in range(3)] == ["r1"] * 3  # the replica whose requests ended
    # a session goes to its own replica whatever the load, and counts there
    own = preferred_replicas("chat", ["r0", "r1", "r2"])[0]
    assert first_choice("s0", session="chat") == own
    assert router._ongoing()[own] == 4
    # a choice made again for the same request (Ray's back-off) replaces the first
    first_choice("s0", session="chat")
    assert router._ongoing()[own] == 4


def test_the_replica_ray_sent_a_request_to_counts_not_the_choice_made_for_it():
    router, replicas = _router(), [_Replica("r0"), _Replica("r1")]

    def choose(request_id: str) -> str:
        return asyncio.run(router.choose_replicas(replicas, _request(request_id)))[0][0].replica_id.unique_id

    first = choose("a")
    other = "r1" if first == "r0" else "r0"
    # Ray gives that choice to an older waiting request, b, and routes a again
    router.on_request_routed(_request("b"), SimpleNamespace(unique_id=first), None)
    assert router._ongoing() == {first: 2}  # b's replica, and a's choice until a is routed
    assert choose("a") == other  # a's own earlier choice is left out: first holds b only
    router.on_request_routed(_request("a"), SimpleNamespace(unique_id=other), None)
    assert router._ongoing() == {first: 1, other: 1}
    # a request whose end Ray reports before its routing is not counted again
    router.on_request_completed(SimpleNamespace(unique_id=other), "a")
    router.on_request_routed(_request("a"), SimpleNamespace(unique_id=other), None)
    assert router._ongoing() == {first: 1}


def test_a_choice_never_sent_lapses():
    router = _router()
    asyncio.run(router.choose_replicas([_Replica("r0")], _request("gone")))
    assert router._ongoing() == {"r0": 1}
    replica, when = router._chosen["gone"]
    router._chosen["gone"] = (replica, when - CHOICE_LIFETIME - 1)
    assert router._ongoing() == {}
    assert least_busy({"a": 2, "b": 0, "c": 1}, ["a", "b", "c"]) == ["b", "c", "a"]


def test_replicas_are_fixed_or_autoscaled_on_ongoing_requests():
    fixed = deployment_options(replicas=3, threads=2, parallel=8)
    assert (fixed["num_replicas"], fixed["ray_actor_options"], fixed["max_ongoing_requests"]) == (3, {"num_cpus": 2}, 16)
    assert "autoscaling_config" not in fixed
    scaled = deployment_options(threads=1, parallel=4, min_replicas=0, max_replicas=5)
    assert scaled["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 5, "initial_replicas": 1,
                                            "target_ongoing_requests": 4}
    assert "num_replicas" not in scaled
    assert deployment_options(max_replicas=2, target_ongoing_requests=1.5)["autoscaling_config"][
        "target_ongoing_requests"] == 1.5


def test_a_replica_takes_its_slots_and_as_many_waiting_as_its_queue_holds():
    # a freed slot takes a request waiting on the replica at the next step, not at Ray's router's next try
    assert deployment_options(parallel=4)["max_ongoing_requests"] == 8
    assert deployment_options(parallel=4, queue_size=64)["max_ongoing_requests"] == 8
    assert deployment_options(parallel=4, queue_size=1)["max_ongoing_requests"] == 5
    assert deployment_options(parallel=4, queue_size=0)["max_ongoing_requests"] == 4


@pytest.mark.parametrize("args, message", [
    ({"replicas": 2}, "the argument 'model' is required"),
    ({"model": "m", "replica": 2}, "unknown argument 'replica'"),
    ({"model": "m", "threads": "two"}, "threads must be a whole number, not 'two'"),
    ({"model": "m", "threads": 0}, "threads must be a positive whole number, not 0"),
    ({"model": "m", "min_replicas": 3, "max_replicas": 2}, r"max_replicas \(2\) is below min_replicas \(3\)"),
    ({"model": "m", "slots_endpoint": "maybe"}, "slots_endpoint must be true or false"),
    ({"model": "m", "stream_interval": "-0.5"}, r"stream_interval must be a number of seconds >= 0, not -0.5"),
    ({"model": "m", "stream_interval": "soon"}, "stream_interval must be a number, not 'soon'"),
])
def test_bad_application_arguments_are_one_line_errors(args, message):
    with pytest.raises(EmberError, match=message):
        build_app(args)


def test_the_config_file_in_the_docs_builds_an_application():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert CONFIG_EXAMPLE in readme
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.parse_obj(yaml.safe_load(CONFIG_EXAMPLE))
    application = config.applications[0]
    assert (application.import_path, application.route_prefix) == ("ember.server.ray:build_app", "/")
    deployment = build_app(application.args)._bound_deployment
    assert deployment.num_replicas == 2
    assert deployment.ray_actor_options["num_cpus"] == 1
    assert deployment.max_ongoing_requests == 8


def test_the_readme_starts_a_cluster_with_embers_environment():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = readme[readme.index("env RAY_SERVE_"):readme.index("ray start --head", readme.index("env RAY_SERVE_"))]
    assert sorted(command.replace("\\\n", " ").split()[1:]) == \
        sorted(f"{name}={value}" for name, value in cluster_environment().items())


def test_the_help_and_the_readme_give_the_replicas_stream_interval(capsys):
    ms = f"{STREAM_INTERVAL * 1000:g}"
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert f"each step's at once; on Ray replicas {ms})" in " ".join(capsys.readouterr().out.split())
    assert f"tokens at most every {ms} ms (`--stream-interval MS`" in (REPO / "README.md").read_text(encoding="utf-8")


def test_serve_run_with_key_value_arguments_builds_an_application():
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    # `serve run ember.server.ray:build_app model=smollm2-135m replicas=3 threads=2`: every value a string
    app = call_user_app_builder_with_args_if_necessary(build_app, {"model": MODEL, "replicas": "3", "threads": "2"})
    deployment = app._bound_deployment
    assert (deployment.num_replicas, deployment.ray_actor_options["num_cpus"]) == (3, 2)
    assert deployment.init_args == (MODEL, {"n_threads": 2, "parallel": 4, "stream_interval": STREAM_INTERVAL})


def test_every_engine_option_of_ember_serve_reaches_the_replicas():
    flags = ["serve", "--ray", "-m", MODEL, "-t", "2", "--parallel", "3", "-c", "256", "-b", "64", "--queue-size", "7",
             "--api-key", "key", "--activations", "f32", "--no-mmap", "--no-huge-pages", "--mlock", "--chat-template", "chatml",
             "--cors-origins", "*", "--no-slots", "-ctk", "q8_0", "-ctv", "f32", "--stream-interval", "20",
             "--replicas", "2"]
    deployment = ray_application(build_parser().parse_args(flags))._bound_deployment
    assert (deployment.num_replicas, deployment.ray_actor_options["num_cpus"], deployment.max_ongoing_requests) == \
        (2, 2, 6)
    model, options = deployment.init_args
    assert model == MODEL
    assert options == {"n_threads": 2, "parallel": 3, "n_ctx": 256, "n_batch": 64, "queue_size": 7, "api_key": "key",
                       "activations": "f32", "use_mmap": False, "use_mlock": True, "chat_template": "chatml",
                       "cors_origins": "*", "slots_endpoint": False, "type_k": "q8_0", "type_v": "f32",
                       "huge_pages": False, "stream_interval": 0.02}
    # every option build_server takes is one of them: a new one cannot be left behind unnoticed
    assert set(options) == set(inspect.signature(build_server).parameters) - {"model"}


def test_the_application_arguments_are_build_servers_options():
    server = set(inspect.signature(build_server).parameters) - {"model", "n_threads", "parallel"}
    assert server <= set(APP_ARGS)
    app = build_app({"model": MODEL, "type_k": "q8_0", "type_v": "q8_0", "use_mmap": "false", "n_batch": "128"})
    assert app._bound_deployment.init_args[1] == {"type_k": "q8_0", "type_v": "q8_0", "use_mmap": False,
                                                  "n_batch": 128, "n_threads": 1, "parallel": 4,
                                                  "stream_interval": STREAM_INTERVAL}
    with pytest.raises(EmberError, match="n_threads is set by the Ray application's threads"):
        from ember.server.ray import ember_app

        ember_app(MODEL, n_threads=2)


# -- the proxy's middleware, around fake proxies ---------------------------------------------


def run_through_middleware(proxy, body: bytes = b'{"prompt": "hi"}', disconnect: bool = False,
                           scopes: list | None = None) -> tuple[list, list]:
    """What a client is sent when `proxy` (an ASGI app, called once per try with the try's
    number and the body it received) serves a POST through CleanReplicaErrors; and the bodies
    each try received (and into `scopes`, the scope of each)."""
    sent, bodies = [], []
    scopes = [] if scopes is None else scopes
    incoming = [{"type": "http.request", "body": body[:4], "more_body": True},
                {"type": "http.request", "body": body[4:], "more_body": False}]

    async def receive():
        if incoming:
            return incoming.pop(0)
        if disconnect:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client waits for its answer

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):  # as Ray's proxy: it reads the client until it disconnects
        received = b""
        while True:
            message = await receive()
            received += message.get("body", b"")
            if not message.get("more_body"):
                break
        bodies.append(received)
        scopes.append(scope)
        listening = asyncio.create_task(receive())
        await asyncio.sleep(0)
        await proxy(len(bodies), send)
        listening.cancel()

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [(b"host", b"x")]}
    asyncio.run(CleanReplicaErrors(app)(scope, receive, send))
    return sent, bodies


def json_answer(sent: list) -> tuple[int, dict, dict]:
    start, body = sent
    return start["status"], dict(start["headers"]), json.loads(body["body"])


def test_a_request_whose_replica_died_before_answering_goes_once_more_with_its_body():
    async def proxy(attempt, send):
        if attempt == 2:  # the first try's replica died: Ray's proxy sent nothing
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"ok": 1}'})

    sent, bodies = run_through_middleware(proxy)
    assert bodies == [b'{"prompt": "hi"}'] * 2
    assert [m.get("status") for m in sent] == [200, None] and sent[1]["body"] == b'{"ok": 1}'


def test_a_small_body_travels_in_the_scope_and_the_replica_reads_it_there():
    async def proxy(attempt, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    scopes = []
    run_through_middleware(proxy, scopes=scopes)
    assert scopes[0][BODY_KEY] == b'{"prompt": "hi"}'
    large = b"x" * (MAX_SCOPE_BODY + 1)
    _, bodies = run_through_middleware(proxy, body=large, scopes=scopes)
    assert BODY_KEY not in scopes[1] and bodies == [large]  # the proxy still gets all of it

    proxied = [{"type": "http.request", "body": b'{"prompt": "hi"}', "more_body": False}, {"type": "http.disconnect"}]
    seen = []

    async def receive():  # Ray's receive in the replica: the proxy's copy of the body, then the disconnect
        return proxied.pop(0)

    async def app(scope, receive, send):
        seen.extend([await receive(), await receive()])

    asyncio.run(_BodyFromScope(app)({"type": "http", BODY_KEY: b'{"prompt": "hi"}'}, receive, None))
    assert seen == [{"type": "http.request", "body": b'{"prompt": "hi"}', "more_body": False},
                    {"type": "http.disconnect"}]


def test_a_request_no_replica_answers_gets_a_retryable_503_in_openais_error_shape():
    async def proxy(attempt, send):
        pass

    sent, bodies = run_through_middleware(proxy)
    assert len(bodies) == 2
    status, headers, body = json_answer(sent)
    assert (status, headers[b"retry-after"], headers[b"content-type"]) == \
        (503, str(RETRY_AFTER_SECONDS).encode(), b"application/json")
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "replica_unavailable"


def test_a_stream_cut_short_ends_with_an_error_event_and_done():
    async def proxy(attempt, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True})

    sent, bodies = run_through_middleware(proxy)
    assert len(bodies) == 1  # part of the answer went out: not sent again
    events = b"".join(m.get("body", b"") for m in sent).decode().split("\n\n")
    assert events[0] == 'data: {"choices": []}' and events[2:] == ["data: [DONE]", ""]
    error = json.loads(events[1][len("data: "):])["error"]
    assert (error["type"], error["code"]) == ("server_error", "replica_unavailable")
    assert sent[-1]["more_body"] is False


def test_rays_plain_text_errors_are_answered_as_error_bodies():
    async def proxy(attempt, send):  # as Ray's proxy answers back-pressure
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"16"),
                                (b"retry-after", b"2")]})
        await send({"type": "http.response.body", "body": b"Request dropped."})

    sent, bodies = run_through_middleware(proxy)
    status, headers, body = json_answer(sent)
    assert (status, headers[b"retry-after"], body["error"]["message"]) == (503, b"2", "Request dropped.")
    assert len(bodies) == 1


def test_a_request_whose_client_went_away_is_not_sent_again():
    async def proxy(attempt, send):
        pass

    sent, bodies = run_through_middleware(proxy, disconnect=True)
    assert (sent, len(bodies)) == ([], 1)


# -- on a local Ray cluster ----------------------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
def test_ember_serve_ray_starts_a_local_cluster_and_leaves_nothing_running():
    resolve_model(MODEL)
    process = ServerProcess("--ray", *SERVE_FLAGS).wait_ready(timeout=TIMEOUT)
    try:
        children = psutil.Process(process.process.pid).children(recursive=True)
        assert any("raylet" in " ".join(child.cmdline()) for child in children)
        models = httpx.get(f"{process.url}/v1/models", timeout=TIMEOUT)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
        assert "through Ray Serve on a local Ray cluster (1 replica, each 4 slots and 1 thread)" in process.output()
    finally:
        process.process.terminate()
        assert process.process.wait(timeout=TIMEOUT) == 0
        process.stop()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == []



@pytest.fixture(scope="module")
def reference():
    """What a plain `ember serve` answers: the 16 requests and a few errors."""
    resolve_model(MODEL)
    process = ServerProcess(*SERVE_FLAGS).wait_ready()
    try:
        yield {"answers": ask_all(process.url, requests_of_16_clients()), "probes": probes(process.url),
               "streams": [stream_events(process.url, *request) for request in STREAMS]}
    finally:
        process.stop()


def probes(url: str) -> dict:
    """Answers beside generation: models, health, and errors (schema, route, context)."""
    found = {}
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        for name, method, route, body in (
                ("models", "GET", "/v1/models", None), ("health", "GET", "/health", None),
                ("no route", "GET", "/v1/nothing", None),
                ("bad field", "POST", "/v1/chat/completions", {"messages": [], "max_tokens": 4}),
                ("bad json", "POST", "/v1/completions", "{not json"),
                ("too long", "POST", "/v1/completions", {"prompt": "word " * 2 * N_CTX, "max_tokens": 1})):
            if isinstance(body, str):
                response = client.request(method, route, content=body, headers={"content-type": "application/json"})
            else:
                response = client.request(method, route, json=body)
            answer = response.json()
            for model in answer.get("data", []) if name == "models" else []:
                model.pop("created")
            found[name] = (response.status_code, answer)
    return found


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs, no dashboard, its processes in ember's cluster_environment.

    Ray workers import the ember this test imports (an installed one, or this checkout's src/ with
    its in-place build) and the tests' helper modules; the PYTHONPATH that tells them so, like the
    cluster's environment, is this fixture's own and is put back afterwards, so later tests'
    subprocesses do not inherit it.
    """
    environment = {**cluster_environment(),
                   "PYTHONPATH": os.pathsep.join([str(ember_root()), str(TESTS),
                                                  *([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ else [])])}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    try:
        context = ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
        try:
            yield context.address_info["gcs_address"]
        finally:
            serve.shutdown()
            ray.shutdown()
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def ray_server(cluster, reference):
    """`ember serve --ray` on the test's cluster: two replicas of one thread and 4 slots each."""
    os.environ["RAY_ADDRESS"] = cluster
    try:
        process = ServerProcess("--ray", "--replicas", "2", *SERVE_FLAGS).wait_ready(timeout=TIMEOUT)
    finally:
        del os.environ["RAY_ADDRESS"]
    yield process.url
    process.stop()


@pytest.mark.model
@pytest.mark.slow
def test_16_concurrent_clients_get_what_ember_serve_answers(ray_server, reference):
    answers = ask_all(ray_server, requests_of_16_clients())
    assert [without_replica(a) for a in answers] == [without_replica(a) for a in reference["answers"]]
    assert all(a["status"] == 200 and a["complete"] for a in answers)
    assert len({a["replica"] for a in answers}) == 2  # both replicas served


@pytest.mark.model
@pytest.mark.slow
def test_streams_that_start_together_fill_both_replicas_slots_evenly(ray_server):
    # 8 streams on 2 replicas of 4 slots: 5 on one would leave a stream waiting for a whole answer
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": True}
    for burst in range(3):
        # The router hears that a request ended from Ray's completion callback, which can come a
        # moment after the client has read the end of the stream: a burst sent at once would be
        # routed with the last one's streams still counted.
        time.sleep(1.0)
        answers = ask_all(ray_server, [("/v1/completions", body)] * 8)
        assert all(a["status"] == 200 and a["complete"] for a in answers)
        replicas = [a["replica"] for a in answers]
        assert sorted(replicas.count(r) for r in set(replicas)) == [4, 4], f"burst {burst}: {replicas}"


@pytest.mark.model
@pytest.mark.slow
def test_a_stream_through_ray_is_ember_serves_event_for_event_and_byte_for_byte(ray_server, reference):
    for request, expected in zip(STREAMS, reference["streams"]):
        events = stream_events(ray_server, *request)
        assert events == expected
        assert len(events) > 16 and events[-1] == b"data: [DONE]"  # a token an event, then usage / finish, [DONE]


@pytest.mark.model
@pytest.mark.slow
def test_models_health_and_errors_are_ember_serves(ray_server, reference):
    assert probes(ray_server) == reference["probes"]


@pytest.mark.model
@pytest.mark.slow
def test_the_replicas_engines_run_with_ember_serves_options(ray_server):
    handle = serve.get_app_handle("ember")
    found = {}
    for _ in range(50):  # the handle picks a replica: until both have answered
        options = handle.engine_options.remote().result(timeout_s=TIMEOUT)
        found[options.pop("replica")] = options
        if len(found) == 2:
            break
    assert len(found) == 2
    for options in found.values():  # SERVE_FLAGS: -c 512 --parallel 4 -t 1 -ctk q8_0 -ctv q8_0
        assert options == {"n_ctx": N_CTX, "n_threads": 1, "n_seq": 4, "n_batch": 512, "activations": "int8",
                           "type_k": "q8_0", "type_v": "q8_0"}


def replica_metric(url: str, session: str, name: str) -> tuple[str, float]:
    response = httpx.get(f"{url}/metrics", headers={SESSION_HEADER: session}, timeout=TIMEOUT)
    value = next(float(line.split()[1]) for line in response.text.splitlines() if line.startswith(name + " "))
    return response.headers[REPLICA_HEADER], value


@pytest.mark.model
@pytest.mark.slow
def test_a_growing_chat_stays_on_one_replica_and_reuses_its_cache(ray_server):
    messages, replicas, evaluated, prompt_tokens = [], set(), [], []
    for turn in ("Hello! Who are you?", "What can you do?", "Tell me a joke."):
        messages.append({"role": "user", "content": turn})
        before = replica_metric(ray_server, "chat-1", "ember_prompt_tokens_total")
        answer = ask(ray_server, "/v1/chat/completions",
                     {"messages": messages, "max_tokens": 8, "temperature": 0}, headers={SESSION_HEADER: "chat-1"})
        after = replica_metric(ray_server, "chat-1", "ember_prompt_tokens_total")
        assert before[0] == after[0] == answer["replica"]
        replicas.add(answer["replica"])
        evaluated.append(after[1] - before[1])
        prompt_tokens.append(answer["usage"]["prompt_tokens"])
        messages.append({"role": "assistant", "content": answer["text"]})
    assert len(replicas) == 1
    assert 0 < evaluated[0] <= prompt_tokens[0]  # the replica may hold the template's system prompt already
    for turn in (1, 2):  # only what the turn added is evaluated: the earlier turns are the slot's cache
        assert evaluated[turn] <= prompt_tokens[turn] - prompt_tokens[turn - 1]


@pytest.mark.model
@pytest.mark.slow
def test_a_killed_replica_loses_no_acknowledged_answer_and_comes_back(ray_server, reference):
    requests = requests_of_16_clients()
    victim = httpx.get(f"{ray_server}/health", timeout=TIMEOUT).headers[REPLICA_HEADER]
    with ThreadPoolExecutor(N_CLIENTS) as pool:
        futures = [pool.submit(ask, ray_server, *request) for request in requests]
        wait(futures, return_when=FIRST_COMPLETED)  # the first answer is in; the others are under way
        ray.kill(replica_actor(victim))
        answers = [future.result() for future in futures]
    for answer, expected in zip(answers, reference["answers"]):
        if answer["status"] == 200 and "error" not in answer:
            assert without_replica(answer) == without_replica(expected)
        elif answer["status"] == 200:  # a stream under way: an error event, then [DONE]
            assert answer["complete"] and answer["error"]["code"] == "replica_unavailable", answer
            assert expected["text"].startswith(answer["text"])
        else:  # not answered: a retryable 503 in OpenAI's error shape
            assert (answer["status"], answer["retry_after"]) == (503, str(RETRY_AFTER_SECONDS)), answer
            error = json.loads(answer["body"])["error"]
            assert (error["type"], error["code"]) == ("server_busy", "replica_unavailable")
    assert any(a["status"] == 200 and a["complete"] and "error" not in a for a in answers)

    deadline = time.monotonic() + TIMEOUT
    while replica_alive(victim) or running_replicas() < 2:
        assert time.monotonic() < deadline, "Ray did not start a replica in place of the killed one"
        time.sleep(1)
    answers = ask_all(ray_server, requests)
    assert [without_replica(a) for a in answers] == [without_replica(a) for a in reference["answers"]]
    assert victim not in {a["replica"] for a in answers}


def replica_actor_names(replica: str) -> list[str]:
    return [actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["name"].endswith("#" + replica)]


def replica_actor(replica: str):
    return ray.get_actor(replica_actor_names(replica)[0], namespace="serve")


def replica_alive(replica: str) -> bool:
    return bool(replica_actor_names(replica))


def running_replicas() -> int:
    deployment = serve.status().applications["ember"].deployments["ember"]
    return deployment.replica_states.get("RUNNING", 0)
