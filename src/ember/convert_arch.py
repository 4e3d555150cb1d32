"""What `ember convert` does per architecture, after llama.cpp's convert_hf_to_gguf.py: the GGUF
metadata from config.json, the GGUF name of each Hugging Face tensor and the changes of layout
the GGUF graphs expect (Q/K row permutation for llama, Gemma's norm weights stored +1, GPT-2's
Conv1D weights transposed).

Each converter has `arch` (general.architecture), `metadata() -> {key: value}`,
`gguf_name(hf_name) -> str | None` (None: not stored), `transforms(hf_name) -> bool` (whether
`transform(hf_name, values) -> values` changes the tensor; numpy order, float32),
`shape_after(hf_name, shape)` and `extra_tensors() -> [(gguf name, values)]`.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ember.errors import EmberError

_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)\.(weight|bias)$")

# Hugging Face decoder (Llama, Qwen2, Gemma 3) sub-module -> GGUF tensor, per layer
_DECODER_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GEMMA3_LAYER = {
    **_DECODER_LAYER,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
_DECODER_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# buffers some checkpoints carry that no graph reads
_IGNORED = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


def _get(config: dict, *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def _require(config: dict, *names: str) -> Any:
    value = _get(config, *names)
    if value is None:
        raise EmberError(f"config.json lacks {names[0]}")
    return value


class DecoderConverter:
    """LLaMA-style decoder (also the base of Qwen2 and Gemma 3)."""

    arch = "llama"
    layer_names = _DECODER_LAYER

    def __init__(self, config: dict):
        self.config = config
        self.n_layer = int(_require(config, "num_hidden_layers"))
        self.n_embd = int(_require(config, "hidden_size"))
        self.n_head = int(_require(config, "num_attention_heads"))
        self.n_kv_head = int(_get(config, "num_key_value_heads", default=self.n_head))
        self.head_dim = int(_get(config, "head_dim", default=self.n_embd // self.n_head))
        self.rope = _rope_parameters(config)

    # -- metadata ----------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = {
            f"{a}.vocab_size": int(_require(c, "vocab_size")),
            f"{a}.context_length": int(_require(c, "max_position_embeddings")),
            f"{a}.embedding_length": self.n_embd,
            f"{a}.block_count": self.n_layer,
            f"{a}.feed_forward_length": int(_require(c, "intermediate_size")),
            f"{a}.attention.head_count": self.n_head,
            f"{a}.attention.head_count_kv": self.n_kv_head,
            f"{a}.attention.layer_norm_rms_epsilon": float(_get(c, "rms_norm_eps", default=1e-6)),
            f"{a}.rope.dimension_count": self.head_dim,
        }
        if c.get("head_dim") is not None:
            meta[f"{a}.attention.key_length"] = self.head_dim
            meta[f"{a}.attention.value_length"] = self.head_dim
        meta.update(self.rope_metadata(self.rope.get("full_attention", self.rope)))
        return meta

    def rope_metadata(self, rope: dict) -> dict[str, Any]:
        a = self.arch
        meta: dict[str, Any] = {}
        if rope.get("rope_theta") is not None:
            meta[f"{a}.rope.freq_base"] = float(rope["rope_theta"])
        kind, factor = rope.get("rope_type", "default"), rope.get("factor")
        if kind == "linear" and factor is not None:
            meta[f"{a}.rope.scaling.type"] = "linear"
            meta[f"{a}.rope.scaling.factor"] = float(factor)
        elif kind == "yarn" and factor is not None:
            meta[f"{a}.rope.scaling.type"] = "yarn"
            meta[f"{a}.rope.scaling.factor"] = float(factor)
            meta[f"{a}.rope.scaling.original_context_length"] = int(rope["original_max_position_embeddings"])
            for key, name in (("extrapolation_factor", "yarn_ext_factor"), ("attention_factor", "yarn_attn_factor"),
                              ("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
                if rope.get(key) is not None:
                    meta[f"{a}.rope.scaling.{name}"] = float(rope[key])
        elif kind not in ("default", "llama3", None):
            raise EmberError(f"RoPE scaling {kind!r} is not supported (ember converts linear, yarn and llama3)")
        return meta

    # -- tensors -----------------------------------------------------------------------------

    def gguf_name(self, hf_name: str) -> str | None:
        if hf_name.endswith(_IGNORED):
            return None
        if hf_name == "lm_head.weight" and self.config.get("tie_word_embeddings"):
            return None  # the graph reads token_embd.weight as the LM head
        if hf_name in _DECODER_GLOBAL:
            return _DECODER_GLOBAL[hf_name]
        match = _LAYER.match(hf_name.removeprefix("model."))
        if match and match.group(2) in self.layer_names:
            layer, module, kind = match.groups()
            return f"blk.{layer}.{self.layer_names[module]}.{kind}"
        raise EmberError(f"cannot map tensor {hf_name} to a {self.arch} GGUF tensor")

    def transform(self, hf_name: str, values: np.ndarray) -> np.ndarray:
        # GGUF llama rotates adjacent pairs (x0, x1), (x2, x3)...; Hugging Face rotates the halves
        # (x_i, x_{i+d/2}) of each head. Reorder each head's rows so the two agree (llama.cpp permute).
        if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            return _permute_rope_rows(values, self.n_head)
        if hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            return _permute_rope_rows(values, self.n_kv_head)
        return values

    def transforms(self, hf_name: str) -> bool:
        """Whether `transform` changes this tensor (if not, it is streamed straight through)."""
        return hf_name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias"))

    def shape_after(self, hf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        rope = self.rope.get("full_attention", self.rope)
        if str(rope.get("rope_type", "")).lower() != "llama3":
            return []
        return [("rope_freqs.weight", _llama3_rope_factors(rope, self.head_dim))]


class QwenConverter(DecoderConverter):
    """Qwen2: the decoder with Q/K/V biases and NeoX-layout rotation (no permutation)."""

    arch = "qwen2"

    def __init__(self, config: dict):
        super().__init__(config)
        layer_types = config.get("layer_types") or []
        if config.get("use_sliding_window") and "sliding_attention" in layer_types:
            raise EmberError("Qwen2 with sliding-window attention (use_sliding_window) is not supported")

    def transform(self, hf_name: str, values: np.ndarray) -> np.ndarray:
        return values

    def transforms(self, hf_name: str) -> bool:
        return False

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        return []


class Gemma3Converter(DecoderConverter):
    """Gemma 3 (text): norms scaled by (1 + w) stored as 1 + w, sliding-window and global layers."""

    arch = "gemma3"
    layer_names = _GEMMA3_LAYER

    def __init__(self, config: dict):
        config = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                  "max_position_embeddings": 131072, **{k: v for k, v in config.items() if v is not None}}
        super().__init__(config)
        if config.get("attn_logit_softcapping") is not None:
            raise EmberError("Gemma 3 with attn_logit_softcapping is not supported")
        self.sliding = _gemma3_sliding_layers(config, self.n_layer)

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = super().metadata()
        del meta[f"{a}.rope.dimension_count"]
        meta[f"{a}.attention.key_length"] = self.head_dim
        meta[f"{a}.attention.value_length"] = self.head_dim
        meta.setdefault(f"{a}.rope.freq_base", 1_000_000.0)
        local = self.rope.get("sliding_attention", {})
        local_base = _get(local, "rope_theta", default=_get(c, "rope_local_base_freq"))
        if local_base is not None:
            meta[f"{a}.rope.freq_base_swa"] = float(local_base)
        if c.get("final_logit_softcapping"):
            meta[f"{a}.final_logit_softcapping"] = float(c["final_logit_softcapping"])
        if any(self.sliding):
            meta[f"{a}.attention.sliding_window"] = int(_require(c, "sliding_window"))
            meta[f"{a}.attention.sliding_window_pattern"] = self.sliding
        scalar = c.get("query_pre_attn_scalar")
        if scalar is not None and int(scalar) != self.head_dim:
            meta[f"{a}.attention.scale"] = 1.0 / math.sqrt(float(scalar))
        return meta

    def gguf_name(self, hf_name: str) -> str | None:
        if hf_name == "lm_head.weight":
            return None  # Gemma ties the LM head to the embedding
        return super().gguf_name(hf_name)

    def transform(self, hf_name: str, values: np.ndarray) -> np.ndarray:
        # Gemma3RMSNorm computes x * (1 + w); GGUF stores 1 + w so the norm is the plain x * w.
        return values + np.float32(1.0) if hf_name.endswith("norm.weight") else values

    def transforms(self, hf_name: str) -> bool:
        return hf_name.endswith("norm.weight")

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        return []


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


class GPT2Converter:
    """GPT-2: learned positions, LayerNorm, fused QKV; Conv1D weights are stored [in, out]."""

    arch = "gpt2"

    def __init__(self, config: dict):
        self.config = config
        if config.get("scale_attn_by_inverse_layer_idx") or config.get("scale_attn_weights") is False:
            raise EmberError("GPT-2 with non-standard attention scaling is not supported")
        activation = config.get("activation_function", "gelu_new")
        if activation not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            raise EmberError(f"GPT-2 with activation {activation!r} is not supported (ember runs tanh GELU)")
        self.n_embd = int(_require(config, "n_embd", "hidden_size"))

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        return {
            f"{a}.vocab_size": int(_require(c, "vocab_size")),
            f"{a}.context_length": int(_require(c, "n_positions", "n_ctx")),
            f"{a}.embedding_length": self.n_embd,
            f"{a}.block_count": int(_require(c, "n_layer", "num_hidden_layers")),
            f"{a}.feed_forward_length": int(_get(c, "n_inner", default=4 * self.n_embd)),
            f"{a}.attention.head_count": int(_require(c, "n_head", "num_attention_heads")),
            f"{a}.attention.layer_norm_epsilon": float(_get(c, "layer_norm_epsilon", default=1e-5)),
        }

    def gguf_name(self, hf_name: str) -> str | None:
        if hf_name.endswith(_IGNORED):
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


CONVERTERS = {
    "LlamaForCausalLM": DecoderConverter,
    "Qwen2ForCausalLM": QwenConverter,
    "Gemma3ForCausalLM": Gemma3Converter,
    "GPT2LMHeadModel": GPT2Converter,
}


def converter_for(architecture: str | None, config: dict):
    cls = CONVERTERS.get(architecture)
    if cls is None:
        supported = ", ".join(CONVERTERS)
        raise EmberError(f"cannot convert architecture {architecture!r} (ember converts {supported})")
    return cls(config)


# -- helpers ---------------------------------------------------------------------------------

def _rope_parameters(config: dict) -> dict:
    """transformers >= 5 `rope_parameters` (maybe per layer type), or the older rope_scaling + rope_theta."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if "full_attention" in rope or "sliding_attention" in rope:
        return rope
    if "rope_type" not in rope and "type" in rope:
        rope["rope_type"] = rope["type"]
    if "rope_theta" not in rope and config.get("rope_theta") is not None:
        rope["rope_theta"] = config["rope_theta"]
    if config.get("rope_local_base_freq") is not None:
        return {"full_attention": rope,
                "sliding_attention": {"rope_type": "default", "rope_theta": config["rope_local_base_freq"]}}
    return rope


def _permute_rope_rows(values: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of each head reordered from halves [0..d/2), [d/2..d) to interleaved pairs (llama.cpp permute)."""
    shape = values.shape
    return (values.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def _llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """Llama 3.1 RoPE scaling as per-frequency divisors (GGUF rope_freqs.weight, llama.cpp's formula)."""
    base = float(rope.get("rope_theta", 10000.0))
    factor = float(rope.get("factor", 8.0))
    low_freq_factor = float(rope.get("low_freq_factor", 1.0))
    high_freq_factor = float(rope.get("high_freq_factor", 4.0))
    old_context = float(rope.get("original_max_position_embeddings", 8192))
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _gemma3_sliding_layers(config: dict, n_layer: int) -> list[bool]:
    """Per layer: True for sliding-window attention (config layer_types, else every 6th is global)."""
    layer_types = config.get("layer_types")
    if layer_types:
        if len(layer_types) != n_layer:
            raise EmberError(f"config.json layer_types has {len(layer_types)} entries for {n_layer} layers")
        return [t == "sliding_attention" for t in layer_types]
    pattern = int(_get(config, "sliding_window_pattern", "_sliding_window_pattern", default=6))
    return [pattern == 0 or (il + 1) % pattern != 0 for il in range(n_layer)]
