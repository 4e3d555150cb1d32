"""ember.Llama: llama-cpp-python's class. Its documented usage runs unchanged (the README's
examples and the class's docstrings, with the model path filled in); arguments ember does not
implement are errors that name them."""

from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest

import ember
from ember.api.llama import LLAMA_DEFAULT_SEED, Llama, LlamaPromptLookupDecoding
from ember.errors import EmberError, EmberWarning, ModelNotFound, Unsupported
from ember.gguf.types import GGMLType
from tiny_gguf import EOS_ID, N_CTX_TRAIN, TOKENS, write_tiny_model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("llama") / "tiny.gguf"))


@pytest.fixture
def llm(tiny_path):
    model = Llama(model_path=tiny_path, n_threads=1, verbose=False)
    yield model
    model.close()


def run_documented(code: str, **paths) -> dict:
    """Run llama-cpp-python's example code as written, `from llama_cpp import Llama` giving ember's."""
    module = types.ModuleType("llama_cpp")
    module.Llama = Llama
    saved = sys.modules.get("llama_cpp")
    sys.modules["llama_cpp"] = module
    try:
        namespace: dict = {}
        for placeholder, path in paths.items():
            code = code.replace(placeholder, path)
        exec(compile(code, "<llama-cpp-python example>", "exec"), namespace)
        return namespace
    finally:
        if saved is None:
            del sys.modules["llama_cpp"]
        else:
            sys.modules["llama_cpp"] = saved


# -- llama-cpp-python's documentation, unchanged ------------------------------------------------------

README_COMPLETION = '''
from llama_cpp import Llama

llm = Llama(
      model_path="./models/7B/llama-model.gguf",
      # n_gpu_layers=-1, # Uncomment to use GPU acceleration
      # seed=1337, # Uncomment to set a specific seed
      # n_ctx=2048, # Uncomment to increase the context window
)
output = llm(
      "Q: Name the planets in the solar system? A: ", # Prompt
      max_tokens=32, # Generate up to 32 tokens, set to None to generate up to the end of the context window
      stop=["Q:", "\\n"], # Stop generating just before the model would generate a new question
      echo=True # Echo the prompt back in the output
) # Generate a completion, can also call create_completion
print(output)
'''

README_CHAT = '''
from llama_cpp import Llama
llm = Llama(
      model_path="path/to/llama-2/llama-model.gguf",
      chat_format="llama-2"
)
llm.create_chat_completion(
      messages = [
          {"role": "system", "content": "You are an assistant who perfectly describes images."},
          {
              "role": "user",
              "content": "Describe this image in detail please."
          }
      ]
)
'''

README_JSON_MODE = '''
from llama_cpp import Llama
llm = Llama(model_path="path/to/model.gguf", chat_format="chatml")
result = llm.create_chat_completion(
    messages=[
        {
            "role": "system",
            "content": "You are a helpful assistant that outputs in JSON.",
        },
        {"role": "user", "content": "Who won the world series in 2020"},
    ],
    response_format={
        "type": "json_object",
    },
    temperature=0.7,
)
'''

README_CONTEXT = '''
from llama_cpp import Llama
llm = Llama(model_path="./models/7B/llama-model.gguf", n_ctx=2048)
'''

DOCSTRING_BASIC = '''
import llama_cpp
model = llama_cpp.Llama(
    model_path="path/to/model",
)
text = model("The quick brown fox jumps ", stop=["."])["choices"][0]["text"]
'''

README_EMBEDDING = '''
import llama_cpp

llm = llama_cpp.Llama(model_path="path/to/model.gguf", embedding=True)

embeddings = llm.create_embedding("Hello, world!")
'''


