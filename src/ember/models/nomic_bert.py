"""Nomic BERT (nomic-embed-text): the BERT encoder with rotary positions (NeoX layout) in place of
a position embedding, a fused QKV projection without biases and a SwiGLU MLP (llama.cpp's
nomic-bert graph: down(silu(gate(x)) * up(x)))."""

from __future__ import annotations

from ember.models.blocks import Builder, HParams
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
