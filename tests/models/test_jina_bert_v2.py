"""Jina BERT v2 against a numpy reference (transformers has no implementation of it): tiny random
files with the tensor names and metadata keys llama.cpp's converter writes for jina-embeddings-v2,
run by ember, give every token's final hidden state as the reference computes it (post-norm
layers, ALiBi's symmetric distance penalties with the slopes of the ALiBi paper, non-causal
attention with biases, GELU-gated MLPs, the gate fused into ffn_up or apart): cosine >= 0.9999 per
vector. The configurations switch on every optional piece: Q/K LayerNorms, the second attention
norm, a head count that is not a power of 2, and each form of the MLP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from encoder_models import write_encoder_gguf

from ember.engine.embed import Embedder
from ember.engine.runtime import Model
from ember.errors import GGUFError

N_EMBD, N_FF, N_LAYER, N_VOCAB, N_CTX, EPS = 48, 80, 2, 128, 64, 1e-12
MIN_COSINE = 0.9999
CONFIGS = {  # heads, MLP form ("fused": gate and up in ffn_up, "gate": ffn_gate apart, "plain": gelu(up)), norms
    "fused-qk-norms": dict(n_head=4, mlp="fused", qk_norm=True, norm_2=False),
    "gate-six-heads-norm-2": dict(n_head=6, mlp="gate", qk_norm=False, norm_2=True),
    "plain-three-heads": dict(n_head=3, mlp="plain", qk_norm=True, norm_2=True),
}


def random_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """numpy layout: [rows = outputs, columns = inputs], as GGUF stores them."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name, n=N_EMBD):
        return {f"{name}.weight": 1 + w(n), f"{name}.bias": w(n)}

    weights = {"token_embd.weight": w(N_VOCAB, N_EMBD, scale=1.0), "token_types.weight": w(2, N_EMBD),
               **norm("token_embd_norm")}
    up_rows = 2 * N_FF if config["mlp"] == "fused" else N_FF
    for il in range(N_LAYER):
        p = f"blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            weights.update({f"{p}.{name}.weight": w(N_EMBD, N_EMBD), f"{p}.{name}.bias": w(N_EMBD)})
        weights.update({f"{p}.ffn_up.weight": w(up_rows, N_EMBD), f"{p}.ffn_up.bias": w(up_rows),
                        f"{p}.ffn_down.weight": w(N_EMBD, N_FF), f"{p}.ffn_down.bias": w(N_EMBD),
                        **norm(f"{p}.attn_output_norm"), **norm(f"{p}.layer_output_norm")})
        if config["mlp"] == "gate":
            weights[f"{p}.ffn_gate.weight"] = w(N_FF, N_EMBD)
        if config["qk_norm"]:
            weights.update({**norm(f"{p}.attn_q_norm"), **norm(f"{p}.attn_k_norm")})
        if config["norm_2"]:
            weights.update(norm(f"{p}.attn_norm_2"))
    return weights


def write_jina_bert_v2(path, config: dict, weights: dict[str, np.ndarray]) -> None:
    write_encoder_gguf(path, "jina-bert-v2", {
        "block_count": N_LAYER, "context_length": N_CTX, "embedding_length": N_EMBD, "feed_forward_length": N_FF,
        "attention.head_count": config["n_head"], "attention.layer_norm_epsilon": EPS, "pooling_type": 1,
        "vocab_size": N_VOCAB}, weights)


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


def gelu(x):  # the exact (erf) GELU the checkpoints use
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def alibi_slopes(n_head: int) -> np.ndarray:
    """The ALiBi paper's slopes (as Jina BERT's code computes them): 2^(-8 (i + 1) / n) for a power
    of 2, else those of the power of 2 below and every other one of twice it."""
    def power_of_2(n):
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    below = 2 ** math.floor(math.log2(n_head))
    return np.array(power_of_2(below) + power_of_2(2 * below)[0::2][:n_head - below])


