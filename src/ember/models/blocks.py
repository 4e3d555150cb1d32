"""Shared pieces of the forward graphs: hyper-parameters from GGUF metadata, weight access, norms,
attention and MLPs. Architecture files compose these; each returns tensor ids of the core graph.
"""

from __future__ import annotations

import math
from collections.abc import Sized
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ember.errors import GGUFError
from ember.gguf.metadata import float_key, int_key, string_key
from ember.gguf.types import GGMLType
from ember.models.rope import RopeScaling, longrope_factors_name, mscale, read_scaling, yarn_divisors
from ember.models.validate import CheckedGraph, check_shape, check_type, n_rows, standard_shapes, trimmed_shape

# 3-D weights read as one matrix per head (MLA's absorbed up-projections); ffn_*_exps go through expert_weight
PER_HEAD_MATRICES = ("attn_k_b.weight", "attn_v_b.weight")
MAX_ROPE_DIMS = 1024  # the core's rope op rotates at most 512 pairs of a head
RANK_SOFTMAX = ("qwen3", "qwen3vl")  # rerankers whose scores llama.cpp's rank pooling softmaxes


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
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    value_dim: int = 0  # per-head value dimensions (MLA's differ from head_dim)
    mla: Any = None  # models/mla.py MLAParams, for multi-head latent attention files
    moe: Any = None  # models/moe.py MoEParams, for mixture-of-experts files

    @classmethod
    def from_gguf(cls, f, default_eps_key: str = "attention.layer_norm_rms_epsilon",
                  head_keys: tuple[str, str] = ("attention.key_length", "attention.value_length"),
                  equal_heads: bool = True) -> "HParams":
        """The hyper-parameters of a file, each checked (validate.py): a bad one is a GGUFError naming its key.
        head_keys: the keys of the per-head key and value dimensions, which must be equal unless
        equal_heads is False (MLA)."""
        meta = f.metadata
        arch = string_key(meta, "general.architecture")

        def key(name: str) -> str:
            return f"{arch}.{name}"

        n_embd = int_key(meta, key("embedding_length"))
        n_head = int_key(meta, key("attention.head_count"), per_layer=True)
        n_kv_head = int_key(meta, key("attention.head_count_kv"), n_head, per_layer=True, maximum=n_head)
        if n_head % n_kv_head:
            raise GGUFError(f"metadata key {key('attention.head_count')} ({n_head}) is not a multiple of "
                            f"{key('attention.head_count_kv')} ({n_kv_head})")
        key_key, value_key = head_keys
        head_dim = int_key(meta, key(key_key), None)
        if head_dim is None:
            if n_embd % n_head:
                raise GGUFError(f"metadata key {key('embedding_length')} ({n_embd}) is not a multiple of "
                                f"{key('attention.head_count')} ({n_head}), and the file has no "
                                f"{key(key_key)}")
            head_dim = n_embd // n_head
        value_dim = int_key(meta, key(value_key), head_dim)
        if value_dim != head_dim and equal_heads:
            raise GGUFError(f"metadata keys {key(key_key)} ({head_dim}) and "
                            f"{key(value_key)} ({value_dim}) differ, which ember does not support")
        rope_dims = int_key(meta, key("rope.dimension_count"), head_dim, maximum=min(head_dim, MAX_ROPE_DIMS))
        if rope_dims % 2:
            raise GGUFError(f"metadata key {key('rope.dimension_count')} is {rope_dims}; it must be even")
        n_ctx_train = int_key(meta, key("context_length"))
        scaling = read_scaling(meta, arch, n_ctx_train)
        return cls(
            arch=arch,
            n_vocab=_vocabulary_size(f, arch),
            n_ctx_train=n_ctx_train,
            n_embd=n_embd,
            n_layer=int_key(meta, key("block_count")),
            n_ff=int_key(meta, key("feed_forward_length"), per_layer=True),
            n_head=n_head,
            n_kv_head=n_kv_head,
            head_dim=head_dim,
            norm_eps=float_key(meta, key(default_eps_key), 1e-5, non_negative=True),
            rope_base=float_key(meta, key("rope.freq_base"), 10000.0, positive=True),
            rope_dims=rope_dims,
            rope_freq_scale=scaling.freq_scale,
            sliding_window=int_key(meta, key("attention.sliding_window"), 0, minimum=0),
            rope_scaling=scaling,
            value_dim=value_dim,
        )


def _vocabulary_size(f, arch: str) -> int:
    """The vocabulary: {arch}.vocab_size, else the tokenizer's token count, else the embedding's rows;
    the embedding, the LM head and the tokenizer must all agree with it (as llama.cpp requires)."""
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens) if isinstance(tokens, Sized) and not isinstance(tokens, str) else None
    rows = {name: n_rows(f.tensors[name].shape) for name in ("token_embd.weight", "output.weight") if name in f.tensors}
    n_vocab = int_key(f.metadata, f"{arch}.vocab_size", None)
    if n_vocab is None:
        n_vocab = n_tokens or rows.get("token_embd.weight")
    if not n_vocab:
        raise GGUFError("the model file gives no vocabulary size (no tokenizer.ggml.tokens, no token_embd.weight)")
    sizes = [("tokenizer.ggml.tokens has", n_tokens)] + [(f"{name} has", n) for name, n in rows.items()]
    for what, size in sizes:
        if size is not None and size != n_vocab:
            source = f"{arch}.vocab_size" if f"{arch}.vocab_size" in f.metadata else "tokenizer.ggml.tokens"
            raise GGUFError(f"the vocabulary has {n_vocab} tokens ({source}) but {what} {size}")
    return n_vocab


