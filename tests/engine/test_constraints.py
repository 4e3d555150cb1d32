"""Constrained output: grammars compiled by llguidance, the mask inside the sampler, and the end of
the grammar ending generation. A fake model that wants to say something else shows the mask
at work; the registry models show that the output parses and matches the schema."""

import json
import re

import jsonschema
import numpy as np
import pytest

from ember.engine.constraints import ConstraintError, Grammar, grammar_from_request, vocabulary
from ember.engine.generate import Generation
from ember.engine.sampling import Sampler, SamplingParams
from fake_llm import BOS, EOS, N_VOCAB, ByteTokenizer, FakeModel, continuation, peaked_logits

PROMPT = [BOS] + list(b"Say:")


def constrained(reply: bytes, grammar: Grammar, temperature=0.0, **kwargs):
    """A generation whose fake model wants to say `reply` (then EOS), under the grammar."""
    model = FakeModel(continuation(PROMPT, list(reply)), n_ctx=256)
    params = SamplingParams(temperature=temperature, seed=1, grammar=grammar)
    return Generation(model, ByteTokenizer(), PROMPT, params=params, **kwargs), model


# -- grammars ----------------------------------------------------------------------------------


def test_a_regex_the_model_would_leave_is_kept():
    g, _ = constrained(b"call 555-1234 now", Grammar.regex(r"[a-z]+ [0-9]{3}-[0-9]{4}"))
    assert g.text() == "call 555-1234"
    assert g.finish_reason == "stop"


def test_the_end_of_the_grammar_ends_generation_without_another_forward_pass():
    g, model = constrained(b"yes, and more", Grammar.choice(["yes", "no"]))
    assert g.text() == "yes" and g.finish_reason == "stop"
    assert g.n_generated == 3
    assert len(model.eval_calls) == 3  # the prompt, then "y" and "e": the grammar ended at "s"


def test_a_choice_forces_an_option_the_model_does_not_prefer():
    g, _ = constrained(b"maybe", Grammar.choice(["yes", "no"]))
    assert g.text() in ("yes", "no")


def test_gbnf_from_llama_cpp():
    gbnf = 'root ::= "[" item ("," item)* "]"\nitem ::= [0-9]+'
    g, _ = constrained(b"[12,x,3]", Grammar.gbnf(gbnf), max_tokens=40)
    text = g.text()
    assert re.fullmatch(r"\[[0-9]+(,[0-9]+)*\]", text) or g.finish_reason == "length", text
    assert text.startswith("[12,")


ARITHMETIC = r"""
# arithmetic, in the features of llama.cpp's grammars: comments, classes, groups, repetition
root   ::= expr
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/] ws factor)*
factor ::= [1-9] [0-9]{0,2} | "(" ws expr ws ")" | "-" factor
ws     ::= [ ]?
"""


def test_a_gbnf_grammar_with_rules_classes_and_repetition_holds_for_random_models():
    import ast

    finished = 0
    for seed in range(12):
        model = FakeModel(lambda tokens: np.random.default_rng(len(tokens) + 1000 * seed).normal(0, 2, N_VOCAB)
                          .astype(np.float32))
        params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                                grammar=Grammar.gbnf(ARITHMETIC))
        g = Generation(model, ByteTokenizer(), PROMPT, params=params, max_tokens=80)
        text = g.text()
        if g.finish_reason == "stop":
            finished += 1
            ast.parse(text, mode="eval")  # an arithmetic expression Python reads
            assert re.fullmatch(r"[0-9 ()*/+-]+", text), text
    assert finished >= 3


def test_lark_syntax_is_accepted_as_a_grammar():
    g, _ = constrained(b"ab", Grammar.gbnf('start: "a" "b"'))
    assert g.text() == "ab"


def test_json_schema_output_validates_when_the_model_says_something_else():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}},
              "required": ["n"], "additionalProperties": False}
    g, _ = constrained(b'{"n": 12}', Grammar.json_schema(schema), max_tokens=30)
    value = json.loads(g.text())
    jsonschema.validate(value, schema)
    assert g.finish_reason == "stop"


def test_sampled_output_follows_the_grammar_at_any_temperature():
    pattern = r"(ab|cd){2,4}"
    for seed in range(5):
        model = FakeModel(lambda tokens: np.random.default_rng(len(tokens)).normal(0, 3, N_VOCAB).astype(np.float32))
        params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed, grammar=Grammar.regex(pattern))
        g = Generation(model, ByteTokenizer(), PROMPT, params=params, max_tokens=20)
        assert re.fullmatch(pattern, g.text()), g.text()


