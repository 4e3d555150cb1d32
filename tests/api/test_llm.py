"""The Python API (ember.LLM) over the fake model, and once over a real registry model."""

import json

import numpy as np
import pytest

import ember
from ember.engine.sampling import InvalidParameter
from ember.errors import EmberError, EmberWarning, ModelNotFound
from fake_llm import BOS, EOS, N_VOCAB, ByteTokenizer, TagTemplate, continuation, fake_llm
from paths import FIXTURES

USER_HI = [{"role": "user", "content": "hi"}]


def completing(prompt_text: str, reply: bytes, then=EOS):
    return fake_llm(continuation(ByteTokenizer().encode(prompt_text), list(reply), then))


def uncertain(tokens):
    return np.random.default_rng(len(tokens)).normal(0, 1, N_VOCAB).astype(np.float32)


def log_softmax(logits):
    x = logits.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_public_names():
    import ember.api.llm

    assert ember.LLM is ember.api.llm.LLM and ember.load is ember.api.llm.load
    assert ember.SamplingParams().top_k == 40


def test_generate_returns_the_text():
    assert completing("Say:", b"Hello").generate("Say:", temperature=0) == "Hello"


def test_generate_streams_pieces():
    pieces = list(completing("Say:", b"Hello").generate("Say:", temperature=0, stream=True))
    assert pieces == ["H", "e", "l", "l", "o"]


def test_generate_honours_max_tokens_and_stop():
    llm = completing("Say:", b"Hello, world")
    assert llm.generate("Say:", max_tokens=4, temperature=0) == "Hell"
    assert llm.generate("Say:", stop=[", "], temperature=0) == "Hello"


def test_chat_answers_through_the_template():
    assert fake_llm().chat(USER_HI, temperature=0) == "You said: hi"


def test_chat_prompt_has_one_bos():
    llm = fake_llm()
    rendered = TagTemplate().render(USER_HI)
    assert rendered.startswith("<s>")
    assert llm.chat_tokens(USER_HI) == ByteTokenizer().encode(rendered, add_special=False, parse_special=True)
    assert llm.chat_tokens(USER_HI)[:2] == [BOS, 259]  # <s><|user|>


def test_prompt_text_gets_bos_when_it_has_none_and_special_text_is_parsed():
    llm = fake_llm()
    assert llm.prompt_tokens("a</s>") == [BOS, ord("a"), EOS]
    assert llm.prompt_tokens("<s>a") == [BOS, ord("a")]


def test_tokenize_and_detokenize():
    llm = fake_llm()
    assert llm.tokenize("hé") == [BOS, 104, 195, 169]
    assert llm.tokenize(b"<s>", add_bos=False) == list(b"<s>")
    assert llm.tokenize("<s>", add_bos=False, special=True) == [BOS]
    assert llm.detokenize([BOS, 104, 195, 169]) == "hé"
    assert llm.detokenize([BOS, 104], special=True) == "<s>h"


def test_a_follow_up_turn_evaluates_only_the_new_tokens():
    llm = fake_llm()
    first = llm.chat(USER_HI, temperature=0)
    history = USER_HI + [{"role": "assistant", "content": first}, {"role": "user", "content": "ok"}]
    llm.chat(history, temperature=0)
    evaluated = llm.model.eval_calls
    prefill = next(call for call in reversed(evaluated) if len(call) > 1)
    assert bytes(t for t in prefill if t < 256) == b"ok"  # the reply's end, then <|user|>ok<|end|><|assistant|>


