"""Shared by the WordPiece, BERT and embedding tests: all-MiniLM-L6-v2 (a BERT encoder that ships as a
Hugging Face folder in a package, hub.HF_FOLDERS), converted by `ember convert` once per session."""

from __future__ import annotations

import atexit
import functools
import tempfile
from pathlib import Path

from ember.convert import convert
from ember.hub import pull_folder

MINILM = "all-minilm-l6-v2"


@functools.cache
def minilm_folder() -> Path:
    return pull_folder(MINILM, progress=False)


@functools.cache
def minilm_gguf() -> Path:
    """The folder converted to F32 (a temporary file, removed when the tests end)."""
    work = tempfile.TemporaryDirectory(prefix="ember-minilm-")
    atexit.register(work.cleanup)
    return convert(minilm_folder(), Path(work.name) / f"{MINILM}-f32.gguf", "f32")