class Builder:
    """Adds a GGUF file's weights to a core graph on demand and offers the shared blocks.

    Every weight is checked as it is added (validate.py): its type must have kernels and, for
    the names in `shapes` (default: `standard_shapes(hp)`), its shape must be the one the
    metadata gives it. `g` is the core graph behind a `CheckedGraph`, so an op the core refuses
    is a GGUFError naming the weights involved; `build` turns any other failure of an
    architecture's build function on a malformed file into a GGUFError too.
    """

    def __init__(self, graph, gguf_file, hp: HParams, shapes: dict[str, tuple[int, ...]] | None = None,
                 n_ctx: int | None = None):
        self.g = CheckedGraph(graph, gguf_file.tensors, hp.arch)
        self.f = gguf_file
        self.hp = hp
        self.shapes = standard_shapes(hp) if shapes is None else shapes
        self.n_ctx = hp.n_ctx_train if n_ctx is None else n_ctx  # the context the graph runs with
        self._keep = []  # converted copies of small vectors, alive as long as the graph
        self._constants: dict[str, int] = {}
        self.embeddings = False  # set before build: lm_head returns the final hidden states instead
        self.hidden_output = False  # whether lm_head did so
        self.rank = False  # set before build: end in the classification head (a reranker)
        self.n_classes: int | None = None  # the head's outputs, set by the build that adds it
        self.token_types: np.ndarray | None = None  # F32 rows [n_types, n_embd] of a token-type input

    def build(self, build_fn: Callable[["Builder"], int]) -> int:
        """build_fn(self), the logits tensor id; a failure on a malformed file is a GGUFError."""
        try:
            return build_fn(self)
        except GGUFError:
            raise
        except (ValueError, TypeError, ArithmeticError, IndexError) as error:
            raise GGUFError(f"the {self.hp.arch} graph cannot be built from this file: "
                            f"{type(error).__name__}: {error}") from None

    @property
    def max_positions(self) -> int | None:
        """Rows of the learned position embedding, when the graph reads one (GPT-2): the longest context."""
        return self.g.max_positions

    def has(self, name: str) -> bool:
        return name in self.f.tensors

    def weight(self, name: str) -> int:
        """A 2-D weight [rows, row length] in its stored type (zero copy)."""
        t = self._tensor(name)
        check_type(t)
        if len(trimmed_shape(t.shape)) > 2 and not name.endswith(PER_HEAD_MATRICES):
            raise GGUFError(f"tensor {name} has shape {list(t.shape)}; only expert weights (ffn_*_exps) and MLA's "
                            "per-head attn_k_b / attn_v_b may have three dimensions")
        ne0 = t.shape[0]
        ne1 = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        return self.g.named_weight(name, int(t.type), int(ne0), ne1, t.data)

    def expert_weight(self, name: str, n_expert: int) -> int:
        """Stacked expert matrices, ggml shape [row length, rows, n_expert] (GGUF ffn_*_exps), as one
        weight of n_expert x rows rows for the expert matmul (matmul_id)."""
        t = self._tensor(name)
        check_type(t)
        shape = tuple(int(d) for d in t.shape)
        if len(shape) > 3 or (shape + (1, 1))[2] != n_expert:
            raise GGUFError(f"tensor {name} has shape {list(shape)}; an expert weight has {n_expert} "
                            "matrices along its third dimension")
        ne1 = int(np.prod(shape[1:]))
        return self.g.named_weight(name, int(t.type), shape[0], ne1, t.data)

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
        return self.g.named_weight(name, int(GGMLType.F32), int(t.n_elements), 1, data)

    def constant(self, name: str, values: np.ndarray) -> int:
        """A vector computed here (not in the file) as an F32 weight, added once per name."""
        if name not in self._constants:
            data = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint8)
            self._keep.append(data)
            self._constants[name] = self.g.weight(int(GGMLType.F32), int(data.size // 4), 1, data)
        return self._constants[name]

    def _tensor(self, name: str):
        t = self.f.tensors.get(name)
        if t is None:
            raise GGUFError(f"tensor {name} is missing from the model file")
        check_shape(t, self.shapes, self.hp.arch)
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

    def rope_qk(self, q: int, k: int, neox: bool, base: float | None = None, scaled: bool = True) -> tuple[int, int]:
        """RoPE on the queries and keys over the first rope_dims of each head, with the file's scaling
        (models/rope.py) unless `scaled` is False (Gemma's local layers); `base`: another frequency
        base than the file's."""
        return (self.rope(q, self.hp.n_head, neox, base, scaled), self.rope(k, self.hp.n_kv_head, neox, base, scaled))

    def rope(self, x: int, n_heads: int, neox: bool, base: float | None = None, scaled: bool = True) -> int:
        hp, g = self.hp, self.g
        base = hp.rope_base if base is None else base
        if not scaled:
            return g.rope(x, hp.head_dim, hp.rope_dims, neox, base, 1.0, -1)
        s = hp.rope_scaling
        factors = self._rope_factors(base)
        factor = mscale(s)
        if factor != 1.0:
            x = self._scale_rotated(x, n_heads, factor)
        return g.rope(x, hp.head_dim, hp.rope_dims, neox, base, hp.rope_freq_scale, factors)

    def _rope_factors(self, base: float) -> int:
        """The per-pair divisors: YaRN's; else the file's rope_freqs.weight (Llama 3); else LongRoPE's
        long or short factors for this context (as llama.cpp, also where the file names no scaling
        type: Phi-3's converter writes none); else none (-1)."""
        s = self.hp.rope_scaling
        if s.kind == "yarn":
            return self.constant(f"rope_yarn.{base:g}", yarn_divisors(s, self.hp.rope_dims, base))
        if self.has("rope_freqs.weight"):
            return self.vector("rope_freqs.weight")
        name = longrope_factors_name(s, self.n_ctx)
        return self.vector(name, optional=s.kind != "longrope")

    def _scale_rotated(self, x: int, n_heads: int, factor: float) -> int:
        """x with the rotated dimensions of each head times factor: as rotation is linear, this scales
        cos and sin (ggml's mscale) and leaves the dimensions past rope_dims as they are."""
        hp = self.hp
        if hp.rope_dims == hp.head_dim:
            return self.g.scale(x, factor)
        head = np.ones(hp.head_dim, dtype=np.float32)
        head[:hp.rope_dims] = factor
        return self.g.mul(x, self.constant(f"rope_mscale.{n_heads}", np.tile(head, n_heads)))

    def attention(self, q: int, k: int, v: int, window: int = 0, scale: float | None = None,
                  softcap: float = 0.0, causal: bool = True, alibi_max_bias: float = 0.0) -> int:
        """softmax(q k^T scale) v per head; causal: each token sees the positions up to its own,
        else (encoders) every position of its sequence; alibi_max_bias > 0: ALiBi's distance
        penalties (ops/attention.cpp) instead of rotary positions."""
        hp = self.hp
        scale = 1.0 / math.sqrt(hp.head_dim) if scale is None else scale
        return self.g.attention(q, k, v, hp.n_head, hp.n_kv_head, hp.head_dim, scale, window, softcap, causal,
                                alibi_max_bias)

    def gated_mlp(self, x: int, prefix: str, act: str = "silu", suffix: str = "") -> int:
        """down(act(gate(x)) * up(x)), with biases where the file has them (Llama's mlp_bias); the
        tensors are {prefix}.ffn_gate{suffix} ... (suffix "_shexp": a mixture's shared experts)."""
        gate = self.linear(x, f"{prefix}.ffn_gate{suffix}")
        up = self.linear(x, f"{prefix}.ffn_up{suffix}")
        h = self.g.swiglu(gate, up) if act == "silu" else self.g.geglu(gate, up)
        return self.linear(h, f"{prefix}.ffn_down{suffix}")

    def lm_head(self, x: int) -> int:
        """The logits of the final hidden states x (plus output.bias where the file has one, Phi-2's);
        with `embeddings` set, x itself; with `rank` set, the reranker's scores (classifier_head)."""
        if self.rank:
            return self.classifier_head(x)
        if self.embeddings:
            self.hidden_output = True
            return x
        logits = self.g.matmul(self.output_weight(), x)
        bias = self.vector("output.bias", optional=True)
        return self.g.add(logits, bias) if bias >= 0 else logits

    def classifier_head(self, x: int) -> int:
        """llama.cpp's rank pooling head on the rows x ([CLS], or a decoder's last token): tanh(cls(x))
        where the file has cls, then cls.output; a softmax over the classes for Qwen3's rerankers,
        whose cls.output is the LM head's rows of "yes" and "no". Sets n_classes."""
        if not (self.has("cls.weight") or self.has("cls.output.weight")):
            raise GGUFError("a reranker needs its classification head (cls.output.weight), which the file lacks")
        last = "cls"
        if self.has("cls.weight"):
            x = self.g.softcap(self.linear(x, "cls"), 1.0)  # 1 * tanh(x / 1)
        if self.has("cls.output.weight"):
            x, last = self.linear(x, "cls.output"), "cls.output"
        if self.hp.arch in RANK_SOFTMAX:
            x = self.g.softmax(x)
        self.n_classes = n_rows(self.f.tensors[f"{last}.weight"].shape)
        return x

    def output_weight(self) -> int:
        """The LM head, tied to the token embedding when the file has no output.weight."""
        return self.weight("output.weight" if self.has("output.weight") else "token_embd.weight")
