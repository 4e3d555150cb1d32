"""Prompt-lookup decoding: the n-gram drafts, and a generation with them that is the plain one."""

import numpy as np
import pytest

from ember.engine.generate import Generation, SequenceCache
from ember.engine.lookup import Lookup, NgramIndex, lookup_options
from ember.engine.sampling import SamplingParams
from ember.errors import EmberError
from fake_llm import BOS, EOS, N_VOCAB, ByteTokenizer, FakeModel, continuation

GREEDY = SamplingParams(temperature=0.0)


def index_of(text: bytes, **options) -> NgramIndex:
    return NgramIndex(Lookup(**options), list(text))


# -- drafts ------------------------------------------------------------------------------------

def test_the_draft_is_what_followed_the_last_tokens_before():
    assert bytes(index_of(b"def f(x): return x\ndef f(", n_draft=8).draft()) == b"x): retu"


def test_the_longest_matching_ngram_wins_over_a_later_shorter_one():
    # "ab" last occurred followed by "Z", but "cab" occurred followed by "Y"
    assert bytes(index_of(b"cabY abZ cab", ngram_min=2, ngram_max=3, n_draft=1).draft()) == b"Y"


def test_the_latest_occurrence_of_an_ngram_is_used():
    assert bytes(index_of(b"xy1 xy2 xy", ngram_min=2, ngram_max=2, n_draft=1).draft()) == b"2"


def test_no_draft_without_a_match_or_below_ngram_min():
    assert index_of(b"abcdef").draft() == []
    assert index_of(b"xa ya", ngram_min=2).draft() == []  # only the 1-gram "a" occurred before
    assert bytes(index_of(b"xa ya", ngram_min=1, n_draft=1).draft()) == b" "


def test_a_draft_stops_at_the_end_of_what_is_known_and_at_the_limit():
    assert bytes(index_of(b"abcab", n_draft=10).draft()) == b"cab"
    assert bytes(index_of(b"abcab", n_draft=10).draft(limit=2)) == b"ca"
    assert index_of(b"abcab").draft(limit=0) == []


def test_appended_tokens_are_looked_up_too():
    index = index_of(b"red fox. ", n_draft=4)
    index.extend(b"red")
    assert bytes(index.draft()) == b" fox"


@pytest.mark.parametrize("options", [{"ngram_min": 0}, {"ngram_max": 0}, {"n_draft": 0}, {"n_draft": 65},
                                     {"ngram_min": 3, "ngram_max": 2}, {"n_draft": 2.5}, {"ngram_min": True}])
def test_bad_options_are_one_line_errors(options):
    with pytest.raises(EmberError, match="lookup"):
        Lookup(**options)


def test_options_from_the_api():
    assert lookup_options(True) == Lookup() and lookup_options(None) is None and lookup_options(False) is None
    assert lookup_options(Lookup(n_draft=3)).n_draft == 3
    with pytest.raises(EmberError, match="lookup must be"):
        lookup_options("yes")


# -- generation --------------------------------------------------------------------------------

PROMPT = [BOS] + list(b"x = 1\ny = 2\nz = 3\n# again:\n")
REPLY = b"x = 1\ny = 5\nz = 3\n"  # the prompt's lines, one changed


def run(reply=REPLY, lookup=Lookup(), params=GREEDY, model=None, **kwargs):
    model = model or FakeModel(continuation(PROMPT, list(reply)), n_ctx=kwargs.pop("n_ctx", 256))
    g = Generation(model, ByteTokenizer(), PROMPT, params, lookup=lookup, **kwargs)
    text = g.text()
    return g, text, model


def test_greedy_output_is_the_plain_output_in_fewer_forward_passes():
    plain, plain_text, plain_model = run(lookup=None)
    g, text, model = run()
    assert text == plain_text == REPLY.decode()
    assert (g.finish_reason, g.n_generated) == (plain.finish_reason, plain.n_generated)
    assert len(model.eval_calls) < len(plain_model.eval_calls)
    assert 0 < g.n_accepted <= g.n_drafted
    # every token generated and evaluated is in the cache, no rejected draft
    assert model.tokens == PROMPT + list(REPLY)


