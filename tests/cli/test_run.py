"""`ember run`: prompt sources, what goes to stdout and stderr, errors; end to end on a real model."""

import io
import json
import os
import re
import subprocess
import sys

import pytest

from ember.cli import run as run_command
from ember.cli.main import main
from fake_llm import ByteTokenizer, continuation, fake_llm
from paths import FIXTURES, ember_root

SRC = ember_root()
TIMING = r"ember: load time += +[\d.]+ ms\n" \
         r"ember: prompt eval = +[\d.]+ ms / +\d+ tokens \( *[\d.]+ tokens per second\)\n" \
         r"ember: generation  = +[\d.]+ ms / +\d+ tokens \( *[\d.]+ tokens per second\)\n"


@pytest.fixture
def fake(monkeypatch):
    """ember run with the fake model: "Say:" is answered "Hello"; chats are echoed."""

    loaded = []

    def load_llm(args):
        if args.chat or args.system is not None:
            loaded.append(fake_llm())
        else:
            loaded.append(fake_llm(continuation(ByteTokenizer().encode("Say:"), list(b"Hello"))))
        return loaded[-1], 0.0125

    monkeypatch.setattr(run_command, "load_llm", load_llm)
    return loaded


def run(argv, capsys, stdin=""):
    sys_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        code = main(["run", *argv])
    finally:
        sys.stdin = sys_stdin
    out, err = capsys.readouterr()
    return code, out, err


def test_stdout_is_only_the_generated_text_and_stderr_the_timings(fake, capsys):
    code, out, err = run(["--temp", "0", "Say:"], capsys)
    assert (code, out) == (0, "Hello")
    assert err.startswith("ember: load time   =      12.50 ms\n")
    assert re.fullmatch(TIMING, err)


def test_prompt_from_flag_file_and_stdin(fake, capsys, tmp_path):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("Say:\n")
    assert run(["--temp", "0", "-p", "Say:"], capsys)[1] == "Hello"
    assert run(["--temp", "0", "-f", str(prompt_file)], capsys)[1] == "Hello"
    assert run(["--temp", "0"], capsys, stdin="Say:\n")[1] == "Hello"


def test_n_limits_the_tokens(fake, capsys):
    assert run(["--temp", "0", "-n", "2", "Say:"], capsys)[1] == "He"


def test_sampling_prints_the_seed(fake, capsys):
    code, out, err = run(["-s", "1234", "Say:"], capsys)
    assert out == "Hello" and err.startswith("ember: seed = 1234\n")


def test_chat_wraps_the_prompt_in_the_template(fake, capsys):
    assert run(["--temp", "0", "--chat", "hi"], capsys)[1] == "You said: hi"


def test_system_implies_chat_and_comes_first(fake, capsys):
    assert run(["--temp", "0", "--system", "Be kind.", "hi"], capsys)[1] == "You said: hi"
    llm = fake[-1]
    assert llm.detokenize(llm.model.tokens, special=True).startswith(
        "<s><|system|>Be kind.<|end|><|user|>hi<|end|><|assistant|>You said")


def test_two_prompts_are_refused(fake, capsys):
    code, out, err = run(["-p", "a", "b"], capsys)
    assert code == 2 and err == "ember: error: give the prompt once: as PROMPT, with -p or with -f\n"


def test_missing_prompt_file_is_one_line(fake, capsys, tmp_path):
    code, _, err = run(["-f", str(tmp_path / "nope.txt")], capsys)
    assert code == 2 and err.startswith("ember: error: cannot read the prompt file") and err.count("\n") == 1


def test_prompt_longer_than_the_context_says_so(monkeypatch, capsys):
    monkeypatch.setattr(run_command, "load_llm", lambda args: (fake_llm(n_ctx=8), 0.0))
    code, out, err = run(["long prompt here"], capsys)
    assert code == 2 and out == ""
    assert err == ("ember: error: the prompt has 17 tokens but the context holds 8: raise the context size"
                   " (-c / n_ctx, up to 1024 for this model) or shorten the prompt\n")


