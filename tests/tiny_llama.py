"""A tiny llama GGUF with random weights, written with ember's own writer: a byte-level BPE
vocabulary (the 256 bytes, a few merges, ChatML specials) and a two-layer decoder small enough
to open and run in milliseconds. Tests of hostile input (and the fuzzer) start from it and
change one thing.

    path = write_tiny_llama(tmp_path / "tiny.gguf")                       # a model that runs
    write_tiny_llama(path, metadata={"llama.attention.head_count": 0})    # one key changed
    write_tiny_llama(path, types={"blk.0.attn_q.weight": GGMLType.Q8_1})  # one tensor's type
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import GGUFError
from ember.gguf import GGUFValueType, GGUFWriter
from ember.gguf.types import TYPES, GGMLType
from ember.quant.reference import quantize

N_EMBD, N_LAYER, N_HEAD, N_KV_HEAD, N_FF, N_CTX = 64, 2, 4, 2, 128, 256
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "a n", "e r"]
DROP = object()  # metadata={key: DROP} leaves the key out


def byte_level_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (bytes_to_unicode), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> list[str]:
    return byte_level_tokens() + [m.replace(" ", "") for m in MERGES] + SPECIALS


def base_metadata() -> dict[str, Any]:
    tokens = vocabulary()
    eos = tokens.index("<|im_end|>")
    return {
        "general.name": "tiny llama",
        "llama.context_length": N_CTX,
        "llama.embedding_length": N_EMBD,
        "llama.block_count": N_LAYER,
        "llama.feed_forward_length": N_FF,
        "llama.attention.head_count": N_HEAD,
        "llama.attention.head_count_kv": N_KV_HEAD,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": N_EMBD // N_HEAD,
        "llama.rope.freq_base": 10000.0,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": eos,
        "tokenizer.ggml.add_bos_token": False,
    }


def tensor_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model and its ggml shape (ne0 first)."""
    head_dim = N_EMBD // N_HEAD
    shapes = {"token_embd.weight": (N_EMBD, n_vocab)}
    for il in range(N_LAYER):
        p = f"blk.{il}"
        shapes.update({
            f"{p}.attn_norm.weight": (N_EMBD,),
            f"{p}.attn_q.weight": (N_EMBD, N_EMBD),
            f"{p}.attn_k.weight": (N_EMBD, N_KV_HEAD * head_dim),
            f"{p}.attn_v.weight": (N_EMBD, N_KV_HEAD * head_dim),
            f"{p}.attn_output.weight": (N_EMBD, N_EMBD),
            f"{p}.ffn_norm.weight": (N_EMBD,),
            f"{p}.ffn_gate.weight": (N_EMBD, N_FF),
            f"{p}.ffn_up.weight": (N_EMBD, N_FF),
            f"{p}.ffn_down.weight": (N_FF, N_EMBD),
        })
    shapes["output_norm.weight"] = (N_EMBD,)
    shapes["output.weight"] = (N_EMBD, n_vocab)
    return shapes


def tensor_bytes(shape: tuple[int, ...], ggml_type: GGMLType, rng: np.random.Generator) -> np.ndarray:
    """Random values of a ggml shape, stored as ggml_type (norm scales near 1)."""
    values = rng.standard_normal(tuple(reversed(shape))).astype(np.float32) * 0.3
    if len(shape) == 1:
        values = 1.0 + values * 0.1
    if ggml_type == GGMLType.F32:
        return values
    if ggml_type == GGMLType.F16:
        return values.astype(np.float16)
    try:
        return quantize(values, ggml_type)
    except GGUFError:  # no quantizer for this type (Q8_1, IQ*, I32, ...): random blocks of the right size
        n_bytes = values.size // TYPES[ggml_type].block_size * TYPES[ggml_type].type_size
        return rng.integers(0, 256, n_bytes, dtype=np.uint8).reshape(*values.shape[:-1], -1)


def write_tiny_llama(path: str | Path, *, metadata: dict[str, Any] | None = None,
                     types: dict[str, GGMLType] | None = None, shapes: dict[str, tuple[int, ...]] | None = None,
                     drop_tensors: tuple[str, ...] = (), weight_type: GGMLType = GGMLType.Q8_0,
                     seed: int = 0) -> Path:
    """Write the tiny model; `metadata` replaces (or with DROP removes) keys, `types` and
    `shapes` change single tensors, `drop_tensors` leaves some out."""
    meta = base_metadata()
    for key, value in (metadata or {}).items():
        if value is DROP:
            meta.pop(key, None)
        else:
            meta[key] = value
    w = GGUFWriter(path, "llama")
    for key, value in meta.items():
        if key == "tokenizer.ggml.token_type" and isinstance(value, list):
            w.add(key, value, GGUFValueType.INT32)
        elif key.endswith(("epsilon", "freq_base")) and isinstance(value, float):
            w.add(key, value, GGUFValueType.FLOAT32)
        else:
            w.add(key, value)
    rng = np.random.default_rng(seed)
    all_shapes = tensor_shapes(len(vocabulary()))
    all_shapes.update(shapes or {})
    for name, shape in all_shapes.items():
        if name in drop_tensors:
            continue
        ggml_type = (types or {}).get(name, GGMLType.F32 if len(shape) == 1 else weight_type)
        w.add_tensor(name, tensor_bytes(shape, ggml_type, rng), ggml_type, shape)
    return w.write()