def test_a_rejected_draft_leaves_no_trace_in_the_cache():
    g, text, model = run(max_tokens=8)
    assert text == "x = 1\ny "
    assert model.tokens == PROMPT + list(b"x = 1\ny")  # the last token is sampled, not yet evaluated
    g, text, model = run()
    # "y = " was drafted with "2" after it; the model said "5": the draft's "2..." is gone
    assert any(call[:1] == [ord(" ")] and ord("2") in call for call in model.eval_calls)
    assert model.tokens == PROMPT + list(REPLY)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7, 11, 12])
def test_max_tokens_ends_where_it_ends_without_lookup(max_tokens):
    plain, plain_text, _ = run(lookup=None, max_tokens=max_tokens)
    g, text, model = run(max_tokens=max_tokens)
    assert (text, g.finish_reason, g.n_generated) == (plain_text, plain.finish_reason, plain.n_generated)
    assert len(model.tokens) <= len(PROMPT) + max_tokens


@pytest.mark.parametrize("n_ctx", [len(PROMPT) + 1, len(PROMPT) + 4, len(PROMPT) + 9])
def test_a_full_context_ends_where_it_ends_without_lookup(n_ctx):
    plain, plain_text, _ = run(lookup=None, n_ctx=n_ctx)
    g, text, _ = run(n_ctx=n_ctx)
    assert (text, g.finish_reason, g.n_generated) == (plain_text, plain.finish_reason, plain.n_generated)
    assert g.finish_reason == "length"


def test_a_stop_string_ends_where_it_ends_without_lookup():
    plain, plain_text, _ = run(lookup=None, stop=["z ="])
    g, text, model = run(stop=["z ="])
    assert text == plain_text == "x = 1\ny = 5\n"
    assert g.finish_reason == plain.finish_reason == "stop" and g.n_accepted > 0


def test_logprobs_equal_plain_decoding_token_by_token():
    def entries(lookup):
        model = FakeModel(continuation(PROMPT, list(REPLY)))
        g = Generation(model, ByteTokenizer(), PROMPT, GREEDY, logprobs=3, lookup=lookup)
        return [(e.token, e.logprob, e.top, e.text_offset) for chunk in g for e in chunk.logprobs]

    assert entries(Lookup()) == entries(None)


def test_an_end_token_inside_a_draft_ends_the_reply():
    prompt = [BOS] + list(b"ok") + [EOS] + list(b"ok")
    model = FakeModel(continuation(prompt, []))  # says EOS at once, as the draft guesses
    g = Generation(model, ByteTokenizer(), prompt, GREEDY, lookup=Lookup(ngram_min=1))
    assert g.text() == "" and g.finish_reason == "stop"


def noisy(tokens):
    """A model unsure between a few tokens, whose logits depend on the whole cache."""
    rng = np.random.default_rng(len(tokens) * 7919 + sum(tokens))
    logits = rng.normal(0.0, 0.5, N_VOCAB).astype(np.float32)
    logits[list(b"ab \n")] += 4.0
    return logits


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_output_is_the_plain_output_for_a_seed(seed):
    params = SamplingParams(temperature=1.0, seed=seed)
    prompt = [BOS] + list(b"ab ab\nab ab\nab")
    texts, accepted = [], []
    for lookup in (None, Lookup(ngram_min=1, ngram_max=3)):
        g = Generation(FakeModel(noisy), ByteTokenizer(), prompt, params, max_tokens=40, lookup=lookup)
        texts.append(g.text())
        accepted.append(g.n_accepted)
    assert texts[0] == texts[1] and len(texts[0]) == 40
    assert accepted[1] > 0


def test_an_interrupted_generation_forgets_its_unsampled_drafts():
    model = FakeModel(continuation(PROMPT, list(REPLY)))
    g = Generation(model, ByteTokenizer(), PROMPT, GREEDY, lookup=Lookup(n_draft=6))
    text = ""
    while g.n_accepted == 0:
        text += next(g).text
    assert len(model.tokens) > len(PROMPT) + len(text)  # drafts after the accepted one were evaluated
    g.close()
    # the cache holds the prompt and the sampled tokens (the last one accepted from the draft)
    assert model.tokens == PROMPT + list(text.encode()) == PROMPT + g.tokens


