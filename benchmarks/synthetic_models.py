"""GGUF files at the shapes of real 1-8B models, with random weights and a real vocabulary, for
measuring ember and llama.cpp at real sizes (compare_llamacpp.py takes their paths).

    python benchmarks/synthetic_models.py [--shapes llama-3.2-1b,qwen2.5-3b,llama-3.1-8b]
        [--types Q4_0,Q4_K_M,Q8_0] [--out DIR] [--llama-vocab FILE] [--qwen-vocab NAME|FILE]
        [-t THREADS] [--seed 0] [--force]

Each file is written by ember's own writer (ember.gguf.GGUFWriter) with the tensor names and
metadata keys llama.cpp's converter writes for the architecture; its weights are normal random
values (standard deviation 1/sqrt(fan-in), norms 1), generated a slab of rows at a time and
quantized by ember's quantizer (`_core.convert_rows`, ggml's reference blocks) with the tensor
types llama-quantize's preset gives each tensor (ember.quant.presets: Q4_K_M's Q6_K output and
attn_v / ffn_down layers, ...). Nothing is held in memory beyond one slab.

The vocabulary (every tokenizer.* key) is copied from another GGUF file: for the Llama shapes
Llama 3's 128,256-token BPE vocabulary, from --llama-vocab (llama.cpp's source tree carries it
as models/ggml-vocab-llama-bpe.gguf, a vocabulary-only file); without it, and for the Qwen
shape, the registry's qwen2.5-coder-0.5b (Qwen2.5's 151,936-token vocabulary). The embedding
and output matrices have as many rows as that vocabulary.

Files go to --out (default: $EMBER_HOME/synthetic, i.e. ~/.cache/ember/synthetic), named
SHAPE-TYPE.gguf; existing files are kept unless --force. Sizes: Llama-3.2-1B Q4_0 ~0.7 GB,
Qwen2.5-3B Q4_K_M ~1.9 GB, Llama-3.1-8B Q8_0 ~8.5 GB.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    """A model's hyper-parameters, as its config.json gives them."""

    arch: str
    name: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    rope_base: float
    norm_eps: float
    tied: bool  # the output matrix is the token embedding (no output.weight)
    qkv_bias: bool
    vocab: str  # "llama" or "qwen": which vocabulary it is given


SHAPES = {
    "llama-3.2-1b": Shape("llama", "Llama-3.2-1B (synthetic)", 2048, 16, 32, 8, 8192, 131072, 500000.0, 1e-5,
                          tied=True, qkv_bias=False, vocab="llama"),
    "qwen2.5-3b": Shape("qwen2", "Qwen2.5-3B (synthetic)", 2048, 36, 16, 2, 11008, 32768, 1000000.0, 1e-6,
                        tied=True, qkv_bias=True, vocab="qwen"),
    "llama-3.1-8b": Shape("llama", "Llama-3.1-8B (synthetic)", 4096, 32, 32, 8, 14336, 131072, 500000.0, 1e-5,
                          tied=False, qkv_bias=False, vocab="llama"),
}
SLAB_VALUES = 1 << 22  # random values made and quantized at a time


