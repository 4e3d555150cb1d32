"""GLM-4 (0414): RMSNorm before and after attention and before and after the MLP; Q/K/V
biases; partial rotary embeddings over the first half of each head, rotating adjacent pairs (the
normal layout, as Hugging Face's GLM-4 does: no permutation); a SwiGLU MLP whose gate and up
projections are one tensor, ffn_up of 2 * n_ff rows (gate first)."""

from __future__ import annotations

from typing import Any, ClassVar

from ember.errors import EmberError
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, DecoderConverter, get

HF_ARCHITECTURES = ("Glm4ForCausalLM",)
FEATURES = ("post-norms", "fused gate and up projection")


def build(b: Builder) -> int:
    hp, g = b.hp, b.g
    x = g.get_rows(b.weight("token_embd.weight"))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        h = b.rms_norm(x, f"{p}.attn_norm.weight")
        q, k = b.rope_qk(b.linear(h, f"{p}.attn_q"), b.linear(h, f"{p}.attn_k"), False)
        a = b.linear(b.attention(q, k, b.linear(h, f"{p}.attn_v")), f"{p}.attn_output")
        x = g.add(x, b.rms_norm(a, f"{p}.post_attention_norm.weight"))
        gate_up = b.linear(b.rms_norm(x, f"{p}.ffn_norm.weight"), f"{p}.ffn_up")
        m = b.linear(g.swiglu(g.view(gate_up, 0, hp.n_ff), g.view(gate_up, hp.n_ff, hp.n_ff)), f"{p}.ffn_down")
        x = g.add(x, b.rms_norm(m, f"{p}.post_ffw_norm.weight"))
    x = b.rms_norm(g.select_outputs(x), "output_norm.weight")
    return b.lm_head(x)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return {"ffn_up.weight": (hp.n_embd, 2 * hp.n_ff), "ffn_up.bias": (2 * hp.n_ff,)}


class Converter(DecoderConverter):
    arch = "glm4"
    layer_names: ClassVar[dict[str, str]] = {
        **{k: v for k, v in DECODER_LAYER.items() if k not in ("mlp.gate_proj", "mlp.up_proj")},
        "post_self_attn_layernorm": "post_attention_norm",
        "post_attention_layernorm": "ffn_norm",
        "post_mlp_layernorm": "post_ffw_norm",
        "mlp.gate_up_proj": "ffn_up",
    }

    def __init__(self, config: dict):
        super().__init__(config)
        if "mrope_section" in self.rope:
            raise EmberError("GLM-4 with multimodal RoPE (mrope_section) is not supported")
        if self.rope.get("rope_type", "default") not in ("default", None):
            raise EmberError(f"GLM-4 with RoPE scaling {self.rope['rope_type']!r} is not supported")

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = super().metadata()
        del meta[f"{a}.vocab_size"]
        factor = float(get(self.rope, "partial_rotary_factor", default=get(c, "partial_rotary_factor", default=0.5)))
        meta[f"{a}.rope.dimension_count"] = int(self.head_dim * factor)
        return meta
