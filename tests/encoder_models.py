"""Shared by the WordPiece, BERT, embedding and rerank tests: all-MiniLM-L6-v2 (a BERT encoder that
ships as a Hugging Face folder in a package, hub.HF_FOLDERS), converted by `ember convert` once per
session, and tiny random cross-encoder rerankers (BertForSequenceClassification)."""

from __future__ import annotations

import atexit
import functools
import tempfile
from pathlib import Path

from ember.convert import convert
from ember.hub import pull_folder

MINILM = "all-minilm-l6-v2"


@functools.cache
def minilm_folder() -> Path:
    return pull_folder(MINILM, progress=False)


@functools.cache
def minilm_gguf() -> Path:
    """The folder converted to F32 (a temporary file, removed when the tests end)."""
    work = tempfile.TemporaryDirectory(prefix="ember-minilm-")
    atexit.register(work.cleanup)
    return convert(minilm_folder(), Path(work.name) / f"{MINILM}-f32.gguf", "f32")


RERANKER_STD = {"bert.pooler.dense.weight": 0.1, "classifier.weight": 1.0}  # a head whose scores spread


def tiny_reranker_folder(folder: Path, num_labels: int = 1, vocab_size: int = 300, **config) -> Path:
    """A random BertForSequenceClassification saved to `folder`: every parameter drawn as
    parity.randomize draws them, the LayerNorm scales about 1 and the pooler and classifier larger
    (RERANKER_STD), so that the scores of different pairs differ by far more than ember's rounding."""
    import torch
    import transformers
    from models.parity import randomize

    torch.manual_seed(0)
    settings = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=64, type_vocab_size=2, num_labels=num_labels)
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**(settings | config))).eval()
    randomize(hf)
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name in RERANKER_STD:
                param.copy_(torch.randn(param.shape, generator=generator) * RERANKER_STD[name])
            if name.endswith("LayerNorm.weight"):
                param.add_(1.0)
    hf.save_pretrained(folder, safe_serialization=True)
    return folder


@functools.cache
def tiny_reranker_gguf() -> Path:
    """A tiny random reranker with all-MiniLM-L6-v2's WordPiece tokenizer, converted to F32 (a
    temporary file, removed when the tests end): texts in, scores out."""
    import shutil

    work = Path(tempfile.mkdtemp(prefix="ember-reranker-"))
    atexit.register(shutil.rmtree, work, True)
    folder = tiny_reranker_folder(work / "hf", vocab_size=30522)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm_folder() / name, folder / name)
    return convert(folder, work / "reranker-f32.gguf", "f32")


def write_encoder_gguf(path: Path, arch: str, hparams: dict, weights: dict) -> None:
    """A tiny encoder's file laid out as llama.cpp's converter writes one: `<arch>.<key>` for each
    of hparams, non-causal attention, and the tensors (numpy arrays in GGUF's row order)."""
    from ember.gguf import GGUFWriter

    writer = GGUFWriter(path, arch)
    for key, value in hparams.items():
        writer.add(f"{arch}.{key}", value)
    writer.add(f"{arch}.attention.causal", False)
    for name, values in weights.items():
        writer.add_tensor(name, values)
    writer.write()
