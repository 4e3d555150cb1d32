"""The one place that turns a model name into what runs it: the file (a registry name, a path or,
through `ember.hub`, anything it resolves), the runtime `Model`, its `Tokenizer` and its chat
template. `LLM`, the server, perplexity, bench and tokenize all load through here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ember.engine.runtime import Model
from ember.gguf import GGUFFile, open_gguf
from ember.hub import resolve_model
from ember.tokenizer.chat_template import ChatTemplate
from ember.tokenizer.tokenizer import Tokenizer


def model_name(model: str | os.PathLike) -> str:
    """The name a model is served and reported under: its file name without .gguf."""
    return Path(os.fspath(model)).name.removesuffix(".gguf")


def open_model_file(model: str | os.PathLike) -> GGUFFile:
    """The opened GGUF file a registry name or path names (a registry model is pulled if missing)."""
    return open_gguf(resolve_model(model))


def load_tokenizer(model: str | os.PathLike) -> Tokenizer:
    """Only the tokenizer of a model (no weights are touched beyond the file's header)."""
    return Tokenizer.from_gguf(open_model_file(model))


def chat_template_of(gguf: GGUFFile) -> ChatTemplate:
    """The chat template a model's file carries (tokenizer.chat_template), or the default."""
    return ChatTemplate.from_metadata(gguf.metadata)


@dataclass
class Loaded:
    """A model ready to run: its file, runtime, tokenizer and (parsed on first use) chat template."""

    name: str
    gguf: GGUFFile
    model: Model
    tokenizer: Tokenizer

    @cached_property
    def chat_template(self) -> ChatTemplate:
        return chat_template_of(self.gguf)


def load(model: str | os.PathLike, n_ctx: int | None = None, n_threads: int | None = None, n_seq: int = 1,
         n_batch: int = 512, n_outputs: int | None = None, activations: str = "int8") -> Loaded:
    """Open a model by registry name or path and build its runtime (see `Model` for the options)."""
    gguf = open_model_file(model)
    runtime = Model(gguf, n_ctx=n_ctx, n_threads=n_threads, n_seq=n_seq, n_batch=n_batch, n_outputs=n_outputs,
                    activations=activations)
    return Loaded(model_name(model), gguf, runtime, Tokenizer.from_gguf(gguf))
