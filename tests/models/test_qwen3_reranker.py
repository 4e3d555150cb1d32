"""Qwen3-Reranker through `ember convert`: a tiny random Qwen3ForCausalLM whose folder says it is
a Qwen3-Reranker (its README's title, as llama.cpp's converter reads it), with a tokenizer that
has "yes" and "no", tied and untied. The file holds what llama.cpp's converter writes
(tests/fixtures/llama_cpp_convert/qwen3-reranker*.json, recorded with the tokenizer keys): pooling
type rank, the labels, the rerank template and cls.output, the LM head's rows of yes and no; and
ember's scores of query-document pairs are transformers' softmax over the two answers' logits on
the last token of the templated pair.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

from converter_record import assert_same_file, load_record, patterned, tokenizer_record, write_tiny_tokenizer  # noqa: E402
from parity import LLAMA_CPP, randomize  # noqa: E402

from ember.convert import convert  # noqa: E402
from ember.engine.embed import Embedder  # noqa: E402
from ember.engine.rerank import Reranker  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402
from ember.models.qwen3 import RERANK_TEMPLATE  # noqa: E402
from ember.tokenizer.tokenizer import Tokenizer  # noqa: E402

N_VOCAB = 320
QUERY = "what does the model run?"
DOCUMENTS = ["the model runs tokens of text", "one after another", "42", "text of the model, one after another"]


def checkpoint(folder: Path, tied: bool = False, weights: str = "random") -> Path:
    """The tiny reranker saved in `folder`/hf: its README titled as Qwen3-Reranker's, the tiny
    byte-level BPE tokenizer with "yes" and "no" added."""
    config = transformers.Qwen3Config(vocab_size=N_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=512, tie_word_embeddings=tied)
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(config).eval()
    patterned(hf) if weights == "patterned" else randomize(hf)
    hf_dir = folder / "hf"
    hf.save_pretrained(hf_dir, safe_serialization=True)
    write_tiny_tokenizer(hf_dir, N_VOCAB - 2)
    tokenizer = tokenizers.Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tokenizer.add_tokens(["yes", "no"])  # the last two ids
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "README.md").write_text("# Qwen3-Reranker-tiny\n\nA tiny random model for tests.\n")
    return hf_dir


def answer_ids(hf_dir: Path) -> tuple[int, int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    return tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")


CONVERTER_RECORDS = {
    "qwen3-reranker": lambda folder: checkpoint(folder, weights="patterned"),
    "qwen3-reranker-tied": lambda folder: checkpoint(folder, tied=True, weights="patterned"),
}


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def tiny(request, tmp_path_factory):
    """(ember Reranker, transformers model, ids of yes and no)."""
    hf_dir = checkpoint(tmp_path_factory.mktemp("qwen3-reranker"), tied=request.param)
    model = Model(convert(hf_dir, hf_dir.parent / "f32.gguf", "f32"), n_threads=2)
    yield Reranker(Embedder(model, Tokenizer.from_gguf(model.gguf))), \
        transformers.Qwen3ForCausalLM.from_pretrained(hf_dir).eval(), answer_ids(hf_dir)
    model.close()


def expected_scores(hf, answers: tuple[int, int], pairs: list[list[int]]) -> np.ndarray:
    with torch.no_grad():
        return np.array([torch.softmax(hf(torch.tensor([ids])).logits[0, -1, list(answers)].double(), 0)[0].item()
                         for ids in pairs])


def test_the_file_is_a_reranker_with_the_answers_rows_as_its_head(tiny):
    reranker, hf, answers = tiny
    model = reranker.embedder.model
    meta = model.gguf.metadata
    assert model.ranks and model.n_out == 2
    assert meta["qwen3.pooling_type"] == 4 and list(meta["qwen3.classifier.output_labels"]) == ["yes", "no"]
    assert meta["tokenizer.chat_template.rerank"] == RERANK_TEMPLATE == reranker.template
    head = model.gguf.tensors["cls.output.weight"]
    rows = np.frombuffer(head.data, np.float32).reshape(2, -1)
    np.testing.assert_array_equal(rows, hf.lm_head.weight.detach().numpy()[list(answers)])
    assert ("output.weight" in model.gguf.tensors) is False


def test_scores_are_transformers_softmax_of_yes_and_no(tiny):
    reranker, hf, answers = tiny
    pairs = [reranker.pair(QUERY, document)[0] for document in DOCUMENTS]
    expected = expected_scores(hf, answers, pairs)
    scores = np.array([s.score for s in reranker.score(QUERY, DOCUMENTS)])
    assert np.ptp(expected) > 0.01  # the documents score apart: not vacuous
    np.testing.assert_allclose(scores, expected, atol=2e-4)


@pytest.mark.parametrize("name", sorted(CONVERTER_RECORDS))
def test_ember_convert_writes_what_llama_cpps_converter_writes(name, tmp_path):
    ours = tokenizer_record(CONVERTER_RECORDS[name](tmp_path), tmp_path / "ember.gguf")
    assert_same_file(ours, load_record(name))


@pytest.mark.skipif(LLAMA_CPP is None, reason="EMBER_LLAMA_CPP names no llama.cpp source tree")
@pytest.mark.parametrize("name", sorted(CONVERTER_RECORDS))
def test_llama_cpps_converter_still_writes_the_record(name, tmp_path):
    assert tokenizer_record(CONVERTER_RECORDS[name](tmp_path), tmp_path / "llama.cpp.gguf", LLAMA_CPP) == load_record(name)
