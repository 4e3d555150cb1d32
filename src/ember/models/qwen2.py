"""Qwen2 (Qwen2.5, DeepSeek-R1-Distill-Qwen): the LLaMA decoder with biases on the Q/K/V
projections and NeoX-layout rotary embeddings."""

from __future__ import annotations

from ember.models.blocks import Builder, HParams
from ember.models.llama import build_decoder


def build(b: Builder) -> int:
    return build_decoder(b, neox=True)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)
