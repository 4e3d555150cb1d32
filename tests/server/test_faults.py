"""`ember serve` under faults: clients that go away mid-request, bodies that trickle in, bodies
that are not JSON, many clients at once, and a model whose chat template never finishes. The
server answers each with the right status, logs no traceback, and goes on serving everyone
else; a tiny random model keeps every test fast."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ember_server import ServerProcess
from tiny_gguf import write_tiny_model

HANG = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    process = ServerProcess("-m", str(path), "-t", "1", "--parallel", "4").wait_ready()
    yield process
    process.stop()


def raw_request(url: str, head: bytes, body_parts: list[bytes], pause: float = 0.0, close_early: bool = False):
    """Send a request over a plain socket, the body in parts; the response bytes (b"" if closed early)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        for part in body_parts:
            time.sleep(pause)
            s.sendall(part)
        if close_early:
            return b""
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def post_head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def chat(url: str, messages=HI, **fields) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
def test_a_client_that_disconnects_while_sending_its_body_leaves_no_traceback(tiny_server, path):
    # used to log two ~50-line tracebacks (ClientDisconnect) per request
    raw_request(tiny_server.url, post_head(path, 1000), [b'{"messages": [{"role": "us'], pause=0.1, close_early=True)
    time.sleep(0.5)
    assert chat(tiny_server.url).status_code == 200
    log = tiny_server.output()
    assert "Traceback" not in log and "ERROR" not in log, log
    metrics = httpx.get(f"{tiny_server.url}/metrics", timeout=10).text
    assert f'ember_requests_total{{route="{path}",status="499"}}' in metrics


def test_a_slow_body_is_answered_and_holds_up_nobody(tiny_server):
    body = json.dumps({"messages": HI, "max_tokens": 8, "temperature": 0}).encode()
    parts = [body[i:i + 8] for i in range(0, len(body), 8)]
    done = {}

    def slow():
        done["response"] = raw_request(tiny_server.url, post_head("/v1/chat/completions", len(body)), parts,
                                       pause=0.25)
        done["slow"] = time.monotonic()

    trickle = threading.Thread(target=slow)
    trickle.start()
    time.sleep(0.5)
    quick = chat(tiny_server.url)
    quick_done = time.monotonic()
    trickle.join(60)
    assert quick.status_code == 200 and quick_done < done["slow"]  # answered while the slow body trickled in
    status_line, _, rest = done["response"].partition(b"\r\n")
    assert status_line == b"HTTP/1.1 200 OK"
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["choices"] == quick.json()["choices"]


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "hi"}',  # truncated
    b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',  # not UTF-8
    b"[" * 100_000 + b"]" * 100_000,  # nested past the parser's recursion limit
    b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e999}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}',
    b"null",
    b"",
])
def test_bodies_that_are_not_a_valid_request_get_400(tiny_server, raw):
    response = httpx.post(f"{tiny_server.url}/v1/chat/completions", content=raw,
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "Traceback" not in tiny_server.output()


def test_concurrent_greedy_requests_get_the_replies_they_get_alone(tiny_server):
    prompts = [[{"role": "user", "content": f"question {i % 5}"}] for i in range(16)]
    alone = {json.dumps(p): chat(tiny_server.url, p, max_tokens=12).json()["choices"][0]["message"]["content"]
             for p in prompts[:5]}
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda p: chat(tiny_server.url, p, max_tokens=12), prompts))
    assert all(r.status_code == 200 for r in replies)
    assert [r.json()["choices"][0]["message"]["content"] for r in replies] == [alone[json.dumps(p)] for p in prompts]


@pytest.fixture(scope="module")
def hanging_template_server(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("hang") / "hang.gguf",
                            metadata={"tokenizer.chat_template": HANG})
    process = ServerProcess("-m", str(path), "-t", "1", "--parallel", "2").wait_ready()
    yield process
    process.stop()


def test_templates_that_never_finish_get_400_while_the_server_serves_others(hanging_template_server):
    # seven such requests used to take every worker thread, forever: ordinary requests timed
    # out and SIGINT no longer stopped the server
    url = hanging_template_server.url
    with ThreadPoolExecutor(8) as pool:
        hanging = [pool.submit(chat, url) for _ in range(8)]
        time.sleep(0.5)
        health = httpx.get(f"{url}/health", timeout=10)
        completion = httpx.post(f"{url}/v1/completions", json={"prompt": "the", "max_tokens": 4}, timeout=10)
        tokens = httpx.post(f"{url}/tokenize", json={"content": "the cat"}, timeout=10)
        still_hanging = sum(not f.done() for f in hanging)
        answers = [f.result() for f in hanging]
    assert health.status_code == completion.status_code == tokens.status_code == 200
    assert still_hanging > 0  # the others were answered while templates were still rendering
    for answer in answers:
        assert answer.status_code == 400
        assert answer.json()["error"]["message"] == ("the chat template did not finish within 5 s "
                                                     "(ember's limit for rendering a chat template)")
    assert "Traceback" not in hanging_template_server.output()


def test_sigint_stops_a_server_whose_template_is_rendering(tmp_path):
    path = write_tiny_model(tmp_path / "hang.gguf", metadata={"tokenizer.chat_template": HANG})
    server = ServerProcess("-m", str(path), "-t", "1").wait_ready()
    try:
        pending = ThreadPoolExecutor(2)
        requests = [pending.submit(chat, server.url) for _ in range(2)]
        time.sleep(1.0)
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=10) == 130  # stopped by Ctrl-C: 128 + SIGINT, as a shell reports it
        for request in requests:  # each was answered at shutdown, or its connection closed
            try:
                answer = request.result()
            except httpx.HTTPError:
                continue
            assert answer.status_code == 503, answer.text
        pending.shutdown()
        assert "Traceback" not in server.output()
    finally:
        server.stop()