def test_the_mask_comes_before_top_k():
    # top_k=1 keeps the best allowed token, not the model's favourite (which the grammar forbids)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=1, seed=0, grammar=Grammar.choice(["b"])), N_VOCAB,
                      tokenizer=ByteTokenizer())
    assert sampler.sample(peaked_logits(ord("a"))) == ord("b")


def test_distribution_has_only_allowed_tokens():
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, grammar=Grammar.regex("[xy]")),
                      N_VOCAB, tokenizer=ByteTokenizer())
    ids, probs = sampler.distribution(peaked_logits(ord("a")))
    assert sorted(ids.tolist()) == [ord("x"), ord("y")]
    assert probs.sum() == pytest.approx(1.0)


def test_eos_is_allowed_where_the_grammar_may_end():
    # "a" or "ab": after "a" the model's EOS ends the reply
    g, _ = constrained(b"a", Grammar.regex("ab?"))
    assert g.text() == "a" and g.finish_reason == "stop"


def test_max_tokens_still_ends_a_constrained_reply():
    g, _ = constrained(b"aaaaaaaa", Grammar.regex("a+"), max_tokens=4)
    assert g.text() == "aaaa" and g.finish_reason == "length"


def test_logprobs_of_a_constrained_reply_are_under_the_raw_logits():
    g, _ = constrained(b"no", Grammar.choice(["no"]), logprobs=1)
    entries = [entry for chunk in g for entry in chunk.logprobs]
    assert [e.token for e in entries] == list(b"no")


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, reason", [
    (lambda: Grammar.regex("a("), "unclosed group"),
    (lambda: Grammar.gbnf('root ::= missing'), "missing"),
    (lambda: Grammar.gbnf("root ::= \"a"), "grammar"),
    (lambda: Grammar.json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
    (lambda: Grammar.json_schema({"type": "string", "format": "bogus"}), "bogus"),
    (lambda: Grammar.json_schema("{not json"), "not valid JSON"),
    (lambda: Grammar.json_schema([1, 2]), "must be an object"),
    (lambda: Grammar.choice([]), "non-empty list"),
    (lambda: Grammar.choice("yes"), "non-empty list"),
    (lambda: Grammar.regex(""), "non-empty"),
])
def test_what_llguidance_cannot_compile_is_an_error_with_its_reason(make, reason):
    with pytest.raises(ConstraintError, match=re.escape(reason)):
        make()


def test_non_strict_schemas_skip_keywords_llguidance_does_not_implement():
    grammar = Grammar.json_schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, strict=False)
    g, _ = constrained(b"[1, 2]", grammar)
    assert json.loads(g.text()) == [1, 2]


def test_one_constraint_per_request():
    with pytest.raises(ConstraintError, match="regex and choice"):
        grammar_from_request(regex="a", choice=["a"])


@pytest.mark.parametrize("response_format, message", [
    ({"type": "xml"}, "text, json_object or json_schema"),
    ({"type": "json_schema"}, "needs json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}, "strict"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}}, "extra"),
    ({"type": "json_object", "other": 1}, "other"),
    ("json", "must be an object"),
])
def test_a_bad_response_format_is_an_error_naming_it(response_format, message):
    with pytest.raises(ConstraintError, match=message):
        grammar_from_request(response_format=response_format)


def test_response_format_text_is_no_constraint():
    assert grammar_from_request(response_format={"type": "text"}) is None


def test_response_format_strict_decides_how_keywords_are_enforced():
    schema = {"type": "array", "uniqueItems": True}
    with pytest.raises(ConstraintError, match="uniqueItems"):
        grammar_from_request(response_format={"type": "json_schema",
                                              "json_schema": {"name": "a", "schema": schema, "strict": True}})
    assert grammar_from_request(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})


def test_a_grammar_needs_the_tokenizer():
    with pytest.raises(ConstraintError, match="tokenizer"):
        Sampler(SamplingParams(grammar=Grammar.regex("a")), N_VOCAB)


def test_the_vocabulary_is_built_once_per_tokenizer():
    tokenizer = ByteTokenizer()
    assert vocabulary(tokenizer, N_VOCAB) is vocabulary(tokenizer, N_VOCAB)
    assert vocabulary(tokenizer, N_VOCAB) is not vocabulary(ByteTokenizer(), N_VOCAB)


def test_special_tokens_never_match_grammar_text():
    # "</s>" is EOS's text; as a grammar's text it must be spelled with the byte tokens
    g, _ = constrained(b"</s>", Grammar.choice(["</s>"]))
    assert g.text() == "</s>" and g.n_generated == 4


