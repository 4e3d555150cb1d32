"""The generation loop over a fake model whose logits are a known function of the tokens."""

import numpy as np
import pytest

from ember.engine.generate import Generation, SequenceCache, StopMatcher
from ember.engine.sampling import SamplingParams
from ember.errors import ContextFullError, EmberError
from fake_llm import BOS, END, EOS, N_VOCAB, USER, ByteTokenizer, FakeModel, continuation, peaked_logits

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [BOS] + list(b"Say:")


def generation(reply: bytes, then=EOS, prompt=PROMPT, n_ctx=256, **kwargs):
    model = FakeModel(continuation(prompt, list(reply), then), n_ctx=n_ctx)
    kwargs.setdefault("params", GREEDY)
    return Generation(model, ByteTokenizer(), prompt, **kwargs)


def log_softmax(logits):
    x = logits.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_stops_at_the_end_of_generation_token_without_emitting_it():
    g = generation(b"Hello")
    assert g.text() == "Hello"
    assert (g.finish_reason, g.n_prompt, g.n_generated) == ("stop", 5, 5)


def test_every_end_of_generation_token_stops():
    g = generation(b"Hi", then=END)
    assert g.text() == "Hi" and g.finish_reason == "stop"


def test_max_tokens_stops_with_length():
    g = generation(b"Hello", max_tokens=3)
    assert g.text() == "Hel"
    assert (g.finish_reason, g.n_generated) == ("length", 3)


def test_zero_max_tokens_generates_nothing():
    g = generation(b"Hello", max_tokens=0)
    assert g.text() == "" and g.finish_reason == "length" and g.n_generated == 0


def test_sampling_with_default_parameters_follows_a_confident_model():
    g = generation(b"Hello", params=SamplingParams(seed=3))
    assert g.text() == "Hello"


def test_text_streams_as_it_is_generated():
    g = generation(b"Hello")
    first = next(iter(g))
    assert first.text == "H"
    assert g.model.eval_calls == [PROMPT]  # only the prompt was evaluated so far


def test_stop_string_across_tokens_is_never_emitted():
    g = generation(b"The ENd? The END. More", stop=["END"])
    pieces = [chunk.text for chunk in g]
    assert "".join(pieces) == "The ENd? The "
    assert g.finish_reason == "stop"
    assert not any("E" in piece and piece.endswith(("E", "EN")) for piece in pieces)
    assert g.n_generated == len(b"The ENd? The END")  # nothing generated after the stop


def test_held_back_prefix_of_a_stop_string_is_released_when_it_diverges():
    g = generation(b"The ENd", stop=["END"])
    pieces = [chunk.text for chunk in g]
    assert pieces[-2:] == ["ENd", ""]  # "E", "N" waited for "d"
    assert g.finish_reason == "stop"  # the end token


def test_earliest_stop_string_wins():
    g = generation(b"Hello world", stop=["world", "lo w"])
    assert g.text() == "Hel"


def test_a_single_stop_string_may_be_given_as_str():
    assert generation(b"one. two.", stop=".").text() == "one"


def test_multibyte_characters_split_across_tokens_stream_whole():
    text = "héllo wörld 🔥"
    pieces = [chunk.text for chunk in generation(text.encode())]
    assert "".join(pieces) == text
    assert [p for p in pieces if p] == list(text)


def test_logprobs_are_the_models_log_softmax_with_top_alternatives():
    reply = list(b"Hey")
    model = FakeModel(continuation(PROMPT, reply))
    g = Generation(model, ByteTokenizer(), PROMPT, GREEDY, logprobs=2)
    entries = [entry for chunk in g for entry in chunk.logprobs]
    assert [e.token for e in entries] == reply
    for k, entry in enumerate(entries):
        reference = log_softmax(continuation(PROMPT, reply)(PROMPT + reply[:k]))
        assert entry.logprob == pytest.approx(reference[reply[k]], abs=1e-6)
        best = np.argsort(-reference)[:2]
        assert [t for t, _ in entry.top] == best.tolist()
        assert entry.text_offset == k


def test_logprobs_leave_out_the_stop_string():
    g = generation(b"ab.cd", stop=["."], logprobs=0)
    assert [e.token for chunk in g for e in chunk.logprobs] == list(b"ab")


def test_prompt_longer_than_the_context_says_how_to_fix_it():
    expected = r"prompt has 5 tokens but the context holds 4: raise the context size \(-c"
    with pytest.raises(ContextFullError, match=expected):
        generation(b"x", n_ctx=4)


def test_prompt_longer_than_the_models_maximum_says_to_shorten_it():
    model = FakeModel(continuation(PROMPT, b"x"), n_ctx=4)
    model.n_ctx_train = 4
    with pytest.raises(ContextFullError, match="shorten the prompt"):
        Generation(model, ByteTokenizer(), PROMPT, GREEDY)


