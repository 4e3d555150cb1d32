"""llama.cpp's flags where its users type them: run, chat, serve, bench and perplexity accept
-ngl, -fa, --mlock, --no-mmap, -b/-ub (a note where they mean nothing here, never a misparse),
the sampling flags, -r/--stop, --ignore-eos, --chat-template, --jinja and --version; defaults
come from one place and --help shows them; settings beyond the model or the machine warn."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

import ember
from ember.cli import run as run_command
from ember.cli.main import batch_size, build_parser, main
from ember.engine.sampling_params import DEFAULTS
from ember.sysinfo import physical_cores
from fake_llm import ByteTokenizer, continuation, fake_llm
from paths import ember_root
from tiny_gguf import N_CTX_TRAIN, write_tiny_model

SRC = ember_root()
MODEL_COMMANDS = ["run", "chat", "serve", "bench", "perplexity"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def parse(*argv):
    return build_parser().parse_args(list(argv))


def ember_cli(*argv, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "ember", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def run(argv, capsys):
    sys_stdin, sys.stdin = sys.stdin, io.StringIO("")
    try:
        code = main(["run", *map(str, argv)])
    finally:
        sys.stdin = sys_stdin
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def hello(monkeypatch):
    """ember run with the fake model: "Say:" is answered "Hello", then the end token."""
    monkeypatch.setattr(run_command, "load_llm",
                        lambda args: (fake_llm(continuation(ByteTokenizer().encode("Say:"), list(b"Hello"))), 0.0))


# -- parsing -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_ngl_is_a_flag_not_n_with_a_value(command):
    extra = ["-f", "x.txt"] if command == "perplexity" else []
    args = parse(command, "-ngl", "99", *extra)
    assert args.n_gpu_layers == "99"
    assert getattr(args, "n_predict", 256) == 256


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_cache_type_flags_on_every_model_command(command):
    extra = ["-f", "x.txt"] if command == "perplexity" else []
    args = parse(command, "-ctk", "q8_0", "--cache-type-v", "f32", *extra)
    assert (args.cache_type_k, args.cache_type_v) == ("q8_0", "f32")
    assert (parse(command, *extra).cache_type_k, parse(command, *extra).cache_type_v) == (None, None)


def test_run_loads_the_cache_types_it_is_given(tiny):
    llm, _ = run_command.load_llm(parse("run", "-m", str(tiny), "-t", "1", "-ctk", "f32", "-ctv", "F16", "hi"))
    assert (llm.model.type_k.name, llm.model.type_v.name) == ("F32", "F16")
    llm.close()


def test_bench_takes_llama_benchs_depth_list():
    assert parse("bench", "-d", "0,512,4096").n_depth == [0, 512, 4096]
    assert parse("bench", "--n-depth", "8").n_depth == [8]
    assert parse("bench").n_depth == [0]


@pytest.mark.parametrize("argv, value, prompt", [
    (["-fa", "Hello"], "on", "Hello"),
    (["-fa", "on", "Hello"], "on", "Hello"),
    (["-fa", "off", "Hello"], "off", "Hello"),
    (["--flash-attn", "auto", "Hello"], "auto", "Hello"),
    (["Hello", "-fa"], "on", "Hello"),
    (["-fa=1", "Hello"], "1", "Hello"),
])
def test_flash_attn_takes_an_optional_value_and_never_the_prompt(argv, value, prompt):
    args = parse("run", *argv)
    assert (args.flash_attn, args.prompt_arg) == (value, prompt)


def test_bench_takes_llama_benchs_fa_list():
    assert parse("bench", "-fa", "0,1", "-p", "8").flash_attn == "0,1"


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_loading_flags_are_accepted_everywhere(command):
    extra = ["-f", "x.txt"] if command == "perplexity" else []
    args = parse(command, "--mlock", "--no-mmap", "--no-huge-pages", "-b", "256", "-ub", "128", *extra)
    assert (args.mlock, args.mmap, args.huge_pages, batch_size(args)) == (True, False, False, 128)
    assert (parse(command, *extra).mmap, parse(command, *extra).huge_pages) == (True, True)


def test_sampling_flags_take_their_defaults_from_sampling_params():
    args = parse("run", "hi")
    params = run_command.sampling_from_args(args)
    for name in ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
                 "presence_penalty", "frequency_penalty", "mirostat_mode", "mirostat_tau", "mirostat_eta"):
        assert getattr(params, name) == getattr(DEFAULTS, name), name


def test_sampling_flags_reach_the_sampler():
    args = parse("run", "--repeat-last-n", "16", "--presence-penalty", "0.5", "--frequency-penalty", "0.25",
                 "--typical", "0.9", "--mirostat", "2", "--mirostat-lr", "0.2", "--mirostat-ent", "3", "hi")
    params = run_command.sampling_from_args(args)
    assert (params.repeat_last_n, params.presence_penalty, params.frequency_penalty, params.typical_p) == (
        16, 0.5, 0.25, 0.9)
    assert (params.mirostat_mode, params.mirostat_eta, params.mirostat_tau) == (2, 0.2, 3.0)


def test_reverse_prompt_and_stop_collect_stop_strings():
    assert parse("run", "-r", "User:", "--stop", "###", "--reverse-prompt", "\n\n", "hi").stop == [
        "User:", "###", "\n\n"]
    assert parse("run", "hi").stop is None


def test_context_zero_means_the_models_and_negative_is_refused():
    assert parse("run", "-c", "0", "hi").ctx_size == 0
    result = ember_cli("run", "-c", "-5", "hi")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--ctx-size" in result.stderr


def test_hf_names_the_model_as_m_does():
    assert parse("run", "-hf", "org/repo:Q8_0", "hi").model == "org/repo:Q8_0"
    assert parse("run", "-hf", "org/repo", "-hff", "model-f16.gguf", "hi").model == "org/repo:model-f16.gguf"
    assert parse("run", "hi").model == "smollm2-135m"
    result = ember_cli("run", "-m", "a.gguf", "-hf", "org/repo", "hi")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "give the model once" in result.stderr


def test_info_takes_m_or_a_positional_model():
    assert parse("info", "-m", "gemma3-270m").model == "gemma3-270m"
    assert parse("info", "gemma3-270m").model == "gemma3-270m"
    assert parse("info", "--system").model is None


@pytest.mark.parametrize("argv", [["--version"], ["run", "--version"], ["serve", "--version"]])
def test_version(argv):
    result = ember_cli(*argv)
    assert (result.returncode, result.stdout) == (0, f"ember {ember.__version__}\n")


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--temp TEMP", DEFAULTS.temperature), ("--top-k TOP_K", DEFAULTS.top_k),
                          ("--min-p MIN_P", DEFAULTS.min_p), ("--repeat-last-n REPEAT_LAST_N", DEFAULTS.repeat_last_n),
                          ("--mirostat-ent MIROSTAT_ENT", DEFAULTS.mirostat_tau)):
        section = out[out.index(flag, out.index("options:")):]
        assert f"(default: {default})" in section[:300], flag


def test_a_port_out_of_range_is_one_line():
    result = ember_cli("serve", "--port", "99999")
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "--port: must be a port number from 0 to 65535, got 99999" in result.stderr


@pytest.mark.parametrize("flag, value", [("--replicas", "2"), ("--max-replicas", "4")])
def test_replica_flags_without_ray_are_one_line(flag, value):
    result = ember_cli("serve", flag, value)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert f"{flag} needs --ray" in result.stderr


def test_ray_without_ray_serve_installed_is_one_line(tmp_path):
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)])}
    result = subprocess.run([sys.executable, "-m", "ember", "serve", "--ray", "--replicas", "2"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "--ray needs Ray Serve: pip install 'ember[ray]'" in result.stderr


# -- what they do -------------------------------------------------------------------------------------

def test_reverse_prompt_stops_the_text(hello, capsys):
    assert run(["--temp", "0", "-r", "ll", "Say:"], capsys)[1] == "He"
    assert run(["--temp", "0", "--stop", "o", "-r", "xyz", "Say:"], capsys)[1] == "Hell"


def test_ignore_eos_generates_past_the_end_token(hello, capsys):
    assert run(["--temp", "0", "Say:"], capsys)[1] == "Hello"
    out = run(["--temp", "0", "--ignore-eos", "-n", "9", "Say:"], capsys)[1]
    assert out.startswith("Hello") and len(out.encode()) > len("Hello")


def test_ignored_flags_say_so_in_one_line_each(hello, capsys):
    code, out, err = run(["--temp", "0", "-ngl", "99", "-fa", "Say:"], capsys)
    assert (code, out) == (0, "Hello")
    notes = [line for line in err.splitlines() if line.startswith("ember: note: ")]
    assert notes == ["ember: note: -ngl 99 is ignored: ember runs on the CPU",
                     "ember: note: --flash-attn on is ignored: ember has one attention kernel (fused, over the KV cache)"]
    assert "note" not in run(["--temp", "0", "-ngl", "0", "Say:"], capsys)[2]


def test_a_real_model_runs_with_every_loading_flag(tiny):
    result = ember_cli("run", "-m", tiny, "--no-mmap", "--mlock", "-ngl", "99", "-fa", "-b", "64", "-ub", "32",
                       "-c", "64", "-t", "1", "-n", "4", "--temp", "0", "--jinja", "the")
    assert result.returncode == 0, result.stderr
    assert "ember: note: -ngl 99 is ignored" in result.stderr


def test_the_chat_template_flag_takes_a_builtin_name_or_a_file(tiny, tmp_path, monkeypatch):
    for flag in (["--chat-template", "llama3"], ["--chat-template-file", str(tmp_path / "t.jinja")]):
        (tmp_path / "t.jinja").write_text("{% for m in messages %}<<{{ m.content }}>>{% endfor %}")
        llm, _ = run_command.load_llm(parse("run", "-m", str(tiny), "-c", "32", "-t", "1", *flag, "hi"))
        text = llm.chat_template.render([{"role": "user", "content": "hi"}])
        expected = ("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n") if "llama3" in flag else "<<hi>>"
        assert text == expected
        llm.close()


def test_an_unknown_chat_template_is_one_line(tiny):
    result = ember_cli("run", "-m", tiny, "--chat-template", "no-such-format", "--chat", "hi")
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr.startswith("ember: error: unknown chat template 'no-such-format': give a built-in format (chatml")


def test_a_context_beyond_training_warns_in_one_line(tiny):
    result = ember_cli("run", "-m", tiny, "-c", 2 * N_CTX_TRAIN, "-t", "1", "-n", "1", "the")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("ember: warning:")]
    assert warnings == [f"ember: warning: the context of {2 * N_CTX_TRAIN} tokens is larger than the model's "
                        f"training context ({N_CTX_TRAIN}); output past {N_CTX_TRAIN} tokens may degrade"]


def test_threads_beyond_the_cores_warn_in_one_line(tiny):
    n = physical_cores() + 2
    result = ember_cli("run", "-m", tiny, "-c", "32", "-t", n, "-n", "1", "the")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if "warning" in line] == [
        f"ember: warning: {n} threads is more than the {n - 2} physical cores this process can use, which is "
        f"slower; the default is {n - 2}"]


def test_context_zero_runs_with_the_models_context(tiny):
    llm, _ = run_command.load_llm(parse("run", "-m", str(tiny), "-c", "0", "-t", "1", "hi"))
    assert llm.n_ctx == N_CTX_TRAIN
    llm.close()


def test_bench_accepts_llama_benchs_flags(tiny):
    result = ember_cli("bench", "-m", tiny, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-ngl", "99", "-fa", "1",
                       "-b", "4", "--no-mmap", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert '"test": "pp8"' in result.stdout and '"test": "tg2"' in result.stdout


def test_bench_runs_each_test_at_each_depth(tiny):
    """llama-bench's names and fields: "pp8 @ d16", n_depth, type_k / type_v."""
    result = ember_cli("bench", "-m", tiny, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-d", "0,16", "-ctk", "f32",
                       "-o", "json")
    assert result.returncode == 0, result.stderr
    rows = [(r["test"], r["n_depth"], r["type_k"], r["type_v"]) for r in json.loads(result.stdout)]
    assert rows == [("pp8", 0, "f32", "f16"), ("tg2", 0, "f32", "f16"), ("pp8 @ d16", 16, "f32", "f16"),
                    ("tg2 @ d16", 16, "f32", "f16")]


def test_bench_refuses_a_cache_type_in_one_line(tiny):
    result = ember_cli("bench", "-m", tiny, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-ctv", "q4_1")
    assert result.returncode == 2
    assert result.stderr.strip().endswith("type_v 'q4_1' is a KV cache type ember does not implement; "
                                          "use one of f32, f16, q8_0")


def test_perplexity_with_the_models_context(tiny, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 200)
    result = ember_cli("perplexity", "-m", tiny, "-f", text, "-c", "0", "-t", "1", "--chunks", "1", "-ngl", "1",
                       "--json")
    assert result.returncode == 0, result.stderr
    assert f"chunks of {N_CTX_TRAIN}" in result.stderr
