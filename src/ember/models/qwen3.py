"""Qwen3 (dense): the Qwen2 decoder without Q/K/V biases (unless the file has them) and with a
per-head RMSNorm on queries and keys before RoPE (attn_q_norm / attn_k_norm).

A Qwen3-Reranker converts as llama.cpp's converter writes one: pooling type rank, the LM head's
rows of "yes" and "no" as the classification head cls.output (no LM head unless it is tied to
the token embedding), the labels yes and no, and the rerank template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ember.errors import EmberError
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, DecoderConverter
from ember.models.llama import build_decoder
from ember.models.pooling import POOLING_IDS

HF_ARCHITECTURES = ("Qwen3ForCausalLM",)
FEATURES = ("per-head Q/K RMSNorm",)
HF_LAYER = {**DECODER_LAYER, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def build(b: Builder) -> int:
    return build_decoder(b, neox=True)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


# the template llama.cpp's converter writes for Qwen3-Reranker (tokenizer.chat_template.rerank)
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


class Converter(DecoderConverter):
    arch = "qwen3"
    layer_names = HF_LAYER
    answers: tuple[int, int] | None = None  # a reranker's ids of "yes" and "no"

    def __init__(self, config: dict):
        super().__init__(config)
        if config.get("use_sliding_window") and "sliding_attention" in (config.get("layer_types") or []):
            raise EmberError("Qwen3 with sliding-window attention (use_sliding_window) is not supported")

    def read_folder(self, path: Path) -> None:
        """A Qwen3-Reranker, as llama.cpp's converter recognises one: its README's title, its
        folder's or config's name, or a sequence classification class; then its ids of yes and no."""
        readme = path / "README.md"
        text = readme.read_text(encoding="utf-8", errors="replace").lower() if readme.is_file() else ""
        hints = [path.resolve().name, str(self.config.get("_name_or_path", "")), str(self.config.get("model_type", "")),
                 str((self.config.get("architectures") or [""])[0])]
        if not ("# qwen3-reranker" in text or any("qwen3-reranker" in h.lower() for h in hints if h)
                or "sequenceclassification" in hints[3].lower()):
            return
        vocab = _token_ids(path)
        if "yes" not in vocab or "no" not in vocab:
            raise EmberError(f"{path} looks like a Qwen3-Reranker, but its tokenizer has no token 'yes' or 'no'")
        self.answers = (vocab["yes"], vocab["no"])

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        # llama.cpp's converter writes neither for Qwen3: the vocabulary is the tokenizer's, RoPE spans the head
        del meta[f"{self.arch}.vocab_size"], meta[f"{self.arch}.rope.dimension_count"]
        if self.answers is not None:
            meta |= {f"{self.arch}.pooling_type": POOLING_IDS["rank"], f"{self.arch}.classifier.output_labels": ["yes", "no"],
                     "tokenizer.chat_template.rerank": RERANK_TEMPLATE, "tokenizer.chat_templates": ["rerank"]}
        return meta

    def gguf_name(self, hf_name: str) -> str | None:
        if self.answers is not None and hf_name == "lm_head.weight" and not self.config.get("tie_word_embeddings"):
            return None  # it becomes cls.output alone (split)
        return super().gguf_name(hf_name)

    def split(self, hf_name: str, shape: tuple[int, ...]) -> list | None:
        """A reranker's head: the LM head's rows of yes and no as cls.output, taken from lm_head or,
        when tied, from the token embedding (which stays too)."""
        if self.answers is not None:
            tied = bool(self.config.get("tie_word_embeddings"))
            if hf_name == ("model.embed_tokens.weight" if tied else "lm_head.weight"):
                rows = list(self.answers)
                head = [("cls.output.weight", lambda v: v[rows], (2, *shape[1:]))]
                return ([("token_embd.weight", lambda v: v, tuple(shape))] if tied else []) + head
        return super().split(hf_name, shape)


def _token_ids(path: Path) -> dict[str, int]:
    """The token ids of a tokenizer.json's vocabulary and added tokens."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return {}
    tokenizer = json.loads(file.read_text(encoding="utf-8"))
    ids = dict((tokenizer.get("model") or {}).get("vocab") or {})
    ids.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens") or []})
    return ids
