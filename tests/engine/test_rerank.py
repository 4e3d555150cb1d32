"""Cross-encoder reranking against transformers: tiny random BertForSequenceClassification models
converted by `ember convert`, their class scores for query-document pairs equal to
AutoModelForSequenceClassification's logits (F32 weights; ember's F16 KV cache and tanh GELU are
the differences), the pairs tokenized as transformers' tokenizer pairs them."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from encoder_models import tiny_reranker_folder, tiny_reranker_gguf  # noqa: E402
from models.parity import rewritten  # noqa: E402

from ember.convert import convert  # noqa: E402
from ember.engine.embed import Embedder  # noqa: E402
from ember.engine.rerank import Reranker, ranked  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.tokenizer.tokenizer import Tokenizer  # noqa: E402

RTOL = 1e-3  # of the largest score
LABELS = {0: "irrelevant", 1: "partly", 2: "relevant"}
CONFIGS = {"one-score": {}, "three-classes": dict(num_labels=3, id2label=LABELS,
                                                  label2id={v: k for k, v in LABELS.items()})}
SEP = 2
LENGTHS = ((3, 9), (6, 20), (1, 1), (4, 6))  # query and document tokens of each pair: 62 in all


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory):
    """(ember Model, transformers model, pairs of (ids, token types)) for one configuration."""
    folder = tiny_reranker_folder(tmp_path_factory.mktemp(request.param) / "hf", **CONFIGS[request.param])
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    model = Model(convert(folder, folder.parent / "f32.gguf", "f32"), n_threads=2)
    rng = np.random.default_rng(7)
    pairs = []
    for n_query, n_document in LENGTHS:
        # the first token is the one the head reads: a different one each pair, so that the scores
        # differ by far more than the rounding (a random encoder changes it little by the others)
        first, query, document = (rng.integers(3, hf.config.vocab_size, n) for n in (1, n_query, n_document))
        ids = [*first, *query, SEP, *document, SEP]
        pairs.append((ids, [0] * (n_query + 2) + [1] * (n_document + 1)))
    yield model, hf, pairs
    model.close()


def scores_of(model, pairs, types=True) -> np.ndarray:
    found = Embedder(model, None).embed_tokens([ids for ids, _ in pairs],
                                               [t for _, t in pairs] if types else None)
    return np.stack([e.vector for e in found])


def transformers_logits(hf, pairs) -> np.ndarray:
    with torch.no_grad():
        return np.stack([hf(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0].numpy()
                         for ids, types in pairs])


def test_scores_equal_transformers_logits(tiny):
    model, hf, pairs = tiny
    expected = transformers_logits(hf, pairs)
    got = scores_of(model, pairs)
    assert model.ranks and got.shape == expected.shape == (len(pairs), hf.config.num_labels)
    assert np.ptp(expected[:, 0]) > 0.1 * np.abs(expected).max()  # the pairs score apart: not vacuous
    assert np.abs(got - expected).max() <= RTOL * np.abs(expected).max()


def test_the_documents_tokens_are_of_the_second_type(tiny):
    """As transformers gives a pair to BERT (llama.cpp gives every token type 0): without the types the
    scores are another function's."""
    model, hf, pairs = tiny
    expected = transformers_logits(hf, pairs)
    assert np.abs(scores_of(model, pairs, types=False) - expected).max() > 10 * RTOL * np.abs(expected).max()


def test_pairs_in_one_run_score_as_each_alone(tiny):
    model, _, pairs = tiny
    embedder = Embedder(model, None)
    assert len(embedder._groups([np.array(ids) for ids, _ in pairs])) == 1
    alone = np.concatenate([scores_of(model, [pair]) for pair in pairs])
    np.testing.assert_allclose(scores_of(model, pairs), alone, atol=1e-5)


def test_the_file_keeps_the_head_under_llama_cpps_names(tiny):
    model, hf, _ = tiny
    meta, tensors = model.gguf.metadata, model.gguf.tensors
    assert meta["bert.pooling_type"] == 4  # rank
    labels = meta.get("bert.classifier.output_labels")
    assert (list(labels) if labels is not None else None) == (
        [LABELS[i] for i in range(3)] if hf.config.num_labels == 3 else ["LABEL_0"])
    assert tensors["cls.weight"].shape == (64, 64) and tuple(tensors["cls.output.weight"].shape)[:2] == (
        64, hf.config.num_labels)
    declared = {gguf.TENSOR_NAMES[t].format(bid=il) + suffix for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.BERT]
                for il in range(model.hp.n_layer) for suffix in (".weight", ".bias")}
    assert set(tensors) <= declared


def test_a_file_without_the_pooler_scores_the_cls_state_as_llama_cpp_does(tiny, tmp_path):
    """llama.cpp's converter drops BERT's pooler and names no pooling: the head is found by its tensors,
    and the score is the classifier on the [CLS] state."""
    model, hf, pairs = tiny
    path = rewritten(model.gguf.path, tmp_path / "no-pooler.gguf", {"bert.pooling_type": None},
                     {"cls.weight": None, "cls.bias": None})
    bare = Model(path, n_threads=2)
    try:
        with torch.no_grad():
            expected = np.stack([hf.classifier(hf.bert(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor(
                [types])).last_hidden_state[:, 0])[0].numpy() for ids, types in pairs])
        got = scores_of(bare, pairs)
        assert bare.ranks
        assert np.abs(got - expected).max() <= RTOL * np.abs(expected).max()
    finally:
        bare.close()


