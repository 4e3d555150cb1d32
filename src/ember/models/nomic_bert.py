"""Nomic BERT (nomic-embed-text): the BERT encoder with rotary positions (NeoX layout) in place of
a position embedding, a fused QKV projection without biases and a SwiGLU MLP (llama.cpp's
nomic-bert graph: down(silu(gate(x)) * up(x))). `ember convert` reads a NomicBertModel checkpoint
(its fc11 is the up projection, fc12 the gate) as llama.cpp's converter does."""

from __future__ import annotations

import re
from typing import Any

from ember.errors import EmberError
from ember.models.blocks import Builder, HParams
from ember.models.hf import get, require
from ember.models import bert
from ember.models.bert import embeddings, encoder_layer, outputs, tensor_shapes  # noqa: F401  (the same norms)

ENCODER = True


def hparams(f) -> HParams:
    return HParams.from_gguf(f, default_eps_key="attention.layer_norm_epsilon")


def rotary_attention(b: Builder, x: int, il: int) -> int:
    n = b.hp.n_embd
    qkv = b.linear(x, f"blk.{il}.attn_qkv")
    q, k, v = b.g.view(qkv, 0, n), b.g.view(qkv, n, n), b.g.view(qkv, 2 * n, n)
    q, k = b.rope_qk(q, k, neox=True)
    return b.attention(q, k, v, causal=False)


def swiglu_mlp(b: Builder, x: int, il: int) -> int:
    return b.gated_mlp(x, f"blk.{il}")


def build(b: Builder) -> int:
    x = embeddings(b)
    for il in range(b.hp.n_layer):
        x = encoder_layer(b, x, il, rotary_attention, swiglu_mlp)
    return outputs(b, x)


HF_ARCHITECTURES = ("NomicBertModel",)

_GLOBAL = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "emb_ln.weight": "token_embd_norm.weight",
    "emb_ln.bias": "token_embd_norm.bias",
}
_LAYER = {"attn.Wqkv": "attn_qkv", "attn.out_proj": "attn_output", "mlp.fc11": "ffn_up", "mlp.fc12": "ffn_gate",
          "mlp.fc2": "ffn_down", "norm1": "attn_output_norm", "norm2": "layer_output_norm"}
_BLOCK = re.compile(r"^encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")
# (n_positions, max_trained_positions) -> the context llama.cpp's converter writes: nomic-embed-text
# v1 and v1.5 are trained for 2048 tokens
_CONTEXTS = {(8192, 2048): 2048}
# what the graph computes, as llama.cpp's converter asserts it of the config
_REQUIRED = {"activation_function": "swiglu", "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
             "mlp_fc2_bias": False, "prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
             "rotary_emb_scale_base": None}


class Converter(bert.Converter):
    """Hugging Face NomicBertModel (nomic-embed-text v1, v1.5) -> GGUF "nomic-bert", with the keys
    and tensor names llama.cpp's NomicBertModel converter writes; the mixture-of-experts v2 is refused."""

    arch = "nomic-bert"
    global_names, layer_names, block, dropped = _GLOBAL, _LAYER, _BLOCK, ("embeddings.position_ids",)

    def __init__(self, config: dict):
        self.config = config
        self.classifies = False
        if config.get("moe_every_n_layers"):
            raise EmberError("nomic-bert with mixture-of-experts layers (nomic-embed-text-v2-moe) is not supported")
        for key, value in _REQUIRED.items():
            if config.get(key, value) != value:
                raise EmberError(f"nomic-bert with {key} = {config[key]!r} is not supported (ember runs {value!r})")
        positions = (config.get("n_positions"), config.get("max_trained_positions", 2048))
        if positions not in _CONTEXTS:
            raise EmberError(f"nomic-bert with n_positions = {positions[0]} and max_trained_positions = "
                             f"{positions[1]} is not a configuration ember knows (nomic-embed-text has 8192 and 2048)")
        self.n_ctx = _CONTEXTS[positions]

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        n_embd, n_head = int(require(c, "n_embd")), int(require(c, "n_head"))
        if n_embd % n_head:
            raise EmberError(f"nomic-bert with n_embd {n_embd} not a multiple of n_head {n_head}")
        return {
            f"{a}.block_count": int(require(c, "n_layer")),
            f"{a}.context_length": self.n_ctx,
            f"{a}.embedding_length": n_embd,
            f"{a}.feed_forward_length": int(require(c, "n_inner")),
            f"{a}.attention.head_count": n_head,
            f"{a}.rope.freq_base": float(get(c, "rotary_emb_base", default=10000.0)),
            f"{a}.attention.layer_norm_epsilon": float(get(c, "layer_norm_epsilon", default=1e-12)),
            f"{a}.attention.key_length": n_embd // n_head,
            f"{a}.attention.value_length": n_embd // n_head,
            f"{a}.attention.causal": False,
        }
