"""DeepSeek-V1 MoE (DeepSeek-MoE 16B; `deepseek` in GGUF, llama.cpp's LLM_ARCH_DEEPSEEK): the LLaMA
decoder (RMSNorm, rotary attention of adjacent pairs, Q/K rows permuted as llama's) whose first
leading_dense_block_count layers have a SwiGLU MLP and the others a mixture of experts: softmax
top-k routing, weights not normalised, plus shared experts run on every token (models/moe.py)."""

from __future__ import annotations

from typing import Any

from ember.models import llama, moe
from ember.models.blocks import Builder, HParams
from ember.errors import EmberError
from ember.models.hf import get, require

HF_ARCHITECTURES = ("DeepseekForCausalLM",)


def features(metadata: dict) -> list[str]:
    return moe.features(metadata, "deepseek")


def build(b: Builder) -> int:
    return llama.build_decoder(b, neox=False)


def hparams(f) -> HParams:
    hp = HParams.from_gguf(f)
    hp.moe = moe.MoEParams.from_gguf(f, hp, norm_weights=False, gating="softmax")
    return hp


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return moe.tensor_shapes(hp)


class Converter(llama.Converter):
    """llama.cpp's DeepseekModel: llama's layout and Q/K permutation, and the expert keys."""

    arch = "deepseek"

    def __init__(self, config: dict):
        super().__init__(config)
        if int(get(config, "moe_layer_freq", default=1)) != 1:
            raise EmberError(f"moe_layer_freq is {config['moe_layer_freq']}: ember (like llama.cpp) converts DeepSeek "
                             "MoE models whose layers after first_k_dense_replace all have experts (moe_layer_freq 1)")

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = super().metadata()
        meta.update({
            f"{a}.rope.scaling.type": "none",
            f"{a}.leading_dense_block_count": int(require(c, "first_k_dense_replace")),
            f"{a}.expert_feed_forward_length": int(require(c, "moe_intermediate_size")),
            f"{a}.expert_weights_scale": 1.0,
            f"{a}.expert_shared_count": int(require(c, "n_shared_experts")),
        })
        if c.get("norm_topk_prob"):  # not written by llama.cpp, whose graph never normalises
            meta[f"{a}.expert_weights_norm"] = True
        return meta