def test_a_reranker_does_not_pool_embeddings(tiny):
    model, _, _ = tiny
    with pytest.raises(EmberError, match="is a reranker"):
        Embedder(model, None, pooling="mean")


def test_ranked_is_best_first_and_cut_to_top_n():
    from ember.engine.rerank import Score

    scores = [Score(0, 0.5, 3), Score(1, 2.0, 3), Score(2, -1.0, 3), Score(3, 2.0, 3)]
    assert [s.index for s in ranked(scores)] == [1, 3, 0, 2]
    assert [s.index for s in ranked(scores, top_n=2)] == [1, 3]
    assert ranked(scores, top_n=0) == []


# -- texts -----------------------------------------------------------------------------------------

QUERY = "How many people live in Berlin?"
DOCUMENTS = ["Berlin has a population of 3,520,031 registered inhabitants.",
             "New York City is famous for the Metropolitan Museum of Art.", "naïve café, 東京", "Berlin"]


@pytest.fixture(scope="module")
def reranker():
    model = Model(tiny_reranker_gguf(), n_threads=2)
    yield Reranker(Embedder(model, Tokenizer.from_gguf(model.gguf)))
    model.close()


@pytest.mark.model
def test_pairs_tokenize_as_transformers_tokenizer_pairs_them(reranker):
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_reranker_gguf().parent / "hf")
    for document in DOCUMENTS:
        encoded = hf_tokenizer(QUERY, document)
        assert reranker.pair(QUERY, document) == (encoded["input_ids"], encoded["token_type_ids"])


@pytest.mark.model
def test_texts_score_as_transformers_scores_them(reranker):
    folder = tiny_reranker_gguf().parent / "hf"
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    encoded = transformers.AutoTokenizer.from_pretrained(folder)([QUERY] * len(DOCUMENTS), DOCUMENTS,
                                                                 padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = hf(**encoded).logits[:, 0].numpy()
    scores = reranker.score(QUERY, DOCUMENTS)
    assert [s.index for s in scores] == list(range(len(DOCUMENTS)))
    assert [s.n_tokens for s in scores] == encoded["attention_mask"].sum(1).tolist()
    assert np.abs(np.array([s.score for s in scores]) - expected).max() <= RTOL * np.abs(expected).max()


@pytest.mark.model
def test_a_pair_longer_than_the_context_is_an_error_unless_truncated(reranker):
    long = "word " * 100  # the tiny model has 64 positions
    with pytest.raises(EmberError, match="document 1 is .* longer than the 64"):
        reranker.score(QUERY, ["short", long])
    assert reranker.score(QUERY, ["short", long], truncate=True)[1].n_tokens == 64


# -- a decoder's reranker (Qwen3-Reranker) ---------------------------------------------------------

YES, NO = 5, 9  # the tiny model's stand-ins for the ids of "yes" and "no"


@pytest.fixture(scope="module")
def tiny_qwen3_reranker(tmp_path_factory):
    """A random Qwen3ForCausalLM and its file as llama.cpp's converter writes a Qwen3-Reranker:
    pooling type rank, cls.output the LM head's rows of "yes" and "no"."""
    from models.parity import converted_random_model

    config = transformers.Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(config).eval()
    plain = converted_random_model(hf, tmp_path_factory.mktemp("qwen3-reranker") / "hf")
    head = hf.lm_head.weight.detach().numpy()[[YES, NO]]
    path = rewritten(plain, plain.parent / "reranker.gguf", {"qwen3.pooling_type": 4}, {"cls.output.weight": head})
    model = Model(path, n_ctx=128, n_threads=2)
    yield model, hf
    model.close()


def test_a_decoder_reranker_scores_the_softmax_of_its_answers_on_the_last_token(tiny_qwen3_reranker):
    model, hf = tiny_qwen3_reranker
    rng = np.random.default_rng(2)
    inputs = [rng.integers(0, 128, n).tolist() for n in (3, 11, 30)]
    found = Embedder(model, None).embed_tokens(inputs)
    with torch.no_grad():
        expected = [torch.softmax(hf(torch.tensor([ids])).logits[0, -1, [YES, NO]].double(), 0).numpy()
                    for ids in inputs]
    assert model.ranks and model.n_out == 2
    assert np.ptp([e[0] for e in expected]) > 0.05  # the inputs score apart
    np.testing.assert_allclose(np.stack([e.vector for e in found]), np.stack(expected), atol=2e-4)


def test_a_decoder_without_rank_pooling_is_no_reranker(tiny_qwen3_reranker, tmp_path):
    model, _ = tiny_qwen3_reranker
    plain = Model(rewritten(model.gguf.path, tmp_path / "plain.gguf", {"qwen3.pooling_type": None}), n_ctx=64,
                  n_threads=1)
    try:
        assert not plain.ranks and plain.n_out == 128
    finally:
        plain.close()
