"""BERT encoders (BERT, BGE, MiniLM, E5; XLM-RoBERTa: bge-m3, multilingual-e5): learned absolute
positions and token types, LayerNorm after each sub-layer (post-norm), non-causal attention with
biases, a GELU MLP. The graph's output
is the last layer's hidden state per token; pooling and normalisation are engine.embed's.

A cross-encoder reranker (BertForSequenceClassification, ms-marco-MiniLM) ends in its
classification head instead, as llama.cpp's rank pooling runs it: the [CLS] state, then
tanh(cls(x)) where the file has `cls` (BERT's pooler, RoBERTa's dense layer), then `cls.output`
(the classifier): one score per class. Its token types are an input per token (the query's 0,
the document's 1, as transformers gives them).

XLM-RoBERTa is this architecture as llama.cpp's converter writes it: its position embedding
without the rows before pad_token_id + 1 (RoBERTa numbers positions from there), so that
position 0 is the first token's, and its Unigram vocabulary as a "t5" tokenizer."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.gguf.types import GGMLType
from ember.models.blocks import Builder, HParams
from ember.models.hf import IGNORED, get, require
from ember.models.pooling import POOLING_IDS

HF_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification", "XLMRobertaModel",
                    "XLMRobertaForSequenceClassification")
_CLASSIFIERS = ("BertForSequenceClassification", "XLMRobertaForSequenceClassification")
ENCODER = True  # no LM head: build returns hidden states


def hparams(f) -> HParams:
    return HParams.from_gguf(f, default_eps_key="attention.layer_norm_epsilon")


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    e = hp.n_embd
    norms = ("token_embd_norm", "attn_output_norm", "layer_output_norm")
    return {f"{norm}.{kind}": (e,) for norm in norms for kind in ("weight", "bias")} | {
        "cls.weight": (e, e), "cls.bias": (e,)}


def token_type_row(b: Builder, row: int = 0) -> int:
    """One row of token_types.weight as an F32 vector: every token is of type `row` (sequence A)."""
    from ember.quant.reference import dequantize

    t = b.f.tensors.get("token_types.weight")
    if t is None:
        return -1
    if t.shape[0] != b.hp.n_embd:
        raise EmberError(f"tensor token_types.weight has rows of {t.shape[0]} values, not {b.hp.n_embd}")
    values = dequantize(t.data, t.type, t.shape).reshape(-1, b.hp.n_embd)[row]
    data = np.ascontiguousarray(values, dtype=np.float32).view(np.uint8)
    b._keep.append(data)
    return b.g.named_weight(t.name, int(GGMLType.F32), b.hp.n_embd, 1, data)


def token_type_input(b: Builder) -> int:
    """A reranker's token-type embedding: a per-token input whose rows the runtime takes from
    token_types.weight (Builder.token_types) by each token's type; -1 where the file has one type."""
    from ember.quant.reference import dequantize

    t = b.f.tensors.get("token_types.weight")
    if t is None or t.shape[0] != b.hp.n_embd or len(t.shape) < 2 or t.shape[1] < 2:
        return -1
    b.token_types = np.ascontiguousarray(dequantize(t.data, t.type, t.shape).reshape(-1, b.hp.n_embd),
                                         dtype=np.float32)
    return b.g.input(b.hp.n_embd)


def embeddings(b: Builder) -> int:
    """LayerNorm(token + position + token type embedding); rotary encoders have no position embedding."""
    g = b.g
    x = g.get_rows(b.weight("token_embd.weight"))
    if b.has("position_embd.weight"):
        x = g.add(x, g.get_rows(b.weight("position_embd.weight"), by_position=True))
    types = token_type_input(b) if b.rank else -1
    if types < 0:
        types = token_type_row(b)
    if types >= 0:
        x = g.add(x, types)
    return b.layer_norm(x, "token_embd_norm")


def gelu_mlp(b: Builder, x: int, il: int) -> int:
    p = f"blk.{il}"
    return b.linear(b.g.gelu(b.linear(x, f"{p}.ffn_up")), f"{p}.ffn_down")


def encoder_layer(b: Builder, x: int, il: int, attend, mlp=gelu_mlp) -> int:
    """Post-norm block: x = LN(x + Attn(x)); x = LN(x + MLP(x)). attend(b, x, il) gives the heads'
    output, mlp(b, x, il) the MLP's."""
    g, p = b.g, f"blk.{il}"
    x = b.layer_norm(g.add(x, b.linear(attend(b, x, il), f"{p}.attn_output")), f"{p}.attn_output_norm")
    return b.layer_norm(g.add(x, mlp(b, x, il)), f"{p}.layer_output_norm")


def self_attention(b: Builder, x: int, il: int) -> int:
    p = f"blk.{il}"
    if b.has(f"{p}.attn_qkv.weight"):
        qkv, n = b.linear(x, f"{p}.attn_qkv"), b.hp.n_embd
        q, k, v = b.g.view(qkv, 0, n), b.g.view(qkv, n, n), b.g.view(qkv, 2 * n, n)
    else:
        q, k, v = (b.linear(x, f"{p}.attn_{name}") for name in "qkv")
    return b.attention(q, k, v, causal=False)


def outputs(b: Builder, x: int) -> int:
    """The rows asked for (each text's, or a reranker's [CLS]); a reranker's through its head."""
    x = b.g.select_outputs(x)
    return b.classifier_head(x) if b.rank else x


def build(b: Builder) -> int:
    x = embeddings(b)
    for il in range(b.hp.n_layer):
        x = encoder_layer(b, x, il, self_attention)
    return outputs(b, x)