def reference(config: dict, weights, ids, alibi: bool = True) -> np.ndarray:
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    n_head = config["n_head"]
    slopes = alibi_slopes(n_head) if alibi else np.zeros(n_head)
    head_dim = N_EMBD // n_head
    n = len(ids)
    distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    x = layer_norm(W["token_embd.weight"][ids] + W["token_types.weight"][0], W["token_embd_norm.weight"],
                   W["token_embd_norm.bias"])
    for il in range(N_LAYER):
        p = f"blk.{il}"

        def linear(h, name):
            return h @ W[f"{p}.{name}.weight"].T + W.get(f"{p}.{name}.bias", 0)

        q, k, v = linear(x, "attn_q"), linear(x, "attn_k"), linear(x, "attn_v")
        if config["qk_norm"]:
            q = layer_norm(q, W[f"{p}.attn_q_norm.weight"], W[f"{p}.attn_q_norm.bias"])
            k = layer_norm(k, W[f"{p}.attn_k_norm.weight"], W[f"{p}.attn_k_norm.bias"])
        heads = []
        for h, slope in enumerate(slopes):
            cols = slice(h * head_dim, (h + 1) * head_dim)
            scores = q[:, cols] @ k[:, cols].T / np.sqrt(head_dim) - slope * distance
            e = np.exp(scores - scores.max(1, keepdims=True))
            heads.append((e / e.sum(1, keepdims=True)) @ v[:, cols])
        h = layer_norm(x + linear(np.concatenate(heads, 1), "attn_output"), W[f"{p}.attn_output_norm.weight"],
                       W[f"{p}.attn_output_norm.bias"])
        if config["norm_2"]:
            h = layer_norm(h + x, W[f"{p}.attn_norm_2.weight"], W[f"{p}.attn_norm_2.bias"])
        up = linear(h, "ffn_up")
        if config["mlp"] == "fused":
            gated = gelu(up[:, :N_FF]) * up[:, N_FF:]
        elif config["mlp"] == "gate":
            gated = gelu(linear(h, "ffn_gate")) * up
        else:
            gated = gelu(up)
        x = layer_norm(h + linear(gated, "ffn_down"), W[f"{p}.layer_output_norm.weight"],
                       W[f"{p}.layer_output_norm.bias"])
    return x


def cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory):
    config = CONFIGS[request.param]
    weights = random_weights(config)
    path = tmp_path_factory.mktemp(request.param) / "jina-bert-v2-f32.gguf"
    write_jina_bert_v2(path, config, weights)
    model = Model(path, n_threads=2)
    yield model, config, weights
    model.close()


def test_every_tokens_hidden_state_equals_the_reference(tiny):
    model, config, weights = tiny
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, N_VOCAB, n).tolist() for n in (1, 6, 17, 33)]
    found = Embedder(model, None, pooling="none", normalize=False).embed_tokens(inputs)
    for embedding, ids in zip(found, inputs):
        assert cosines(embedding.vector, reference(config, weights, ids)).min() >= MIN_COSINE


def test_the_distance_penalties_matter(tiny):
    """Without ALiBi the reference is another function: the check above can fail."""
    model, config, weights = tiny
    ids = list(range(5, 38))
    (embedding,) = Embedder(model, None, pooling="none", normalize=False).embed_tokens([ids])
    assert cosines(embedding.vector, reference(config, weights, ids, alibi=False)).min() < 0.999


def test_the_file_pools_by_mean(tiny):
    model, config, weights = tiny
    ids = list(range(10, 30))
    (embedding,) = Embedder(model, None).embed_tokens([ids])
    assert cosines(embedding.vector, reference(config, weights, ids).mean(0)) >= MIN_COSINE


def test_an_up_projection_of_another_width_is_an_error_naming_it(tmp_path):
    config = CONFIGS["plain-three-heads"]
    weights = random_weights(config)
    weights["blk.0.ffn_up.weight"] = np.zeros((N_FF + 3, N_EMBD), np.float32)
    weights["blk.0.ffn_up.bias"] = np.zeros(N_FF + 3, np.float32)
    write_jina_bert_v2(tmp_path / "bad.gguf", config, weights)
    with pytest.raises(GGUFError, match="blk.0.ffn_up.weight has 83 rows"):
        Model(tmp_path / "bad.gguf", n_threads=1)


def test_a_reranker_scores_tanh_of_its_one_row_head_on_cls(tmp_path):
    """jina-reranker-v1 as llama.cpp's converter writes it: the classifier as cls (one row), no
    pooling type; llama.cpp's rank pooling gives tanh(cls([CLS]))."""
    config = CONFIGS["fused-qk-norms"]
    weights = random_weights(config)
    rng = np.random.default_rng(4)
    weights.update({"cls.weight": rng.standard_normal((1, N_EMBD)).astype(np.float32) * 0.3,
                    "cls.bias": np.array([0.1], np.float32)})
    path = tmp_path / "reranker.gguf"
    write_encoder_gguf(path, "jina-bert-v2", {
        "block_count": N_LAYER, "context_length": N_CTX, "embedding_length": N_EMBD, "feed_forward_length": N_FF,
        "attention.head_count": config["n_head"], "attention.layer_norm_epsilon": EPS, "vocab_size": N_VOCAB},
        weights)
    model = Model(path, n_threads=2)
    try:
        inputs = [list(range(3, 3 + n)) for n in (4, 9, 20)]
        scores = [e.vector for e in Embedder(model, None).embed_tokens(inputs)]
        expected = [np.tanh(reference(config, weights, ids)[0] @ weights["cls.weight"][0] + 0.1) for ids in inputs]
        assert model.ranks and model.n_out == 1
        np.testing.assert_allclose(np.concatenate(scores), expected, atol=2e-4)
    finally:
        model.close()


