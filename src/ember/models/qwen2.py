"""Qwen2 (Qwen2.5, DeepSeek-R1-Distill-Qwen): the LLaMA decoder with biases on the Q/K/V
projections and NeoX-layout rotary embeddings."""

from __future__ import annotations

from typing import Any

from ember.errors import EmberError
from ember.models.blocks import Builder, HParams
from ember.models.hf import DecoderConverter
from ember.models.llama import build_decoder

HF_ARCHITECTURES = ("Qwen2ForCausalLM",)


def build(b: Builder) -> int:
    return build_decoder(b, neox=True)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


class Converter(DecoderConverter):
    """The decoder with Q/K/V biases and NeoX-layout rotation: no permutation."""

    arch = "qwen2"

    def __init__(self, config: dict):
        super().__init__(config)
        layer_types = config.get("layer_types") or []
        if config.get("use_sliding_window") and "sliding_attention" in layer_types:
            raise EmberError("Qwen2 with sliding-window attention (use_sliding_window) is not supported")

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        # llama.cpp's converter writes neither for Qwen2: the vocabulary is the tokenizer's, RoPE spans the head
        del meta[f"{self.arch}.vocab_size"], meta[f"{self.arch}.rope.dimension_count"]
        return meta
