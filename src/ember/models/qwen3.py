"""Qwen3 (dense): the Qwen2 decoder without Q/K/V biases (unless the file has them) and with a
per-head RMSNorm on queries and keys before RoPE (attn_q_norm / attn_k_norm)."""

from __future__ import annotations

from typing import Any

from ember.errors import EmberError
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, DecoderConverter
from ember.models.llama import build_decoder

HF_ARCHITECTURES = ("Qwen3ForCausalLM",)
FEATURES = ("per-head Q/K RMSNorm",)
HF_LAYER = {**DECODER_LAYER, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def build(b: Builder) -> int:
    return build_decoder(b, neox=True)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


class Converter(DecoderConverter):
    arch = "qwen3"
    layer_names = HF_LAYER

    def __init__(self, config: dict):
        super().__init__(config)
        if config.get("use_sliding_window") and "sliding_attention" in (config.get("layer_types") or []):
            raise EmberError("Qwen3 with sliding-window attention (use_sliding_window) is not supported")

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        # llama.cpp's converter writes neither for Qwen3: the vocabulary is the tokenizer's, RoPE spans the head
        del meta[f"{self.arch}.vocab_size"], meta[f"{self.arch}.rope.dimension_count"]
        return meta