def tensor_shapes(shape: Shape, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape (ne0 first), in llama.cpp's names."""
    head_dim = shape.n_embd // shape.n_head
    n_kv = shape.n_head_kv * head_dim
    tensors = {"token_embd.weight": (shape.n_embd, n_vocab), "output_norm.weight": (shape.n_embd,)}
    if not shape.tied:
        tensors["output.weight"] = (shape.n_embd, n_vocab)
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        tensors |= {b + "attn_norm.weight": (shape.n_embd,), b + "attn_q.weight": (shape.n_embd, shape.n_embd),
                    b + "attn_k.weight": (shape.n_embd, n_kv), b + "attn_v.weight": (shape.n_embd, n_kv),
                    b + "attn_output.weight": (shape.n_embd, shape.n_embd), b + "ffn_norm.weight": (shape.n_embd,),
                    b + "ffn_gate.weight": (shape.n_embd, shape.n_ff), b + "ffn_up.weight": (shape.n_embd, shape.n_ff),
                    b + "ffn_down.weight": (shape.n_ff, shape.n_embd)}
        if shape.qkv_bias:
            tensors |= {b + "attn_q.bias": (shape.n_embd,), b + "attn_k.bias": (n_kv,), b + "attn_v.bias": (n_kv,)}
    return tensors


def vocabulary(source: str):
    """The tokenizer.* keys of a GGUF file (a path or a registry name) as (key, value, type)."""
    from ember.gguf import open_gguf
    from ember.hub import resolve_model

    gguf = open_gguf(resolve_model(source))
    keys = [(k, v, gguf.metadata_types[k]) for k, v in gguf.metadata.items() if k.startswith("tokenizer.")]
    n_vocab = len(gguf.metadata["tokenizer.ggml.tokens"])
    return keys, n_vocab, gguf


def random_rows(name: str, ne: tuple[int, ...], dst, rng: np.random.Generator, n_threads: int):
    """A callable the writer calls for the tensor's bytes: random rows, quantized slab by slab."""
    from ember import _core
    from ember.gguf.types import GGMLType

    n_per_row, n_rows = ne[0], int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1
    if name.endswith("_norm.weight"):
        return lambda: iter([np.ones(n_per_row, np.float32)])
    scale = np.float32(1.0 / np.sqrt(n_per_row))
    if len(ne) == 1:  # biases
        return lambda: iter([rng.standard_normal(n_per_row, dtype=np.float32) * scale])
    step = max(1, SLAB_VALUES // n_per_row)

    def slabs():
        for first in range(0, n_rows, step):
            rows = rng.standard_normal((min(step, n_rows - first), n_per_row), dtype=np.float32)
            rows *= scale
            if dst == GGMLType.F32:
                yield rows
            else:
                yield _core.convert_rows(int(GGMLType.F32), rows.view(np.uint8), int(dst), n_per_row, n_threads)
    return slabs


def write_model(path: Path, shape: Shape, preset_name: str, vocab_source: str, n_threads: int, seed: int) -> dict:
    from ember.gguf import GGUFValueType, GGUFWriter
    from ember.gguf.types import GGMLType
    from ember.quant.presets import ModelShape, llama_order, preset_by_name, tensor_types
    from ember.quant.quantize import QUANTIZATION_VERSION

    U32, F32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    preset = preset_by_name(preset_name)
    vocab_keys, n_vocab, vocab_file = vocabulary(vocab_source)
    shapes = tensor_shapes(shape, n_vocab)
    types = tensor_types({n: (GGMLType.F32, s) for n, s in shapes.items()}, preset,
                         ModelShape(arch=shape.arch, n_layer=shape.n_layer, n_head=shape.n_head,
                                    n_head_kv=shape.n_head_kv, n_expert=0))
    a = shape.arch
    writer = GGUFWriter(path, a)
    for key, value, value_type in [
        ("general.name", shape.name, None),
        (f"{a}.context_length", shape.n_ctx_train, U32), (f"{a}.embedding_length", shape.n_embd, U32),
        (f"{a}.block_count", shape.n_layer, U32), (f"{a}.feed_forward_length", shape.n_ff, U32),
        (f"{a}.attention.head_count", shape.n_head, U32), (f"{a}.attention.head_count_kv", shape.n_head_kv, U32),
        (f"{a}.rope.freq_base", shape.rope_base, F32), (f"{a}.attention.layer_norm_rms_epsilon", shape.norm_eps, F32),
        *([(f"{a}.vocab_size", n_vocab, U32), (f"{a}.rope.dimension_count", shape.n_embd // shape.n_head, U32)]
          if a == "llama" else []),
        ("general.file_type", preset.file_type, U32), ("general.quantization_version", QUANTIZATION_VERSION, U32),
        *vocab_keys,
    ]:
        writer.add(key, value, value_type)
    rng = np.random.default_rng(seed)
    for name in llama_order(shapes):
        writer.add_tensor(name, random_rows(name, shapes[name], types[name], rng, n_threads), types[name],
                          shapes[name])
    writer.write()
    vocab_file.close()
    return {"n_vocab": n_vocab, "types": type_counts(types)}


def type_counts(types: dict) -> dict[str, int]:
    """{tensor type name: number of tensors of it}."""
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t.name] = counts.get(t.name, 0) + 1
    return counts


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """--out, -t, --seed and --force, as the synthetic-file scripts take them."""
    parser.add_argument("--out", default=None, help="folder of the files (default: $EMBER_HOME/synthetic)")
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="write files that exist already")


def parse_output_arguments(parser: argparse.ArgumentParser, argv=None):
    """(the parsed arguments, the output folder, made if missing, the thread count)."""
    from ember.hub import cache_dir
    from ember.sysinfo import checked_threads

    add_output_arguments(parser)
    args = parser.parse_args(argv)
    out = Path(args.out).expanduser() if args.out else cache_dir() / "synthetic"
    out.mkdir(parents=True, exist_ok=True)
    return args, out, checked_threads(args.threads)


def chosen(names: str, known: dict, script: str) -> list[str]:
    """The comma-separated `names`, each one of `known`'s keys (else the script exits naming them)."""
    for name in names.split(","):
        if name not in known:
            raise SystemExit(f"{script}: unknown name {name!r} (choose from {', '.join(known)})")
    return names.split(",")


def write_files(out: Path, name: str, presets: str, force: bool, write) -> None:
    """out/NAME-PRESET.gguf for each comma-separated preset, by write(path, preset) -> {"n_vocab",
    "types"}, unless it exists (and not force); the path printed on stdout, what it holds on stderr."""
    for preset in presets.split(","):
        path = out / f"{name}-{preset.lower()}.gguf"
        if path.exists() and not force:
            print(f"{path}: exists, kept", file=sys.stderr)
            print(path)
            continue
        start = time.perf_counter()
        info = write(path, preset)
        types = ", ".join(f"{n} {t}" for t, n in sorted(info["types"].items(), key=lambda kv: -kv[1]))
        print(f"{path}: {path.stat().st_size / 1e9:.2f} GB, n_vocab {info['n_vocab']}, tensors {types}, "
              f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        print(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="llama-3.2-1b,qwen2.5-3b,llama-3.1-8b", help=", ".join(SHAPES))
    parser.add_argument("--types", default="Q4_0,Q4_K_M,Q8_0", help="llama-quantize presets, comma-separated")
    parser.add_argument("--llama-vocab", default=None, help="GGUF file with Llama 3's vocabulary "
                        "(llama.cpp's models/ggml-vocab-llama-bpe.gguf)")
    parser.add_argument("--qwen-vocab", default="qwen2.5-coder-0.5b", help="GGUF file or registry name with "
                        "Qwen2.5's vocabulary")
    args, out, n_threads = parse_output_arguments(parser, argv)
    for shape_name in chosen(args.shapes, SHAPES, "synthetic_models"):
        shape = SHAPES[shape_name]
        vocab = args.llama_vocab if shape.vocab == "llama" and args.llama_vocab else args.qwen_vocab
        if shape.vocab == "llama" and not args.llama_vocab:
            print(f"{shape_name}: no --llama-vocab, so Qwen2.5's vocabulary ({args.qwen_vocab}) instead of "
                  "Llama 3's: the embedding has 151,936 rows, not 128,256", file=sys.stderr)
        write_files(out, shape_name, args.types, args.force,
                    lambda path, preset: write_model(path, shape, preset, vocab, n_threads, args.seed))


if __name__ == "__main__":
    main()
