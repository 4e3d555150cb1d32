"""Architecture registry: general.architecture -> the module that builds its forward graph.

Each module has `hparams(gguf_file) -> HParams` and `build(builder) -> logits tensor id`.
Adding an architecture is adding a file and a line here.
"""

from __future__ import annotations

import importlib

from ember.errors import GGUFError

ARCHITECTURES = {
    "llama": "ember.models.llama",
    "qwen2": "ember.models.qwen2",
    "gemma3": "ember.models.gemma3",
    "gpt2": "ember.models.gpt2",
}


def architecture(name: str | None):
    if name not in ARCHITECTURES:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise GGUFError(f"unsupported architecture {name!r} (ember runs: {supported})")
    return importlib.import_module(ARCHITECTURES[name])