def test_a_newer_request_on_the_cache_ends_a_generation_with_pending_drafts():
    model = FakeModel(continuation(PROMPT, list(REPLY)))
    cache = SequenceCache(model)
    g = Generation(model, ByteTokenizer(), PROMPT, GREEDY, cache=cache, lookup=Lookup(n_draft=6))
    next(g), next(g)
    newer = Generation(model, ByteTokenizer(), PROMPT, GREEDY, cache=cache, max_tokens=3)
    assert newer.text() == "x ="
    held = list(model.tokens)
    with pytest.raises(EmberError, match="interrupted by a newer request"):
        next(g)
    assert model.tokens == held  # the newer request's cache, untouched


# -- real models -------------------------------------------------------------------------------

EDIT_CODE = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n" \
            "    return 2 * (width + height)\n"
EDIT_PROMPT = ("The file, then the same file with `width` renamed to `w`.\n\n```python\n" + EDIT_CODE
               + "```\n\n```python\n" + EDIT_CODE.replace("width", "w", 1))


@pytest.mark.parametrize("weight_type", ["F32", "Q8_0", "Q4_0"])
def test_each_row_of_a_batch_is_the_logits_of_a_single_token_step(tmp_path, weight_type):
    """What lookup's exactness rests on: a batch of k tokens (here past the 16 at which matmuls
    switch to panels) gives each position, bit for bit, the logits evaluating it alone gives."""
    from ember.engine.runtime import Model
    from ember.gguf.types import GGMLType
    from tiny_gguf import tiny_tensors, write_tiny_model

    types = {name: GGMLType[weight_type] for name, array in tiny_tensors() if array.ndim == 2}
    model = Model(write_tiny_model(tmp_path / "tiny.gguf", types=types), n_ctx=128, n_threads=2)
    tokens = np.random.default_rng(1).integers(0, model.n_vocab, 60).tolist()
    model.eval(tokens[:30])
    alone = np.stack([model.eval([t]) for t in tokens[30:]])
    for k in (2, 5, 16, 30):
        model.truncate(30)
        assert np.array_equal(model.eval(tokens[30:30 + k], logits="all"), alone[:k])


def outputs(llm, params, n_tokens):
    """The ids generated plain and with lookup, and the lookup generation."""
    runs = []
    for lookup in (False, Lookup()):
        llm.reset()
        g = llm.generation(EDIT_PROMPT, params, max_tokens=n_tokens, lookup=lookup)
        g.text()
        runs.append(g)
    return list(runs[0].tokens), list(runs[1].tokens), runs[1]


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    from ember.api.llm import LLM
    from tiny_gguf import write_tiny_model

    llm = LLM(write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf"), n_ctx=512, n_threads=1)
    yield llm
    llm.close()


def test_the_tiny_model_says_the_same_with_lookup(tiny_llm):
    plain, looked_up, g = outputs(tiny_llm, GREEDY, 64)
    assert looked_up == plain and len(plain) == 64
    assert g.n_accepted > 0  # the drafts were checked in batches, and some held


@pytest.mark.parametrize("seed", [7, 8])
def test_the_tiny_model_samples_the_same_with_lookup(tiny_llm, seed):
    plain, looked_up, _ = outputs(tiny_llm, SamplingParams(temperature=0.7, seed=seed), 48)
    assert looked_up == plain


@pytest.mark.slow
def test_smollm2_edits_a_file_the_same_with_lookup():
    from ember.api.llm import LLM

    with LLM("smollm2-135m", n_ctx=1024, n_threads=2) as llm:
        # past the end of the copied file (where the model may stop: its end tokens are banned)
        no_end = SamplingParams(temperature=0.0, logit_bias={t: float("-inf") for t in llm.tokenizer.eog_ids})
        plain, looked_up, g = outputs(llm, no_end, 64)
        assert looked_up == plain and len(plain) == 64
        assert g.n_accepted >= 16  # the model copies the file: most of its tokens came from drafts
        plain, looked_up, _ = outputs(llm, SamplingParams(temperature=0.8, seed=5), 48)
        assert looked_up == plain
