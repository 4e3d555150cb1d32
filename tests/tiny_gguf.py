"""A tiny llama-shaped GGUF model that ember runs (random weights, a byte-level BPE vocabulary),
written with ember's own writer, and the same model as the parts of a split model.

Tests that need a real model file without pulling a registry model use these: the hub's fake
Hugging Face server serves them, the llama-cpp-python compatibility tests load them, and the
tests of hostile input (and the fuzzer) start from it and change one thing:

    write_tiny_model(path, metadata={"llama.attention.head_count": 0})      # one key changed
    write_tiny_model(path, metadata={"llama.rope.freq_base": DROP})          # one key left out
    write_tiny_model(path, types={"blk.0.attn_q.weight": GGMLType.Q8_1})     # one tensor's type
    write_tiny_model(path, shapes={"blk.0.attn_q.weight": (32, 64)})          # ... or shape (ne0 first)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import GGUFError
from ember.gguf import GGUFValueType, GGUFWriter
from ember.gguf.split import split_name
from ember.gguf.types import TYPES, GGMLType
from ember.quant.reference import quantize

DROP = object()  # metadata={key: DROP} leaves the key out

N_EMBD, N_LAYER, N_HEAD, N_KV_HEAD, N_FF, N_CTX_TRAIN = 64, 2, 4, 2, 128, 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: the 256 one-byte tokens of a byte-level BPE vocabulary."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


TOKENS = byte_tokens() + ["Ġt", "he", "Ġthe"] + SPECIALS
EOS_ID = TOKENS.index("<|endoftext|>")
IM_END_ID = TOKENS.index("<|im_end|>")


def tiny_metadata(chat_template: str | None = None, name: str = "Tiny Llama") -> list[tuple]:
    """(key, value, type or None) in file order."""
    types = [1] * (256 + 3) + [3] * len(SPECIALS)  # normal, then control
    items = [
        ("general.name", name, None),
        ("general.file_type", 7, GGUFValueType.UINT32),  # MOSTLY_Q8_0
        ("llama.context_length", N_CTX_TRAIN, GGUFValueType.UINT32),
        ("llama.embedding_length", N_EMBD, GGUFValueType.UINT32),
        ("llama.block_count", N_LAYER, GGUFValueType.UINT32),
        ("llama.feed_forward_length", N_FF, GGUFValueType.UINT32),
        ("llama.attention.head_count", N_HEAD, GGUFValueType.UINT32),
        ("llama.attention.head_count_kv", N_KV_HEAD, GGUFValueType.UINT32),
        ("llama.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32),
        ("llama.rope.freq_base", 10000.0, GGUFValueType.FLOAT32),
        ("tokenizer.ggml.model", "gpt2", None),
        ("tokenizer.ggml.pre", "smollm", None),
        ("tokenizer.ggml.tokens", TOKENS, None),
        ("tokenizer.ggml.token_type", types, GGUFValueType.INT32),
        ("tokenizer.ggml.merges", MERGES, None),
        ("tokenizer.ggml.bos_token_id", EOS_ID, GGUFValueType.UINT32),
        ("tokenizer.ggml.eos_token_id", EOS_ID, GGUFValueType.UINT32),
        ("tokenizer.ggml.add_bos_token", False, None),
    ]
    if chat_template is not None:
        items.append(("tokenizer.chat_template", chat_template, None))
    return items


def tiny_tensors(seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy shape) in file order."""
    rng = np.random.default_rng(seed)
    n_vocab, head_dim = len(TOKENS), N_EMBD // N_HEAD

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    tensors = [("token_embd.weight", matrix(n_vocab, N_EMBD))]
    for i in range(N_LAYER):
        p = f"blk.{i}"
        tensors += [
            (f"{p}.attn_norm.weight", np.ones(N_EMBD, np.float32)),
            (f"{p}.attn_q.weight", matrix(N_EMBD, N_EMBD)),
            (f"{p}.attn_k.weight", matrix(N_KV_HEAD * head_dim, N_EMBD)),
            (f"{p}.attn_v.weight", matrix(N_KV_HEAD * head_dim, N_EMBD)),
            (f"{p}.attn_output.weight", matrix(N_EMBD, N_EMBD)),
            (f"{p}.ffn_norm.weight", np.ones(N_EMBD, np.float32)),
            (f"{p}.ffn_gate.weight", matrix(N_FF, N_EMBD)),
            (f"{p}.ffn_up.weight", matrix(N_FF, N_EMBD)),
            (f"{p}.ffn_down.weight", matrix(N_EMBD, N_FF)),
        ]
    tensors += [("output_norm.weight", np.ones(N_EMBD, np.float32)), ("output.weight", matrix(n_vocab, N_EMBD))]
    return tensors


