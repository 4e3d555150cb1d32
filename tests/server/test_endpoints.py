"""llama-server's endpoints beside OpenAI's, as its users' tools call them: /v1/models/{id},
/props, /slots, CORS for pages on other origins, and a log line per request. A real `ember
serve` process on a tiny random model (tests/tiny_gguf.py), so nothing is pulled."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import gguf
import httpx
import openai
import pytest

from ember.engine.load import load
from ember.engine.sampling import SamplingParams
from ember.engine.sampling_params import CHAT_TEMPERATURE, DEFAULTS
from ember.server.scheduler import Finished, Scheduler
from ember_server import ServerProcess
from tiny_gguf import N_CTX_TRAIN, N_EMBD, write_tiny_model

N_CTX = 256
N_SLOTS = 2
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("endpoints") / "tiny.gguf"
    write_tiny_model(path, chat_template=TEMPLATE)
    return path


@pytest.fixture(scope="module")
def server(model_path):
    process = ServerProcess("-m", str(model_path), "-c", str(N_CTX), "--parallel", str(N_SLOTS), "-t", "1",
                            "--cors-origins", "https://app.example,http://localhost:3000").wait_ready()
    yield process
    process.stop()


def test_a_model_is_retrieved_by_its_id_and_an_unknown_one_is_a_404(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    (listed,) = client.models.list().data
    retrieved = client.models.retrieve(listed.id)
    assert retrieved.id == listed.id and retrieved.object == "model"
    card = httpx.get(f"{server.url}/v1/models/{listed.id}").json()
    assert card["meta"] == {"n_ctx": N_CTX, "n_ctx_train": N_CTX_TRAIN, "n_vocab": card["meta"]["n_vocab"],
                            "n_embd": N_EMBD, "n_slots": N_SLOTS}
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("no-such-model")
    assert error.value.body["code"] == "model_not_found"
    assert "no-such-model" in error.value.body["message"]


def test_props_say_what_llama_servers_props_say(server, model_path):
    props = httpx.get(f"{server.url}/props").json()
    assert props["total_slots"] == N_SLOTS
    assert props["default_generation_settings"]["n_ctx"] == N_CTX
    params = props["default_generation_settings"]["params"]
    assert (params["temperature"], params["top_k"], params["top_p"], params["min_p"]) == (
        DEFAULTS.temperature, DEFAULTS.top_k, DEFAULTS.top_p, DEFAULTS.min_p)
    assert params["chat_temperature"] == CHAT_TEMPERATURE
    assert props["chat_template"] == TEMPLATE
    reader = gguf.GGUFReader(model_path)  # the oracle for the special tokens: the file, read by the gguf package
    tokens = reader.fields["tokenizer.ggml.tokens"]
    for name in ("bos", "eos"):
        token_id = int(reader.fields[f"tokenizer.ggml.{name}_token_id"].parts[-1][0])
        assert props[f"{name}_token"] == bytes(tokens.parts[tokens.data[token_id]]).decode()
    assert props["model_path"] == str(model_path)
    assert props["modalities"] == {"vision": False, "audio": False, "video": False}
    assert props["build_info"].startswith("ember ")
    assert httpx.post(f"{server.url}/props", json={}).status_code == 405  # changing props is not offered


def test_slots_of_an_idle_server(server):
    idle = httpx.get(f"{server.url}/slots").json()
    assert [slot["id"] for slot in idle] == list(range(N_SLOTS))
    assert all(slot["n_ctx"] == N_CTX and not slot["is_processing"] for slot in idle)


def test_slots_show_a_request_being_served_step_by_step(model_path):
    loaded = load(str(model_path), n_ctx=64, n_threads=1, n_seq=2)
    scheduler = Scheduler(loaded.model, loaded.tokenizer)
    prompt = loaded.tokenizer.encode("the the the")
    events = []
    scheduler.submit(scheduler.job(prompt, SamplingParams(temperature=0, logit_bias={0: -100}), 5, [], None,
                                   events.append))
    scheduler.run_once()  # the prompt (whose logits give the first token), then one decode step: two tokens
    serving, idle = scheduler.slot_states()
    assert serving["is_processing"] and not idle["is_processing"]
    assert serving["n_prompt_tokens"] == serving["n_prompt_tokens_processed"] == len(prompt)
    assert serving["next_token"] == [{"has_next_token": True, "n_remain": 3, "n_decoded": 2}]
    while scheduler.n_running:
        scheduler.run_once()
    assert isinstance(events[-1], Finished) and events[-1].usage["completion_tokens"] == 5
    done, _ = scheduler.slot_states()
    assert not done["is_processing"] and "next_token" not in done
    assert done["n_cached"] == len(prompt) + 4  # the last token sampled is never evaluated


def test_cors_lets_in_the_origins_named_and_no_others(server):
    preflight = httpx.options(f"{server.url}/v1/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    answer = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://localhost:3000"})
    assert answer.headers["access-control-allow-origin"] == "http://localhost:3000"
    stranger = httpx.get(f"{server.url}/v1/models", headers={"Origin": "https://evil.example"})
    assert stranger.status_code == 200 and "access-control-allow-origin" not in stranger.headers
    refused = httpx.options(f"{server.url}/v1/models", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "GET"})
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers


def test_every_request_is_one_log_line(server):
    httpx.get(f"{server.url}/health")
    httpx.post(f"{server.url}/v1/completions", content=b"{not json")
    httpx.get(f"{server.url}/no/such/route")
    lines = [r'INFO: 127\.0\.0\.1 "GET /health" 200 \d+\.\d{3}s',
             r'INFO: 127\.0\.0\.1 "POST /v1/completions" 400 \d+\.\d{3}s',
             r'INFO: 127\.0\.0\.1 "GET /no/such/route" 404 \d+\.\d{3}s']
    deadline = time.monotonic() + 30  # a line is written once its answer has gone out
    while not all(re.search(line, server.output()) for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = server.output()
    for line in lines:
        assert re.search(line, log), line
    assert "Traceback" not in log


@pytest.mark.parametrize("flags, origin, allowed", [
    ((), "http://127.0.0.1:5173", True),           # the default: pages on this machine
    ((), "https://evil.example", False),
    (("--cors-origins", "*"), "https://evil.example", True),
    (("--cors-origins", ""), "http://localhost:3000", False),
])
def test_the_default_cors_origins_are_this_machine(model_path, flags, origin, allowed):
    process = ServerProcess("-m", str(model_path), "-c", "64", "--parallel", "1", "-t", "1", *flags).wait_ready()
    try:
        answer = httpx.get(f"{process.url}/health", headers={"Origin": origin})
        assert ("access-control-allow-origin" in answer.headers) == allowed
    finally:
        process.stop()


def test_slots_can_be_turned_off(model_path):
    process = ServerProcess("-m", str(model_path), "-c", "64", "--parallel", "1", "-t", "1",
                            "--no-slots").wait_ready()
    try:
        answer = httpx.get(f"{process.url}/slots")
        assert answer.status_code == 501 and "--slots" in answer.json()["error"]["message"]
        assert httpx.get(f"{process.url}/props").json()["endpoint_slots"] is False
    finally:
        process.stop()


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_bad_port_is_a_one_line_error(model_path, port):
    result = subprocess.run([sys.executable, "-m", "ember", "serve", "-m", str(model_path), "--port", port],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--port" in result.stderr and "Traceback" not in result.stderr
