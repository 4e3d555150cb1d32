"""Architecture registry: general.architecture -> the module that runs it.

Each module (models/<arch>.py, over the shared pieces in blocks.py) has
- `hparams(gguf_file) -> HParams` and `build(builder) -> logits tensor id`: the forward graph;
- optionally `tensor_shapes(hp) -> {name: shape}`: the shapes its weights must have, where they
  differ from llama.cpp's common ones (validate.standard_shapes, which every weight is checked
  against when the model is opened);
- `HF_ARCHITECTURES` and `Converter`: the Hugging Face classes `ember convert` turns into this
  architecture's GGUF, with the tensor names and metadata keys llama.cpp's converter writes
  (shared machinery in hf.py).

Adding an architecture touches exactly: its model file, one line in ARCHITECTURES below, and
one test (tests/models/test_<arch>.py).
"""

from __future__ import annotations

import importlib

from ember.errors import EmberError, GGUFError
from ember.models.validate import standard_shapes

ARCHITECTURES = {
    "llama": "ember.models.llama",
    "qwen2": "ember.models.qwen2",
    "gemma3": "ember.models.gemma3",
    "gpt2": "ember.models.gpt2",
}


def architecture(name: str | None):
    """The module of a GGUF architecture name; a GGUFError naming the supported ones otherwise."""
    if not isinstance(name, str) or name not in ARCHITECTURES:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise GGUFError(f"unsupported architecture {name!r} (ember runs: {supported})")
    return importlib.import_module(ARCHITECTURES[name])


def tensor_shapes(module, hp) -> dict[str, tuple[int, ...]]:
    """The shapes an architecture's weights must have (by name; `blk.N.` left out)."""
    shapes = standard_shapes(hp)
    if hasattr(module, "tensor_shapes"):
        shapes.update(module.tensor_shapes(hp))
    return shapes


def converter_for(hf_architecture: str | None, config: dict):
    """The converter of a Hugging Face model class (config.json `architectures[0]`)."""
    converters = {}
    for module_name in ARCHITECTURES.values():
        module = importlib.import_module(module_name)
        for hf_name in getattr(module, "HF_ARCHITECTURES", ()):
            converters[hf_name] = module.Converter
    if hf_architecture not in converters:
        supported = ", ".join(sorted(converters))
        raise EmberError(f"cannot convert architecture {hf_architecture!r} (ember converts {supported})")
    return converters[hf_architecture](config)
