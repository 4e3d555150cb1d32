"""The Hugging Face side of an architecture: what `ember convert` needs to write a checkpoint as
llama.cpp's convert_hf_to_gguf.py does. Each model file (models/<arch>.py) has a `Converter`
(most subclass `DecoderConverter`) and the Hugging Face class names it converts,
`HF_ARCHITECTURES`.

A converter has `arch` (general.architecture), `metadata() -> {key: value}`,
`gguf_name(hf_name) -> str | None` (None: not stored), `split(hf_name, shape) -> [(gguf name,
values -> part, part shape)] | None` (a checkpoint tensor stored as several), `expert(hf_name) -> (gguf name, index) |
None` (one expert's matrix of a 3-D expert tensor), `transforms(hf_name) -> bool` (whether
`transform(hf_name, values) -> values` changes the tensor; numpy order, float32),
`shape_after(hf_name, shape)`, `extra_tensors() -> [(gguf name, values)]` and
`merged_tensors(checkpoint tensors) -> [(gguf name, values)]` (tensors made of several of the
checkpoint's, whose own gguf_name is None).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ember.errors import EmberError

LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)\.(weight|bias)$")

# Hugging Face decoder sub-module -> GGUF tensor, per layer
DECODER_LAYER = {
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
# ... and the mixture-of-experts sub-modules (Mixtral's block_sparse_moe, Qwen-MoE's and OLMoE's
# mlp, DeepSeek's shared_experts): the router and the shared experts
MOE_LAYER = {
    "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}
# one matrix per expert, stacked into blk.N.ffn_{gate,up,down}_exps (Mixtral names them w1, w3, w2)
EXPERT = re.compile(r"^(?:model\.)?layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\."
                    r"(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
EXPERT_TENSORS = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps",
                  "gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
# ... or all of a layer's experts in one 3-D tensor, as transformers >= 5 holds them: gate and up
# projections together ([experts, 2 * expert rows, hidden], gate rows first), and the down ones
STACKED_EXPERTS = re.compile(r"^(?:model\.)?layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\."
                             r"(gate_up_proj|down_proj)(?:\.weight)?$")
DECODER_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "model.norm.bias": "output_norm.bias",
    "lm_head.weight": "output.weight",
}
# buffers some checkpoints carry that no graph reads
IGNORED = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


def get(config: dict, *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def require(config: dict, *names: str) -> Any:
    value = get(config, *names)
    if value is None:
        raise EmberError(f"config.json lacks {names[0]}")
    return value


class DecoderConverter:
    """A Hugging Face decoder in the common layout (model.layers.N.self_attn.q_proj, ...): its GGUF
    metadata, tensor names and layout changes. Architectures subclass it and set `arch`."""

    arch = ""
    layer_names = {**DECODER_LAYER, **MOE_LAYER}

    def __init__(self, config: dict):
        self.config = config
        self.n_layer = int(require(config, "num_hidden_layers"))
        self.n_embd = int(require(config, "hidden_size"))
        self.n_head = int(require(config, "num_attention_heads"))
        self.n_kv_head = int(get(config, "num_key_value_heads", default=self.n_head))
        self.head_dim = int(get(config, "head_dim", default=self.n_embd // self.n_head))
        self.rope = rope_parameters(config)

    # -- metadata ----------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        meta = {
            f"{a}.vocab_size": int(require(c, "vocab_size")),
            f"{a}.context_length": int(require(c, "max_position_embeddings")),
            f"{a}.embedding_length": self.n_embd,
            f"{a}.block_count": self.n_layer,
            f"{a}.feed_forward_length": int(require(c, "intermediate_size")),
            f"{a}.attention.head_count": self.n_head,
            f"{a}.attention.head_count_kv": self.n_kv_head,
            f"{a}.attention.layer_norm_rms_epsilon": float(get(c, "rms_norm_eps", default=1e-6)),
            f"{a}.rope.dimension_count": self.head_dim,
        }
        meta.update(self.moe_metadata())
        if c.get("head_dim") is not None:
            meta[f"{a}.attention.key_length"] = self.head_dim
            meta[f"{a}.attention.value_length"] = self.head_dim
        meta.update(self.rope_metadata(self.rope.get("full_attention", self.rope)))
        return meta

    def moe_metadata(self) -> dict[str, Any]:
        """The expert keys llama.cpp's converter writes for any model whose config has them."""
        c, a = self.config, self.arch
        meta: dict[str, Any] = {}
        for key, names in (("expert_count", ("num_local_experts", "num_experts", "n_routed_experts")),
                           ("expert_used_count", ("num_experts_per_tok",)), ("expert_group_count", ("n_group",)),
                           ("expert_group_used_count", ("topk_group",))):
            if get(c, *names) is not None:
                meta[f"{a}.{key}"] = int(get(c, *names))
        score = get(c, "scoring_func", "score_function")
        if score is not None:
            if score not in ("softmax", "sigmoid"):
                raise EmberError(f"expert scoring function {score!r} is not supported (ember has softmax and sigmoid)")
            meta[f"{a}.expert_gating_func"] = 1 if score == "softmax" else 2
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
        if hf_name.endswith(IGNORED):
            return None
        if hf_name == "lm_head.weight" and self.config.get("tie_word_embeddings"):
            return None  # the graph reads token_embd.weight as the LM head
        if hf_name in DECODER_GLOBAL:
            return DECODER_GLOBAL[hf_name]
        match = LAYER.match(hf_name.removeprefix("model."))
        if match and match.group(2) in self.layer_names:
            layer, module, kind = match.groups()
            return f"blk.{layer}.{self.layer_names[module]}.{kind}"
        raise EmberError(f"cannot map tensor {hf_name} to a {self.arch} GGUF tensor")

    def split(self, hf_name: str, shape: tuple[int, ...]) -> list | None:
        """The GGUF tensors a checkpoint tensor becomes, where it becomes several (or is renamed
        whole, as a layer's stacked experts are); else None."""
        return stacked_experts(hf_name, shape)

    def expert(self, hf_name: str) -> tuple[str, int] | None:
        """(GGUF tensor, expert index) of one expert's matrix, stacked with the others; else None."""
        match = EXPERT.match(hf_name)
        if match is None:
            return None
        layer, index, kind = match.groups()
        return f"blk.{layer}.{EXPERT_TENSORS[kind]}.weight", int(index)

    def transform(self, hf_name: str, values: np.ndarray) -> np.ndarray:
        return values

    def transforms(self, hf_name: str) -> bool:
        """Whether `transform` changes this tensor (if not, it is streamed straight through)."""
        return False

    def shape_after(self, hf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        return []

    def merged_tensors(self, tensors: dict) -> list[tuple[str, np.ndarray]]:
        return []


# -- helpers ---------------------------------------------------------------------------------

def stacked_experts(hf_name: str, shape: tuple[int, ...]) -> list | None:
    """A layer's stacked expert tensor as the GGUF expert tensors (numpy order [expert, rows, row
    length]): gate_up_proj split into ffn_gate_exps and ffn_up_exps, down_proj as ffn_down_exps;
    None for any other tensor."""
    match = STACKED_EXPERTS.match(hf_name)
    if match is None:
        return None
    layer, kind = match.groups()
    if len(shape) != 3 or (kind == "gate_up_proj" and shape[1] % 2):
        raise EmberError(f"{hf_name} has shape {list(shape)}, not [experts, {'2 * ' if kind == 'gate_up_proj' else ''}"
                         "rows, row length]")
    if kind == "down_proj":
        return [(f"blk.{layer}.ffn_down_exps.weight", lambda v: v, tuple(shape))]
    n_expert, rows, width = shape[0], shape[1] // 2, shape[2]
    return [(f"blk.{layer}.ffn_gate_exps.weight", lambda v: v[:, :rows, :], (n_expert, rows, width)),
            (f"blk.{layer}.ffn_up_exps.weight", lambda v: v[:, rows:, :], (n_expert, rows, width))]


def rope_parameters(config: dict) -> dict:
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


def permute_rope_rows(values: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of each head reordered from halves [0..d/2), [d/2..d) to interleaved pairs (llama.cpp permute)."""
    shape = values.shape
    return (values.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
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
