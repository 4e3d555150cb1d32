"""Nomic BERT against a numpy reference (transformers has no implementation of it): a tiny random
file with the tensor names and metadata keys llama.cpp's converter writes for nomic-embed-text,
run by ember, gives every token's final hidden state as the reference computes it (post-norm
layers, rotary positions in the NeoX layout, a fused QKV projection, SwiGLU, non-causal
attention): cosine >= 0.9999 per vector."""

from __future__ import annotations

import numpy as np
import pytest
from encoder_models import write_encoder_gguf

from ember.engine.embed import Embedder
from ember.engine.runtime import Model

N_EMBD, N_HEAD, N_FF, N_LAYER, N_VOCAB, N_CTX, ROPE_BASE, EPS = 64, 4, 96, 2, 128, 64, 1000.0, 1e-12
HEAD_DIM = N_EMBD // N_HEAD
MIN_COSINE = 0.9999


def random_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """numpy layout: [rows = outputs, columns = inputs], as GGUF stores them."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {"token_embd.weight": w(N_VOCAB, N_EMBD, scale=1.0), "token_types.weight": w(2, N_EMBD),
               "token_embd_norm.weight": 1 + w(N_EMBD), "token_embd_norm.bias": w(N_EMBD)}
    for il in range(N_LAYER):
        p = f"blk.{il}"
        weights.update({
            f"{p}.attn_qkv.weight": w(3 * N_EMBD, N_EMBD), f"{p}.attn_output.weight": w(N_EMBD, N_EMBD),
            f"{p}.attn_output_norm.weight": 1 + w(N_EMBD), f"{p}.attn_output_norm.bias": w(N_EMBD),
            f"{p}.ffn_up.weight": w(N_FF, N_EMBD), f"{p}.ffn_gate.weight": w(N_FF, N_EMBD),
            f"{p}.ffn_down.weight": w(N_EMBD, N_FF),
            f"{p}.layer_output_norm.weight": 1 + w(N_EMBD), f"{p}.layer_output_norm.bias": w(N_EMBD)})
    return weights


def write_nomic_bert(path, weights) -> None:
    write_encoder_gguf(path, "nomic-bert", {
        "block_count": N_LAYER, "context_length": N_CTX, "embedding_length": N_EMBD, "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD, "attention.layer_norm_epsilon": EPS, "rope.freq_base": ROPE_BASE,
        "pooling_type": 1, "vocab_size": N_VOCAB}, weights)


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


def rope_neox(x):
    """x [n_tokens, n_heads * head_dim]: each head's halves (i, i + d/2) rotated by position * base^(-2i/d)."""
    n = x.shape[0]
    x = x.reshape(n, -1, HEAD_DIM)
    half = HEAD_DIM // 2
    angle = np.arange(n)[:, None] * ROPE_BASE ** (-np.arange(half) * 2 / HEAD_DIM)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1).reshape(n, -1)


def reference(weights, ids) -> np.ndarray:
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    x = W["token_embd.weight"][ids] + W["token_types.weight"][0]
    x = layer_norm(x, W["token_embd_norm.weight"], W["token_embd_norm.bias"])
    for il in range(N_LAYER):
        p = f"blk.{il}"
        q, k, v = np.split(x @ W[f"{p}.attn_qkv.weight"].T, 3, axis=1)
        q, k = rope_neox(q), rope_neox(k)
        heads = []
        for h in range(N_HEAD):
            cols = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
            scores = q[:, cols] @ k[:, cols].T / np.sqrt(HEAD_DIM)
            p_ = np.exp(scores - scores.max(1, keepdims=True))
            heads.append((p_ / p_.sum(1, keepdims=True)) @ v[:, cols])
        x = layer_norm(x + np.concatenate(heads, 1) @ W[f"{p}.attn_output.weight"].T,
                       W[f"{p}.attn_output_norm.weight"], W[f"{p}.attn_output_norm.bias"])
        gate, up = x @ W[f"{p}.ffn_gate.weight"].T, x @ W[f"{p}.ffn_up.weight"].T
        mlp = (gate / (1 + np.exp(-gate)) * up) @ W[f"{p}.ffn_down.weight"].T
        x = layer_norm(x + mlp, W[f"{p}.layer_output_norm.weight"], W[f"{p}.layer_output_norm.bias"])
    return x


def cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    weights = random_weights()
    path = tmp_path_factory.mktemp("nomic") / "nomic-bert-f32.gguf"
    write_nomic_bert(path, weights)
    model = Model(path, n_threads=2)
    yield model, weights
    model.close()


def test_every_tokens_hidden_state_equals_the_reference(tiny):
    model, weights = tiny
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, N_VOCAB, n).tolist() for n in (1, 6, 17, 33)]
    found = Embedder(model, None, pooling="none", normalize=False).embed_tokens(inputs)
    for embedding, ids in zip(found, inputs):
        assert cosines(embedding.vector, reference(weights, ids)).min() >= MIN_COSINE


def test_the_file_pools_by_mean(tiny):
    model, weights = tiny
    ids = list(range(10, 30))
    (embedding,) = Embedder(model, None).embed_tokens([ids])
    assert cosines(embedding.vector, reference(weights, ids).mean(0)) >= MIN_COSINE


# -- ember convert --------------------------------------------------------------------------------

HF_NAMES = {"token_embd": "embeddings.word_embeddings", "token_types": "embeddings.token_type_embeddings",
            "token_embd_norm": "emb_ln", "attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "ffn_up": "mlp.fc11",
            "ffn_gate": "mlp.fc12", "ffn_down": "mlp.fc2", "attn_output_norm": "norm1", "layer_output_norm": "norm2"}
CONFIG = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function": "swiglu",
          "causal": False, "layer_norm_epsilon": EPS, "max_trained_positions": 2048, "mlp_fc1_bias": False,
          "mlp_fc2_bias": False, "n_embd": N_EMBD, "n_head": N_HEAD, "n_inner": N_FF, "n_layer": N_LAYER,
          "n_positions": 8192, "prenorm": False, "qkv_proj_bias": False, "rotary_emb_base": ROPE_BASE,
          "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
          "type_vocab_size": 2, "vocab_size": N_VOCAB}
# the keys llama.cpp's converter writes for a nomic-embed-text checkpoint (besides general.* and tokenizer.*)
LLAMA_CPP_KEYS = {"block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                  "rope.freq_base", "attention.layer_norm_epsilon", "attention.key_length", "attention.value_length",
                  "attention.causal"}


def hf_name(name: str) -> str:
    """The checkpoint's name of a GGUF tensor (encoder.layers.N.attn.Wqkv.weight, emb_ln.bias, ...)."""
    parts = name.split(".")
    if parts[0] == "blk":
        return f"encoder.layers.{parts[1]}.{HF_NAMES[parts[2]]}.{parts[3]}"
    return f"{HF_NAMES[parts[0]]}.{parts[1]}"


def save_checkpoint(folder, weights, **config) -> None:
    import json

    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({hf_name(name): values for name, values in weights.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(CONFIG | config))


def test_a_converted_checkpoint_runs_as_the_reference(tmp_path):
    from ember.convert import convert

    weights = random_weights(seed=5)
    save_checkpoint(tmp_path / "hf", weights)
    model = Model(convert(tmp_path / "hf", tmp_path / "f32.gguf", "f32"), n_threads=2)
    try:
        meta = model.gguf.metadata
        assert {k.removeprefix("nomic-bert.") for k in meta if k.startswith("nomic-bert.")} == LLAMA_CPP_KEYS
        assert meta["nomic-bert.context_length"] == 2048  # nomic-embed-text's training context
        assert set(model.gguf.tensors) == set(weights)
        ids = list(range(7, 40))
        (embedding,) = Embedder(model, None, pooling="none", normalize=False).embed_tokens([ids])
        assert cosines(embedding.vector, reference(weights, ids)).min() >= MIN_COSINE
    finally:
        model.close()


@pytest.mark.parametrize("change", [dict(prenorm=True), dict(qkv_proj_bias=True), dict(rotary_emb_fraction=0.5),
                                    dict(moe_every_n_layers=2), dict(n_positions=4096)])
def test_configurations_the_graph_does_not_compute_are_refused(tmp_path, change):
    from ember.convert import convert
    from ember.errors import EmberError

    save_checkpoint(tmp_path / "hf", random_weights(), **change)
    with pytest.raises(EmberError, match=next(iter(change)) if "moe" not in next(iter(change)) else "experts"):
        convert(tmp_path / "hf", tmp_path / "f32.gguf", "f32")