@pytest.mark.model
def test_the_readme_completion_example_runs(capsys):
    from ember.hub import resolve_model

    namespace = run_documented(README_COMPLETION, **{"./models/7B/llama-model.gguf": str(resolve_model("smollm2-135m"))})
    output = namespace["output"]
    assert set(output) == {"id", "object", "created", "model", "choices", "usage"}
    assert output["object"] == "text_completion" and output["id"].startswith("cmpl-")
    choice = output["choices"][0]
    assert choice["text"].startswith("Q: Name the planets in the solar system? A: ")
    assert "\n" not in choice["text"] and "Q:" not in choice["text"][len("Q: Name"):]
    assert choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    usage = output["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["prompt_tokens"] > 5
    assert "'object': 'text_completion'" in capsys.readouterr().out


@pytest.mark.model
def test_the_readme_chat_and_json_mode_examples_run():
    from ember.hub import resolve_model

    path = str(resolve_model("smollm2-135m"))
    run_documented(README_CHAT, **{"path/to/llama-2/llama-model.gguf": path})
    result = run_documented(README_JSON_MODE, **{"path/to/model.gguf": path})["result"]
    import json

    choice = result["choices"][0]
    assert choice["message"]["content"].startswith("{")
    if choice["finish_reason"] == "stop":  # a 135M model may also loop inside the object until the context ends
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_the_context_and_docstring_examples_run(tiny_path):
    llm = run_documented(README_CONTEXT, **{"./models/7B/llama-model.gguf": tiny_path})["llm"]
    assert llm.n_ctx() == 2048
    assert isinstance(run_documented(DOCSTRING_BASIC, **{"path/to/model": tiny_path})["text"], str)


@pytest.mark.model
def test_the_embedding_example_runs():
    from encoder_models import minilm_gguf

    namespace = run_documented(README_EMBEDDING, **{"path/to/model.gguf": str(minilm_gguf())})
    embeddings, llm = namespace["embeddings"], namespace["llm"]
    assert embeddings["object"] == "list" and embeddings["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    (item,) = embeddings["data"]
    assert item["object"] == "embedding" and item["index"] == 0 and len(item["embedding"]) == 384
    assert item["embedding"] == llm.embed("Hello, world!")
    vectors, count = llm.embed(["Hello, world!", "hi"], return_count=True)
    assert len(vectors) == 2 and count == 6 + 3 and vectors[0] == item["embedding"]


# -- the constructor ------------------------------------------------------------------------------

def test_public_name():
    assert ember.Llama is Llama


def test_defaults_are_llama_cpp_pythons(llm):
    assert llm.n_ctx() == 512 and llm.n_batch == 512
    assert llm.model_path.endswith("tiny.gguf") and llm.chat_format is None


def test_n_ctx_zero_is_the_models(tiny_path):
    assert Llama(tiny_path, n_ctx=0, n_threads=1, verbose=False).n_ctx() == N_CTX_TRAIN


def test_gpu_layers_are_ignored_with_a_warning(tiny_path):
    with pytest.warns(EmberWarning, match=r"n_gpu_layers=-1, offload_kqv=False ignored: ember runs on the CPU"):
        Llama(tiny_path, n_gpu_layers=-1, offload_kqv=False, n_threads=1, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Llama(tiny_path, n_gpu_layers=0, flash_attn=False, n_threads=1, verbose=False)


@pytest.mark.parametrize("argument", [dict(lora_path="x.gguf"), dict(rope_freq_base=1e6), dict(vocab_only=True),
                                      dict(kv_overrides={"a": 1}), dict(swa_full=True), dict(n_threads_batch=3)])
def test_an_argument_ember_does_not_implement_is_named(tiny_path, argument):
    (name, value), = argument.items()
    with pytest.raises(Unsupported, match=name):
        Llama(tiny_path, n_threads=1, verbose=False, **argument)


def test_the_defaults_of_unimplemented_arguments_are_fine(tiny_path):
    Llama(tiny_path, lora_path=None, rope_freq_base=0.0, vocab_only=False, numa=False, n_threads=1, verbose=False)


def test_a_prompt_lookup_draft_model_gives_the_same_completion(tiny_path, llm):
    prompt = "the cat sat. the cat sat. the cat"
    plain = llm(prompt, max_tokens=24, temperature=0)["choices"][0]["text"]
    draft = LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=5)
    looked_up = Llama(tiny_path, n_threads=1, verbose=False, draft_model=draft)
    assert looked_up._llm.lookup == ember.Lookup(ngram_min=1, ngram_max=3, n_draft=5)
    assert looked_up(prompt, max_tokens=24, temperature=0)["choices"][0]["text"] == plain
    looked_up.close()


def test_a_draft_model_other_than_prompt_lookup_is_refused(tiny_path):
    with pytest.raises(Unsupported, match="draft_model=.*prompt lookup"):
        Llama(tiny_path, n_threads=1, verbose=False, draft_model=object())


def test_an_unknown_argument_is_a_type_error(tiny_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_gpu'"):
        Llama(tiny_path, n_gpu=1, verbose=False)


def test_verbose_says_what_was_loaded(tiny_path, capsys):
    Llama(tiny_path, n_threads=1)
    assert "ember: loaded " in capsys.readouterr().err
    Llama(tiny_path, n_threads=1, verbose=False)
    assert capsys.readouterr().err == ""


def test_use_mmap_false_and_use_mlock(tiny_path):
    a = Llama(tiny_path, n_threads=1, verbose=False)
    b = Llama(tiny_path, n_threads=1, verbose=False, use_mmap=False, use_mlock=True)
    tokens = a.tokenize(b"the cat")
    a.eval(tokens)
    b.eval(tokens)
    assert np.array_equal(a.scores, b.scores)


# -- the model, tokens ---------------------------------------------------------------------------

def test_model_facts_are_methods(llm):
    assert llm.n_vocab() == len(TOKENS)
    assert llm.token_eos() == EOS_ID and llm.token_bos() == EOS_ID
    assert llm.n_embd() == 64
    assert llm.detokenize([llm.token_nl()]) == b"\n"


def test_metadata_is_strings_as_llama_cpp_formats_them(llm):
    assert llm.metadata["general.architecture"] == "llama"
    assert llm.metadata["llama.context_length"] == str(N_CTX_TRAIN)
    assert llm.metadata["tokenizer.ggml.add_bos_token"] == "false"
    assert llm.metadata["tokenizer.ggml.merges"].startswith('["Ġ t", "h e"')


def test_tokenize_takes_bytes_and_detokenize_gives_bytes(llm):
    ids = llm.tokenize(b"the cat")
    assert ids == [116, 257, 32, 99, 97, 116]
    assert llm.detokenize(ids) == b"the cat"
    assert llm.tokenize("the cat") == ids
    assert llm.tokenize(b"<|im_end|>", add_bos=False, special=True) == [TOKENS.index("<|im_end|>")]
    assert llm.detokenize([TOKENS.index("<|im_end|>")]) == b""
    assert llm.detokenize([TOKENS.index("<|im_end|>")], special=True) == b"<|im_end|>"


def test_detokenize_keeps_the_bytes_of_a_partial_character(llm):
    e_acute = list("é".encode())  # two byte tokens
    assert llm.detokenize(e_acute[:1]) == b"\xc3"
    assert llm.detokenize(e_acute[1:], prev_tokens=e_acute[:1]) == b"\xa9"


# -- eval, state --------------------------------------------------------------------------------------

def test_eval_continues_at_n_tokens(llm, tiny_path):
    tokens = llm.tokenize(b"the cat sat")
    llm.eval(tokens[:3])
    llm.eval(tokens[3:])
    assert llm.n_tokens == len(tokens) and list(llm.input_ids) == tokens
    whole = Llama(tiny_path, n_threads=1, verbose=False, logits_all=True)
    whole.eval(tokens)
    assert whole.scores.shape == (len(tokens), llm.n_vocab())
    np.testing.assert_allclose(llm.scores[-1], whole.scores[-1], rtol=1e-5, atol=1e-5)
    llm.reset()
    assert llm.n_tokens == 0


def test_save_and_load_state_come_back_to_the_same_logits(llm):
    llm.eval(llm.tokenize(b"the cat"))
    state = llm.save_state()
    llm.eval(llm.tokenize(b" sat", add_bos=False))
    after = llm.scores[-1].copy()
    llm.reset()
    llm.eval(llm.tokenize(b"something else entirely"))
    llm.load_state(state)
    assert llm.n_tokens == state.n_tokens == len(llm.tokenize(b"the cat"))
    llm.eval(llm.tokenize(b" sat", add_bos=False))
    np.testing.assert_array_equal(llm.scores[-1], after)


def test_a_state_of_another_model_is_refused(llm):
    llm.eval(llm.tokenize(b"the cat"))
    state = llm.save_state()
    state.llama_state = state.llama_state[:-2]
    state.llama_state_size -= 2
    with pytest.raises(EmberError, match="is not one of this model's"):
        llm.load_state(state)


# -- completions ---------------------------------------------------------------------------------------

def test_create_completion_is_openai_shaped_with_the_model_path(llm):
    out = llm.create_completion("the cat", max_tokens=4, temperature=0)
    assert out["object"] == "text_completion" and out["model"] == llm.model_path
    assert out["usage"]["completion_tokens"] <= 4
    assert llm("the cat", max_tokens=4, temperature=0)["choices"][0]["text"] == out["choices"][0]["text"]


def test_echo_puts_the_prompt_first(llm):
    plain = llm("the cat", max_tokens=3, temperature=0)["choices"][0]["text"]
    assert llm("the cat", max_tokens=3, temperature=0, echo=True)["choices"][0]["text"] == "the cat" + plain
    chunks = list(llm("the cat", max_tokens=3, temperature=0, echo=True, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == "the cat" + plain


def test_a_fixed_seed_repeats_every_request(tiny_path):
    llm = Llama(tiny_path, seed=1234, n_threads=1, verbose=False)
    texts = {llm("the", max_tokens=8, temperature=1.5)["choices"][0]["text"] for _ in range(3)}
    assert len(texts) == 1
    fresh = Llama(tiny_path, seed=LLAMA_DEFAULT_SEED, n_threads=1, verbose=False)
    assert len({fresh("the", max_tokens=8, temperature=1.5, top_k=0, min_p=0.0)["choices"][0]["text"]
                for _ in range(4)}) > 1


def test_sampling_options_reach_the_sampler(llm, monkeypatch):
    seen = []
    original = llm._llm.generation

    def spy(prompt, params=None, **kwargs):
        seen.append(params)
        return original(prompt, params, **kwargs)

    monkeypatch.setattr(llm._llm, "generation", spy)
    llm("the", max_tokens=2, typical_p=0.7, mirostat_mode=2, mirostat_tau=4.0, mirostat_eta=0.2,
        logit_bias={5: -1.0}, repeat_penalty=1.1)
    params = seen[-1]
    assert (params.typical_p, params.mirostat_mode, params.mirostat_tau, params.mirostat_eta) == (0.7, 2, 4.0, 0.2)
    assert params.logit_bias == {5: -1.0} and params.repeat_last_n == 64 and params.repeat_penalty == 1.1


def test_max_tokens_none_or_negative_runs_to_the_end(llm):
    out = llm("the", max_tokens=-1, temperature=0, logit_bias={EOS_ID: -1e9}, stop=None)
    assert out["choices"][0]["finish_reason"] == "length"
    # the context fills up, and one more token is drawn from the logits of its last position
    assert out["usage"]["total_tokens"] == llm.n_ctx() + 1


def test_suffix_without_fim_tokens_is_appended_as_documented(llm):
    plain = llm("the", max_tokens=3, temperature=0)["choices"][0]["text"]
    assert llm("the", suffix=" END", max_tokens=3, temperature=0)["choices"][0]["text"] == plain + " END"


def test_suffix_with_fim_tokens_builds_a_fill_in_the_middle_prompt(tmp_path):
    from ember.gguf import GGUFWriter, open_gguf

    source = write_tiny_model(tmp_path / "plain.gguf")
    fim = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
    with open_gguf(source) as f:  # the tiny model with three more tokens (and rows) for FIM
        writer = GGUFWriter(tmp_path / "fim.gguf")
        for key, value in f.metadata.items():
            value = list(value) + (fim if key == "tokenizer.ggml.tokens" else [3, 3, 3]) \
                if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type") else value
            writer.add(key, value, f.metadata_types[key])
        for name, info in f.tensors.items():
            array = info.array()
            if name in ("token_embd.weight", "output.weight"):
                array = np.concatenate([array, array[:3]])
            writer.add_tensor(name, np.ascontiguousarray(array))
        writer.write()
    llm = Llama(str(tmp_path / "fim.gguf"), n_threads=1, verbose=False)
    pre, suf, mid = (len(TOKENS) + i for i in range(3))
    tokens, append = llm._completion_prompt("def f(", "):\n")
    assert append == ""
    assert tokens == [pre] + llm.tokenize(b"def f(", add_bos=False) + [suf] + llm.tokenize(b"):\n", add_bos=False) + [mid]
    llm.spm_infill = True
    tokens, _ = llm._completion_prompt("def f(", "):\n")
    assert tokens[0] == suf and tokens[-1] == mid
    out = llm("def f(", suffix="):\n", max_tokens=2, temperature=0)
    assert out["usage"]["prompt_tokens"] == len(tokens)


@pytest.mark.parametrize("argument, name", [(dict(tfs_z=0.9), "tfs_z"), (dict(logits_processor=[abs]), "logits_processor"),
                                            (dict(stopping_criteria=[abs]), "stopping_criteria"),
                                            (dict(echo=True, logprobs=1), "echo=True with logprobs")])
def test_completion_arguments_ember_does_not_implement_are_named(llm, argument, name):
    with pytest.raises(Unsupported, match=name):
        llm("the", max_tokens=1, **argument)


def test_chat_completion_takes_content_parts_and_empty_assistant_turns(tiny_path):
    llm = Llama(tiny_path, n_threads=1, verbose=False, chat_format="chatml")
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    out = llm.create_chat_completion(messages, max_tokens=3, temperature=0)
    assert out["object"] == "chat.completion" and out["model"] == llm.model_path
    expected = llm._llm.chat_tokens([
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None}, {"role": "user", "content": "again"}])
    assert out["usage"]["prompt_tokens"] == len(expected)
    with pytest.raises(Unsupported, match="image_url"):
        llm.create_chat_completion([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_chat_format_picks_a_builtin_format(tiny_path):
    llm = Llama(tiny_path, n_threads=1, verbose=False, chat_format="llama-3")
    assert llm._llm.chat_template.origin == "built-in llama3"
    with pytest.raises(EmberError, match="unknown chat template"):
        Llama(tiny_path, n_threads=1, verbose=False, chat_format="no-such-format")


# -- from_pretrained --------------------------------------------------------------------------------------

def test_from_pretrained_takes_a_pattern_and_passes_the_rest_on(tmp_path, monkeypatch, tiny_path):
    from pathlib import Path

    from fake_hub import FakeHub

    data = Path(tiny_path).read_bytes()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub({"org/Tiny-GGUF": {"tiny-Q8_0.gguf": data, "tiny-Q4_K_M.gguf": data, "tokenizer.json": b"{}"}}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        llm = Llama.from_pretrained(repo_id="org/Tiny-GGUF", filename="*Q8_0.gguf", verbose=False, n_threads=1,
                                    additional_files=["tokenizer.json"])
        assert llm.model_path.endswith("tiny-Q8_0.gguf") and llm.n_ctx() == 512
        assert sorted(hub.downloads()) == ["tiny-Q8_0.gguf", "tokenizer.json"]
        with pytest.raises(ModelNotFound, match=r"no GGUF model matching '\*Q2_K.gguf'"):
            Llama.from_pretrained("org/Tiny-GGUF", "*Q2_K.gguf", verbose=False)
        with pytest.raises(EmberError, match="2 GGUF models are matching"):
            Llama.from_pretrained("org/Tiny-GGUF", "*.gguf", verbose=False)


def test_type_k_and_type_v_choose_the_cache_types_by_ggml_id(tiny_path):
    """llama-cpp-python's type_k / type_v are ggml type ids: 0 F32, 1 F16, 8 Q8_0."""
    f16 = Llama(model_path=tiny_path, n_threads=1, n_ctx=64, verbose=False)
    f32 = Llama(model_path=tiny_path, n_threads=1, n_ctx=64, verbose=False, type_k=0, type_v=0)
    try:
        assert (f32._llm.model.type_k, f32._llm.model.type_v) == (GGMLType.F32, GGMLType.F32)
        assert f32._llm.model.memory()["kv_cache"] == 2 * f16._llm.model.memory()["kv_cache"]
    finally:
        f16.close()
        f32.close()


def test_a_cache_type_ember_lacks_is_an_error_naming_it(tiny_path):
    with pytest.raises(EmberError, match="type_v q4_0 is not a KV cache type ember implements; use one of f32, f16, q8_0"):
        Llama(model_path=tiny_path, n_threads=1, verbose=False, type_v=2)
    # the tiny model's heads have 16 dimensions: not whole Q8_0 blocks
    with pytest.raises(EmberError, match="multiple of 32, not 16"):
        Llama(model_path=tiny_path, n_threads=1, verbose=False, type_k=8)
