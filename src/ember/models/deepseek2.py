"""DeepSeek-V2, V2-Lite, V3 and R1 (`deepseek2` in GGUF): pre-norm decoder with multi-head latent
attention (models/mla.py); the first leading_dense_block_count layers have a SwiGLU MLP, the others
a mixture of experts with shared experts (models/moe.py). The LM head may be tied to the embedding.

Routing by the file's expert_gating_func: softmax (V2, and files that name none, as llama.cpp
reads them) or sigmoid with the score-correction bias exp_probs_b (V3). Group-limited selection
(expert_group_count > 1) keeps the experts of the expert_group_used_count best groups; a group
scores its best expert under softmax (DeepSeek-V2's group_limited_greedy) and the sum of its two
best under sigmoid (V3's noaux_tc; llama.cpp scores every deepseek2 file's groups so)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ember.errors import EmberError, GGUFError
from ember.gguf.metadata import int_key
from ember.models import mla, moe
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, LAYER, MOE_LAYER, DecoderConverter, get, require

HF_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
ARCH = "deepseek2"
GATING_FUNCS = {"softmax": 1, "sigmoid": 2}  # {arch}.expert_gating_func, llama.cpp's enum
# V3's score-correction bias, a buffer of the router
SCORE_BIAS = re.compile(r"^(?:model\.)?layers\.(\d+)\.mlp\.gate\.e_score_correction_bias$")
LAYER_INDEX = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


FEATURES = ("multi-head latent attention",)


def features(metadata: dict) -> list[str]:
    """The experts, where some layers have them (files of all-dense models carry expert keys too)."""
    n_layer = int_key(metadata, f"{ARCH}.block_count")
    if int_key(metadata, f"{ARCH}.leading_dense_block_count", 0, minimum=0) >= n_layer:
        return []
    gating = "sigmoid" if metadata.get(f"{ARCH}.expert_gating_func") == GATING_FUNCS["sigmoid"] else "softmax"
    return moe.features(metadata, ARCH, group_score=group_score(gating))


def group_score(gating: str) -> str:
    """How a group of experts is scored: DeepSeek-V2's best expert, V3's two best (see above)."""
    return "top2" if gating == "sigmoid" else "max"


def hparams(f) -> HParams:
    meta = f.metadata
    split = f"{ARCH}.attention.key_length_mla" in meta and f"{ARCH}.attention.value_length_mla" in meta
    head_keys = ("attention.key_length_mla", "attention.value_length_mla") if split else (
        "attention.key_length", "attention.value_length")
    hp = HParams.from_gguf(f, head_keys=head_keys, equal_heads=False)
    if hp.rope_scaling.kind not in ("none", "yarn"):
        raise GGUFError(f"RoPE scaling {hp.rope_scaling.kind!r} is not one DeepSeek uses (none or yarn)")
    hp.mla = mla.mla_params(f, hp)
    n_dense = int_key(f.metadata, f"{ARCH}.leading_dense_block_count", 0, minimum=0, maximum=hp.n_layer)
    if n_dense < hp.n_layer:  # llama.cpp's converter writes expert keys for all-dense models too
        hp.moe = moe.MoEParams.from_gguf(f, hp, norm_weights=False, gating="softmax")
        hp.moe.group_score = group_score(hp.moe.gating)
    return hp


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    shapes = mla.tensor_shapes(hp, hp.mla)
    return shapes if hp.moe is None else shapes | moe.tensor_shapes(hp)


def build(b: Builder) -> int:
    hp, g = b.hp, b.g
    x = g.get_rows(b.weight("token_embd.weight"))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        x = g.add(x, mla.attention(b, b.rms_norm(x, f"{p}.attn_norm.weight"), p, hp.mla))
        x = g.add(x, moe.ffn(b, b.rms_norm(x, f"{p}.ffn_norm.weight"), il))
    x = b.rms_norm(g.select_outputs(x), "output_norm.weight")
    return b.lm_head(x)


HF_LAYER = {
    **DECODER_LAYER,
    **MOE_LAYER,
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
}


class Converter(DecoderConverter):
    """llama.cpp's DeepseekV2Model: MLA written for the absorbed form (kv_b_proj split into
    attn_k_b, transposed per head, and attn_v_b), one KV head of kv_lora_rank + rope dimensions."""

    arch = ARCH
    layer_names = HF_LAYER

    def __init__(self, config: dict):
        super().__init__(config)
        c = config
        self.kv_lora_rank = int(get(c, "kv_lora_rank", default=512))
        self.nope = int(require(c, "qk_nope_head_dim"))
        self.rope_dims = int(require(c, "qk_rope_head_dim"))
        self.value = int(require(c, "v_head_dim"))
        self.hf_architecture = (c.get("architectures") or [HF_ARCHITECTURES[0]])[0]

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = super().metadata()
        for name in ("attention.key_length", "attention.value_length"):
            meta.pop(f"{a}.{name}", None)
        has_moe = c.get("n_routed_experts") is not None
        dense = get(c, "first_k_dense_replace", default=None if has_moe else self.n_layer)
        meta.update({
            f"{a}.attention.head_count_kv": 1,
            f"{a}.leading_dense_block_count": int(dense or 0),
            f"{a}.attention.kv_lora_rank": self.kv_lora_rank,
            f"{a}.attention.key_length": self.kv_lora_rank + self.rope_dims,
            f"{a}.attention.value_length": self.kv_lora_rank,
            f"{a}.attention.key_length_mla": self.nope + self.rope_dims,
            f"{a}.attention.value_length_mla": self.value,
            f"{a}.expert_feed_forward_length": int(get(c, "moe_intermediate_size", "intermediate_size")),
            f"{a}.expert_shared_count": int(get(c, "n_shared_experts", default=0)),
            f"{a}.rope.dimension_count": self.rope_dims,
        })
        if c.get("q_lora_rank") is not None:
            meta[f"{a}.attention.q_lora_rank"] = int(c["q_lora_rank"])
        if c.get("routed_scaling_factor") is not None:
            meta[f"{a}.expert_weights_scale"] = float(c["routed_scaling_factor"])
        if c.get("norm_topk_prob"):
            meta[f"{a}.expert_weights_norm"] = True
        rope = self.rope.get("full_attention", self.rope)
        if rope.get("rope_type") == "yarn" and rope.get("mscale_all_dim") is not None:
            # llama.cpp's converter writes 0.1 * mscale_all_dim (and its loader divides by 0.1)
            meta[f"{a}.rope.scaling.yarn_log_multiplier"] = 0.1 * float(rope["mscale_all_dim"])
        return meta

    def moe_metadata(self) -> dict[str, Any]:
        """The expert keys llama.cpp's converter writes (for all-dense models too); V3's sigmoid
        where a model with experts names no scoring function (transformers' V3 has no other), and
        every group usable where V2 routes greedily (topk_method "greedy" ignores n_group)."""
        c, a = self.config, self.arch
        meta = super().moe_metadata()
        routed = c.get("n_routed_experts") is not None and get(c, "first_k_dense_replace", default=0) < self.n_layer
        v3 = self.hf_architecture == "DeepseekV3ForCausalLM"
        if routed and v3 and get(c, "scoring_func", "score_function") is None:
            meta[f"{a}.expert_gating_func"] = GATING_FUNCS["sigmoid"]
        if c.get("topk_method") == "greedy" and f"{a}.expert_group_count" in meta:
            meta[f"{a}.expert_group_used_count"] = meta[f"{a}.expert_group_count"]
        return meta

    def beyond_layers(self, hf_name: str) -> bool:
        """Whether the tensor belongs to a layer past num_hidden_layers (V3's multi-token
        prediction layers, which llama.cpp's converter leaves out too)."""
        match = LAYER_INDEX.match(hf_name)
        return match is not None and int(match.group(1)) >= self.n_layer

    def gguf_name(self, hf_name: str) -> str | None:
        if self.beyond_layers(hf_name):
            return None
        match = SCORE_BIAS.match(hf_name)
        if match is not None:
            return f"blk.{match.group(1)}.exp_probs_b.bias"
        return super().gguf_name(hf_name)

    def expert(self, hf_name: str) -> tuple[str, int] | None:
        return None if self.beyond_layers(hf_name) else super().expert(hf_name)

    def split(self, hf_name: str, shape: tuple[int, ...]) -> list | None:
        if self.beyond_layers(hf_name):
            return None
        if not hf_name.endswith("self_attn.kv_b_proj.weight"):
            return super().split(hf_name, shape)
        layer = LAYER.match(hf_name.removeprefix("model.")).group(1)
        h, nope, value, rank = self.n_head, self.nope, self.value, self.kv_lora_rank
        if tuple(shape) != (h * (nope + value), rank):
            raise EmberError(f"{hf_name} has shape {list(shape)}, not [{h * (nope + value)}, {rank}]")

        def heads(values: np.ndarray) -> np.ndarray:
            return values.reshape(h, nope + value, rank)

        return [  # numpy order: attn_k_b [h, rank, nope] (W_UK^T per head), attn_v_b [h, value, rank]
            (f"blk.{layer}.attn_k_b.weight", lambda v: heads(v)[:, :nope, :].transpose(0, 2, 1), (h, rank, nope)),
            (f"blk.{layer}.attn_v_b.weight", lambda v: heads(v)[:, nope:, :], (h, value, rank)),
        ]
