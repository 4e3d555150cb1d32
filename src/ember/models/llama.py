"""LLaMA family (SmolLM2, TinyLlama, DeepSeek-LLM, Llama 2/3): pre-norm decoder with RMSNorm,
rotary attention (GQA) and a SwiGLU MLP. The LM head may be tied to the token embedding."""

from __future__ import annotations

from ember.models.blocks import Builder, HParams


def attention_layer(b: Builder, x: int, il: int, neox: bool) -> int:
    """x + Attention(RMSNorm(x)); projections take biases when the file has them (Qwen2)."""
    p = f"blk.{il}"
    h = b.rms_norm(x, f"{p}.attn_norm.weight")
    q = b.rope(b.linear(h, f"{p}.attn_q"), neox)
    k = b.rope(b.linear(h, f"{p}.attn_k"), neox)
    v = b.linear(h, f"{p}.attn_v")
    return b.g.add(x, b.linear(b.attention(q, k, v), f"{p}.attn_output"))


def build_decoder(b: Builder, neox: bool) -> int:
    x = b.g.get_rows(b.weight("token_embd.weight"))
    for il in range(b.hp.n_layer):
        x = attention_layer(b, x, il, neox)
        h = b.rms_norm(x, f"blk.{il}.ffn_norm.weight")
        x = b.g.add(x, b.gated_mlp(h, f"blk.{il}"))
    # Only the rows whose logits are wanted go through the final norm and the LM head.
    x = b.rms_norm(b.g.select_outputs(x), "output_norm.weight")
    return b.g.matmul(b.output_weight(), x)


def build(b: Builder) -> int:
    # GGUF llama files store Q/K permuted for rotation of adjacent pairs (the "normal" layout).
    return build_decoder(b, neox=False)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)