def write_tiny_model(path: Path, chat_template: str | None = None, name: str = "Tiny Llama", *,
                     metadata: dict[str, Any] | None = None, types: dict[str, GGMLType] | None = None,
                     shapes: dict[str, tuple[int, ...]] | None = None, drop_tensors: tuple[str, ...] = (),
                     seed: int = 0) -> Path:
    """The tiny model as one file; `metadata` replaces (DROP: removes) or adds keys, `types` stores
    tensors in another type, `shapes` gives tensors other ggml shapes (random values), and
    `drop_tensors` leaves tensors out."""
    changes = dict(metadata or {})
    writer = GGUFWriter(path, "llama")
    items = [(key, changes.pop(key), None) if key in changes else (key, value, value_type)
             for key, value, value_type in tiny_metadata(chat_template, name)]
    for key, value, value_type in items + [(key, value, None) for key, value in changes.items()]:
        if value is not DROP:
            writer.add(key, value, value_type)
    rng = np.random.default_rng(seed + 1)
    for tensor_name, array in tiny_tensors(seed):
        if tensor_name in drop_tensors:
            continue
        if shapes and tensor_name in shapes:
            array = rng.standard_normal(tuple(reversed(shapes[tensor_name]))).astype(np.float32) * 0.1
        ggml_type = (types or {}).get(tensor_name, GGMLType.F32)
        writer.add_tensor(tensor_name, stored_as(array, ggml_type, rng), ggml_type, tuple(reversed(array.shape)))
    return writer.write()


def stored_as(values: np.ndarray, ggml_type: GGMLType, rng: np.random.Generator) -> np.ndarray:
    """float32 values as the bytes of ggml_type; random blocks of the right size for a type ember
    cannot quantize to (Q8_1, IQ*, I32, ...)."""
    if ggml_type == GGMLType.F32:
        return values
    if ggml_type == GGMLType.F16:
        return values.astype(np.float16)
    try:
        return quantize(values, ggml_type)
    except GGUFError:
        n_bytes = values.size // TYPES[ggml_type].block_size * TYPES[ggml_type].type_size
        return rng.integers(0, 256, n_bytes, dtype=np.uint8).reshape(*values.shape[:-1], -1)


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor of the tiny model and its ggml shape (ne0 first)."""
    return {name: tuple(reversed(array.shape)) for name, array in tiny_tensors()}


def write_split_model(directory: Path, prefix: str, n_parts: int, chat_template: str | None = None,
                      split_keys=None) -> list[Path]:
    """The tiny model as n_parts files named as llama.cpp's gguf-split names them: the first holds
    the metadata; every part its split.* keys and a share of the tensors.

    split_keys(index) -> (split.no, split.count, split.tensors.count or None) overrides the keys
    (to make malformed sets).
    """
    tensors = tiny_tensors()
    shares = np.array_split(np.arange(len(tensors)), n_parts)
    paths = []
    for index, share in enumerate(shares):
        no, count, total = split_keys(index) if split_keys else (index, n_parts, len(tensors))
        writer = GGUFWriter(directory / split_name(prefix, index, n_parts), "llama" if index == 0 else None)
        if index == 0:
            for key, value, value_type in tiny_metadata(chat_template):
                writer.add(key, value, value_type)
        writer.add("split.no", no, GGUFValueType.UINT16)
        writer.add("split.count", count, GGUFValueType.UINT16)
        if total is not None:
            writer.add("split.tensors.count", total, GGUFValueType.INT32)
        for i in share:
            writer.add_tensor(*tensors[i])
        paths.append(writer.write())
    return paths
