"""Architecture registry: general.architecture -> the module that runs it.

Each module (models/<arch>.py, over the shared pieces in blocks.py) has
- `hparams(gguf_file) -> HParams` and `build(builder) -> logits tensor id`: the forward graph;
- optionally `tensor_shapes(hp) -> {name: shape}`: the shapes its weights must have, where they
  differ from llama.cpp's common ones (validate.standard_shapes, which every weight is checked
  against when the model is opened);
- optionally `FEATURES` (a tuple of words) and `features(metadata) -> [str]`: what `ember info`
  names about the architecture and about a file of it (with the shared ones, see `features`),
  and `sliding_layer_count(metadata) -> (sliding, layers)` where only some layers slide;
- `HF_ARCHITECTURES` and `Converter`: the Hugging Face classes `ember convert` turns into this
  architecture's GGUF, with the tensor names and metadata keys llama.cpp's converter writes
  (shared machinery in hf.py).

Adding an architecture touches exactly: its model file, one line in ARCHITECTURES below, and
one test (tests/models/test_<arch>.py).
"""

from __future__ import annotations

import importlib
import numbers

from ember.errors import EmberError, GGUFError
from ember.models.rope import scaling_features
from ember.models.validate import standard_shapes

ARCHITECTURES = {
    "llama": "ember.models.llama",
    "qwen2": "ember.models.qwen2",
    "qwen3": "ember.models.qwen3",
    "gemma2": "ember.models.gemma2",
    "gemma3": "ember.models.gemma3",
    "gpt2": "ember.models.gpt2",
    "olmo2": "ember.models.olmo2",
    "starcoder2": "ember.models.starcoder2",
    "phi2": "ember.models.phi2",
    "granite": "ember.models.granite",
    "phi3": "ember.models.phi3",
    "bert": "ember.models.bert",
    "nomic-bert": "ember.models.nomic_bert",
    "jina-bert-v2": "ember.models.jina_bert_v2",
    "glm4": "ember.models.glm4",
    "stablelm": "ember.models.stablelm",
    "deepseek": "ember.models.deepseek",
    "deepseek2": "ember.models.deepseek2",
    "smollm3": "ember.models.smollm3",
    "qwen2moe": "ember.models.qwen2moe",
    "qwen3moe": "ember.models.qwen3moe",
    "olmoe": "ember.models.olmoe",
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


def features(metadata: dict, tensors: dict | None = None) -> list[str]:
    """What `ember info` names about a file's architecture: its module's FEATURES and
    `features(metadata)`, then what the shared keys switch on (partial rotary, sliding window, RoPE
    scaling as rope.scaling_features names it, from the tensors too, logit soft-capping).
    Malformed values are left out; an unsupported architecture has none."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        return []
    module = importlib.import_module(ARCHITECTURES[arch])
    names = list(getattr(module, "FEATURES", ()))
    if hasattr(module, "features"):
        try:
            names += module.features(metadata)
        except EmberError:
            pass

    def number(name: str, kind=numbers.Real):
        value = metadata.get(f"{arch}.{name}")
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    n_embd, n_head = number("embedding_length", numbers.Integral), number("attention.head_count", numbers.Integral)
    # an MLA file's key_length is its cache row (latent + rotary part); key_length_mla the head's
    head_dim = (number("attention.key_length_mla", numbers.Integral) or number("attention.key_length", numbers.Integral)
                or (n_embd // n_head if n_embd and n_head else None))
    n_rot = number("rope.dimension_count", numbers.Integral)
    if n_rot and head_dim and n_rot < head_dim:
        names.append(f"partial rotary ({n_rot} of {head_dim} dimensions)")
    if number("attention.sliding_window", numbers.Integral):
        sliding = f"sliding window {number('attention.sliding_window')}"
        try:
            count = module.sliding_layer_count(metadata) if hasattr(module, "sliding_layer_count") else None
        except EmberError:
            count = None
        names.append(sliding + (f" ({count[0]} of {count[1]} layers)" if count else ""))
    names += scaling_features(metadata, arch, tensors)
    if number("final_logit_softcapping"):
        names.append(f"logit soft-cap {number('final_logit_softcapping'):g}")
    return names
