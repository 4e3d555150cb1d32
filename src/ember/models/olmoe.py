"""OLMoE: a decoder with RMSNorm of the whole query and key rows (all heads together) before NeoX
rotation, and mixtures of experts with softmax top-k routing, weights not normalised."""

from __future__ import annotations

from typing import Any

from ember.models import moe
from ember.models.blocks import Builder, HParams
from ember.models.hf import DecoderConverter
from ember.models.llama import build_decoder

HF_ARCHITECTURES = ("OlmoeForCausalLM",)
FEATURES = ("Q/K RMSNorm over all heads", "mixture of experts")


def build(b: Builder) -> int:
    return build_decoder(b, neox=True)


def hparams(f) -> HParams:
    hp = HParams.from_gguf(f)
    hp.moe = moe.MoEParams.from_gguf(f, hp, norm_weights=False)
    return hp


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return moe.tensor_shapes(hp) | {"attn_q_norm.weight": (hp.n_head * hp.head_dim,),
                                    "attn_k_norm.weight": (hp.n_kv_head * hp.head_dim,)}


class Converter(DecoderConverter):
    """llama.cpp's OlmoeModel: the experts' size is feed_forward_length; RMSNorm epsilon 1e-5."""

    arch = "olmoe"
    layer_names = {**DecoderConverter.layer_names, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        del meta[f"{self.arch}.vocab_size"], meta[f"{self.arch}.rope.dimension_count"]  # as llama.cpp's
        meta[f"{self.arch}.attention.layer_norm_rms_epsilon"] = 1e-5
        if self.config.get("norm_topk_prob"):  # not written by llama.cpp, whose graph never normalises
            meta[f"{self.arch}.expert_weights_norm"] = True
        return meta
