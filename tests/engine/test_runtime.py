"""The runtime Model's limits: the context and batch it is asked for must fit in the machine's
memory, thread counts must make sense for the machine, and token ids must be in the vocabulary;
each is a one-line EmberError, never an overflowing size, a crash or a bad_alloc traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ember.engine.runtime import Model, token_ids
from ember.errors import EmberError
from ember.sysinfo import available_cpus, physical_memory
from paths import REPO
from tiny_gguf import N_CTX_TRAIN as N_CTX
from tiny_gguf import TOKENS, write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def cli(*argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "ember", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


@pytest.mark.parametrize("n_ctx", [2**60 + 1, 10**9])
def test_a_context_larger_than_memory_is_refused_with_the_largest_that_fits(tiny, n_ctx):
    with pytest.raises(EmberError, match=rf"a context of {n_ctx} tokens needs .* of KV cache, more than this "
                                         r"machine's .* of memory; use a context of at most (\d+) tokens") as error:
        Model(tiny, n_ctx=n_ctx, n_threads=1)
    fits = int(str(error.value).rsplit(" at most ", 1)[1].split()[0])
    per_token = Model(tiny, n_ctx=N_CTX, n_threads=1).kv_bytes_per_token
    assert fits * per_token <= physical_memory() < (fits + 1) * per_token


def test_sequence_slots_multiply_the_cache(tiny):
    per_token = Model(tiny, n_ctx=N_CTX, n_threads=1).kv_bytes_per_token
    n_ctx = physical_memory() // per_token // 2
    with pytest.raises(EmberError, match=rf"{n_ctx} tokens x 4 sequences needs"):
        Model(tiny, n_ctx=n_ctx, n_seq=4, n_threads=1)


@pytest.mark.parametrize("argv", [("run", "-c", 2**60 + 1, "hi"), ("run", "-c", 10**9, "hi"),
                                  ("info", "--memory", "-c", 2**60 + 1)])
def test_the_cli_refuses_an_impossible_context_in_one_line(tiny, argv):
    # 2^60 + 1 tokens used to wrap the KV cache size in the core (SIGSEGV), 10^9 to raise bad_alloc,
    # and `info --memory` to report 108 MB
    command, *rest = argv
    result = cli(command, *(["-m", tiny] if command == "run" else [tiny]), *rest)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("ember: error: a context of ")
    assert len([line for line in result.stderr.splitlines() if not line.startswith("ember: warning:")]) == 1


@pytest.mark.parametrize("n_threads", [5000, 1000, 4 * available_cpus() + 1, 0, -1])
def test_absurd_thread_counts_are_refused(tiny, n_threads):
    with pytest.raises(EmberError, match=rf"n_threads must be between 1 and {4 * available_cpus()} \(4 per CPU "
                                         rf"of this machine\), got {n_threads}"):
        Model(tiny, n_threads=n_threads)


def test_the_cli_refuses_absurd_threads_in_one_line(tiny):
    result = cli("run", "-m", tiny, "-t", 5000, "-n", 1, "hi")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"ember: error: n_threads must be between 1 and {4 * available_cpus()} "
                                          "(4 per CPU of this machine), got 5000"]


@pytest.mark.parametrize("bad, match", [
    ([1, 2**40], "token id 1099511627776 is outside the vocabulary"),
    ([2**70], "token id 1180591620717411303424 is outside the vocabulary"),
    ([-1], rf"token id -1 is outside the vocabulary \[0, {len(TOKENS)}\)"),
    ([len(TOKENS)], f"token id {len(TOKENS)} is outside"),
    ([1.5], "token ids must be integers, got 1.5"),
    ([True], "token ids must be integers, got True"),
    ("abc", "token ids must be a sequence of integers, not str"),
    ([[1, 2], [3]], "token ids must be a flat sequence of integers"),
])
def test_bad_token_ids_are_refused(tiny, bad, match):
    model = Model(tiny, n_threads=1)
    with pytest.raises(EmberError, match=match):
        model.eval(bad)
    with pytest.raises(EmberError, match=match):
        token_ids(bad, model.n_vocab)
    assert model.n_past() == 0


@pytest.mark.parametrize("name, value", [("n_ctx", -1), ("n_ctx", 2.5), ("n_batch", -3), ("n_seq", True),
                                         ("n_outputs", "4")])
def test_bad_sizes_are_refused(tiny, name, value):
    with pytest.raises(EmberError, match=rf"{name} must be (positive|>= 0|an integer), got"):
        Model(tiny, n_threads=1, **{name: value})
