"""Shared pieces of the forward graphs: hyper-parameters from GGUF metadata, weight access, norms,
attention and MLPs. Architecture files compose these; each returns tensor ids of the core graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ember.errors import GGUFError
from ember.gguf.types import GGMLType


@dataclass
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_kv_head: int
    head_dim: int
    norm_eps: float
    rope_base: float
    rope_dims: int
    rope_freq_scale: float
    sliding_window: int

    @classmethod
    def from_gguf(cls, f, default_eps_key: str = "attention.layer_norm_rms_epsilon") -> "HParams":
        arch = f.metadata.get("general.architecture")

        def field(name, default=None):
            value = f.metadata.get(f"{arch}.{name}", default)
            if value is None:
                raise GGUFError(f"missing metadata key {arch}.{name}")
            return value

        n_embd = int(field("embedding_length"))
        n_head = _first(field("attention.head_count"))
        head_dim = int(field("attention.key_length", n_embd // n_head))
        scaling = f.metadata.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise GGUFError(f"RoPE scaling type {scaling!r} ({arch}.rope.scaling.type) is not supported yet;"
                            " ember supports none and linear")
        factor = float(f.metadata.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        vocab = f.metadata.get(f"{arch}.vocab_size")
        if vocab is None:
            vocab = len(f.metadata.get("tokenizer.ggml.tokens", [])) or f.tensors["token_embd.weight"].shape[1]
        return cls(
            arch=arch,
            n_vocab=int(vocab),
            n_ctx_train=int(field("context_length")),
            n_embd=n_embd,
            n_layer=int(field("block_count")),
            n_ff=_first(field("feed_forward_length")),
            n_head=n_head,
            n_kv_head=_first(field("attention.head_count_kv", n_head)),
            head_dim=head_dim,
            norm_eps=float(f.metadata.get(f"{arch}.{default_eps_key}", 1e-5)),
            rope_base=float(f.metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_dims=int(f.metadata.get(f"{arch}.rope.dimension_count", head_dim)),
            rope_freq_scale=1.0 / factor if scaling == "linear" else 1.0,
            sliding_window=int(f.metadata.get(f"{arch}.attention.sliding_window", 0) or 0),
        )


def _first(value) -> int:
    """Per-layer arrays (head counts, FFN sizes) must be uniform here; take the first."""
    if isinstance(value, (list, tuple, np.ndarray)):
        values = {int(v) for v in value}
        if len(values) != 1:
            raise GGUFError("per-layer head counts / FFN sizes that differ between layers are not supported")
        return values.pop()
    return int(value)


class Builder:
    """Adds a GGUF file's weights to a core graph on demand and offers the shared blocks."""

    def __init__(self, graph, gguf_file, hp: HParams):
        self.g = graph
        self.f = gguf_file
        self.hp = hp
        self._keep = []  # converted copies of small vectors, alive as long as the graph

    def has(self, name: str) -> bool:
        return name in self.f.tensors

    def weight(self, name: str) -> int:
        """A 2-D weight [rows, row length] in its stored type (zero copy)."""
        t = self._tensor(name)
        ne0 = t.shape[0]
        ne1 = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        return self.g.weight(int(t.type), int(ne0), ne1, t.data)

    def vector(self, name: str, optional: bool = False, add: float = 0.0) -> int:
        """A 1-D weight (norm scale, bias) as F32; -1 when optional and absent."""
        if optional and name not in self.f.tensors:
            return -1
        t = self._tensor(name)
        if t.type == GGMLType.F32 and add == 0.0:
            data = t.data
        else:
            from ember.quant.reference import dequantize

            values = dequantize(t.data, t.type, t.shape).reshape(-1) + np.float32(add)
            data = np.ascontiguousarray(values, dtype=np.float32).view(np.uint8)
            self._keep.append(data)
        return self.g.weight(int(GGMLType.F32), int(t.n_elements), 1, data)

    def _tensor(self, name: str):
        t = self.f.tensors.get(name)
        if t is None:
            raise GGUFError(f"tensor {name} is missing from the model file")
        return t

    # -- blocks ------------------------------------------------------------------------------

    def rms_norm(self, x: int, weight_name: str, add: float = 0.0, group: int = 0) -> int:
        return self.g.rms_norm(x, self.vector(weight_name, add=add), self.hp.norm_eps, group)

    def layer_norm(self, x: int, prefix: str) -> int:
        return self.g.layer_norm(x, self.vector(prefix + ".weight"), self.vector(prefix + ".bias", optional=True),
                                 self.hp.norm_eps)

    def linear(self, x: int, prefix: str) -> int:
        """x W^T (+ b when the file has prefix.bias)."""
        y = self.g.matmul(self.weight(prefix + ".weight"), x)
        bias = self.vector(prefix + ".bias", optional=True)
        return self.g.add(y, bias) if bias >= 0 else y

    def rope(self, x: int, neox: bool, base: float | None = None, freq_scale: float | None = None) -> int:
        hp = self.hp
        factors = self.vector("rope_freqs.weight", optional=True)
        return self.g.rope(x, hp.head_dim, hp.rope_dims, neox, hp.rope_base if base is None else base,
                           hp.rope_freq_scale if freq_scale is None else freq_scale, factors)

    def attention(self, q: int, k: int, v: int, window: int = 0, scale: float | None = None,
                  softcap: float = 0.0) -> int:
        hp = self.hp
        scale = 1.0 / math.sqrt(hp.head_dim) if scale is None else scale
        return self.g.attention(q, k, v, hp.n_head, hp.n_kv_head, hp.head_dim, scale, window, softcap)

    def gated_mlp(self, x: int, prefix: str, act: str = "silu") -> int:
        """down(act(gate(x)) * up(x)), with biases where the file has them (Llama's mlp_bias)."""
        gate = self.linear(x, f"{prefix}.ffn_gate")
        up = self.linear(x, f"{prefix}.ffn_up")
        h = self.g.swiglu(gate, up) if act == "silu" else self.g.geglu(gate, up)
        return self.linear(h, f"{prefix}.ffn_down")

    def output_weight(self) -> int:
        """The LM head, tied to the token embedding when the file has no output.weight."""
        return self.weight("output.weight" if self.has("output.weight") else "token_embd.weight")