_GLOBAL = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_BLOCK = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
# heads no embedding reads: the pooler, the masked-LM and next-sentence heads
_DROPPED = ("embeddings.position_ids", "pooler.", "cls.")
# a sequence classifier's head: BERT's pooler (dense + tanh on [CLS]) and the classifier
_CLASSIFIER = {"pooler.dense.weight": "cls.weight", "pooler.dense.bias": "cls.bias",
               "classifier.weight": "cls.output.weight", "classifier.bias": "cls.output.bias"}
# XLM-RoBERTa's classification head (RobertaClassificationHead: dense + tanh on <s>, out_proj)
_ROBERTA_CLASSIFIER = {"classifier.dense.weight": "cls.weight", "classifier.dense.bias": "cls.bias",
                       "classifier.out_proj.weight": "cls.output.weight", "classifier.out_proj.bias": "cls.output.bias"}
_POSITIONS = "embeddings.position_embeddings.weight"


class Converter:
    """Hugging Face BertModel -> GGUF "bert", as llama.cpp's BertModel converter writes it.

    BertForSequenceClassification (a cross-encoder reranker) keeps its head as llama.cpp's
    converter names it, the classifier as cls.output and its labels as classifier.output_labels,
    with two differences that make the file mean what the checkpoint computes: the pooler stays
    (as cls; llama.cpp's converter drops it, and its graph then scores classifier([CLS]) instead
    of classifier(tanh(pooler([CLS])))) and the file says pooling type rank (llama.cpp's converter
    says none and leaves it to --reranking).

    XLMRobertaModel and XLMRobertaForSequenceClassification (bge-m3, bge-reranker-v2-m3) drop the
    position embedding's first pad_token_id + 1 rows and count them off the context length, as
    llama.cpp's XLMRobertaModel converter does; the reranker's head is RoBERTa's dense layer
    (cls) and out_proj (cls.output)."""

    arch = "bert"
    # the checkpoint's names: whole-model tensors, a layer's modules under `block`, the ones left out
    global_names, layer_names, block, dropped = _GLOBAL, _LAYER, _BLOCK, _DROPPED
    xlm_roberta, position_offset = False, 0  # XLM-RoBERTa: its padding rows before the first position

    def __init__(self, config: dict):
        self.config = config
        hf_class = (config.get("architectures") or [None])[0]
        self.classifies = hf_class in _CLASSIFIERS
        self.xlm_roberta = str(hf_class).startswith("XLMRoberta")
        pad = config.get("pad_token_id")
        self.position_offset = pad + 1 if self.xlm_roberta and isinstance(pad, int) and pad >= 0 else 0
        if self.xlm_roberta and config.get("lora_adaptations"):
            raise EmberError("XLM-RoBERTa with LoRA adaptations (jina-embeddings-v3) is not supported")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise EmberError(f"BERT with {config['position_embedding_type']} position embeddings is not supported")
        if config.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise EmberError(f"BERT with activation {config['hidden_act']!r} is not supported (ember runs GELU)")

    def metadata(self) -> dict[str, Any]:
        c, a = self.config, self.arch
        return {
            f"{a}.context_length": int(require(c, "max_position_embeddings")) - self.position_offset,
            f"{a}.embedding_length": int(require(c, "hidden_size")),
            f"{a}.block_count": int(require(c, "num_hidden_layers")),
            f"{a}.feed_forward_length": int(require(c, "intermediate_size")),
            f"{a}.attention.head_count": int(require(c, "num_attention_heads")),
            f"{a}.attention.layer_norm_epsilon": float(get(c, "layer_norm_eps", default=1e-12)),
            f"{a}.attention.causal": False,
        } | (self._classifier_metadata() if self.classifies else {})

    def _classifier_metadata(self) -> dict[str, Any]:
        """The rank pooling type and, as llama.cpp's converter, the class labels unless they are
        the two transformers makes up (LABEL_0, LABEL_1)."""
        meta: dict[str, Any] = {f"{self.arch}.pooling_type": POOLING_IDS["rank"]}
        labels = self.config.get("id2label") or {}
        names = [str(v) for _, v in sorted(labels.items(), key=lambda kv: int(kv[0]))]
        if names and names != ["LABEL_0", "LABEL_1"]:
            meta[f"{self.arch}.classifier.output_labels"] = names
        return meta

    def _name(self, hf_name: str) -> str:
        name = hf_name.removeprefix("roberta.") if self.xlm_roberta else hf_name
        name = name.removeprefix("bert.")
        if name.endswith(".gamma"):
            name = name[:-6] + ".weight"
        if name.endswith(".beta"):
            name = name[:-5] + ".bias"
        return name

    def gguf_name(self, hf_name: str) -> str | None:
        name = self._name(hf_name)
        classifier = _ROBERTA_CLASSIFIER if self.xlm_roberta else _CLASSIFIER
        if self.classifies and name in classifier:
            return classifier[name]
        if name.endswith(IGNORED) or name.startswith(self.dropped):
            return None
        if name in self.global_names:
            return self.global_names[name]
        match = self.block.match(name)
        if match and match.group(2) in self.layer_names:
            layer, module, kind = match.groups()
            return f"blk.{layer}.{self.layer_names[module]}.{kind}"
        raise EmberError(f"cannot map tensor {hf_name} to a {self.arch} GGUF tensor")

    def transform(self, hf_name: str, values: np.ndarray) -> np.ndarray:
        return values[self.position_offset:] if self.transforms(hf_name) else values

    def transforms(self, hf_name: str) -> bool:
        return self.position_offset > 0 and self._name(hf_name) == _POSITIONS

    def shape_after(self, hf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.transforms(hf_name):
            return (shape[0] - self.position_offset, *shape[1:])
        return shape

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        return []
