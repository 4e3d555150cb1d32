"""GPT-2: learned position embeddings, LayerNorm, fused QKV projection, GELU (tanh) MLP,
biases everywhere, no rotary embedding."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.models.blocks import Builder, HParams
from ember.models.hf import IGNORED, get, require

HF_ARCHITECTURES = ("GPT2LMHeadModel",)


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
    return b.lm_head(x)


def hparams(f) -> HParams:
    return HParams.from_gguf(f, default_eps_key="attention.layer_norm_epsilon")


_GPT2_GLOBAL = {
    "wte.weight": "token_embd.weight",
    "wpe.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight",
    "ln_f.bias": "output_norm.bias",
}
_GPT2_LAYER = {
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}
_GPT2_BLOCK = re.compile(r"^h\.(\d+)\.(.+)\.(weight|bias)$")
_CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")


class Converter:
    """Conv1D weights are stored [in, out]: transposed to GGUF's [out, in]."""

    arch = "gpt2"

    def __init__(self, config: dict):
        self.config = config
        if config.get("scale_attn_by_inverse_layer_idx") or config.get("scale_attn_weights") is False:
            raise EmberError("GPT-2 with non-standard attention scaling is not supported")
        activation = config.get("activation_function", "gelu_new")
        if activation not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            raise EmberError(f"GPT-2 with activation {activation!r} is not supported (ember runs tanh GELU)")
        self.n_embd = int(require(config, "n_embd", "hidden_size"))

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        return {
            f"{a}.context_length": int(require(c, "n_positions", "n_ctx")),
            f"{a}.embedding_length": self.n_embd,
            f"{a}.block_count": int(require(c, "n_layer", "num_hidden_layers")),
            f"{a}.feed_forward_length": int(get(c, "n_inner", default=4 * self.n_embd)),
            f"{a}.attention.head_count": int(require(c, "n_head", "num_attention_heads")),
            f"{a}.attention.layer_norm_epsilon": float(get(c, "layer_norm_epsilon", default=1e-5)),
        }

    def gguf_name(self, hf_name: str) -> str | None:
        if hf_name.endswith(IGNORED):
            return None
        if hf_name == "lm_head.weight":
            return None if self.config.get("tie_word_embeddings", True) else "output.weight"
        name = hf_name.removeprefix("transformer.")
        if name in _GPT2_GLOBAL:
            return _GPT2_GLOBAL[name]
        match = _GPT2_BLOCK.match(name)
        if match and match.group(2) in _GPT2_LAYER:
            layer, module, kind = match.groups()
            return f"blk.{layer}.{_GPT2_LAYER[module]}.{kind}"
        raise EmberError(f"cannot map tensor {hf_name} to a gpt2 GGUF tensor")

    def transform(self, hf_name: str, values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values.T) if self.transforms(hf_name) else values

    def transforms(self, hf_name: str) -> bool:
        return hf_name.endswith(_CONV1D)

    def shape_after(self, hf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[::-1] if self.transforms(hf_name) else shape

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        return []

    def merged_tensors(self, tensors: dict) -> list[tuple[str, np.ndarray]]:
        return []