def ember_cli(*argv, timeout=300, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "ember", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


BAD_VALUES = [
    (["-n", "-1"], "-n/--n-predict"),
    (["--temp", "-0.5"], "--temp"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-p", "-0.1"], "--top-p"),
    (["--min-p", "2"], "--min-p"),
    (["-c", "-1"], "--ctx-size"),
    (["--activations", "int4"], "--activations"),
]


@pytest.mark.parametrize("flags, name", BAD_VALUES, ids=[" ".join(f) for f, _ in BAD_VALUES])
def test_bad_flag_values_exit_2_naming_the_flag(flags, name):
    result = ember_cli("run", *flags, "hi")
    assert result.returncode == 2 and result.stdout == ""
    assert name in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("flags, name", BAD_VALUES[:3], ids=[" ".join(f) for f, _ in BAD_VALUES[:3]])
def test_bad_flag_values_print_one_line(flags, name):
    result = ember_cli("run", *flags, "hi")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_repeat_penalty_of_zero_is_one_line():
    result = ember_cli("run", "--repeat-penalty", "0", "hi")
    assert (result.returncode, result.stderr) == (2, "ember: error: repeat_penalty must be > 0, got 0.0\n")


@pytest.mark.parametrize("isa, why", [("sse9", "unknown ISA 'sse9'"), ("amx", "does not support ISA 'amx'")])
def test_a_bad_ember_isa_is_one_line(isa, why):
    from ember import _core
    if isa == "amx" and _core.cpu_flags()["amx_granted"]:
        pytest.skip("this CPU and OS give the process AMX tiles")
    env = {k: v for k, v in os.environ.items() if k != "EMBER_EMULATE_AMX"}
    result = subprocess.run([sys.executable, "-m", "ember", "run", "hi"], capture_output=True, text=True, timeout=60,
                            env={**env, "PYTHONPATH": str(SRC), "EMBER_ISA": isa})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ember: error: EMBER_ISA: ") and why in result.stderr


@pytest.mark.parametrize("command", ["chat", "serve", "bench", "perplexity -f x.txt"])
def test_every_model_command_checks_activations(command):
    result = ember_cli(*command.split(), "--activations", "f64")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "--activations: must be one of int8, f32, got 'f64'" in result.stderr


def test_an_unsupported_architecture_is_named(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from ember.engine.runtime import Model
    from ember.errors import GGUFError

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from ember.models import ARCHITECTURES

    supported = ", ".join(sorted(ARCHITECTURES))
    with pytest.raises(GGUFError, match=rf"unsupported architecture 'mamba' \(ember runs: {supported}\)"):
        Model(path)
    result = ember_cli("run", "-m", str(path), "hi")
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "unsupported architecture 'mamba'" in result.stderr


def test_names_from_a_model_file_cannot_break_the_error_line(tmp_path):
    from tiny_gguf import write_tiny_model

    from ember.models import ARCHITECTURES

    path = write_tiny_model(tmp_path / "odd.gguf", metadata={"general.architecture": "lla\nma\x1c\u2028"})
    result = ember_cli("run", "-m", str(path), "hi")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [r"ember: error: unsupported architecture 'lla\nma\x1c\u2028' "
                                          f"(ember runs: {', '.join(sorted(ARCHITECTURES))})"]


def test_a_chat_template_that_never_finishes_is_one_line(tmp_path):
    from tiny_gguf import write_tiny_model

    hang = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    path = write_tiny_model(tmp_path / "hang.gguf", metadata={"tokenizer.chat_template": hang})
    result = ember_cli("run", "-m", str(path), "--chat", "-n", "2", "hi")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["ember: error: the chat template did not finish within 5 s "
                                          "(ember's limit for rendering a chat template)"]


def test_unknown_model_is_one_line():
    result = ember_cli("run", "-m", "no-such-model", "hi")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("ember: error: 'no-such-model' is neither a model file nor a registry model")


# -- a real model, end to end --------------------------------------------------------------------

@pytest.mark.model
@pytest.mark.slow
def test_greedy_continuation_matches_llama_cpp():
    """The same greedy text as llama.cpp on the same file, up to its first near-tie."""
    fixture = json.loads((FIXTURES / "llama_cpp_greedy_smollm2-135m.json").read_text())
    for case in fixture["cases"]:
        result = ember_cli("run", "-m", fixture["model"], "--temp", "0", "-n", str(case["n_predict"]),
                           "-c", "512", "-p", case["prompt"])
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(case["text_before_near_tie"]), (case["prompt"], result.stdout)


@pytest.mark.model
def test_real_model_run_prints_text_then_timings():
    result = ember_cli("run", "--temp", "0", "-n", "8", "-c", "256", "The capital of France is")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and not result.stdout.startswith("The capital")
    assert re.fullmatch(TIMING, result.stderr)


@pytest.mark.model
def test_activations_flag_reaches_the_model():
    from ember.cli.main import build_parser

    for flags, float_activations in (([], False), (["--activations", "f32"], True)):
        llm, _ = run_command.load_llm(build_parser().parse_args(["run", *flags, "-c", "64", "hi"]))
        assert llm.model.graph.float_activations is float_activations
        llm.close()


@pytest.mark.model
def test_same_seed_same_text_across_runs_and_thread_counts():
    outputs = {ember_cli("run", "-s", "7", "-n", "24", "-c", "256", "-t", threads, "Once upon a time").stdout
               for threads in ("1", "2", "1")}
    assert len(outputs) == 1 and outputs.pop().strip()


@pytest.mark.model
def test_real_prompt_longer_than_the_context():
    result = ember_cli("run", "-c", "16", "-p", "word " * 40)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("ember: error: the prompt has ") and "(-c / n_ctx" in result.stderr


# -- constraints -----------------------------------------------------------------------------------


def test_grammar_and_json_schema_flags_constrain_the_output(fake, capsys, tmp_path):
    # the fake model wants to say "Hello"
    assert run(["--temp", "0", "--grammar", 'root ::= "Hel" [a-z] "!"', "Say:"], capsys)[1] == "Hell!"
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "He" ("y" | "p")\n')
    assert run(["--temp", "0", "--grammar-file", str(grammar), "Say:"], capsys)[1] in ("Hey", "Hep")
    code, out, _ = run(["--temp", "0", "-n", "12", "--json-schema", '{"type": "integer", "maximum": 99}', "Say:"], capsys)
    assert code == 0 and isinstance(json.loads(out), int)
    schema = tmp_path / "s.json"
    schema.write_text('{"enum": ["Hello", "Bye"]}')
    assert run(["--temp", "0", "--json-schema-file", str(schema), "Say:"], capsys)[1] == '"Hello"'


@pytest.mark.parametrize("flags, message", [
    (["--grammar", "root ::= missing"], "ember: error: the grammar cannot be used"),
    (["--json-schema", "{bad"], "ember: error: the JSON schema is not valid JSON"),
    (["--json-schema", '{"type": "array", "uniqueItems": true}'], "uniqueItems"),
    (["--grammar-file", "/nonexistent/g.gbnf"], "ember: error: cannot read the grammar file /nonexistent/g.gbnf"),
])
def test_a_bad_constraint_is_one_line(fake, capsys, flags, message):
    code, out, err = run([*flags, "Say:"], capsys)
    assert code != 0 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_two_constraint_flags_are_refused(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["run", "--grammar", "a", "--json-schema", "{}", "x"])
    assert exit.value.code == 2 and "not allowed with" in capsys.readouterr().err


@pytest.mark.model
def test_real_model_run_with_a_json_schema():
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}}, "required": ["capital"],
              "additionalProperties": False}
    result = ember_cli("run", "--temp", "0", "-n", "40", "-c", "256", "--chat", "-j", json.dumps(schema),
                       "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)) == {"capital"}


def test_lookup_prints_the_same_text_and_its_draft_counts(tmp_path, capsys):
    from tiny_gguf import write_tiny_model

    path = str(write_tiny_model(tmp_path / "tiny.gguf"))
    argv = ["-m", path, "-n", "40", "--temp", "0", "-t", "1", "-p", "the cat. the cat. the"]
    code, plain, err = run(argv, capsys)
    assert code == 0 and "ember: lookup" not in err
    code, looked_up, err = run(argv + ["--lookup", "--lookup-ngram-min", "1", "--draft-max", "6"], capsys)
    assert code == 0 and looked_up == plain
    assert re.search(r"ember: lookup      = +\d+ drafted, +\d+ accepted \((\d+\.\d%|-)\)\n", err)


def test_bad_lookup_sizes_are_one_line(capsys):
    code, out, err = run(["-m", "smollm2-135m", "--lookup", "--lookup-ngram-min", "5", "--lookup-ngram-max", "2",
                          "hi"], capsys)
    assert code == 2 and out == ""
    assert err == "ember: error: lookup ngram_min (5) is larger than ngram_max (2)\n"