def test_create_completion_is_openai_shaped():
    result = completing("Say:", b"Hello").create_completion("Say:", max_tokens=16, temperature=0)
    assert result["object"] == "text_completion" and result["id"].startswith("cmpl-")
    assert result["model"] == "fake" and isinstance(result["created"], int)
    assert result["choices"] == [{"text": "Hello", "index": 0, "logprobs": None, "finish_reason": "stop"}]
    assert result["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


def test_create_completion_default_max_tokens_is_16():
    result = completing("Say:", b"x" * 40).create_completion("Say:", temperature=0)
    assert result["choices"][0]["text"] == "x" * 16 and result["choices"][0]["finish_reason"] == "length"


def test_create_completion_streams_chunks():
    chunks = list(completing("Say:", b"Hi").create_completion("Say:", temperature=0, stream=True))
    assert [c["choices"][0]["text"] for c in chunks] == ["H", "i", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "stop"]
    assert len({c["id"] for c in chunks}) == 1


def test_completion_logprobs_in_the_legacy_format():
    prompt = ByteTokenizer().encode("Say:")
    llm = fake_llm(continuation(prompt, list(b"Yo")))
    result = llm.create_completion("Say:", temperature=0, logprobs=2)
    logprobs = result["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["Y", "o"] and logprobs["text_offset"] == [0, 1]
    reference = log_softmax(continuation(prompt, list(b"Yo"))(prompt))
    assert logprobs["token_logprobs"][0] == pytest.approx(reference[ord("Y")], abs=1e-6)
    best = np.argsort(-reference)[:2]
    assert list(logprobs["top_logprobs"][0].values()) == pytest.approx(reference[best].tolist(), abs=1e-6)


def test_create_chat_completion_is_openai_shaped():
    result = fake_llm().create_chat_completion(USER_HI, temperature=0)
    assert result["object"] == "chat.completion" and result["id"].startswith("chatcmpl-")
    assert result["choices"][0]["message"] == {"role": "assistant", "content": "You said: hi"}
    assert result["choices"][0]["finish_reason"] == "stop"
    n_prompt = len(fake_llm().chat_tokens(USER_HI))
    assert result["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 12, "total_tokens": n_prompt + 12}


def test_create_chat_completion_streams_deltas():
    chunks = list(fake_llm().create_chat_completion(USER_HI, temperature=0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "You said: hi"
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


def test_chat_logprobs_in_the_content_format():
    result = fake_llm().create_chat_completion(USER_HI, temperature=0, logprobs=True, top_logprobs=1)
    content = result["choices"][0]["logprobs"]["content"]
    assert "".join(item["token"] for item in content) == "You said: hi"
    assert content[0]["bytes"] == [ord("Y")] and content[0]["logprob"] < 0
    assert content[0]["top_logprobs"][0]["token"] == "Y"


def test_llm_seed_makes_a_sequence_of_requests_reproducible():
    def run(seed):
        llm = fake_llm(uncertain, seed=seed)
        return [llm.generate("x", max_tokens=8, temperature=1.0) for _ in range(3)]

    first = run(5)
    assert first == run(5)
    assert len(set(first)) == 3  # each request gets its own seed
    assert first != run(6)


def test_request_seed_wins():
    llm = fake_llm(uncertain, seed=1)
    a = llm.generate("x", max_tokens=8, temperature=1.0, seed=77)
    b = llm.generate("x", max_tokens=8, temperature=1.0, seed=77)
    assert a == b


def test_more_sampling_options_pass_through():
    llm = completing("Say:", b"Hello")
    assert llm.generate("Say:", temperature=0, logit_bias={"72": -np.inf}, max_tokens=1) != "H"


def test_bad_sampling_values_are_refused():
    with pytest.raises(InvalidParameter, match="temperature"):
        fake_llm().generate("x", temperature=-1)
    with pytest.raises(InvalidParameter, match="top_p"):
        fake_llm().create_chat_completion(USER_HI, top_p=1.5)


def test_generate_and_chat_follow_a_constraint():
    llm = completing("Say:", b"maybe")
    assert llm.generate("Say:", choice=["yes", "no"], temperature=0) in ("yes", "no")
    assert llm.generate("Say:", regex="m[a-z]{2}", temperature=0) == "may"
    assert llm.generate("Say:", grammar='root ::= "ma" [a-z]', temperature=0) == "may"
    assert isinstance(json.loads(fake_llm().chat(USER_HI, json_schema={"type": "integer"}, temperature=0, max_tokens=8)), int)


def test_create_completion_and_chat_completion_take_response_format():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    completion = completing("Say:", b'{"ok": yes}').create_completion("Say:", response_format=fmt, temperature=0,
                                                                      max_tokens=20)
    assert completion["choices"][0]["text"] == '{"ok": true}'
    assert completion["choices"][0]["finish_reason"] == "stop"
    chat = fake_llm().create_chat_completion(USER_HI, response_format={"type": "json_object"}, max_tokens=40,
                                             temperature=0)
    assert chat["choices"][0]["message"]["content"].startswith("{")


def test_a_constraint_that_cannot_compile_is_an_error_with_its_reason():
    from ember.engine.constraints import ConstraintError

    with pytest.raises(ConstraintError, match="unclosed"):
        fake_llm().generate("x", regex="(a")
    with pytest.raises(ConstraintError, match="one constraint"):
        fake_llm().create_chat_completion(USER_HI, regex="a", response_format={"type": "json_object"})


def test_a_grammar_object_is_a_constraint():
    grammar = ember.Grammar.choice(["no"])
    assert completing("Say:", b"yes").generate("Say:", grammar=grammar, temperature=0) == "no"
    params = ember.SamplingParams(temperature=0, grammar=grammar)
    assert completing("Say:", b"yes").generation("Say:", params).text() == "no"


def test_unknown_model_is_refused():
    with pytest.raises(ModelNotFound):
        ember.LLM("no-such-model-anywhere")


@pytest.mark.model
def test_real_model_chat_and_completion():
    llm = ember.LLM("smollm2-135m", n_ctx=512, seed=0)
    result = llm.create_chat_completion([{"role": "user", "content": "What is 2+2?"}], max_tokens=24,
                                        temperature=0)
    choice = result["choices"][0]
    assert choice["message"]["content"].strip()
    assert choice["finish_reason"] in ("stop", "length")
    assert result["usage"]["completion_tokens"] <= 24
    assert llm.tokenize("Hello world", add_bos=False) == llm.tokenizer.encode("Hello world", add_special=False)
    assert llm.detokenize(llm.tokenize("Hello world", add_bos=False)) == "Hello world"


@pytest.mark.model
@pytest.mark.slow
def test_greedy_tokens_match_llama_cpp_up_to_the_first_near_tie():
    import json

    fixture = json.loads((FIXTURES / "llama_cpp_greedy_smollm2-135m.json").read_text())
    llm = ember.LLM(fixture["model"], n_ctx=512)
    for case in fixture["cases"]:
        assert llm.prompt_tokens(case["prompt"]) == case["prompt_ids"]
        generation = llm.generation(case["prompt"], ember.SamplingParams(temperature=0),
                                    max_tokens=case["n_before_near_tie"])
        generation.text()
        assert generation.tokens == case["ids"][:case["n_before_near_tie"]], case["prompt"]


@pytest.mark.model
def test_a_template_that_writes_bos_gets_no_second_one():
    from ember.gguf import open_gguf
    from ember.hub import resolve_model
    from ember.tokenizer.chat_template import ChatTemplate
    from ember.tokenizer.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(open_gguf(resolve_model("gemma3-270m")))  # adds BOS by itself
    template = ChatTemplate("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}"
                            "<end_of_turn>\n{% endfor %}<start_of_turn>model\n", bos_token="<bos>")
    llm = llm_over(tokenizer, template)
    text = template.render(USER_HI)
    assert tokenizer.encode(text, parse_special=True).count(tokenizer.bos_id) == 2  # the hazard
    ids = llm.chat_tokens(USER_HI)
    assert ids == tokenizer.encode(text, add_special=False, parse_special=True)
    assert ids.count(tokenizer.bos_id) == 1 and ids[0] == tokenizer.bos_id


def llm_over(tokenizer, template):
    """An LLM whose model is never run: enough to turn messages into prompt ids."""
    class Unused:
        n_ctx, n_vocab = 512, tokenizer.n_vocab

        def reset(self, seq=0):
            pass

    return ember.LLM.from_components(Unused(), tokenizer, template)


@pytest.mark.model
def test_logits_of_every_position_through_the_kv_cache():
    from ember.errors import ContextFullError

    llm = ember.LLM("smollm2-135m", n_ctx=32, n_threads=2)
    ids = llm.tokenize("The history of natural language processing generally started in the 1950s")
    at_once = llm.logits(ids)
    assert at_once.shape == (len(ids), llm.n_vocab) and at_once.dtype == np.float32
    llm.reset()
    in_parts = np.concatenate([llm.logits(ids[:5]), llm.logits(ids[5:6]), llm.logits(ids[6:])])
    assert np.array_equal(in_parts, at_once)
    llm.reset()
    assert np.array_equal(llm.logits(ids[:3])[-1], at_once[2])  # row i: the logits after token i

    chunked = ember.LLM("smollm2-135m", n_ctx=32, n_threads=2, n_batch=4)
    assert np.array_equal(chunked.logits(ids), at_once)
    with pytest.raises(ContextFullError, match="do not fit in the context of 32 tokens"):
        chunked.logits(ids * 2)
    # the refused call left the cache as it was: the sequence goes on after ids
    assert np.array_equal(chunked.logits([ids[0]]), np.asarray(llm.logits(ids[3:] + [ids[0]]))[-1:])


@pytest.mark.model
def test_unknown_activations_are_refused():
    from ember.errors import EmberError

    with pytest.raises(EmberError, match="activations must be one of int8, f32, got 'fp8'"):
        ember.LLM("smollm2-135m", activations="fp8")


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    from tiny_gguf import write_tiny_model

    llm = ember.LLM(write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf"), n_threads=1)
    yield llm
    llm.close()


def test_tokenize_bytes_is_utf8_with_each_invalid_byte_as_u_fffd(tiny_llm):
    # llama.cpp's rule (llama-tokenize gives "a\xe2\x82b\xff" as a, U+FFFD, U+FFFD, b, U+FFFD)
    assert tiny_llm.tokenize(b"\xff") == tiny_llm.tokenize("\ufffd")
    assert tiny_llm.tokenize(b"a\xe2\x82b\xff") == tiny_llm.tokenize("a\ufffd\ufffdb\ufffd")
    assert tiny_llm.tokenize("héllo".encode()) == tiny_llm.tokenize("héllo")


def test_a_bytes_prompt_is_text_not_token_ids(tiny_llm):
    # bytes used to be taken for a list of token ids (255, 254) without a word
    generation = tiny_llm.generation(b"\xff\xfe", max_tokens=1)
    assert generation.prompt_tokens == tiny_llm.prompt_tokens("\ufffd\ufffd") != [255, 254]


def test_prompt_token_ids_are_checked_before_generating(tiny_llm):
    with pytest.raises(EmberError, match="token id 1099511627776 is outside the vocabulary"):
        tiny_llm.generate([1, 2**40], max_tokens=2)
    with pytest.raises(EmberError, match="token ids must be integers, got 'a'"):
        tiny_llm.generate([1, "a"], max_tokens=2)


@pytest.mark.parametrize("max_tokens", [-1, -100, 2.5])
def test_negative_max_tokens_is_refused_not_unlimited(max_tokens):
    # None is "until the model stops"; -1 used to mean that too, silently
    with pytest.raises(EmberError, match=r"max_tokens must be a count >= 0, or None for no limit"):
        completing("Say:", b"Hello").generate("Say:", max_tokens=max_tokens)


# -- embeddings -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_llm():
    from encoder_models import minilm_gguf

    with ember.LLM(minilm_gguf(), n_threads=2) as llm:
        yield llm


@pytest.mark.model
def test_embed_gives_a_vector_for_a_text_and_a_list_for_a_list(minilm_llm):
    one = minilm_llm.embed("Hello, world!")
    many = minilm_llm.embed(["Hello, world!", "Goodbye"])
    assert len(one) == 384 and isinstance(one[0], float) and abs(np.linalg.norm(one) - 1) < 1e-5
    assert len(many) == 2 and np.allclose(many[0], one, atol=1e-6)


@pytest.mark.model
def test_embed_without_normalisation_keeps_the_length(minilm_llm):
    raw = np.array(minilm_llm.embed("Hello, world!", normalize=False))
    assert np.linalg.norm(raw) > 1.5
    np.testing.assert_allclose(raw / np.linalg.norm(raw), minilm_llm.embed("Hello, world!"), atol=1e-6)


@pytest.mark.model
def test_create_embedding_is_openai_shaped_and_base64_is_the_float32_bytes(minilm_llm):
    import base64

    plain = minilm_llm.create_embedding(["a cat", "a dog"])
    assert plain["model"] == minilm_llm.name and [d["index"] for d in plain["data"]] == [0, 1]
    assert plain["usage"]["prompt_tokens"] == plain["usage"]["total_tokens"] == 8
    encoded = minilm_llm.create_embedding(["a cat", "a dog"], encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(encoded["data"][1]["embedding"]), "<f4")
    np.testing.assert_array_equal(decoded, np.array(plain["data"][1]["embedding"], np.float32))


@pytest.mark.model
def test_create_embedding_takes_token_ids(minilm_llm):
    ids = minilm_llm.tokenize("a cat")
    by_ids = minilm_llm.create_embedding([ids, ids])["data"]
    assert by_ids[0]["embedding"] == minilm_llm.create_embedding("a cat")["data"][0]["embedding"]


@pytest.mark.model
def test_dimensions_other_than_the_models_are_refused_naming_them(minilm_llm):
    with pytest.raises(EmberError, match="dimensions=128 is not supported"):
        minilm_llm.create_embedding("a cat", dimensions=128)
    assert len(minilm_llm.create_embedding("a cat", dimensions=384)["data"][0]["embedding"]) == 384


@pytest.mark.model
def test_an_encoder_does_not_generate(minilm_llm):
    with pytest.raises(EmberError, match="is an embedding model .*use embed"):
        minilm_llm.generate("Hello")


@pytest.mark.model
def test_a_generation_model_embeds_with_its_default_pooling_and_keeps_generating():
    with ember.LLM("smollm2-135m", n_ctx=256, n_threads=2) as llm:
        before = llm.generate("The capital of France is", max_tokens=8, temperature=0)
        with pytest.warns(EmberWarning, match="no llama.pooling_type .*embedding with mean pooling"):
            vector = llm.embed("The capital of France is")
        assert len(vector) == 576 and abs(np.linalg.norm(vector) - 1) < 1e-5
        assert llm.generate("The capital of France is", max_tokens=8, temperature=0) == before


# -- reranking ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reranker_llm():
    from encoder_models import tiny_reranker_gguf

    with ember.LLM(tiny_reranker_gguf(), n_threads=2) as llm:
        yield llm


DOCUMENTS = ["Berlin has 3.5 million inhabitants.", "Paris is the capital of France.", "Bread is baked.",
             "Berlin"]


@pytest.mark.model
def test_rerank_gives_llama_servers_results_best_first(reranker_llm):
    from ember.engine.rerank import Reranker

    alone = [Reranker(reranker_llm.embedder).score("people in Berlin", [d])[0].score for d in DOCUMENTS]
    results = reranker_llm.rerank("people in Berlin", DOCUMENTS)
    assert [r["index"] for r in results] == list(np.argsort(alone, kind="stable")[::-1])
    np.testing.assert_allclose([r["relevance_score"] for r in results], sorted(alone, reverse=True), atol=1e-5)
    assert len(set(alone)) == len(alone)  # scores apart: the order is the scores'
    assert [r["index"] for r in reranker_llm.rerank("people in Berlin", DOCUMENTS, top_n=2)] == [
        r["index"] for r in results[:2]]


@pytest.mark.model
def test_create_rerank_is_llama_servers_response(reranker_llm):
    response = reranker_llm.create_rerank("people in Berlin", DOCUMENTS, top_n=3, return_documents=True)
    assert response["object"] == "list" and response["model"] == reranker_llm.name
    pair_tokens = [len(reranker_llm.reranker.pair("people in Berlin", d)[0]) for d in DOCUMENTS]
    assert response["usage"] == {"prompt_tokens": sum(pair_tokens), "total_tokens": sum(pair_tokens)}
    assert len(response["results"]) == 3
    assert all(r["document"] == {"text": DOCUMENTS[r["index"]]} for r in response["results"])


@pytest.mark.model
def test_a_reranker_neither_embeds_nor_generates(reranker_llm):
    with pytest.raises(EmberError, match="is a reranker.*rerank"):
        reranker_llm.embed("Hello")
    with pytest.raises(EmberError, match="is a reranker .*use rerank"):
        reranker_llm.generate("Hello")


@pytest.mark.model
def test_a_model_without_a_classification_head_does_not_rerank(minilm_llm):
    with pytest.raises(EmberError, match="is not a reranker"):
        minilm_llm.rerank("a", ["b"])


@pytest.mark.model
@pytest.mark.parametrize("query, documents, top_n", [(1, ["b"], None), ("a", "b", None), ("a", ["b", 2], None),
                                                     ("a", ["b"], -1), ("a", [], None)])
def test_bad_rerank_arguments_are_errors(reranker_llm, query, documents, top_n):
    with pytest.raises(EmberError):
        reranker_llm.rerank(query, documents, top_n=top_n)
