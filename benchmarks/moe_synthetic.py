"""A synthetic mixture-of-experts GGUF at a real model's shape, for speed measurements of the expert
matmul: random Q4_K weights (F32 norms and routers, as llama.cpp's converter keeps them) and the
vocabulary of a registry model, written by ember's own GGUF writer.

    python benchmarks/moe_synthetic.py OUT.gguf [--shape olmoe-1b-7b|qwen1.5-moe-a2.7b] [--vocab smollm2-135m]

Then, for instance:

    python benchmarks/compare_llamacpp.py --models OUT.gguf --only speed -p 512 -n 128 -t 2

It prints the bytes of weights a decode step reads (every tensor but the token embedding, of the
experts only the chosen ones), from which a memory-bandwidth bound on decode follows.

The weights are random blocks: every 4-bit value and 6-bit scale random, the two f16 super-block
scales set so that a weight is about N(0, 1/row length). A random router picks experts about
uniformly, as a trained one does on average over a batch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from ember.gguf import GGUFWriter, open_gguf
from ember.gguf.types import TYPES, GGMLType
from ember.hub import resolve_model

Q4_K = GGMLType.Q4_K
_CHUNK_BLOCKS = 1 << 16  # Q4_K blocks generated at a time (9 MiB)


@dataclass(frozen=True)
class Shape:
    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_ff: int           # dense MLP rows (Qwen1.5-MoE's feed_forward_length, unused by its MoE layers)
    n_ff_exp: int
    n_expert: int
    n_expert_used: int
    n_ff_shexp: int = 0  # Qwen2-MoE's gated shared expert


SHAPES = {
    # allenai/OLMoE-1B-7B-0924: 6.9B parameters, 1.3B active
    "olmoe-1b-7b": Shape("olmoe", 2048, 16, 16, 16, 1024, 1024, 64, 8),
    # Qwen/Qwen1.5-MoE-A2.7B: 14.3B parameters, 2.7B active
    "qwen1.5-moe-a2.7b": Shape("qwen2moe", 2048, 24, 16, 16, 5632, 1408, 60, 4, 5632),
}


def tensors(s: Shape, n_vocab: int) -> dict[str, tuple[tuple[int, ...], GGMLType]]:
    """name -> (ggml shape, type)."""
    e, q = s.n_embd, s.n_head * (s.n_embd // s.n_head)
    kv = s.n_kv_head * (s.n_embd // s.n_head)
    out = {"token_embd.weight": ((e, n_vocab), Q4_K), "output_norm.weight": ((e,), GGMLType.F32),
           "output.weight": ((e, n_vocab), Q4_K)}
    for il in range(s.n_layer):
        p = f"blk.{il}."
        out |= {p + "attn_norm.weight": ((e,), GGMLType.F32), p + "ffn_norm.weight": ((e,), GGMLType.F32),
                p + "attn_q.weight": ((e, q), Q4_K), p + "attn_k.weight": ((e, kv), Q4_K),
                p + "attn_v.weight": ((e, kv), Q4_K), p + "attn_output.weight": ((q, e), Q4_K),
                p + "ffn_gate_inp.weight": ((e, s.n_expert), GGMLType.F32),
                p + "ffn_gate_exps.weight": ((e, s.n_ff_exp, s.n_expert), Q4_K),
                p + "ffn_up_exps.weight": ((e, s.n_ff_exp, s.n_expert), Q4_K),
                p + "ffn_down_exps.weight": ((s.n_ff_exp, e, s.n_expert), Q4_K)}
        if s.arch == "olmoe":
            out |= {p + "attn_q_norm.weight": ((q,), GGMLType.F32), p + "attn_k_norm.weight": ((kv,), GGMLType.F32)}
        if s.arch == "qwen2moe":
            out |= {p + "attn_q.bias": ((q,), GGMLType.F32), p + "attn_k.bias": ((kv,), GGMLType.F32),
                    p + "attn_v.bias": ((kv,), GGMLType.F32),
                    p + "ffn_gate_inp_shexp.weight": ((e,), GGMLType.F32),
                    p + "ffn_gate_shexp.weight": ((e, s.n_ff_shexp), Q4_K),
                    p + "ffn_up_shexp.weight": ((e, s.n_ff_shexp), Q4_K),
                    p + "ffn_down_shexp.weight": ((s.n_ff_shexp, e), Q4_K)}
    return out


def random_q4_k(shape: tuple[int, ...], rng: np.random.Generator):
    """A callable streaming random Q4_K blocks of a tensor, a chunk at a time."""
    n_blocks = int(np.prod(shape)) // 256
    # w = d * scale * q - dmin * min, q < 16, scale and min < 64: d ~ 1 / (8 * 32 * sqrt(row)) keeps w ~ 1/sqrt(row)
    d = np.float16(1.0 / (256 * np.sqrt(shape[0])))

    def chunks():
        for start in range(0, n_blocks, _CHUNK_BLOCKS):
            blocks = rng.integers(0, 256, size=(min(_CHUNK_BLOCKS, n_blocks - start), 144), dtype=np.uint8)
            blocks[:, 0:2] = np.frombuffer(d.tobytes(), np.uint8)
            blocks[:, 2:4] = np.frombuffer(np.float16(d / 2).tobytes(), np.uint8)
            yield blocks

    return chunks


def random_f32(shape: tuple[int, ...], name: str, rng: np.random.Generator) -> np.ndarray:
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape[::-1])).astype(np.float32)
    return (rng.standard_normal(shape[::-1]) / np.sqrt(shape[0])).astype(np.float32)


def active_bytes(s: Shape, n_vocab: int) -> int:
    """Bytes of weights one decode step reads: all but the token embedding (one row), the experts
    scaled by n_expert_used / n_expert."""
    total = 0
    for name, (shape, kind) in tensors(s, n_vocab).items():
        if name == "token_embd.weight":
            continue
        size = int(np.prod(shape)) // TYPES[kind].block_size * TYPES[kind].type_size
        total += size * s.n_expert_used // s.n_expert if name.endswith("_exps.weight") else size
    return total


def write(path: str, s: Shape, vocab_model: str, seed: int = 0) -> None:
    source = open_gguf(resolve_model(vocab_model))
    n_vocab = len(source.metadata["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    a = s.arch
    w = GGUFWriter(path, a)
    w.add("general.name", f"synthetic {a} ({s.n_layer} layers, {s.n_expert} experts, random Q4_K)")
    w.add("general.file_type", 15)  # Q4_K_M's id; every matrix is Q4_K
    for key, value in {"context_length": 4096, "embedding_length": s.n_embd, "block_count": s.n_layer,
                       "feed_forward_length": s.n_ff, "attention.head_count": s.n_head,
                       "attention.head_count_kv": s.n_kv_head, "rope.freq_base": 10000.0,
                       "attention.layer_norm_rms_epsilon": 1e-5, "expert_count": s.n_expert,
                       "expert_used_count": s.n_expert_used}.items():
        w.add(f"{a}.{key}", value)
    if s.arch == "qwen2moe":
        w.add(f"{a}.expert_feed_forward_length", s.n_ff_exp)
        w.add(f"{a}.expert_shared_feed_forward_length", s.n_ff_shexp)
    for key in source.metadata:
        if key.startswith("tokenizer."):
            w.add(key, source.metadata[key], source.metadata_types[key])
    for name, (shape, kind) in tensors(s, n_vocab).items():
        if kind == Q4_K:
            w.add_tensor(name, random_q4_k(shape, rng), Q4_K, shape)
        else:
            w.add_tensor(name, random_f32(shape, name, rng))
    w.write()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="olmoe-1b-7b")
    parser.add_argument("--vocab", default="smollm2-135m", help="registry model whose vocabulary the file gets")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    write(args.out, shape, args.vocab)
    n_vocab = len(open_gguf(args.out).metadata["tokenizer.ggml.tokens"])
    print(f"{args.out}: {args.shape}, decode reads {active_bytes(shape, n_vocab) / 1e6:.0f} MB of weights per token "
          f"({shape.n_expert_used} of {shape.n_expert} experts)")


if __name__ == "__main__":
    main()