# -- ember convert: JinaBertModel checkpoints --------------------------------------------------------

# llama.cpp's tensors -> Jina's checkpoint names (jina-embeddings-v2-base-en's layout)
HF_NAMES = {"token_embd": "embeddings.word_embeddings", "token_types": "embeddings.token_type_embeddings",
            "token_embd_norm": "embeddings.LayerNorm", "attn_q": "attention.self.query",
            "attn_k": "attention.self.key", "attn_v": "attention.self.value",
            "attn_q_norm": "attention.self.layer_norm_q", "attn_k_norm": "attention.self.layer_norm_k",
            "attn_output": "attention.output.dense", "attn_output_norm": "attention.output.LayerNorm",
            "ffn_up": "mlp.gated_layers", "ffn_down": "mlp.wo", "layer_output_norm": "mlp.layernorm"}
CHECKPOINT_CONFIG = CONFIGS["fused-qk-norms"]


def jina_checkpoint(folder, weights: dict[str, np.ndarray], tokenizer=None):
    """`weights` (random_weights' names, unbiased_up) saved as a JinaBertModel folder: Jina's tensor
    names, its config, mean pooling in modules.json, and the files of a WordPiece `tokenizer` folder
    if given."""
    import json
    import shutil

    from safetensors.numpy import save_file

    tensors = {}
    for name, values in weights.items():
        parts = name.split(".")
        if parts[0] == "blk":
            tensors[f"encoder.layer.{parts[1]}.{HF_NAMES[parts[2]]}.{parts[3]}"] = values
        else:
            tensors[f"{HF_NAMES[parts[0]]}.{parts[1]}"] = values
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    n_vocab = weights["token_embd.weight"].shape[0]
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["JinaBertModel"], "model_type": "bert", "vocab_size": n_vocab, "hidden_size": N_EMBD,
        "num_hidden_layers": N_LAYER, "num_attention_heads": CHECKPOINT_CONFIG["n_head"], "intermediate_size": N_FF,
        "max_position_embeddings": N_CTX, "type_vocab_size": 2, "layer_norm_eps": EPS, "hidden_act": "gelu",
        "position_embedding_type": "alibi", "feed_forward_type": "geglu"}))
    (folder / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                     "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    if tokenizer is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
            shutil.copy(tokenizer / name, folder / name)
    return folder


def unbiased_up(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Without the fused gate and up's bias, which Jina's gated_layers has not."""
    return {name: values for name, values in weights.items() if not name.endswith("ffn_up.bias")}


def minilm_sized_weights() -> dict[str, np.ndarray]:
    """random_weights with a token embedding of all-MiniLM's (BERT's uncased) 30,522 tokens."""
    weights = unbiased_up(random_weights(CHECKPOINT_CONFIG))
    weights["token_embd.weight"] = np.random.default_rng(5).standard_normal((30522, N_EMBD)).astype(np.float32)
    return weights


def minilm_jina_checkpoint(folder):
    from encoder_models import minilm_folder

    return jina_checkpoint(folder / "hf", minilm_sized_weights(), minilm_folder())


CONVERTER_RECORDS = {"jina-bert-v2": minilm_jina_checkpoint}


def test_a_converted_checkpoint_runs_as_the_reference(tmp_path):
    from ember.convert import convert

    weights = unbiased_up(random_weights(CHECKPOINT_CONFIG))
    model = Model(convert(jina_checkpoint(tmp_path / "hf", weights), tmp_path / "f32.gguf", "f32"), n_threads=2)
    try:
        assert model.gguf.metadata["jina-bert-v2.pooling_type"] == 1
        inputs = [list(range(7, 7 + n)) for n in (3, 21)]
        found = Embedder(model, None, pooling="none", normalize=False).embed_tokens(inputs)
        for embedding, ids in zip(found, inputs):
            assert cosines(embedding.vector, reference(CHECKPOINT_CONFIG, weights, ids)).min() >= MIN_COSINE
    finally:
        model.close()


@pytest.mark.model
def test_ember_convert_writes_what_llama_cpps_converter_writes(tmp_path):
    """Every jina-bert-v2.* and tokenizer.* key and every tensor, tokenizer.ggml.pre jina-v2-en among them."""
    from converter_record import assert_same_file, load_record, tokenizer_record

    record = load_record("jina-bert-v2")
    assert record["metadata"]["tokenizer.ggml.pre"]["value"] == "jina-v2-en"
    assert_same_file(tokenizer_record(minilm_jina_checkpoint(tmp_path), tmp_path / "ember.gguf"), record)
