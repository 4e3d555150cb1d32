"""Phi-2: one LayerNorm (with bias) feeds attention and the MLP in parallel, x + Attention(h) +
MLP(h); partial rotary embeddings (NeoX layout, rope.dimension_count of each head's dimensions);
biases on every projection, a GELU (tanh) MLP, and an LM head with a bias. Q, K and V are
separate tensors or one fused attn_qkv, as older files have it."""

from __future__ import annotations

from typing import Any, ClassVar

from ember.errors import EmberError
from ember.models.blocks import Builder, HParams
from ember.models.hf import DecoderConverter, get, require

HF_ARCHITECTURES = ("PhiForCausalLM",)
FEATURES = ("parallel attention and MLP", "LayerNorm with bias", "biases", "GELU MLP")
DEFAULT_ROPE_BASE = 10000.0


def qkv(b: Builder, h: int, p: str) -> tuple[int, int, int]:
    hp = b.hp
    if not b.has(f"{p}.attn_qkv.weight"):
        return b.linear(h, f"{p}.attn_q"), b.linear(h, f"{p}.attn_k"), b.linear(h, f"{p}.attn_v")
    fused = b.linear(h, f"{p}.attn_qkv")
    n_q, n_kv = hp.n_head * hp.head_dim, hp.n_kv_head * hp.head_dim
    return b.g.view(fused, 0, n_q), b.g.view(fused, n_q, n_kv), b.g.view(fused, n_q + n_kv, n_kv)


def build(b: Builder) -> int:
    g = b.g
    x = g.get_rows(b.weight("token_embd.weight"))
    for il in range(b.hp.n_layer):
        p = f"blk.{il}"
        h = b.layer_norm(x, f"{p}.attn_norm")
        q, k, v = qkv(b, h, p)
        q, k = b.rope_qk(q, k, True)
        a = b.linear(b.attention(q, k, v), f"{p}.attn_output")
        m = b.linear(g.gelu(b.linear(h, f"{p}.ffn_up")), f"{p}.ffn_down")
        x = g.add(x, g.add(a, m))
    x = b.layer_norm(g.select_outputs(x), "output_norm")
    return b.lm_head(x)


def hparams(f) -> HParams:
    return HParams.from_gguf(f, default_eps_key="attention.layer_norm_epsilon")


class Converter(DecoderConverter):
    """llama.cpp's keys: no rope.freq_base (its default, 10000, unless the model has another)."""

    arch = "phi2"
    layer_names: ClassVar[dict[str, str]] = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.dense": "attn_output",
        "mlp.fc1": "ffn_up",
        "mlp.fc2": "ffn_down",
    }
    global_names: ClassVar[dict[str, str]] = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.final_layernorm.weight": "output_norm.weight",
        "model.final_layernorm.bias": "output_norm.bias",
        "lm_head.weight": "output.weight",
        "lm_head.bias": "output.bias",
    }

    def __init__(self, config: dict):
        super().__init__(config)
        if config.get("qk_layernorm"):
            raise EmberError("Phi with qk_layernorm is not supported (llama.cpp's phi2 has no Q/K norms)")
        activation = config.get("hidden_act", "gelu_new")
        if activation not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            raise EmberError(f"Phi with activation {activation!r} is not supported (ember runs tanh GELU)")

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        rope = self.rope
        if rope.get("rope_type", "default") not in ("default", None):
            raise EmberError(f"Phi with RoPE scaling {rope['rope_type']!r} is not supported")
        factor = float(get(rope, "partial_rotary_factor", default=get(c, "partial_rotary_factor", default=0.5)))
        meta = {
            f"{a}.context_length": int(require(c, "max_position_embeddings")),
            f"{a}.embedding_length": self.n_embd,
            f"{a}.feed_forward_length": int(require(c, "intermediate_size")),
            f"{a}.block_count": self.n_layer,
            f"{a}.attention.head_count": self.n_head,
            f"{a}.attention.head_count_kv": self.n_kv_head,
            f"{a}.attention.layer_norm_epsilon": float(get(c, "layer_norm_eps", default=1e-5)),
            f"{a}.rope.dimension_count": int(factor * self.head_dim),
        }
        base = float(get(rope, "rope_theta", default=DEFAULT_ROPE_BASE))
        if base != DEFAULT_ROPE_BASE:
            meta[f"{a}.rope.freq_base"] = base
        return meta

    def gguf_name(self, hf_name: str) -> str | None:
        if hf_name in self.global_names and not (hf_name == "lm_head.weight" and self.config.get("tie_word_embeddings")):
            return self.global_names[hf_name]
        return super().gguf_name(hf_name)