def test_a_full_context_ends_generation_with_length():
    g = generation(b"0123456789", n_ctx=8)
    # 5 prompt tokens and 3 generated ones fill the 8 positions; the logits after them give a 4th
    assert g.text() == "0123"
    assert g.finish_reason == "length"
    assert g.model.n_past() == 8


def test_empty_prompt_is_refused():
    with pytest.raises(EmberError, match="empty"):
        Generation(FakeModel(lambda t: peaked_logits(0)), ByteTokenizer(), [], GREEDY)


def test_a_new_prompt_reuses_the_cached_prefix():
    model = FakeModel(continuation(PROMPT, list(b"ok")))
    cache = SequenceCache(model)
    Generation(model, ByteTokenizer(), PROMPT, GREEDY, cache=cache).text()
    longer = PROMPT + list(b"ok") + list(b" more")
    g = Generation(model, ByteTokenizer(), longer, GREEDY, max_tokens=1, cache=cache)
    g.text()
    assert model.eval_calls[-1] == list(b" more")  # the reply "ok" was evaluated while generating
    assert g.n_prompt_evaluated == 5
    assert model.tokens[:len(longer)] == longer


def test_the_same_prompt_again_evaluates_only_its_last_token():
    model = FakeModel(continuation(PROMPT, list(b"ok")))
    cache = SequenceCache(model)
    Generation(model, ByteTokenizer(), PROMPT, GREEDY, max_tokens=0, cache=cache).text()
    g = Generation(model, ByteTokenizer(), PROMPT, GREEDY, max_tokens=0, cache=cache)
    g.text()
    assert model.eval_calls[-1] == PROMPT[-1:] and g.n_prompt_evaluated == 1


def test_a_diverging_prompt_drops_the_cache_after_the_common_prefix():
    model = FakeModel(continuation(PROMPT, list(b"ok")))
    cache = SequenceCache(model)
    Generation(model, ByteTokenizer(), PROMPT + list(b"abc"), GREEDY, max_tokens=0, cache=cache).text()
    other = PROMPT + list(b"xyz")
    Generation(model, ByteTokenizer(), other, GREEDY, max_tokens=0, cache=cache).text()
    assert model.eval_calls[-1] == list(b"xyz") and model.tokens == other


def test_an_interrupted_evaluation_keeps_the_cache_consistent():
    class Interrupted(FakeModel):
        def eval(self, tokens, seq=0, logits="last"):
            self.tokens.extend(tokens[:2])  # the first chunk got in, then Ctrl-C
            raise KeyboardInterrupt

    model = Interrupted(continuation(PROMPT, list(b"ok")))
    cache = SequenceCache(model)
    with pytest.raises(KeyboardInterrupt):
        Generation(model, ByteTokenizer(), PROMPT, GREEDY, cache=cache).text()
    assert cache.tokens == PROMPT[:2] == model.tokens


def test_a_newer_request_ends_an_unfinished_stream():
    model = FakeModel(continuation(PROMPT, list(b"long reply")))
    cache = SequenceCache(model)
    first = iter(Generation(model, ByteTokenizer(), PROMPT, GREEDY, cache=cache))
    next(first)
    Generation(model, ByteTokenizer(), PROMPT, GREEDY, cache=cache).text()
    with pytest.raises(EmberError, match="newer request"):
        next(first)


def test_penalties_count_the_prompt():
    def prefers_a(tokens):
        logits = np.zeros(N_VOCAB, np.float32)
        logits[ord("a")], logits[ord("b")] = 2.0, 1.5
        return logits

    prompt = [BOS] + list(b"a")
    model = FakeModel(prefers_a)
    params = SamplingParams(temperature=0.0, repeat_penalty=1.5)
    assert Generation(model, ByteTokenizer(), prompt, params, max_tokens=1).text() == "b"


def test_same_seed_same_text():
    def uncertain(tokens):
        return np.random.default_rng(len(tokens)).normal(0, 1, N_VOCAB).astype(np.float32)

    def sample(seed):
        params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        return [c.text for c in Generation(FakeModel(uncertain), ByteTokenizer(), PROMPT, params, max_tokens=30)]

    assert sample(42) == sample(42)
    assert sample(42) != sample(43)


def test_timings_and_counts_are_reported():
    g = generation(b"Hello")
    g.text()
    assert g.t_prompt > 0 and g.t_generate > 0
    assert g.n_prompt_evaluated == len(PROMPT)


def test_stop_matcher_holds_back_only_possible_starts():
    matcher = StopMatcher(["</answer>"])
    assert matcher.feed("yes <") == ("yes ", False)
    assert matcher.feed("/ans") == ("", False)
    assert matcher.feed("wer> tail") == ("", True)


def test_stop_matcher_flushes_what_it_held():
    matcher = StopMatcher(["###"])
    assert matcher.feed("a#") == ("a", False)
    assert matcher.flush() == "#"


def test_control_tokens_add_no_text():
    g = Generation(FakeModel(continuation(PROMPT, [ord("a"), USER, ord("b")])), ByteTokenizer(), PROMPT, GREEDY)
    assert g.text() == "ab" and g.n_generated == 3
