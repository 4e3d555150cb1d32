"""What a model file must satisfy before its graph is built, checked in one place.

A GGUF file is untrusted input. Everything the graph builder relies on is checked here, and a
mismatch is a GGUFError naming the metadata key or the tensor:

- metadata values (through gguf/metadata.py in HParams.from_gguf): present when required, of the
  right kind (an integer is not an array, a float is finite) and in range (head counts positive, ...);
- tensor shapes (`check_shape`): each weight against the shape the architecture's metadata gives
  it (`standard_shapes`: llama.cpp's shapes of the common tensor names);
- tensor types (`check_type`): each weight's type must have the kernels its op needs;
- the graph itself (`CheckedGraph`): any op the core refuses (shapes that do not fit together)
  becomes a GGUFError naming the weights its operands come from.

Architectures get all of this through `blocks.Builder` and `blocks.HParams` without a line of
their own; one whose tensors are shaped differently from the standard ones (a fused gate and
up projection, say) defines `tensor_shapes(hp)` in its module (see `models/__init__.py`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from ember import _core
from ember.errors import GGUFError

# -- tensors ---------------------------------------------------------------------------------

def standard_shapes(hp) -> dict[str, tuple[int, ...]]:
    """llama.cpp's shapes (ggml order, ne0 first) of the tensors most architectures share, by name;
    names under `blk.N.` are given without that prefix."""
    e, v, ff = hp.n_embd, hp.n_vocab, hp.n_ff
    q, kv = hp.n_head * hp.head_dim, hp.n_kv_head * hp.head_dim
    shapes = {
        "token_embd.weight": (e, v),
        "position_embd.weight": (e, hp.n_ctx_train),
        "rope_freqs.weight": (hp.rope_dims // 2,),
        "rope_factors_long.weight": (hp.rope_dims // 2,),
        "rope_factors_short.weight": (hp.rope_dims // 2,),
        "attn_q_norm.weight": (hp.head_dim,),
        "attn_k_norm.weight": (hp.head_dim,),
    }
    projections = (("output", e, v), ("attn_q", e, q), ("attn_k", e, kv), ("attn_v", e, kv),
                   ("attn_qkv", e, q + 2 * kv), ("attn_output", q, e), ("ffn_gate", e, ff), ("ffn_up", e, ff),
                   ("ffn_down", ff, e))
    norms = ("output_norm", "attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
    for name, n_in, n_out in projections + tuple((norm, e, e) for norm in norms):
        shapes[f"{name}.weight"] = (n_in,) if name in norms else (n_in, n_out)
        shapes[f"{name}.bias"] = (n_out,)
    return shapes


def trimmed_shape(shape: Iterable[int]) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def _layer_free(name: str) -> str:
    if name.startswith("blk."):
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[1].isdigit():
            return parts[2]
    return name


def check_shape(tensor, shapes: Mapping[str, tuple[int, ...]], arch: str) -> None:
    """The tensor's shape against the one the metadata gives its name (names not in shapes pass)."""
    expected = shapes.get(_layer_free(tensor.name))
    if expected is not None and trimmed_shape(tensor.shape) != trimmed_shape(expected):
        raise GGUFError(f"tensor {tensor.name} has shape {list(tensor.shape)}, but the {arch} metadata "
                        f"(embedding length, head counts, vocabulary, ...) makes it {list(expected)}")


_types_with_kernels: frozenset[str] | None = None


def check_type(tensor) -> None:
    """A weight whose type ember has no matmul kernel for (IQ*, TQ*, Q8_1, I32, ...) is refused."""
    global _types_with_kernels
    if _types_with_kernels is None:
        _types_with_kernels = frozenset(_core.types_with_kernels())
    if tensor.type.name not in _types_with_kernels:
        raise GGUFError(f"tensor {tensor.name} is of type {tensor.type.name}, which ember cannot compute "
                        f"with (weights may be {', '.join(sorted(_types_with_kernels))})")


# -- the graph -------------------------------------------------------------------------------

def n_rows(shape: tuple[int, ...]) -> int:
    """Rows of a ggml shape: the product of its dimensions after ne0."""
    return int(np.prod(shape[1:])) if len(shape) > 1 else 1


class Value(int):
    """A tensor id of the core graph that remembers the weights it was computed from (for errors)."""

    weights: tuple[str, ...] = ()
    is_weight = False


def _value(tensor_id: int, weights: tuple[str, ...], is_weight: bool = False) -> Value:
    value = Value(tensor_id)
    value.weights = weights
    value.is_weight = is_weight
    return value


_MAX_NAMED = 4  # weights an error names at most


def _behind(operands: list[Value]) -> tuple[str, ...]:
    """The weights behind an op's result: its weight operands, else those behind its operands."""
    direct = [name for a in operands if a.is_weight for name in a.weights]
    names = direct or [name for a in operands for name in a.weights]
    return tuple(dict.fromkeys(names))[:_MAX_NAMED]


class CheckedGraph:
    """The core graph as architectures use it: every op is the core's, but tensor ids carry the
    names of the weights behind them, and an op the core refuses (ValueError: shapes that do not
    fit, a bad parameter) is a GGUFError naming those weights and their shapes."""

    def __init__(self, graph, tensors: Mapping[str, Any], arch: str):
        self._graph = graph
        self._tensors = tensors  # the file's TensorInfo by name
        self._arch = arch
        self.max_positions: int | None = None  # rows of a weight read by position (get_rows)

    def named_weight(self, name: str, *args) -> Value:
        """graph.weight(*args) for the file's tensor `name`."""
        return _value(self._call("weight", args, {}, (name,)), (name,), is_weight=True)

    def __getattr__(self, op: str):
        method = getattr(self._graph, op)
        if op.startswith("_") or not callable(method):
            return method

        def checked(*args, **kwargs):
            operands = [a for a in (*args, *kwargs.values()) if isinstance(a, Value)]
            weights = _behind(operands)
            out = self._call(op, args, kwargs, weights)
            if op == "get_rows" and (kwargs.get("by_position") or args[1:2] == (True,)) and weights:
                rows = n_rows(self._tensors[weights[0]].shape)
                self.max_positions = rows if self.max_positions is None else min(rows, self.max_positions)
            return _value(out, weights) if isinstance(out, int) and not isinstance(out, bool) else out

        return checked

    def _call(self, op: str, args, kwargs, weights: tuple[str, ...]):
        try:
            return getattr(self._graph, op)(*args, **kwargs)
        except (ValueError, IndexError, OverflowError) as error:
            reason = str(error) if str(error).startswith(f"{op}:") else f"{op}: {error}"
            if not weights:
                raise GGUFError(f"the {self._arch} graph cannot be built from this file ({reason})") from None
            named = ", ".join(self._describe(name) for name in weights)
            verb = "does" if len(weights) == 1 else "do"
            subject = "tensor" if len(weights) == 1 else "tensors"
            raise GGUFError(f"{subject} {named} {verb} not fit the {self._arch} graph ({reason})") from None

    def _describe(self, name: str) -> str:
        t = self._tensors.get(name)
        return name if t is None else f"{name} ({t.type.name} {list(t.shape)})"
