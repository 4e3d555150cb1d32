"""XLM-RoBERTa (bge-m3, multilingual-e5, bge-reranker-v2-m3) against transformers: a tiny random
XLMRobertaModel and XLMRobertaForSequenceClassification with the Unigram vocabulary of
fixtures/unigram.model (sentencepiece.bpe.model beside transformers' own tokenizer files, as the
Hugging Face repositories ship them), converted to F32 by `ember convert`.

- ember's tokenizer gives transformers' tokenizer's ids, for single texts and for pairs;
- every token's final hidden state and the pooled, normalised embeddings point where
  transformers' do: cosine >= 0.9999 per vector (as for BERT, tests/models/test_bert.py);
- the reranker's scores for query-document pairs equal transformers' logits (the same order,
  each within 1% of the scores' spread);
- `ember convert` writes what llama.cpp's converter writes (tests/fixtures/llama_cpp_convert,
  recorded with the tokenizer keys by make_llama_cpp_convert_fixtures.py from CONVERTER_RECORDS:
  the position embedding without its first pad_token_id + 1 rows, the "t5" vocabulary, from
  sentencepiece.bpe.model or, where the folder has none, tokenizer.json), ember's rank pooling type aside; with EMBER_LLAMA_CPP naming a llama.cpp source tree, the file its
  converter writes from the random checkpoints gives ember the same embeddings and scores; with
  EMBER_LLAMA_CPP_BIN naming a folder of llama.cpp's binaries, llama-tokenize and llama-embedding
  give ember's ids and embeddings on the file `ember convert` writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from converter_record import assert_same_file, llama_cpp_convert, load_record, patterned, tokenizer_record  # noqa: E402
from parity import LLAMA_CPP, randomize  # noqa: E402
from tokenizer_support import UNIGRAM_MODEL  # noqa: E402

from ember.convert import convert  # noqa: E402
from ember.engine.embed import Embedder  # noqa: E402
from ember.engine.rerank import Reranker  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402
from ember.tokenizer.tokenizer import Tokenizer  # noqa: E402

MIN_COSINE = 0.9999
SPREAD_RTOL = 0.01
N_POSITIONS = 64
# unigram.model's 1627 pieces, one id later from 3 on (fairseq's), and <mask>: 1629 ids
CONFIG = dict(vocab_size=1629, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=N_POSITIONS + 2, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
              eos_token_id=2, layer_norm_eps=1e-5)
TEXTS = ["Hello, world!", "The quick brown fox jumps over the lazy dog.", "naïve café résumé",
         "東京は日本の首都です。人口は約1400万人です。", "ＡＢＣ ｶﾀｶﾅ 半角カナ", "x",
         "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt. " * 2]
QUERY = "what is the capital of Japan?"
DOCUMENTS = ["東京は日本の首都です。", "The cat sat on the mat.", "Tokyo is the capital of Japan.", "x"]
# the reranker's head and attention drawn larger, so that <s>'s state, which the head reads, takes
# enough of the documents' for their scores to spread far beyond ember's rounding
HEAD_STD = {"classifier.dense.weight": 0.1, "classifier.out_proj.weight": 1.0, "attention.self.query.weight": 0.5,
            "attention.self.key.weight": 0.5, "attention.self.value.weight": 0.5,
            "attention.output.dense.weight": 0.5}


def checkpoint(folder: Path, classifier: bool = False, weights: str = "random", sentencepiece: bool = True) -> Path:
    """The tiny model (random weights as parity.randomize draws them, or converter_record's
    pattern) and its tokenizer, saved in `folder`/hf; without `sentencepiece`, only transformers'
    tokenizer files (tokenizer.json, no sentencepiece.bpe.model)."""
    torch.manual_seed(0)
    config = transformers.XLMRobertaConfig(**CONFIG, **({"num_labels": 1} if classifier else {}))
    hf = (transformers.XLMRobertaForSequenceClassification(config) if classifier
          else transformers.XLMRobertaModel(config)).eval()
    if weights == "patterned":
        patterned(hf)
    else:
        randomize(hf)
        generator = torch.Generator().manual_seed(99)
        with torch.no_grad():
            for name, param in hf.named_parameters():
                std = next((v for k, v in HEAD_STD.items() if name.endswith(k)), None)
                if classifier and std is not None:
                    param.copy_(torch.randn(param.shape, generator=generator) * std)
    hf_dir = folder / "hf"
    hf.save_pretrained(hf_dir, safe_serialization=True)
    shutil.copy(UNIGRAM_MODEL, hf_dir / "sentencepiece.bpe.model")
    transformers.XLMRobertaTokenizer.from_pretrained(hf_dir).save_pretrained(hf_dir)
    if not sentencepiece:
        (hf_dir / "sentencepiece.bpe.model").unlink()
    return hf_dir


CONVERTER_RECORDS = {
    "xlm-roberta": lambda folder: checkpoint(folder, weights="patterned"),
    "xlm-roberta-classifier": lambda folder: checkpoint(folder, classifier=True, weights="patterned"),
    "xlm-roberta-tokenizer-json": lambda folder: checkpoint(folder, weights="patterned", sentencepiece=False),
}
LEFT_OUT = {"xlm-roberta-classifier": ("bert.pooling_type",)}  # ember's rank pooling


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """(ember Model, its tokenizer, transformers model, transformers tokenizer)."""
    hf_dir = checkpoint(tmp_path_factory.mktemp("xlm-roberta"))
    model = Model(convert(hf_dir, hf_dir.parent / "f32.gguf", "f32"), n_threads=2)
    yield model, Tokenizer.from_gguf(model.gguf), transformers.XLMRobertaModel.from_pretrained(hf_dir).eval(), \
        transformers.AutoTokenizer.from_pretrained(hf_dir)
    model.close()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """(ember Reranker, transformers model, transformers tokenizer)."""
    hf_dir = checkpoint(tmp_path_factory.mktemp("xlm-roberta-reranker"), classifier=True)
    model = Model(convert(hf_dir, hf_dir.parent / "f32.gguf", "f32"), n_threads=2)
    yield Reranker(Embedder(model, Tokenizer.from_gguf(model.gguf))), \
        transformers.XLMRobertaForSequenceClassification.from_pretrained(hf_dir).eval(), \
        transformers.AutoTokenizer.from_pretrained(hf_dir)
    model.close()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def assert_same_scores(scores: np.ndarray, expected: np.ndarray) -> None:
    """The documents in transformers' order, each score within SPREAD_RTOL of the scores' spread
    (which the head's bias sets apart from 0: the spread is what ranks)."""
    assert np.argsort(scores).tolist() == np.argsort(expected).tolist()
    assert np.abs(scores - expected).max() <= SPREAD_RTOL * np.ptp(expected)


def hidden_states(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).last_hidden_state[0].double().numpy()


def test_texts_tokenize_as_transformers_tokenizer_does(encoder):
    _, tokenizer, _, hf_tokenizer = encoder
    for text in TEXTS:
        assert tokenizer.encode(text) == hf_tokenizer(text)["input_ids"], text


def test_every_tokens_hidden_state_equals_transformers(encoder):
    model, tokenizer, hf, _ = encoder
    inputs = [tokenizer.encode(text) for text in TEXTS]
    assert max(map(len, inputs)) >= 40  # positions well past the offset rows
    for embedding, ids in zip(Embedder(model, None, pooling="none", normalize=False).embed_tokens(inputs), inputs):
        assert cosines(embedding.vector, hidden_states(hf, ids)).min() >= MIN_COSINE


@pytest.mark.parametrize("pooling", ["cls", "mean"])  # bge-m3's and multilingual-e5's
def test_pooled_embeddings_equal_transformers(encoder, pooling):
    model, tokenizer, hf, _ = encoder
    for text, embedding in zip(TEXTS, Embedder(model, tokenizer, pooling=pooling).embed(TEXTS)):
        states = hidden_states(hf, tokenizer.encode(text))
        assert abs(np.linalg.norm(embedding.vector) - 1) < 1e-5
        assert cosines(embedding.vector, states[0] if pooling == "cls" else states.mean(0)) >= MIN_COSINE


def test_the_position_embedding_starts_after_the_padding_rows(encoder):
    model, _, hf, _ = encoder
    meta = model.gguf.metadata
    assert meta["bert.context_length"] == N_POSITIONS and meta["tokenizer.ggml.model"] == "t5"
    rows = model.gguf.tensors["position_embd.weight"]
    assert tuple(rows.shape) == (CONFIG["hidden_size"], N_POSITIONS)


def test_pairs_tokenize_as_transformers_tokenizer_pairs_them(reranker):
    ours, _, hf_tokenizer = reranker
    for document in DOCUMENTS:
        assert ours.pair(QUERY, document)[0] == hf_tokenizer(QUERY, document)["input_ids"]  # <s> q </s></s> d </s>


def test_rerank_scores_equal_transformers_logits(reranker):
    ours, hf, hf_tokenizer = reranker
    encoded = hf_tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = hf(**encoded).logits[:, 0].numpy()
    scores = np.array([s.score for s in ours.score(QUERY, DOCUMENTS)])
    assert_same_scores(scores, expected)


@pytest.mark.parametrize("name", sorted(CONVERTER_RECORDS))
def test_ember_convert_writes_what_llama_cpps_converter_writes(name, tmp_path):
    ours = tokenizer_record(CONVERTER_RECORDS[name](tmp_path), tmp_path / "ember.gguf")
    assert_same_file(ours, load_record(name), left_out=LEFT_OUT.get(name, ()))


@pytest.mark.skipif(LLAMA_CPP is None, reason="EMBER_LLAMA_CPP names no llama.cpp source tree")
@pytest.mark.parametrize("name", sorted(CONVERTER_RECORDS))
def test_llama_cpps_converter_still_writes_the_record(name, tmp_path):
    assert tokenizer_record(CONVERTER_RECORDS[name](tmp_path), tmp_path / "llama.cpp.gguf", LLAMA_CPP) == load_record(name)


@pytest.mark.skipif(LLAMA_CPP is None, reason="EMBER_LLAMA_CPP names no llama.cpp source tree")
def test_llama_cpps_file_embeds_as_transformers(encoder, tmp_path):
    _, tokenizer, hf, _ = encoder
    file = llama_cpp_convert(LLAMA_CPP, checkpoint(tmp_path), tmp_path / "llama.cpp.gguf")
    theirs = Model(file, n_threads=2)
    try:
        found = Embedder(theirs, Tokenizer.from_gguf(theirs.gguf), pooling="cls").embed(TEXTS)
    finally:
        theirs.close()
    for text, embedding in zip(TEXTS, found):
        assert cosines(embedding.vector, hidden_states(hf, tokenizer.encode(text))[0]) >= MIN_COSINE


@pytest.mark.skipif(LLAMA_CPP is None, reason="EMBER_LLAMA_CPP names no llama.cpp source tree")
def test_llama_cpps_file_reranks_as_transformers(reranker, tmp_path):
    ours, hf, hf_tokenizer = reranker
    file = llama_cpp_convert(LLAMA_CPP, checkpoint(tmp_path, classifier=True), tmp_path / "llama.cpp.gguf")
    encoded = hf_tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = hf(**encoded).logits[:, 0].numpy()
    # llama.cpp's converter names no pooling type: rank is what llama.cpp's --reranking asks for
    theirs = Model(file, n_threads=2, rank=True)
    try:
        found = Reranker(Embedder(theirs, Tokenizer.from_gguf(theirs.gguf))).score(QUERY, DOCUMENTS)
    finally:
        theirs.close()
    assert_same_scores(np.array([s.score for s in found]), expected)


LLAMA_CPP_BIN = os.environ.get("EMBER_LLAMA_CPP_BIN")  # a folder of llama.cpp's binaries (llama-embedding, ...)


@pytest.mark.skipif(LLAMA_CPP_BIN is None, reason="EMBER_LLAMA_CPP_BIN names no folder of llama.cpp's binaries")
def test_llama_cpp_runs_embers_file_to_the_same_ids_and_embeddings(encoder):
    model, tokenizer, _, _ = encoder
    ours = Embedder(model, tokenizer, pooling="cls").embed(TEXTS)
    for text, embedding in zip(TEXTS, ours):
        run = subprocess.run([f"{LLAMA_CPP_BIN}/llama-embedding", "-m", str(model.gguf.path), "-p", text,
                              "--pooling", "cls", "--embd-normalize", "2", "--embd-output-format", "json", "-t", "1"],
                             capture_output=True, text=True, timeout=120, check=True)
        theirs = np.array(json.loads(run.stdout)["data"][0]["embedding"])
        assert cosines(embedding.vector, theirs) >= MIN_COSINE, text
        run = subprocess.run([f"{LLAMA_CPP_BIN}/llama-tokenize", "-m", str(model.gguf.path), "-p", text, "--ids",
                              "--log-disable"], capture_output=True, text=True, timeout=120, check=True)
        assert json.loads(run.stdout.strip().splitlines()[-1]) == tokenizer.encode(text), text
