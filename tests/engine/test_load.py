"""ember.engine.load: the chat template a model runs with, the context and thread settings
(warnings beyond the model and the machine), and loading without mmap, in small pages or with mlock."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ember.engine.load import chat_template_of, chat_template_source, load
from ember.engine.runtime import DEFAULT_MAX_CTX, Model
from ember.errors import EmberError, EmberWarning
from ember.gguf import open_gguf
from ember.sysinfo import physical_cores
from ember.tokenizer.chat_formats import BUILTIN
from tiny_gguf import N_CTX_TRAIN, write_tiny_model

FILE_TEMPLATE = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_model(tmp_path / "tiny.gguf")


@pytest.fixture
def tiny_with_template(tmp_path):
    return write_tiny_model(tmp_path / "templated.gguf", chat_template=FILE_TEMPLATE)


def test_the_files_template_comes_first(tiny_with_template):
    with open_gguf(tiny_with_template) as f:
        assert chat_template_source(f.metadata) == (FILE_TEMPLATE, "the model file")


def test_without_one_the_familys_builtin_is_used(tiny):
    with open_gguf(tiny) as f:  # <|im_start|> in the vocabulary
        source, origin = chat_template_source(f.metadata)
    assert source == BUILTIN["chatml"] and origin.startswith("built-in chatml")


def test_an_override_by_builtin_name(tiny_with_template):
    with open_gguf(tiny_with_template) as f:
        template = chat_template_of(f, "llama3")
    assert template.source == BUILTIN["llama3"] and template.origin == "built-in llama3"


def test_an_override_by_file_or_text(tiny, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}!")
    with open_gguf(tiny) as f:
        assert chat_template_of(f, str(path)).render([{"role": "user", "content": "hi"}]) == "hi!"
        assert chat_template_of(f, "{{ messages | length }}").render([{"role": "user", "content": "hi"}]) == "1"


def test_an_unknown_override_names_the_builtins(tiny):
    with open_gguf(tiny) as f, pytest.raises(EmberError, match=r"unknown chat template 'nope': give a built-in "
                                                                r"format \(chatml, llama2, .*gemma.*\), a template file"):
        chat_template_source(f.metadata, "nope")


def test_load_fails_on_an_unknown_override_before_the_weights(tiny):
    with pytest.raises(EmberError, match="unknown chat template"):
        load(tiny, chat_template="nope")


def test_context_zero_is_the_models_own(tiny):
    assert Model(tiny, n_ctx=0, n_threads=1).n_ctx == N_CTX_TRAIN
    assert Model(tiny, n_threads=1).n_ctx == min(N_CTX_TRAIN, DEFAULT_MAX_CTX)


def test_a_context_beyond_the_training_context_warns(tiny):
    with pytest.warns(EmberWarning, match=rf"context of {2 * N_CTX_TRAIN} tokens is larger than the model's "
                                          rf"training context \({N_CTX_TRAIN}\)"):
        model = Model(tiny, n_ctx=2 * N_CTX_TRAIN, n_threads=1)
    assert model.n_ctx == 2 * N_CTX_TRAIN


def test_more_threads_than_cores_warns(tiny):
    n = physical_cores() + 1
    with pytest.warns(EmberWarning, match=rf"{n} threads is more than the {n - 1} physical cores"):
        Model(tiny, n_ctx=16, n_threads=n)


def test_settings_within_the_model_and_machine_say_nothing(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Model(tiny, n_ctx=N_CTX_TRAIN, n_threads=physical_cores())


@pytest.mark.parametrize("use_mmap, huge_pages", [(False, True), (False, False), (True, False)])
def test_read_or_in_small_pages_the_model_computes_the_same(tiny, use_mmap, huge_pages):
    tokens = [1, 2, 257, 258]
    mapped = load(tiny, n_ctx=16, n_threads=1)
    other = load(tiny, n_ctx=16, n_threads=1, use_mmap=use_mmap, huge_pages=huge_pages)
    assert np.array_equal(mapped.model.eval(tokens, logits="all"), other.model.eval(tokens, logits="all"))


def test_mlock_locks_or_warns(tiny, monkeypatch):
    with warnings.catch_warnings():  # a file this small is within any memlock limit
        warnings.simplefilter("error")
        loaded = load(tiny, n_ctx=16, n_threads=1, use_mlock=True)

    def refuse(self):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(type(loaded.gguf), "lock", refuse)
    with pytest.warns(EmberWarning, match=r"could not lock the model's \d+ bytes in memory \(Cannot allocate memory\)"):
        load(tiny, n_ctx=16, n_threads=1, use_mlock=True)
