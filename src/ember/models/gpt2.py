"""GPT-2: learned position embeddings, LayerNorm, fused QKV projection, GELU (tanh) MLP,
biases everywhere, no rotary embedding."""

from __future__ import annotations

from ember.models.blocks import Builder, HParams


def build(b: Builder) -> int:
    hp, g = b.hp, b.g
    n = hp.n_embd
    x = g.add(g.get_rows(b.weight("token_embd.weight")),
              g.get_rows(b.weight("position_embd.weight"), by_position=True))
    for il in range(hp.n_layer):
        p = f"blk.{il}"
        qkv = b.linear(b.layer_norm(x, f"{p}.attn_norm"), f"{p}.attn_qkv")
        q, k, v = g.view(qkv, 0, n), g.view(qkv, n, n), g.view(qkv, 2 * n, n)
        x = g.add(x, b.linear(b.attention(q, k, v), f"{p}.attn_output"))
        h = b.layer_norm(x, f"{p}.ffn_norm")
        x = g.add(x, b.linear(g.gelu(b.linear(h, f"{p}.ffn_up")), f"{p}.ffn_down"))
    x = b.layer_norm(g.select_outputs(x), "output_norm")
    return g.matmul(b.output_weight(), x)


def hparams(f) -> HParams:
    return HParams.from_gguf(f, default_eps_key="attention.layer_norm_epsilon")
