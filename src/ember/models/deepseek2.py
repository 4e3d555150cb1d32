"""DeepSeek-V2, V2-Lite, V3 and R1 (`deepseek2` in GGUF): pre-norm decoder with multi-head latent
attention (models/mla.py) and SwiGLU MLPs; the first leading_dense_block_count layers are dense,
the others mixtures of experts with shared experts. The LM head may be tied to the embedding."""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import EmberError, GGUFError
from ember.gguf.metadata import int_key
from ember.models import mla
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, LAYER, DecoderConverter, get, require

HF_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
ARCH = "deepseek2"
GATING_FUNCS = {"softmax": 1, "sigmoid": 2}  # {arch}.expert_gating_func, llama.cpp's enum


def hparams(f) -> HParams:
    meta = f.metadata
    split = f"{ARCH}.attention.key_length_mla" in meta and f"{ARCH}.attention.value_length_mla" in meta
    head_keys = ("attention.key_length_mla", "attention.value_length_mla") if split else (
        "attention.key_length", "attention.value_length")
    hp = HParams.from_gguf(f, head_keys=head_keys, equal_heads=False)
    if hp.rope_scaling.kind not in ("none", "yarn"):
        raise GGUFError(f"RoPE scaling {hp.rope_scaling.kind!r} is not one DeepSeek uses (none or yarn)")
    hp.mla = mla.mla_params(f, hp)
    return hp


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return mla.tensor_shapes(hp, hp.mla)


def dense_layers(b: Builder) -> int:
    hp = b.hp
    return int_key(b.f.metadata, f"{hp.arch}.leading_dense_block_count", 0, minimum=0, maximum=hp.n_layer)


def build(b: Builder) -> int:
    hp, g = b.hp, b.g
    n_dense = dense_layers(b)
    if n_dense < hp.n_layer:
        raise GGUFError(f"layers {n_dense} to {hp.n_layer - 1} of this {hp.arch} file are mixtures of experts "
                        f"({hp.arch}.leading_dense_block_count is {n_dense}), which ember does not run yet")
    x = g.get_rows(b.weight("token_embd.weight"))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        x = g.add(x, mla.attention(b, b.rms_norm(x, f"{p}.attn_norm.weight"), p, hp.mla))
        x = g.add(x, b.gated_mlp(b.rms_norm(x, f"{p}.ffn_norm.weight"), p))
    x = b.rms_norm(g.select_outputs(x), "output_norm.weight")
    return g.matmul(b.output_weight(), x)


HF_LAYER = {
    **DECODER_LAYER,
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
        if get(c, "n_routed_experts") is not None and get(c, "first_k_dense_replace", default=0) < self.n_layer:
            raise EmberError("DeepSeek mixtures of experts are not converted yet (only models whose layers are all "
                             "dense: first_k_dense_replace = num_hidden_layers)")

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
        for key, names in (("expert_count", ("n_routed_experts",)), ("expert_used_count", ("num_experts_per_tok",)),
                           ("expert_group_count", ("n_group",)), ("expert_group_used_count", ("topk_group",))):
            if get(c, *names) is not None:  # llama.cpp's converter writes them for dense models too
                meta[f"{a}.{key}"] = int(get(c, *names))
        if c.get("scoring_func") in GATING_FUNCS:
            meta[f"{a}.expert_gating_func"] = GATING_FUNCS[c["scoring_func"]]
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

    def split(self, hf_name: str, shape: tuple[int, ...]) -> list | None:
        if not hf_name.endswith("self_attn.kv_b_proj.weight"):
            return None
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
