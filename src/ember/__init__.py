"""ember: local LLM inference on the CPU.

    import ember
    llm = ember.LLM("smollm2-135m")          # or ember.load(...), or a path to a .gguf file
    print(llm.generate("Once upon a time", max_tokens=32))

The public API is `LLM`, `SamplingParams`, `Grammar`, `Lookup` (prompt-lookup decoding's options),
`load` and `Llama` (llama-cpp-python's class, for code written for it); they are imported on first use, so the `ember` command starts without
loading numpy or the compiled core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.version import __version__

__all__ = ["LLM", "Grammar", "Llama", "Lookup", "SamplingParams", "load", "__version__"]

_LAZY = {"LLM": "ember.api.llm", "load": "ember.api.llm", "SamplingParams": "ember.engine.sampling",
         "Grammar": "ember.engine.constraints", "Llama": "ember.api.llama", "Lookup": "ember.engine.lookup"}

if TYPE_CHECKING:
    from ember.api.llama import Llama
    from ember.api.llm import LLM, load
    from ember.engine.constraints import Grammar
    from ember.engine.lookup import Lookup
    from ember.engine.sampling import SamplingParams


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ember' has no attribute {name!r}")
