"""GGUF files at the shapes of real small models of the dense families (Llama 3.2, Mistral, Qwen3,
Gemma 2, Phi-3, Phi-2, Granite, OLMo 2, StarCoder2, SmolLM3, StableLM 2, GLM-4), random weights and
a real vocabulary, for `ember bench` beside llama-bench on the same file (compare_llamacpp.py
--models takes their paths).

    python benchmarks/family_synthetic.py [--models qwen3-0.6b,gemma2-2b,...] [--types Q4_K_M,Q8_0]
        [--out DIR] [--vocab-dir DIR] [-t THREADS] [--seed 0] [--force]

Tensor names, shapes and metadata are what `ember convert` writes for the model's config.json
(the values below, from the models' published configs; tests/models hold `ember convert` to
llama.cpp's converter): transformers builds the model on the meta device, which gives every
parameter's name and shape without memory, and ember's converter plans the file from those
(tensors it computes from the config, such as Llama 3's rope_freqs, keep their real values).
Weights are random (benchmarks/synthetic_models.py: N(0, 1/fan-in), norms 1) in the tensor types
llama-quantize's preset gives each tensor: a quantized tensor is blocks drawn at random from a pool
that ember's quantizer made of POOL_ROWS random rows (the kernels' speed does not depend on the
values; quantizing every row would take minutes per file on a busy machine).

The vocabulary (every tokenizer.* key) is copied from a GGUF file: the family's own where
llama.cpp's source tree carries it as a vocabulary-only file (--vocab-dir: its models/ folder;
Phi-3's ggml-vocab-phi-3.gguf, StarCoder's ggml-vocab-starcoder.gguf, Llama 3's ggml-vocab-llama-bpe.gguf),
else another of about the family's size. The embedding and output have as many rows as that vocabulary.
Files go to --out (default: $EMBER_HOME/synthetic), named MODEL-TYPE.gguf.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_models import (  # noqa: E402
    chosen,
    parse_output_arguments,
    random_rows,
    type_counts,
    vocabulary,
    write_files,
)

POOL_ROWS = 64
SLAB_BLOCKS = 1 << 16  # blocks drawn at a time

# name -> (Hugging Face class, config.json values, vocabularies to try: vocab-dir file or registry name)
MODELS = {
    "qwen3-0.6b": ("Qwen3ForCausalLM", {
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": True}, ["qwen2.5-coder-0.5b"]),
    "gemma2-2b": ("Gemma2ForCausalLM", {
        "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256, "max_position_embeddings": 8192,
        "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "rms_norm_eps": 1e-6}, ["gemma3-270m"]),
    "phi3-mini": ("Phi3ForCausalLM", {
        "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
        "sliding_window": 2047, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}, ["ggml-vocab-phi-3.gguf", "smollm2-135m"]),
    "granite-3-2b": ("GraniteForCausalLM", {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 5000000.0, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.015625, "logits_scaling": 8.0, "tie_word_embeddings": True},
        ["ggml-vocab-starcoder.gguf", "smollm2-135m"]),
    "olmo2-1b": ("Olmo2ForCausalLM", {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16,
        "num_key_value_heads": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 500000.0, "tie_word_embeddings": False}, ["ggml-vocab-deepseek-llm.gguf", "qwen2.5-coder-0.5b"]),
    "starcoder2-3b": ("Starcoder2ForCausalLM", {
        "hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30, "num_attention_heads": 24,
        "num_key_value_heads": 2, "max_position_embeddings": 16384, "sliding_window": 4096, "norm_epsilon": 1e-5,
        "rope_theta": 999999.4420358813, "use_bias": True, "tie_word_embeddings": True},
        ["ggml-vocab-starcoder.gguf", "smollm2-135m"]),
    "llama3.2-1b": ("LlamaForCausalLM", {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True}, ["ggml-vocab-llama-bpe.gguf", "qwen2.5-coder-0.5b"]),
    "mistral-7b": ("MistralForCausalLM", {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 32768, "sliding_window": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False}, ["ggml-vocab-llama-spm.gguf", "smollm2-135m"]),
    "smollm3-3b": ("SmolLM3ForCausalLM", {
        "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
        "num_key_value_heads": 4, "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 5000000.0,
        "no_rope_layer_interval": 4, "tie_word_embeddings": True}, ["ggml-vocab-llama-bpe.gguf", "qwen2.5-coder-0.5b"]),
    "stablelm-2-1.6b": ("StableLmForCausalLM", {
        "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 32,
        "num_key_value_heads": 32, "partial_rotary_factor": 0.25, "layer_norm_eps": 1e-5, "use_qkv_bias": True,
        "qk_layernorm": False, "use_parallel_residual": False, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": False}, ["ggml-vocab-deepseek-llm.gguf", "qwen2.5-coder-0.5b"]),
    "phi2": ("PhiForCausalLM", {
        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "partial_rotary_factor": 0.4, "layer_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 2048, "tie_word_embeddings": False}, ["ggml-vocab-gpt-2.gguf", "smollm2-135m"]),
    "glm4-9b": ("Glm4ForCausalLM", {
        "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
        "num_key_value_heads": 2, "head_dim": 128, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 32768, "attention_bias": True, "tie_word_embeddings": False},
        ["ggml-vocab-qwen2.gguf", "qwen2.5-coder-0.5b"]),
}


def checkpoint_tensors(hf_class: str, config: dict) -> dict:
    """{name: SafeTensor} of the model's checkpoint, each an all-zero broadcast (no memory): the
    names and shapes save_pretrained would write (a tied LM head left out)."""
    import torch
    import transformers

    from ember.convert.checkpoint import SafeTensor

    model_class = getattr(transformers, hf_class)
    with torch.device("meta"):
        model = model_class(model_class.config_class(**config))
    tensors = {}
    for name, param in model.state_dict().items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings", True):
            continue
        shape = tuple(param.shape)
        tensors[name] = SafeTensor(name, "F32", shape, np.broadcast_to(np.float32(0), shape))
    return tensors


def pooled_rows(name: str, ne: tuple[int, ...], dst, rng: np.random.Generator, n_threads: int):
    """A callable the writer calls for the tensor's bytes: for a quantized type, blocks drawn at
    random from POOL_ROWS random rows quantized to `dst`; F32 tensors as synthetic_models makes them."""
    from ember import _core
    from ember.gguf.types import TYPES, GGMLType

    if dst in (GGMLType.F32, GGMLType.F16) or len(ne) == 1:
        return random_rows(name, ne, dst, rng, n_threads)
    info = TYPES[dst]
    rows = rng.standard_normal((POOL_ROWS, ne[0]), dtype=np.float32) / np.float32(np.sqrt(ne[0]))
    pool = np.asarray(_core.convert_rows(int(GGMLType.F32), rows.view(np.uint8), int(dst), ne[0], n_threads))
    pool = pool.reshape(-1, info.type_size)
    n_blocks = int(np.prod(ne, dtype=np.int64)) // info.block_size

    def slabs():
        for first in range(0, n_blocks, SLAB_BLOCKS):
            yield pool[rng.integers(0, len(pool), min(SLAB_BLOCKS, n_blocks - first))]
    return slabs


def resolve_vocab(candidates: list[str], vocab_dir: Path | None) -> str:
    for candidate in candidates:
        if candidate.endswith(".gguf"):
            if vocab_dir is not None and (vocab_dir / candidate).is_file():
                return str(vocab_dir / candidate)
        else:
            return candidate
    raise SystemExit(f"family_synthetic: none of the vocabularies {candidates} is at hand")


def write_model(path: Path, name: str, preset_name: str, vocab_source: str, n_threads: int, seed: int) -> dict:
    from types import SimpleNamespace

    from ember.convert.hf_to_gguf import plan_tensors
    from ember.gguf import GGUFValueType, GGUFWriter
    from ember.gguf.types import GGMLType
    from ember.models import converter_for
    from ember.quant.presets import ModelShape, llama_order, preset_by_name, tensor_types
    from ember.quant.quantize import QUANTIZATION_VERSION

    hf_class, config, _ = MODELS[name]
    vocab_keys, n_vocab, vocab_file = vocabulary(vocab_source)
    config = {**config, "vocab_size": n_vocab, "architectures": [hf_class]}
    converter = converter_for(hf_class, config)
    tensors = checkpoint_tensors(hf_class, config)
    computed = {n for n, _ in converter.extra_tensors()}  # from the config: real values
    planned = {t.name: t for t in plan_tensors(SimpleNamespace(path=path, tensors=tensors), converter, GGMLType.F32)}
    shapes = {n: tuple(reversed(t.shape)) for n, t in planned.items()}
    meta = converter.metadata()
    a = converter.arch
    preset = preset_by_name(preset_name)
    types = tensor_types({n: (GGMLType.F32, s) for n, s in shapes.items()}, preset,
                         ModelShape(arch=a, n_layer=meta[f"{a}.block_count"], n_head=meta[f"{a}.attention.head_count"],
                                    n_head_kv=meta.get(f"{a}.attention.head_count_kv", meta[f"{a}.attention.head_count"]),
                                    n_expert=0))
    writer = GGUFWriter(path, a)
    writer.add("general.name", f"{name} (synthetic)")
    for key, value in meta.items():
        writer.add(key, value)
    writer.add("general.file_type", preset.file_type, GGUFValueType.UINT32)
    writer.add("general.quantization_version", QUANTIZATION_VERSION, GGUFValueType.UINT32)
    for key, value, value_type in vocab_keys:
        writer.add(key, value, value_type)
    rng = np.random.default_rng(seed)
    for n in llama_order(shapes):
        if n in computed:
            writer.add_tensor(n, planned[n].chunks, planned[n].type, shapes[n])
        else:
            writer.add_tensor(n, pooled_rows(n, shapes[n], types[n], rng, n_threads), types[n], shapes[n])
    writer.write()
    vocab_file.close()
    return {"n_vocab": n_vocab, "types": type_counts(types)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=", ".join(MODELS))
    parser.add_argument("--types", default="Q4_K_M", help="llama-quantize presets, comma-separated")
    parser.add_argument("--vocab-dir", type=Path, default=None,
                        help="llama.cpp's models/ folder (its vocabulary-only GGUF files)")
    args, out, n_threads = parse_output_arguments(parser, argv)
    for name in chosen(args.models, MODELS, "family_synthetic"):
        vocab = resolve_vocab(MODELS[name][2], args.vocab_dir)
        print(f"{name}: the vocabulary of {vocab}", file=sys.stderr)
        write_files(out, name, args.types, args.force,
                    lambda path, preset: write_model(path, name, preset, vocab, n_threads, args.seed))


if __name__ == "__main__":
    main()
