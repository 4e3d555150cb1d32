"""The one place that turns a model name into what runs it: the file (a registry name, a path or,
through `ember.hub`, anything it resolves), the runtime `Model`, its `Tokenizer` and its chat
template. `LLM`, the server, perplexity, bench and tokenize all load through here.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ember.engine.runtime import Model
from ember.errors import EmberError, EmberWarning
from ember.gguf import GGUFFile, open_gguf
from ember.hub import resolve_model
from ember.tokenizer.chat_formats import builtin_names, builtin_template, canonical_name, detect_format
from ember.tokenizer.chat_template import ChatTemplate, file_template
from ember.tokenizer.tokenizer import Tokenizer


def model_name(model: str | os.PathLike) -> str:
    """The name a model is served and reported under: its file name without .gguf."""
    return Path(os.fspath(model)).name.removesuffix(".gguf")


def open_model_file(model: str | os.PathLike, use_mmap: bool = True, huge_pages: bool = True) -> GGUFFile:
    """The opened GGUF file a registry name or path names (a registry model is pulled if missing);
    use_mmap=False reads it into memory instead of mapping it; huge_pages asks the kernel to back
    the weights with 2 MiB pages (see ember.gguf.reader.open_file)."""
    return open_gguf(resolve_model(model), use_mmap=use_mmap, huge_pages=huge_pages)


def load_tokenizer(model: str | os.PathLike) -> Tokenizer:
    """Only the tokenizer of a model (no weights are touched beyond the file's header)."""
    return Tokenizer.from_gguf(open_model_file(model))


def chat_template_of(gguf: GGUFFile, override: str | None = None) -> ChatTemplate:
    """The chat template of a model, compiled (see `chat_template_source` for which)."""
    source, origin = chat_template_source(gguf.metadata, override)
    return ChatTemplate.from_metadata(gguf.metadata, source, origin)


def chat_template_source(metadata: dict, override: str | None = None) -> tuple[str, str]:
    """The chat template a model is run with, and where it comes from, in this order:

    - `override` (--chat-template, chat_format=): the name of a built-in format (see
      ember.tokenizer.chat_formats), a template file, or template text;
    - the file's tokenizer.chat_template;
    - the built-in format of the model's family, chosen from its architecture and special tokens.
    """
    if override is not None:
        return _override_source(override)
    source = file_template(metadata)
    if source:
        return source, "the model file"
    name = detect_format(metadata)
    return builtin_template(name), f"built-in {name} (the file has no template; chosen from its tokens)"


def _override_source(override: str) -> tuple[str, str]:
    builtin = builtin_template(override)
    if builtin is not None:
        return builtin, f"built-in {canonical_name(override)}"
    if "{{" in override or "{%" in override:
        return override, "the template given"
    path = Path(override).expanduser()
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), f"file {path}"
        except (OSError, UnicodeDecodeError) as exc:
            raise EmberError(f"cannot read the chat template file {path}: {getattr(exc, 'strerror', None) or exc}") \
                from None
    raise EmberError(f"unknown chat template {override!r}: give a built-in format ({', '.join(builtin_names())}), "
                     "a template file or template text")


@dataclass
class Loaded:
    """A model ready to run: its file, runtime, tokenizer and (parsed on first use) chat template."""

    name: str
    gguf: GGUFFile
    model: Model
    tokenizer: Tokenizer
    chat_template_override: str | None = None

    @cached_property
    def chat_template(self) -> ChatTemplate:
        return chat_template_of(self.gguf, self.chat_template_override)


def load(model: str | os.PathLike, n_ctx: int | None = None, n_threads: int | None = None, n_seq: int = 1,
         n_batch: int = 512, n_outputs: int | None = None, activations: str = "int8", use_mmap: bool = True,
         use_mlock: bool = False, chat_template: str | None = None, type_k: str | int | None = None,
         type_v: str | int | None = None, huge_pages: bool = True) -> Loaded:
    """Open a model by registry name or path and build its runtime (see `Model` for the options).

    use_mmap=False reads the weights into memory instead of mapping the file; use_mlock pins them in
    RAM (a warning, not an error, when the system refuses); huge_pages=False keeps them in 4 KiB
    pages. chat_template overrides the model's (see `chat_template_source`).
    """
    gguf = open_model_file(model, use_mmap=use_mmap, huge_pages=huge_pages)
    try:
        if chat_template is not None:
            chat_template_source(gguf.metadata, chat_template)  # an unknown name fails before the weights load
        runtime = Model(gguf, n_ctx=n_ctx, n_threads=n_threads, n_seq=n_seq, n_batch=n_batch, n_outputs=n_outputs,
                        activations=activations, type_k=type_k, type_v=type_v)
    except BaseException:
        gguf.close()
        raise
    if use_mlock:
        lock_in_memory(gguf)
    return Loaded(model_name(model), gguf, runtime, Tokenizer.from_gguf(gguf), chat_template)


def lock_in_memory(gguf: GGUFFile) -> None:
    """mlock the model's bytes; when the system refuses, say why (as llama.cpp does) and go on."""
    try:
        gguf.lock()
    except OSError as exc:
        warnings.warn(EmberWarning(
            f"could not lock the model's {gguf.size} bytes in memory ({exc.strerror or exc}); "
            "raise the limit with `ulimit -l` (RLIMIT_MEMLOCK) or run without --mlock"), stacklevel=2)
