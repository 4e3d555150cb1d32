"""Jina BERT v2 (jina-embeddings-v2, jina-reranker-v1): the BERT encoder with ALiBi's distance
penalties in place of position embeddings (symmetric, max bias 8 as llama.cpp fixes it), Q and K
LayerNormed where the file has attn_q_norm / attn_k_norm, a second norm after attention where it
has attn_norm_2, and a gated GELU MLP, gelu(gate(x)) * up(x), the gate its own ffn_gate or the
first half of a fused ffn_up of 2 n_ff rows (plain gelu(up(x)) where ffn_up has n_ff rows):
llama.cpp's jina-bert-v2 graph. A reranker's head (jina-reranker-v1) is one row, `cls`, run as
llama.cpp's rank pooling runs it: tanh(cls([CLS])).

`ember convert` turns JinaBertModel (jina-embeddings-v2 with a WordPiece tokenizer: base-en,
small-en) into this file as llama.cpp's converter writes it."""

from __future__ import annotations

from ember.errors import EmberError, GGUFError
from ember.models import bert
from ember.models.blocks import Builder, HParams
from ember.models.validate import n_rows

HF_ARCHITECTURES = ("JinaBertModel", "JinaBertForMaskedLM")
ENCODER = True
ALIBI_MAX_BIAS = 8.0


def hparams(f) -> HParams:
    return HParams.from_gguf(f, default_eps_key="attention.layer_norm_epsilon")


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...] | None]:
    e = hp.n_embd
    return bert.tensor_shapes(hp) | {
        f"{norm}.{kind}": (e,) for norm in ("attn_q_norm", "attn_k_norm", "attn_norm_2") for kind in ("weight", "bias")
    } | {"ffn_up.weight": None, "ffn_up.bias": None,  # n_ff or 2 n_ff rows: checked by gated_gelu_mlp
         "cls.weight": (e, 1), "cls.bias": (1,)}  # a reranker's one score (jina-reranker-v1)


def alibi_attention(b: Builder, x: int, il: int) -> int:
    p = f"blk.{il}"
    q, k, v = (b.linear(x, f"{p}.attn_{name}") for name in "qkv")
    if b.has(f"{p}.attn_q_norm.weight"):
        q = b.layer_norm(q, f"{p}.attn_q_norm")
    if b.has(f"{p}.attn_k_norm.weight"):
        k = b.layer_norm(k, f"{p}.attn_k_norm")
    return b.attention(q, k, v, causal=False, alibi_max_bias=ALIBI_MAX_BIAS)


def gated_gelu_mlp(b: Builder, x: int, il: int) -> int:
    g, p, n_ff = b.g, f"blk.{il}", b.hp.n_ff
    up = b.linear(x, f"{p}.ffn_up")
    n_up = n_rows(b.f.tensors[f"{p}.ffn_up.weight"].shape)
    if b.has(f"{p}.ffn_gate.weight"):
        h = g.geglu(b.linear(x, f"{p}.ffn_gate"), up)
    elif n_up == 2 * n_ff:  # gate and up in one projection, the gate first
        h = g.geglu(g.view(up, 0, n_ff), g.view(up, n_ff, n_ff))
    elif n_up == n_ff:
        h = g.gelu(up)
    else:
        raise GGUFError(f"tensor {p}.ffn_up.weight has {n_up} rows; jina-bert-v2 needs {n_ff} "
                        f"(feed_forward_length) or {2 * n_ff} (gate and up together)")
    return b.linear(h, f"{p}.ffn_down")


def layer(b: Builder, x: int, il: int) -> int:
    g, p = b.g, f"blk.{il}"
    h = b.layer_norm(g.add(x, b.linear(alibi_attention(b, x, il), f"{p}.attn_output")), f"{p}.attn_output_norm")
    if b.has(f"{p}.attn_norm_2.weight"):
        h = b.layer_norm(g.add(h, x), f"{p}.attn_norm_2")
    return b.layer_norm(g.add(h, gated_gelu_mlp(b, h, il)), f"{p}.layer_output_norm")


def build(b: Builder) -> int:
    x = bert.embeddings(b)
    for il in range(b.hp.n_layer):
        x = layer(b, x, il)
    return bert.outputs(b, x)


_GLOBAL = {name: gguf for name, gguf in bert.Converter.global_names.items() if gguf != "position_embd.weight"}
# Jina's modules (and jina-embeddings-v2-base-code's names for them) -> llama.cpp's tensors
_LAYER = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
    "attention.self.layer_norm_q": "attn_q_norm", "attention.self.layer_norm_k": "attn_k_norm",
    "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
    "layer_norm_1": "attn_norm_2",
    "mlp.gated_layers": "ffn_up", "mlp.up_gated_layer": "ffn_up",  # the gate and up rows together, the gate first
    "mlp.wo": "ffn_down", "mlp.down_layer": "ffn_down",
    "mlp.layernorm": "layer_output_norm", "layer_norm_2": "layer_output_norm",
}


class Converter(bert.Converter):
    """Hugging Face JinaBertModel -> GGUF "jina-bert-v2", with llama.cpp's tensor names and keys
    (BERT's, no position embedding: ALiBi); the vocabulary is BERT's WordPiece."""

    arch = "jina-bert-v2"
    global_names, layer_names = _GLOBAL, _LAYER
    dropped = ("embeddings.position_ids", "pooler.", "cls.")

    def __init__(self, config: dict):
        self.config = config
        self.classifies = False
        if config.get("position_embedding_type", "alibi") != "alibi":
            raise EmberError(f"Jina BERT with {config['position_embedding_type']} positions is not supported "
                             "(ember runs ALiBi)")
        if config.get("feed_forward_type", "geglu") != "geglu":
            raise EmberError(f"Jina BERT with a {config['feed_forward_type']} MLP is not supported (ember runs GEGLU)")
