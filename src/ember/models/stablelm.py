"""StableLM (2): LayerNorm with bias; partial rotary embeddings (NeoX layout); Q/K/V biases where
the file has them; a SwiGLU MLP. Each block is sequential, x + Attention(LN1(x)) then
+ MLP(LN2(x)), or parallel, x + Attention(LN1(x)) + MLP(LN1(x)), as the file says
(stablelm.use_parallel_residual; without it, parallel where the blocks have no ffn_norm, as
llama.cpp decides). StableLM 2 12B has a LayerNorm (no bias) of its own per head on Q and K:
attn_q_norm / attn_k_norm of [head_dim, heads]."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ember.errors import EmberError, GGUFError
from ember.gguf.metadata import bool_key
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, DecoderConverter, get

HF_ARCHITECTURES = ("StableLmForCausalLM",)
FEATURES = ("LayerNorm with bias",)
DEFAULT_ROPE_BASE = 10000.0


def features(metadata: dict) -> list[str]:
    return ["parallel attention and MLP"] if bool_key(metadata, "stablelm.use_parallel_residual", False) else []


def parallel_blocks(b: Builder) -> bool:
    key = "stablelm.use_parallel_residual"
    has_ffn_norm = b.has("blk.0.ffn_norm.weight")
    parallel = bool_key(b.f.metadata, key, not has_ffn_norm)
    if parallel and has_ffn_norm:
        raise GGUFError(f"metadata key {key} is true, but the blocks have an ffn_norm (tensor blk.0.ffn_norm.weight)")
    return parallel


def per_head_layer_norm(b: Builder, x: int, weight_name: str, n_heads: int) -> int:
    """LayerNorm over each head's head_dim values, scaled by that head's own weights."""
    g, head_dim = b.g, b.hp.head_dim
    normed = g.layer_norm(g.reshape(x, head_dim), -1, -1, b.hp.norm_eps)
    return g.mul(g.reshape(normed, n_heads * head_dim), b.vector(weight_name))


def build(b: Builder) -> int:
    hp, g = b.hp, b.g
    parallel = parallel_blocks(b)
    x = g.get_rows(b.weight("token_embd.weight"))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        h = b.layer_norm(x, f"{p}.attn_norm")
        q, k = b.linear(h, f"{p}.attn_q"), b.linear(h, f"{p}.attn_k")
        if b.has(f"{p}.attn_q_norm.weight"):
            q = per_head_layer_norm(b, q, f"{p}.attn_q_norm.weight", hp.n_head)
            k = per_head_layer_norm(b, k, f"{p}.attn_k_norm.weight", hp.n_kv_head)
        q, k = b.rope_qk(q, k, True)
        a = b.linear(b.attention(q, k, b.linear(h, f"{p}.attn_v")), f"{p}.attn_output")
        if parallel:
            x = g.add(x, g.add(a, b.gated_mlp(h, p)))
        else:
            x = g.add(x, a)
            x = g.add(x, b.gated_mlp(b.layer_norm(x, f"{p}.ffn_norm"), p))
    x = b.layer_norm(g.select_outputs(x), "output_norm")
    return b.lm_head(x)


def hparams(f) -> HParams:
    return HParams.from_gguf(f, default_eps_key="attention.layer_norm_epsilon")


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return {"attn_q_norm.weight": (hp.head_dim, hp.n_head), "attn_k_norm.weight": (hp.head_dim, hp.n_kv_head)}


class Converter(DecoderConverter):
    """The per-head Q/K norms (q_layernorm.norms.N) are stacked into one tensor per layer; the RoPE
    base is written only where it is not llama.cpp's default, as llama.cpp's converter never does."""

    arch = "stablelm"
    layer_names: ClassVar[dict[str, str]] = {**DECODER_LAYER}

    def __init__(self, config: dict):
        super().__init__(config)
        if self.rope.get("rope_type", "default") not in ("default", None):
            raise EmberError(f"StableLM with RoPE scaling {self.rope['rope_type']!r} is not supported")

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = super().metadata()
        for key in ("vocab_size", "attention.layer_norm_rms_epsilon", "attention.key_length",
                    "attention.value_length"):
            meta.pop(f"{a}.{key}", None)
        factor = float(get(self.rope, "partial_rotary_factor", default=get(c, "partial_rotary_factor", default=0.25)))
        meta[f"{a}.rope.dimension_count"] = int(factor * self.head_dim)
        meta[f"{a}.use_parallel_residual"] = bool(get(c, "use_parallel_residual", default=True))
        meta[f"{a}.attention.layer_norm_epsilon"] = float(get(c, "layer_norm_eps", "norm_eps", default=1e-5))
        if meta.get(f"{a}.rope.freq_base") == DEFAULT_ROPE_BASE:
            del meta[f"{a}.rope.freq_base"]  # llama.cpp's converter writes it for no StableLM
        return meta

    def gguf_name(self, hf_name: str) -> str | None:
        if "_layernorm.norms." in hf_name:
            return None  # stacked by merged_tensors
        return super().gguf_name(hf_name)

    def merged_tensors(self, tensors: dict) -> list[tuple[str, np.ndarray]]:
        out = []
        for il in range(self.n_layer):
            for hf, gguf, n_heads in (("q_layernorm", "attn_q_norm", self.n_head), ("k_layernorm", "attn_k_norm", self.n_kv_head)):
                names = [f"model.layers.{il}.self_attn.{hf}.norms.{h}.weight" for h in range(n_heads)]
                if names[0] in tensors:
                    missing = [n for n in names if n not in tensors]
                    if missing:
                        raise EmberError(f"the checkpoint lacks {missing[0]}")
                    out.append((f"blk.{il}.{gguf}.weight", np.stack([tensors[n].numpy() for n in names])))
        return out
