"""Qwen3-MoE (Qwen3-30B-A3B): the Qwen3 decoder (no Q/K/V biases, RMSNorm of each query and key
head before NeoX rotation) with mixtures of experts: softmax top-k routing, weights normalised."""

from __future__ import annotations

from ember.models import moe
from ember.models.blocks import Builder, HParams
from ember.models.llama import build_decoder
from ember.models.qwen2moe import Converter as Qwen2MoeConverter

HF_ARCHITECTURES = ("Qwen3MoeForCausalLM",)
FEATURES = ("per-head Q/K RMSNorm", "mixture of experts")


def build(b: Builder) -> int:
    return build_decoder(b, neox=True)


def hparams(f) -> HParams:
    hp = HParams.from_gguf(f)
    hp.moe = moe.MoEParams.from_gguf(f, hp, norm_weights=True)
    return hp


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return moe.tensor_shapes(hp)


class Converter(Qwen2MoeConverter):
    arch = "qwen3moe"
    norm_weights = True
    layer_names = {**Qwen2MoeConverter.layer_names, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
