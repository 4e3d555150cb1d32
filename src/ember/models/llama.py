"""LLaMA family (SmolLM2, TinyLlama, DeepSeek-LLM, Llama 2/3.x, Mistral) and Mixtral: pre-norm
decoder with RMSNorm, rotary attention (GQA) and a SwiGLU MLP, or in Mixtral a mixture of SwiGLU
experts (llama.cpp writes Mixtral as `llama` with expert tensors: models/moe.py). The LM head may
be tied to the token embedding;
RoPE may be scaled (linear, YaRN, Llama 3's rope_freqs.weight: models/rope.py); attention slides
over the last llama.attention.sliding_window positions where the file gives one (Mistral 7B v0.1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.models import moe
from ember.models.blocks import Builder, HParams
from ember.models.hf import DecoderConverter, llama3_rope_factors, permute_rope_rows

HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")


@dataclass(frozen=True)
class Multipliers:
    """Granite's scalings of the LLaMA decoder (GGUF {arch}.embedding_scale, .residual_scale,
    .attention.scale, .logit_scale): embeddings times `embedding`, each attention and MLP output
    times `residual` before it joins the residual stream, attention scores times `attention`
    (None: 1/sqrt(head_dim)), logits divided by `logit`."""

    embedding: float = 1.0
    residual: float = 1.0
    attention: float | None = None
    logit: float = 1.0


def attention_layer(b: Builder, x: int, il: int, neox: bool, m: Multipliers = Multipliers(),
                    rope: bool = True) -> int:
    """x + Attention(RMSNorm(x)); projections take biases when the file has them (Qwen2), queries
    and keys an RMSNorm before RoPE when it has attn_q_norm / attn_k_norm (Qwen3, OLMoE); a
    sliding window where the file gives attention.sliding_window (Mistral)."""
    p = f"blk.{il}"
    h = b.rms_norm(x, f"{p}.attn_norm.weight")
    q, k = qk_norm(b, p, b.linear(h, f"{p}.attn_q"), b.linear(h, f"{p}.attn_k"))
    if rope:  # SmolLM3's NoPE layers have none
        q, k = b.rope_qk(q, k, neox)
    v = b.linear(h, f"{p}.attn_v")
    out = b.linear(b.attention(q, k, v, window=b.hp.sliding_window, scale=m.attention), f"{p}.attn_output")
    return b.g.add(x, scaled(b, out, m.residual))


def scaled(b: Builder, x: int, factor: float) -> int:
    return x if factor == 1.0 else b.g.scale(x, factor)


def qk_norm(b: Builder, p: str, q: int, k: int) -> tuple[int, int]:
    """RMSNorm of queries and keys where the file has their weights: per head where a weight is one
    head wide (Qwen3), else over all heads together (OLMoE)."""
    if not b.has(f"{p}.attn_q_norm.weight"):
        return q, k

    def norm(x: int, name: str) -> int:
        per_head = b.f.tensors[name].n_elements == b.hp.head_dim
        return b.rms_norm(x, name, group=b.hp.head_dim if per_head else 0)

    return norm(q, f"{p}.attn_q_norm.weight"), norm(k, f"{p}.attn_k_norm.weight")


def build_decoder(b: Builder, neox: bool, m: Multipliers = Multipliers(),
                  rope_layers: Callable[[int], bool] = lambda il: True) -> int:
    x = scaled(b, b.g.get_rows(b.weight("token_embd.weight")), m.embedding)
    for il in range(b.hp.n_layer):
        x = attention_layer(b, x, il, neox, m, rope=rope_layers(il))
        h = b.rms_norm(x, f"blk.{il}.ffn_norm.weight")
        x = b.g.add(x, scaled(b, moe.ffn(b, h, il), m.residual))
    # Only the rows whose logits are wanted go through the final norm and the LM head.
    x = b.rms_norm(b.g.select_outputs(x), "output_norm.weight")
    logits = b.lm_head(x)
    return logits if b.embeddings else scaled(b, logits, 1.0 / m.logit)


def build(b: Builder) -> int:
    # GGUF llama files store Q/K permuted for rotation of adjacent pairs (the "normal" layout).
    return build_decoder(b, neox=False)


def hparams(f) -> HParams:
    hp = HParams.from_gguf(f)
    if f"{hp.arch}.expert_count" in f.metadata:  # Mixtral: normalised top-k softmax weights
        hp.moe = moe.MoEParams.from_gguf(f, hp, norm_weights=True)
    return hp


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return moe.tensor_shapes(hp) if hp.moe is not None else {}


class Converter(DecoderConverter):
    arch = "llama"

    def transform(self, hf_name: str, values: np.ndarray) -> np.ndarray:
        # GGUF llama rotates adjacent pairs (x0, x1), (x2, x3)...; Hugging Face rotates the halves
        # (x_i, x_{i+d/2}) of each head. Reorder each head's rows so the two agree (llama.cpp permute).
        if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            return permute_rope_rows(values, self.n_head)
        if hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            return permute_rope_rows(values, self.n_kv_head)
        return values

    def transforms(self, hf_name: str) -> bool:
        return hf_name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias"))

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        # Mistral's sliding window (llama.cpp's converter leaves it out and attends to everything)
        if self.config.get("sliding_window"):
            meta[f"{self.arch}.attention.sliding_window"] = int(self.config["sliding_window"])
        return meta

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        rope = self.rope.get("full_attention", self.rope)
        if str(rope.get("rope_type", "")).lower() != "llama3":
            return []
        return [("rope_freqs.weight", llama3_rope_factors(rope, self.head_dim))]
