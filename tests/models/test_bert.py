"""BERT against transformers: tiny random BertModels (written by `ember convert` with llama.cpp's
tensor names and keys) and all-MiniLM-L6-v2's real weights. Every token's final hidden state, and
the pooled, normalised embedding, must point where transformers' does: cosine >= 0.9999 per vector
(F32 weights; the F16 KV cache and ember's tanh GELU, as llama.cpp's, against BERT's erf GELU are
the differences)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from encoder_models import minilm_folder, minilm_gguf  # noqa: E402
from parity import randomize  # noqa: E402

from ember.convert import convert  # noqa: E402
from ember.engine.embed import Embedder  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402
from ember.tokenizer.tokenizer import Tokenizer  # noqa: E402

MIN_COSINE = 0.9999
CONFIGS = {
    "bert": dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=64, type_vocab_size=2),
    "bert-one-type": dict(vocab_size=200, hidden_size=96, num_hidden_layers=3, num_attention_heads=6,
                          intermediate_size=160, max_position_embeddings=48, type_vocab_size=1, layer_norm_eps=1e-5),
}
LENGTHS = (1, 5, 12, 24)  # 42 tokens: one run in either configuration


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory):
    """(ember Model, transformers model, token id lists) for one configuration."""
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**CONFIGS[request.param]), add_pooling_layer=False).eval()
    randomize(hf)
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    hf.save_pretrained(folder, safe_serialization=True)
    model = Model(convert(folder, folder.parent / "f32.gguf", "f32"), n_threads=2)
    rng = np.random.default_rng(3)
    inputs = [rng.integers(0, hf.config.vocab_size, n).tolist() for n in LENGTHS]
    yield model, hf, inputs
    model.close()


def hidden_states(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).last_hidden_state[0].double().numpy()


def test_every_tokens_hidden_state_equals_transformers(tiny):
    model, hf, inputs = tiny
    for embedding, ids in zip(Embedder(model, None, pooling="none", normalize=False).embed_tokens(inputs), inputs):
        assert embedding.vector.shape == (len(ids), hf.config.hidden_size)
        assert cosines(embedding.vector, hidden_states(hf, ids)).min() >= MIN_COSINE


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooled_embeddings_equal_transformers(tiny, pooling):
    model, hf, inputs = tiny
    for embedding, ids in zip(Embedder(model, None, pooling=pooling).embed_tokens(inputs), inputs):
        states = hidden_states(hf, ids)
        expected = {"mean": states.mean(0), "cls": states[0], "last": states[-1]}[pooling]
        assert abs(np.linalg.norm(embedding.vector) - 1) < 1e-5
        assert cosines(embedding.vector, expected) >= MIN_COSINE


def test_texts_in_one_run_embed_as_each_alone(tiny):
    model, _, inputs = tiny
    embedder = Embedder(model, None, pooling="mean")
    together = [e.vector for e in embedder.embed_tokens(inputs)]
    alone = [embedder.embed_tokens([ids])[0].vector for ids in inputs]
    assert len(embedder._groups([np.array(ids) for ids in inputs])) == 1
    np.testing.assert_allclose(np.stack(together), np.stack(alone), atol=1e-6)


def test_the_converted_file_says_what_llama_cpps_converter_says(tiny):
    model, hf, _ = tiny
    meta = model.gguf.metadata
    assert meta["bert.attention.causal"] is False
    assert meta["bert.context_length"] == hf.config.max_position_embeddings
    assert "bert.pooling_type" not in meta  # a plain checkpoint names no pooling
    assert model.gguf.tensors["token_types.weight"].shape[1] == hf.config.type_vocab_size
    assert model.is_encoder and model.n_out == hf.config.hidden_size


# -- real weights ---------------------------------------------------------------------------------

TEXTS = ["Hello, world!", "The quick brown fox jumps over the lazy dog.", "naïve café au lait",
         "東京は日本の首都です。", "Embeddings map text to vectors; similar texts land close together. " * 6]


@pytest.mark.model
def test_minilm_embeddings_equal_sentence_transformers_pipeline():
    """all-MiniLM-L6-v2 as sentence-transformers runs it: transformers, mean pooling, L2 normalisation."""
    folder = minilm_folder()
    model = Model(minilm_gguf(), n_threads=2)
    with model.gguf as f:
        embedder = Embedder(model, Tokenizer.from_gguf(f))
        assert embedder.pooling == "mean"  # modules.json -> 1_Pooling/config.json -> bert.pooling_type
        ours = embedder.embed(TEXTS)
    hf = transformers.AutoModel.from_pretrained(folder).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    for text, embedding in zip(TEXTS, ours):
        encoded = hf_tokenizer(text, return_tensors="pt")
        assert embedding.n_tokens == encoded["input_ids"].shape[1]
        with torch.no_grad():
            expected = hf(**encoded).last_hidden_state[0].mean(0).numpy()
        assert cosines(embedding.vector, expected) >= MIN_COSINE


# what llama.cpp's converter writes for all-MiniLM-L6-v2 (tests/fixtures/llama_cpp_convert, recorded
# with the tokenizer keys): among them tokenizer.ggml.pre, which it names by a hash of the
# tokenizer's ids ("jina-v2-en" for uncased BERT's vocabulary)
CONVERTER_RECORDS = {"all-minilm-l6-v2": lambda folder: minilm_folder()}


@pytest.mark.model
def test_ember_convert_writes_what_llama_cpps_converter_writes_for_minilm(tmp_path):
    from converter_record import assert_same_file, load_record, tokenizer_record

    record = load_record("all-minilm-l6-v2")
    assert record["metadata"]["tokenizer.ggml.pre"]["value"] == "jina-v2-en"
    assert_same_file(tokenizer_record(minilm_folder(), tmp_path / "ember.gguf"), record)