def test_the_end_of_generation_token_is_refused_before_the_grammar_is_complete():
    model = FakeModel(lambda tokens: peaked_logits(EOS if len(tokens) > 6 else ord("a"), seed=len(tokens)))
    params = SamplingParams(temperature=0.0, grammar=Grammar.regex("a{4}"))
    g = Generation(model, ByteTokenizer(), PROMPT, params=params)
    assert g.text() == "aaaa"


# -- the registry models -------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,11}$"},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "height_m": {"type": "number", "minimum": 1.2, "maximum": 2.3},
        "role": {"enum": ["admin", "editor", "viewer"]},
    },
    "required": ["name", "age", "height_m", "role"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "customer": {"type": "object", "properties": {
            "id": {"type": "string", "pattern": "^C-[0-9]{4}$"},
            "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"], "additionalProperties": False}},
            "required": ["id", "address"], "additionalProperties": False},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "maxLength": 12},
                                             "quantity": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "quantity"], "additionalProperties": False}},
        "paid": {"type": "boolean"},
    },
    "required": ["customer", "items", "paid"],
    "additionalProperties": False,
}
SCORES = {"type": "array", "minItems": 2, "maxItems": 4,
          "items": {"type": "number", "multipleOf": 0.5, "exclusiveMinimum": 0, "maximum": 10}}
REGISTRY = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]


@pytest.fixture(scope="module", params=REGISTRY)
def registry_llm(request):
    import ember
    from ember.hub import resolve_model

    with ember.LLM(resolve_model(request.param), n_ctx=1024) as llm:
        yield llm


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("schema, ask", [
    (PERSON, "Describe a user of a website."),
    (ORDER, "Write an example order with two items."),
    (SCORES, "Rate three movies from 0 to 10."),
])
def test_registry_models_write_json_that_matches_the_schema(registry_llm, schema, ask, temperature):
    messages = [{"role": "user", "content": ask + " Answer in JSON."}]
    result = registry_llm.create_chat_completion(
        messages, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}},
        temperature=temperature, seed=3, max_tokens=200)
    choice = result["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


@pytest.mark.model
def test_registry_models_follow_a_regex_a_choice_and_a_grammar(registry_llm):
    phone = registry_llm.generate("Call me at", regex=r" \(\d{3}\) \d{3}-\d{4}", temperature=1.0, seed=5)
    assert re.fullmatch(r" \(\d{3}\) \d{3}-\d{4}", phone)
    answer = registry_llm.generate("Is water wet? Answer:", choice=[" yes", " no"], temperature=0)
    assert answer in (" yes", " no")
    gbnf = 'root ::= " " fruit (", " fruit){1,3} "."\nfruit ::= "apple" | "pear" | "plum"'
    fruits = registry_llm.generate("Some fruits:", grammar=gbnf, temperature=0.7, seed=2, max_tokens=40)
    assert re.fullmatch(r" (apple|pear|plum)(, (apple|pear|plum)){1,3}\.", fruits)


def test_masks_on_a_worker_thread_or_in_line_give_the_same_text(monkeypatch):
    from ember.engine.constraints import Constraint

    pattern = r"[a-z]{3,8}( [a-z]{2,6}){2}"

    def texts(overlap: bool) -> list[str]:
        monkeypatch.setattr(Constraint, "overlap", overlap)
        out = []
        for seed in range(4):
            model = FakeModel(lambda tokens: np.random.default_rng(len(tokens)).normal(0, 3, N_VOCAB).astype(np.float32))
            params = SamplingParams(temperature=1.0, seed=seed, grammar=Grammar.regex(pattern))
            out.append(Generation(model, ByteTokenizer(), PROMPT, params=params, max_tokens=40).text())
        return out

    threaded, in_line = texts(True), texts(False)
    assert threaded == in_line
    assert all(re.fullmatch(pattern, text) for text in threaded), threaded


def test_few_allowed_tokens_are_sampled_among_themselves_with_the_same_distribution():
    # the chain over the allowed ids alone equals the chain over the masked vocabulary
    logits = np.random.default_rng(5).normal(0, 2, N_VOCAB).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_k=5, top_p=0.9, min_p=0.02, grammar=Grammar.regex("[a-j]"))
    ids, probs = Sampler(params, N_VOCAB, tokenizer=ByteTokenizer()).distribution(logits)
    masked = np.full(N_VOCAB, -np.inf, np.float32)
    allowed = np.arange(ord("a"), ord("j") + 1)
    masked[allowed] = logits[allowed]
    plain = SamplingParams(temperature=0.9, top_k=5, top_p=0.9, min_p=0.02)
    expected_ids, expected_probs = Sampler(plain, N_VOCAB).distribution(masked)
    assert ids.tolist() == expected_ids.tolist()
    np.testing.assert_allclose(probs, expected_probs, rtol=1e-6)
