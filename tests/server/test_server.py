"""`ember serve` as its users see it: the real server on 127.0.0.1, spoken to with the official
openai client and with raw httpx; and the continuous-batching scheduler driven step by step.

The oracle for generated text is ember's Python API (`LLM`, one sequence, the plain
generation loop): the server, batching many requests into one graph run per token, must
produce exactly what a request alone produces.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest

import ember
from ember.cli.main import build_parser
from ember.engine.generate import Chunk
from ember.engine.sampling import SamplingParams
from ember.hub import resolve_model
from ember.server.metrics import Metrics
from ember.server.scheduler import Finished, QueueFull, Scheduler
from ember_server import ServerProcess, metric, without_ids
from paths import FIXTURES

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
N_CTX = 512
N_SLOTS = 8
API_KEY = "sekret-key"
STREAM_INTERVAL_MS = 100
NO_END = {"0": -100, "2": -100, "4": -100}  # bans smollm2's end-of-generation tokens: replies run to max_tokens
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def reference():
    with ember.LLM(resolve_model(MODEL), n_ctx=N_CTX) as llm:
        yield llm


@pytest.fixture(scope="module")
def server():
    resolve_model(MODEL)
    process = ServerProcess("-m", MODEL, "-c", str(N_CTX), "--parallel", str(N_SLOTS)).wait_ready()
    yield process.url
    process.stop()


@pytest.fixture(scope="module")
def guarded_server():
    """One slot, one place in the queue, an API key, and streams sent at most every 100 ms."""
    resolve_model(MODEL)
    process = ServerProcess("-m", MODEL, "-c", str(N_CTX), "--parallel", "1", "--queue-size", "1",
                            "--api-key", API_KEY, "--stream-interval", str(STREAM_INTERVAL_MS)).wait_ready()
    yield process.url
    process.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def eventually(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def reference_completion(reference, prompt, **kwargs):
    return reference.create_completion(prompt, **kwargs)["choices"][0]["text"]


# -- the scheduler, step by step ---------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime():
    from ember.engine.runtime import Model

    model = Model(resolve_model(MODEL), n_ctx=N_CTX, n_seq=4)
    yield model
    model.close()


class RecordingModel:
    """A runtime model that records the sequences each batched decode advanced."""

    def __init__(self, model):
        self._model = model
        self.batches: list[list[int]] = []

    def decode_batch(self, items):
        self.batches.append([seq for seq, _ in items])
        return self._model.decode_batch(items)

    def __getattr__(self, name):
        return getattr(self._model, name)


def greedy_job(scheduler, reference, prompt: str, max_tokens: int, events: list):
    params = SamplingParams(temperature=0, logit_bias={int(k): v for k, v in NO_END.items()})
    return scheduler.job(reference.prompt_tokens(prompt), params, max_tokens, [], None, events.append)


def run_until_idle(scheduler: Scheduler) -> None:
    while scheduler.n_running or scheduler.n_waiting:
        scheduler.run_once()


def text_of(events: list) -> str:
    return "".join(event.text for event in events if isinstance(event, Chunk))


def test_batched_decode_rows_equal_single_decodes(runtime, reference):
    prompts = [reference.prompt_tokens(text) for text in ("The capital of France is", "Once upon a time",
                                                          "def fib(n):", "1, 2, 3,")]
    for seq, prompt in enumerate(prompts):
        runtime.reset(seq)
        runtime.eval(prompt, seq=seq)
    batched = runtime.decode_batch([(seq, 100 + seq) for seq in range(4)])
    for seq, prompt in enumerate(prompts):
        runtime.truncate(len(prompt), seq)
        assert np.array_equal(batched[seq], runtime.decode_batch([(seq, 100 + seq)])[0])


def test_requests_join_and_leave_the_batch_at_token_granularity(runtime, reference):
    model = RecordingModel(runtime)
    scheduler = Scheduler(model, reference.tokenizer)
    first_events, second_events = [], []
    scheduler.submit(greedy_job(scheduler, reference, "The capital of France is", 6, first_events))
    scheduler.run_once()
    scheduler.submit(greedy_job(scheduler, reference, "Once upon a time", 6, second_events))
    run_until_idle(scheduler)
    # one graph run per step for every generating slot; the second joins at the next token
    assert model.batches == [[0], [0, 1], [0, 1], [0, 1], [0, 1], [1]]
    for events, prompt in ((first_events, "The capital of France is"), (second_events, "Once upon a time")):
        assert text_of(events) == reference_completion(reference, prompt, max_tokens=6, temperature=0,
                                                       logit_bias=NO_END)
        assert events[-1] == Finished("length", {"prompt_tokens": len(reference.prompt_tokens(prompt)),
                                                 "completion_tokens": 6, "total_tokens":
                                                 len(reference.prompt_tokens(prompt)) + 6})


def test_a_cancelled_request_leaves_at_the_next_step(runtime, reference):
    model = RecordingModel(runtime)
    scheduler = Scheduler(model, reference.tokenizer)
    staying, leaving = [], []
    scheduler.submit(greedy_job(scheduler, reference, "The capital of France is", 50, staying))
    job = greedy_job(scheduler, reference, "Once upon a time", 50, leaving)
    scheduler.submit(job)
    scheduler.run_once()
    scheduler.cancel(job)
    n_events = len(leaving)
    scheduler.run_once()
    assert model.batches == [[0, 1], [0]]
    assert scheduler.n_running == 1 and len(leaving) == n_events


def test_a_repeated_prompt_evaluates_only_its_last_token(runtime, reference):
    metrics = Metrics()
    scheduler = Scheduler(runtime, reference.tokenizer, metrics=metrics)
    prompt = "The capital of France is"
    replies = []
    for _ in range(2):
        events = []
        scheduler.submit(greedy_job(scheduler, reference, prompt, 3, events))
        run_until_idle(scheduler)
        replies.append(text_of(events))
    assert metrics.prompt_tokens == len(reference.prompt_tokens(prompt)) + 1
    assert replies[0] == replies[1]


def test_a_new_conversation_leaves_another_conversations_cache_alone(runtime, reference):
    metrics = Metrics()
    scheduler = Scheduler(runtime, reference.tokenizer, metrics=metrics)
    system = list(range(100, 110))  # a system prompt both conversations start with
    first, second = system + list(range(200, 230)), system + list(range(300, 330))
    for prompt in (first, second):
        events = []
        scheduler.submit(scheduler.job(prompt, SamplingParams(temperature=0), 2, [], None, events.append))
        run_until_idle(scheduler)
    slots_with = {slot.seq for slot in scheduler.slots if slot.tokens[:len(first)] == first}
    assert len(slots_with) == 1  # the second conversation took another slot
    evaluated = metrics.prompt_tokens
    next_turn = first + list(range(400, 410))
    job = scheduler.job(next_turn, SamplingParams(temperature=0), 2, [], None, [].append)
    scheduler.submit(job)
    run_until_idle(scheduler)
    assert job.slot.seq in slots_with
    assert metrics.prompt_tokens - evaluated <= len(next_turn) - len(first)


def test_the_waiting_queue_is_bounded(runtime, reference):
    scheduler = Scheduler(runtime, reference.tokenizer, queue_size=2)
    for _ in range(4 + 2):
        scheduler.submit(greedy_job(scheduler, reference, "Hi", 1, []))
    with pytest.raises(QueueFull):
        scheduler.submit(greedy_job(scheduler, reference, "Hi", 1, []))


# -- the OpenAI API through the official client ------------------------------------------------


def test_health_and_models(server, client):
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_equals_the_python_api(client, reference):
    result = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                       temperature=0)
    expected = reference.create_completion("The capital of France is", max_tokens=12, temperature=0)
    assert result.choices[0].text == expected["choices"][0]["text"]
    assert result.choices[0].finish_reason == expected["choices"][0]["finish_reason"]
    assert result.usage.model_dump(exclude_none=True) == expected["usage"]
    assert result.model == MODEL and result.object == "text_completion"


def test_chat_completion_equals_the_python_api(client, reference):
    result = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0)
    expected = reference.create_chat_completion(QUESTION, max_tokens=16, temperature=0)
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert result.choices[0].finish_reason == expected["choices"][0]["finish_reason"]
    assert result.usage.model_dump(exclude_none=True) == expected["usage"]


def test_streamed_chat_equals_the_whole_reply_and_ends_with_usage(client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert len({c.id for c in chunks}) == 1


def test_streamed_completion_equals_the_whole_text(client):
    kwargs = dict(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"


def test_raw_stream_is_server_sent_events_ending_with_done(server):
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("sampling", [
    {"temperature": 1.0, "seed": 1234},
    {"temperature": 0.7, "top_p": 0.8, "seed": 99, "extra_body": {"top_k": 5, "min_p": 0.1}},
    {"temperature": 0, "presence_penalty": 1.5, "frequency_penalty": 0.5},
])
def test_sampling_fields_are_honoured_as_in_the_python_api(client, reference, sampling):
    result = client.completions.create(model=MODEL, prompt="My favourite colour is", max_tokens=12,
                                       logit_bias=NO_END, **sampling)
    as_keywords = {**{k: v for k, v in sampling.items() if k != "extra_body"}, **sampling.get("extra_body", {})}
    assert result.choices[0].text == reference_completion(reference, "My favourite colour is", max_tokens=12,
                                                          logit_bias=NO_END, **as_keywords)


def test_stop_strings_cut_the_reply(client, reference):
    full = reference_completion(reference, "The capital of France is", max_tokens=12, temperature=0)
    stop = full.strip()[2:5]  # a string that occurs in the reply
    result = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                       temperature=0, stop=[stop, "never seen"])
    assert result.choices[0].text == full[:full.index(stop)]
    assert result.choices[0].finish_reason == "stop"


def test_completion_logprobs_equal_the_python_api(client, reference):
    result = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4,
                                       temperature=0, logprobs=3)
    expected = reference.create_completion("The capital of France is", max_tokens=4, temperature=0,
                                           logprobs=3)["choices"][0]["logprobs"]
    logprobs = result.choices[0].logprobs
    assert logprobs.tokens == expected["tokens"] and logprobs.text_offset == expected["text_offset"]
    assert logprobs.token_logprobs == pytest.approx(expected["token_logprobs"], abs=1e-5)
    assert [list(t) for t in logprobs.top_logprobs] == [list(t) for t in expected["top_logprobs"]]


def test_chat_logprobs_name_the_greedy_token_first(client):
    result = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=2)
    content = result.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == result.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.logprob <= 0 and bytes(entry.bytes).decode() == entry.token


def test_max_tokens_zero_generates_nothing(client):
    result = client.completions.create(model=MODEL, prompt="Hello", max_tokens=0)
    assert result.choices[0].text == "" and result.choices[0].finish_reason == "length"
    assert result.usage.completion_tokens == 0


# -- reasoning (api/reasoning.py) -----------------------------------------------------------------

# smollm2 is no reasoning model: a regex makes its reply one that thinks first
THINKING = {"regex": "<think>[a-z ]{4,24}</think>[A-Za-z ]{4,24}"}


def test_reasoning_comes_back_as_reasoning_content(client):
    kwargs = {"model": MODEL, "messages": QUESTION, "max_tokens": 64, "temperature": 0}
    raw = client.chat.completions.create(**kwargs, extra_body={**THINKING, "reasoning_format": "none"})
    split = client.chat.completions.create(**kwargs, extra_body=THINKING)
    text = raw.choices[0].message.content
    thoughts, answer = text.removeprefix("<think>").split("</think>")
    assert split.choices[0].message.reasoning_content == thoughts.strip()
    assert split.choices[0].message.content == answer.lstrip()
    assert split.usage == raw.usage


def test_streamed_reasoning_arrives_as_reasoning_content_deltas(client):
    kwargs = {"model": MODEL, "messages": QUESTION, "max_tokens": 64, "temperature": 0, "extra_body": THINKING}
    whole = client.chat.completions.create(**kwargs).choices[0].message
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
    thoughts = [getattr(d, "reasoning_content", None) or "" for d in deltas]
    assert "".join(thoughts) == whole.reasoning_content
    assert "".join(d.content or "" for d in deltas) == whole.content
    assert len([t for t in thoughts if t]) > 1


def test_an_unknown_reasoning_format_gets_400(server):
    body = {"messages": QUESTION, "reasoning_format": "hidden"}
    assert_openai_error(httpx.post(f"{server}/v1/chat/completions", json=body), 400, "reasoning_format")


# -- tokenize, detokenize, metrics --------------------------------------------------------------


def tokenizer_cases():

    path = FIXTURES / f"tokenize-{MODEL}.json"
    return json.loads(path.read_text())["cases"][:6]


@pytest.mark.parametrize("case", tokenizer_cases(), ids=lambda case: case["text"][:20])
def test_tokenize_gives_llama_cpp_ids(server, case):
    body = {"content": case["text"], "add_special": True, "parse_special": case["parse_special"]}
    assert httpx.post(f"{server}/tokenize", json=body).json() == {"tokens": case["ids"]}


def test_detokenize_inverts_tokenize(server):
    text = "Hello, world! <|im_start|>user\nÜnïcödé 123"
    tokens = httpx.post(f"{server}/tokenize", json={"content": text}).json()["tokens"]
    assert httpx.post(f"{server}/detokenize", json={"tokens": tokens}).json() == {"content": text}


def test_tokenize_with_pieces(server):
    tokens = httpx.post(f"{server}/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(t["piece"] for t in tokens) == "Hello world"


def test_metrics_count_requests_and_tokens(server, client):
    before = metric(server, "ember_generated_tokens_total")
    result = client.completions.create(model=MODEL, prompt="Count with me: one, two,", max_tokens=5,
                                       temperature=0, logit_bias=NO_END)
    text = httpx.get(f"{server}/metrics").text
    assert metric(server, "ember_generated_tokens_total") - before == result.usage.completion_tokens == 5
    assert 'ember_requests_total{route="/v1/completions",status="200"}' in text
    for name in ("ember_prompt_tokens_total", "ember_requests_waiting", "ember_requests_running",
                 "ember_generated_tokens_per_second"):
        assert metric(server, name) >= 0
    assert metric(server, "ember_slots") == N_SLOTS
    assert "# TYPE ember_generated_tokens_total counter" in text


# -- bad input never hurts the server -----------------------------------------------------------


def assert_openai_error(response, status: int, param: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param


BAD_COMPLETIONS = [
    ({}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [10**9]}, None),
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**30}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"),
    ({"prompt": "x", "temperature": 1e308}, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": -5}, "top_k"),
    ({"prompt": "x", "min_p": -1}, "min_p"),
    ({"prompt": "x", "seed": 10**40}, "seed"),
    ({"prompt": "x", "seed": "random"}, "seed"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": ["."] * 100}, "stop"),
    ({"prompt": "x", "presence_penalty": 7}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -9}, "frequency_penalty"),
    ({"prompt": "x", "logprobs": 1000}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "logit_bias": {"49999999": 1}}, None),
    ({"prompt": "x", "logit_bias": {"5": "a lot"}}, "logit_bias.5"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": "please"}}, "stream_options.include_usage"),
    ({"prompt": "x", "n": 3}, "n"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "model": 42}, "model"),
]

BAD_CHATS = [
    ({}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content"),
    ({"messages": QUESTION, "top_logprobs": -1}, "top_logprobs"),
    ({"messages": QUESTION, "max_completion_tokens": -3}, "max_completion_tokens"),
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS, ids=[json.dumps(b)[:40] for b, _ in BAD_COMPLETIONS])
def test_bad_completion_requests_get_400(server, body, param):
    assert_openai_error(httpx.post(f"{server}/v1/completions", json=body), 400, param)


@pytest.mark.parametrize("body,param", BAD_CHATS, ids=[json.dumps(b)[:40] for b, _ in BAD_CHATS])
def test_bad_chat_requests_get_400(server, body, param):
    assert_openai_error(httpx.post(f"{server}/v1/chat/completions", json=body), 400, param)


@pytest.mark.parametrize("raw", [b"{\"prompt\": ", b"not json", b"[1, 2]", b"\xff\xfe", b"{\"prompt\": \"x\", "
                                 b"\"temperature\": NaN}", b"[" * 100_000 + b"]" * 100_000, b""])
def test_malformed_bodies_get_400(server, raw):
    response = httpx.post(f"{server}/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert_openai_error(response, 400)


def test_a_prompt_beyond_the_context_gets_400(server):
    response = httpx.post(f"{server}/v1/completions", json={"prompt": "word " * (N_CTX + 10)})
    assert_openai_error(response, 400, "prompt")
    assert response.json()["error"]["code"] == "context_length_exceeded"
    chat = [{"role": "user", "content": "word " * (N_CTX + 10)}]
    assert_openai_error(httpx.post(f"{server}/v1/chat/completions", json={"messages": chat}), 400, "messages")


def test_a_body_over_the_limit_gets_413(server):
    response = httpx.post(f"{server}/v1/completions", json={"prompt": "x" * (9 << 20)})
    assert_openai_error(response, 413)


def test_bad_tokenize_and_detokenize_requests_get_400(server):
    assert_openai_error(httpx.post(f"{server}/tokenize", json={"content": 5}), 400, "content")
    assert_openai_error(httpx.post(f"{server}/detokenize", json={"tokens": [-1]}), 400, "tokens")
    assert_openai_error(httpx.post(f"{server}/detokenize", json={"tokens": "abc"}), 400, "tokens")


def test_unknown_routes_get_404_and_wrong_methods_405(server):
    assert_openai_error(httpx.get(f"{server}/v1/engines"), 404)
    assert_openai_error(httpx.post(f"{server}/v2/chat/completions", json={}), 404)
    assert_openai_error(httpx.get(f"{server}/v1/completions"), 405)


def test_the_server_still_answers_after_bad_input(server, client):
    result = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    assert result.usage.completion_tokens == 2


# -- concurrency --------------------------------------------------------------------------------

SUBJECTS = ["The capital of France is", "My favourite fruit is", "Python is a", "The ocean is", "In 1969,",
            "The best way to learn is", "Cats and dogs", "The old castle"]


def request_for(i: int) -> dict:
    """Different requests: greedy ones, and sampled ones with a fixed seed."""
    sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 1.0, "seed": 100 + i}
    return {"model": MODEL, "prompt": SUBJECTS[i], "max_tokens": 6, **sampling}


async def streamed_text(client: openai.AsyncOpenAI, request: dict) -> tuple[str, str]:
    stream = await client.completions.create(**request, stream=True)
    texts, finish_reason = [], None
    async for chunk in stream:
        texts.append(chunk.choices[0].text)
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    return "".join(texts), finish_reason


def test_sixteen_concurrent_streams_each_get_their_own_reply(server):
    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)
        alone = [await streamed_text(client, request_for(i)) for i in range(len(SUBJECTS))]

        async def one_client(c: int):
            return [(i, await streamed_text(client, request_for(i))) for i in
                    ((c + r) % len(SUBJECTS) for r in range(4))]

        together = await asyncio.gather(*(one_client(c) for c in range(16)))
        await client.close()
        return alone, [reply for replies in together for reply in replies]

    alone, together = asyncio.run(run())
    assert len(set(text for text, _ in alone)) == len(SUBJECTS)  # every request has its own reply
    assert len(together) == 64
    for i, reply in together:
        assert reply == alone[i], SUBJECTS[i]


def test_batched_greedy_replies_match_llama_cpp_up_to_its_first_near_tie(server):

    fixture = json.loads((FIXTURES / f"llama_cpp_greedy_{MODEL}.json").read_text())
    cases = fixture["cases"]

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)
        results = await asyncio.gather(*(client.completions.create(
            model=MODEL, prompt=case["prompt"], max_tokens=case["n_before_near_tie"], temperature=0)
            for case in cases))
        await client.close()
        return results

    for case, result in zip(cases, asyncio.run(run())):
        assert result.usage.prompt_tokens == len(case["prompt_ids"])
        assert result.choices[0].text == case["text_before_near_tie"], case["prompt"]


def test_a_client_that_disconnects_frees_its_slot_within_a_step(server):
    body = {"messages": QUESTION, "max_tokens": 400, "temperature": 0, "stream": True, "logit_bias": NO_END}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break  # the first generated text
        steps_at_disconnect = metric(server, "ember_decode_steps_total")
    assert eventually(lambda: metric(server, "ember_requests_running") == 0)
    assert metric(server, "ember_decode_steps_total") - steps_at_disconnect <= 2


def test_a_client_that_gives_up_on_a_whole_response_frees_its_slot(server):
    # 400 tokens take well over 0.5 s on any CPU (smollm2 decodes at a few hundred tokens/s at
    # most); at 1.5 s a fast host finished the reply before the client gave up.
    body = {"prompt": "Once upon a time", "max_tokens": 400, "logit_bias": NO_END}
    steps_before = metric(server, "ember_decode_steps_total")
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server}/v1/completions", json=body, timeout=0.5)
    assert eventually(lambda: metric(server, "ember_decode_steps_total") > steps_before)  # it ran
    assert eventually(lambda: metric(server, "ember_requests_running") == 0)


# -- queue, API key -----------------------------------------------------------------------------


def test_past_the_queue_requests_get_503_with_retry_after(guarded_server):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    long = {"messages": QUESTION, "max_tokens": 400, "stream": True, "logit_bias": NO_END}
    url = f"{guarded_server}/v1/chat/completions"
    with httpx.stream("POST", url, json=long, headers=auth, timeout=60) as running:
        assert running.status_code == 200
        with httpx.stream("POST", url, json=long, headers=auth, timeout=60) as waiting:
            assert waiting.status_code == 200
            assert eventually(lambda: metric(guarded_server, "ember_requests_waiting", auth) == 1)
            refused = httpx.post(url, json=long, headers=auth)
            assert_openai_error(refused, 503)
            assert refused.headers["retry-after"] == "1"
    after = httpx.post(url, json={"messages": QUESTION, "max_tokens": 2}, headers=auth, timeout=60)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] <= 2


def test_a_stream_interval_sends_the_tokens_in_pieces_and_changes_no_event(server, guarded_server):
    body = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "stream": True, "logit_bias": NO_END}

    def pieces(url: str, headers: dict) -> tuple[list[tuple[float, bytes]], float]:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as response:
            start = time.perf_counter()
            got = [(time.perf_counter() - start, piece) for piece in response.iter_raw()]
        return got, time.perf_counter() - start

    def events(got) -> list[bytes]:
        return without_ids(b"".join(p for _, p in got)).split(b"\n\n")

    plain, _ = pieces(server, {})
    held, seconds = pieces(guarded_server, {"Authorization": f"Bearer {API_KEY}"})
    assert events(held) == events(plain) and len(events(held)) > 48
    times = [t for t, _ in held]
    # pieces no closer than the interval (the last, with the end, is not held back), so at most
    # one piece per interval of the stream's time plus the first and the last
    assert all(b - a >= STREAM_INTERVAL_MS / 1000 - 0.01 for a, b in zip(times, times[1:-1]))
    assert len(held) <= seconds * 1000 / STREAM_INTERVAL_MS + 2 < len(plain)


def test_api_key_is_required_when_set(guarded_server):
    assert_openai_error(httpx.get(f"{guarded_server}/v1/models"), 401)
    wrong = httpx.get(f"{guarded_server}/v1/models", headers={"Authorization": "Bearer wrong"})
    assert_openai_error(wrong, 401)
    assert wrong.headers["www-authenticate"] == "Bearer"
    assert_openai_error(httpx.post(f"{guarded_server}/v1/completions", json={"prompt": "x"}), 401)
    client = openai.OpenAI(base_url=f"{guarded_server}/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{guarded_server}/health").status_code == 200


def test_a_busy_port_is_a_one_line_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "ember", "serve", "--port", str(port)],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"ember: error: cannot listen on 127.0.0.1:{port}: "
                                                  "Address already in use"]


def test_the_server_listens_on_loopback_by_default():
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.api_key) == ("127.0.0.1", None)
