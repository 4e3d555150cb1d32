"""OLMo 2: no pre-norms; RMSNorm after attention and after the MLP, before each residual add;
RMSNorm over all heads of the Q and K projections (one weight of n_head * head_dim, not one
per head); NeoX-layout rotary embeddings; SwiGLU MLP; untied LM head."""

from __future__ import annotations

from typing import Any, ClassVar

from ember.errors import EmberError, GGUFError
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, DecoderConverter

HF_ARCHITECTURES = ("Olmo2ForCausalLM",)
FEATURES = ("post-norms", "Q/K RMSNorm over all heads")


def build(b: Builder) -> int:
    g = b.g
    x = g.get_rows(b.weight("token_embd.weight"))
    for il in range(b.hp.n_layer):
        p = f"blk.{il}"
        q = b.rms_norm(b.linear(x, f"{p}.attn_q"), f"{p}.attn_q_norm.weight")
        k = b.rms_norm(b.linear(x, f"{p}.attn_k"), f"{p}.attn_k_norm.weight")
        q, k = b.rope_qk(q, k, True)
        v = b.linear(x, f"{p}.attn_v")
        a = b.linear(b.attention(q, k, v), f"{p}.attn_output")
        x = g.add(x, b.rms_norm(a, f"{p}.post_attention_norm.weight"))
        x = g.add(x, b.rms_norm(b.gated_mlp(x, p), f"{p}.post_ffw_norm.weight"))
    x = b.rms_norm(g.select_outputs(x), "output_norm.weight")
    return b.lm_head(x)


def hparams(f) -> HParams:
    hp = HParams.from_gguf(f)
    if hp.sliding_window:
        raise GGUFError("olmo2 files with sliding-window attention (OLMo 3) are not supported yet")
    return hp


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return {"attn_q_norm.weight": (hp.n_head * hp.head_dim,), "attn_k_norm.weight": (hp.n_kv_head * hp.head_dim,)}


class Converter(DecoderConverter):
    arch = "olmo2"
    layer_names: ClassVar[dict[str, str]] = {
        **{k: v for k, v in DECODER_LAYER.items() if k not in ("input_layernorm", "post_attention_layernorm")},
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "post_attention_layernorm": "post_attention_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    }

    def __init__(self, config: dict):
        super().__init__(config)
        if config.get("sliding_window") or config.get("layer_types") and "sliding_attention" in config["layer_types"]:
            raise EmberError("OLMo with sliding-window attention is not supported yet")

    def metadata(self) -> dict[str, Any]:
        # llama.cpp's converter writes neither the vocabulary size nor the rotary dimensions for OLMo 2
        meta = super().metadata()
        del meta[f"{self.arch}.vocab_size"], meta[f"{self.arch}.rope.dimension_count"]
        return meta
