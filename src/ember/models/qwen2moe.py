"""Qwen2-MoE (Qwen1.5-MoE): the Qwen2 decoder (Q/K/V biases, NeoX rotation) whose MLPs are
mixtures of experts: softmax top-k routing without normalisation, plus a shared expert scaled by
sigmoid(ffn_gate_inp_shexp x)."""

from __future__ import annotations

from typing import Any

from ember.models import moe
from ember.models.blocks import Builder, HParams
from ember.models.hf import DecoderConverter, get
from ember.models.llama import build_decoder

HF_ARCHITECTURES = ("Qwen2MoeForCausalLM",)
FEATURES = ("mixture of experts", "gated shared expert")


def build(b: Builder) -> int:
    return build_decoder(b, neox=True)


def hparams(f) -> HParams:
    hp = HParams.from_gguf(f)
    hp.moe = moe.MoEParams.from_gguf(f, hp, norm_weights=False)
    return hp


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return moe.tensor_shapes(hp)


class Converter(DecoderConverter):
    """llama.cpp's Qwen2MoeModel: the expert and shared-expert sizes as keys of their own."""

    arch = "qwen2moe"
    norm_weights = False  # what llama.cpp's graph does for the architecture

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        del meta[f"{self.arch}.vocab_size"], meta[f"{self.arch}.rope.dimension_count"]  # as llama.cpp's
        return meta

    def moe_metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = super().moe_metadata()
        if c.get("moe_intermediate_size") is not None:
            meta[f"{a}.expert_feed_forward_length"] = int(c["moe_intermediate_size"])
        if c.get("shared_expert_intermediate_size") is not None:
            meta[f"{a}.expert_shared_feed_forward_length"] = int(c["shared_expert_intermediate_size"])
        # llama.cpp's converter writes no norm key; ember writes one where the config differs from
        # the architecture's fixed choice
        if bool(get(c, "norm_topk_prob", default=self.norm_weights)) != self.norm_weights:
            meta[f"{a}.expert_weights_norm"] = not self.norm_weights
        return meta
