"""ember.engine.embed: pooling as the file says, decoder embeddings against transformers, batching,
and the errors of bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from encoder_models import minilm_gguf  # noqa: E402
from models.parity import converted_random_model  # noqa: E402

from ember.engine.embed import Embedder, file_pooling  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402
from ember.errors import EmberError, EmberWarning  # noqa: E402
from ember.gguf import GGUFWriter, open_gguf  # noqa: E402
from ember.hub import resolve_model  # noqa: E402
from ember.tokenizer.tokenizer import Tokenizer  # noqa: E402

MIN_COSINE = 0.9999


def cosine(a, b) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random LlamaForCausalLM and its converted file, run with embeddings=True."""
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    path = converted_random_model(hf, tmp_path_factory.mktemp("llama") / "hf")
    model = Model(path, n_ctx=128, n_threads=2, n_seq=4, n_batch=32, embeddings=True)
    yield model, hf
    model.close()


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_decoder_embeddings_are_its_final_normed_hidden_states(tiny_llama, pooling):
    model, hf = tiny_llama
    rng = np.random.default_rng(5)
    inputs = [rng.integers(0, 256, n).tolist() for n in (3, 9, 17, 60)]  # 60 > n_batch: run alone, chunked
    embedder = Embedder(model, None, pooling=pooling)
    for embedding, ids in zip(embedder.embed_tokens(inputs), inputs):
        with torch.no_grad():
            states = hf.model(torch.tensor([ids])).last_hidden_state[0].numpy()
        expected = states.mean(0) if pooling == "mean" else states[-1]
        assert cosine(embedding.vector, expected) >= MIN_COSINE


def test_a_generation_model_without_pooling_metadata_warns_which_pooling_it_uses(tiny_llama):
    model, _ = tiny_llama
    with pytest.warns(EmberWarning, match="no llama.pooling_type .*mean pooling"):
        embedder = Embedder(model, None, name="tiny")
    assert embedder.pooling == "mean"


def test_a_model_built_for_logits_is_refused():
    model = Model(resolve_model("smollm2-135m"), n_ctx=64, n_threads=1)
    with pytest.raises(EmberError, match="embeddings=True"):
        Embedder(model, None)


def write_pooling(tmp_path, value) -> dict:
    path = tmp_path / "p.gguf"
    writer = GGUFWriter(path, "bert")
    writer.add("bert.pooling_type", value)
    writer.write()
    with open_gguf(path) as f:
        return f


@pytest.mark.parametrize("value, pooling", [(0, "none"), (1, "mean"), (2, "cls"), (3, "last"), (4, "rank")])
def test_file_pooling_reads_llama_cpps_pooling_types(tmp_path, value, pooling):
    assert file_pooling(write_pooling(tmp_path, value)) == pooling


def test_an_unknown_pooling_type_is_an_error_naming_it(tmp_path):
    with pytest.raises(EmberError, match="unknown pooling type 9"):
        file_pooling(write_pooling(tmp_path, 9))


@pytest.fixture(scope="module")
def minilm():
    model = Model(minilm_gguf(), n_threads=2)
    yield Embedder(model, Tokenizer.from_gguf(model.gguf))
    model.close()


@pytest.mark.model
def test_rank_pooling_is_refused_naming_it(minilm):
    with pytest.raises(EmberError, match="reranker"):
        Embedder(minilm.model, minilm.tokenizer, pooling="rank")


@pytest.mark.model
def test_an_input_longer_than_the_context_is_an_error_unless_truncated(minilm):
    text = "word " * 600
    with pytest.raises(EmberError, match="longer than the 512"):
        minilm.embed([text])
    assert minilm.embed([text], truncate=True)[0].n_tokens == 512


@pytest.mark.model
def test_an_empty_input_is_an_error(minilm):
    with pytest.raises(EmberError, match="empty input"):
        minilm.embed_tokens([[]])


@pytest.mark.model
def test_many_short_texts_share_runs(minilm):
    texts = [f"sentence number {i}" for i in range(32)]
    groups = minilm._groups([np.array(minilm.tokenize(t)) for t in texts])
    assert len(groups) == 2  # 16 sequence slots a run
    vectors = [e.vector for e in minilm.embed(texts)]
    assert cosine(vectors[3], minilm.embed([texts[3]])[0].vector) > 0.999999
