"""Granite (IBM Granite 3.x dense): the LLaMA decoder with four multipliers (llama.Multipliers):
embeddings times embedding_scale, attention and MLP outputs times residual_scale, attention
scores times attention.scale, logits divided by logit_scale."""

from __future__ import annotations

from typing import Any

from ember.errors import EmberError
from ember.gguf.metadata import float_key
from ember.models import llama
from ember.models.blocks import Builder, HParams

HF_ARCHITECTURES = ("GraniteForCausalLM",)


def multipliers(b: Builder) -> llama.Multipliers:
    meta, a = b.f.metadata, b.hp.arch
    attention = float_key(meta, f"{a}.attention.scale", 0.0, non_negative=True)
    return llama.Multipliers(
        embedding=float_key(meta, f"{a}.embedding_scale", 0.0, non_negative=True) or 1.0,
        residual=float_key(meta, f"{a}.residual_scale", 0.0, non_negative=True) or 1.0,
        attention=attention or None,
        logit=float_key(meta, f"{a}.logit_scale", 1.0, positive=True))


def features(metadata: dict) -> list[str]:
    a = "granite"
    names = []
    for label, key in (("embedding x", "embedding_scale"), ("residual x", "residual_scale"),
                       ("attention scale ", "attention.scale"), ("logits /", "logit_scale")):
        value = float_key(metadata, f"{a}.{key}", 0.0, non_negative=True)
        if value:
            names.append(f"{label}{value:g}")
    return names


def build(b: Builder) -> int:
    return llama.build_decoder(b, neox=False, m=multipliers(b))


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


# config.json name -> GGUF key (after the architecture), as llama.cpp's converter writes them
_MULTIPLIERS = {"attention_multiplier": "attention.scale", "embedding_multiplier": "embedding_scale",
                "residual_multiplier": "residual_scale", "logits_scaling": "logit_scale"}


class Converter(llama.Converter):
    """LLaMA's layout (Q/K rows permuted) plus the multipliers; head_dim is hidden / heads."""

    arch = "granite"

    def __init__(self, config: dict):
        head_dim = config.get("head_dim")
        config = {k: v for k, v in config.items() if k != "head_dim"}
        super().__init__(config)
        if head_dim is not None and head_dim != self.head_dim:
            raise EmberError(f"Granite with head_dim {head_dim} != hidden_size / num_attention_heads "
                             f"({self.head_dim}) is not supported (llama.cpp's granite has no head_dim)")

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        for name, key in _MULTIPLIERS.items():
            if self.config.get(name):
                meta[f"{self.arch}.{key}"] = float(self.config[name])
        return meta
