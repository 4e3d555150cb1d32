"""`Llama`: llama-cpp-python's class, over ember's `LLM`, so that code written for
llama-cpp-python runs unchanged:

    from ember import Llama
    llm = Llama(model_path="model.gguf", n_ctx=2048, seed=1337, verbose=False)
    out = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"], echo=True)
    print(out["choices"][0]["text"])

The constructor takes llama-cpp-python's names and defaults (n_ctx=512, 0 = the model's;
seed=LLAMA_DEFAULT_SEED = a fresh seed per request, any other seed = the same seed for every
request). Arguments that only mean something on a GPU (n_gpu_layers, main_gpu, tensor_split,
offload_kqv, flash_attn, ...) are ignored with a warning when they ask for a GPU; any other
argument ember does not implement raises `Unsupported` naming it, unless it has its default
value. Methods return what llama-cpp-python returns: OpenAI-shaped dicts from
`create_completion` (also `llm(...)`) and `create_chat_completion`, token ids from
`tokenize(bytes)`, bytes from `detokenize`; `n_ctx()`, `n_vocab()`, `token_eos()` ... are methods.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ember.api.llm import LLM
from ember.engine.generate import SequenceState
from ember.engine.lookup import Lookup
from ember.engine.sampling_params import CHAT_TEMPERATURE
from ember.engine.sampling_params import DEFAULTS as D
from ember.errors import EmberWarning, Unsupported

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# llama-cpp-python's Llama arguments ember has no use for on a CPU: ignored (a warning when they ask for a GPU)
_GPU_ONLY = {"split_mode": None, "main_gpu": 0, "tensor_split": None, "offload_kqv": True, "op_offload": None,
             "flash_attn": False}
# ... and those it does not implement: accepted only with their default value
_NOT_IMPLEMENTED = {
    "vocab_only": False, "kv_overrides": None, "rope_scaling_type": -1, "pooling_type": -1, "attention_type": -1,
    "rope_freq_base": 0.0, "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0,
    "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0, "swa_full": None, "lora_base": None,
    "lora_scale": 1.0, "lora_path": None, "numa": False, "chat_handler": None, "tokenizer": None,
    "no_perf": False,
}


class LlamaPromptLookupDecoding:
    """llama-cpp-python's prompt-lookup draft model, as `Llama(draft_model=...)` takes it: drafts
    of up to num_pred_tokens tokens found after the last 1..max_ngram_size tokens (ember.Lookup)."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens
        self.lookup = Lookup(ngram_min=1, ngram_max=max_ngram_size, n_draft=num_pred_tokens)


@dataclass
class LlamaState:
    """A saved state of a Llama: its tokens, their scores, the KV cache bytes and the seed."""

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int


class Llama:
    def __init__(self, model_path: str, *, n_gpu_layers: int = 0, use_mmap: bool = True, use_mlock: bool = False,
                 seed: int = LLAMA_DEFAULT_SEED, n_ctx: int = 512, n_batch: int = 512, n_ubatch: int = 512,
                 n_threads: int | None = None, n_threads_batch: int | None = None, logits_all: bool = False,
                 embedding: bool = False, last_n_tokens_size: int = 64, chat_format: str | None = None,
                 spm_infill: bool = False, verbose: bool = True,
                 draft_model: LlamaPromptLookupDecoding | None = None, type_k: int | str | None = None,
                 type_v: int | str | None = None, **kwargs: Any):
        _check_arguments(kwargs, n_gpu_layers)
        if draft_model is not None and not isinstance(draft_model, LlamaPromptLookupDecoding):
            raise Unsupported(f"draft_model={draft_model!r}: ember drafts only by prompt lookup "
                              "(LlamaPromptLookupDecoding), not with a draft model")
        if n_threads_batch is not None and n_threads_batch != n_threads:
            raise Unsupported(f"n_threads_batch={n_threads_batch}: ember uses the same threads (n_threads) for "
                              "prompts and generation")
        self.model_path = str(model_path)
        self.verbose = verbose
        self.chat_format = chat_format
        self.last_n_tokens_size = last_n_tokens_size
        self.spm_infill = spm_infill
        self._logits_all = logits_all
        self._seed = seed
        self._llm = LLM(model_path, n_ctx=n_ctx, n_threads=n_threads, n_batch=min(n_batch, n_ubatch),
                        use_mmap=use_mmap, use_mlock=use_mlock, chat_template=chat_format,
                        lookup=draft_model.lookup if draft_model is not None else None, type_k=type_k, type_v=type_v)
        self.n_batch = self._llm.model.n_batch
        self.input_ids = np.zeros(0, dtype=np.intc)
        self._scores: list[np.ndarray] = []
        if verbose:
            model = self._llm.model
            print(f"ember: loaded {self.model_path} ({model.hp.arch}, n_ctx {model.n_ctx}, {model.n_threads} threads, "
                  f"chat template: {self._llm.chat_template.origin})", file=sys.stderr)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files: Sequence[str] | None = None,
                        local_dir: str | os.PathLike | None = None, local_dir_use_symlinks: Any = "auto",
                        cache_dir: str | os.PathLike | None = None, **kwargs: Any) -> "Llama":
        """A model from a Hugging Face repository: `filename` is a file name or glob pattern
        (e.g. "*Q8_0.gguf"; a split model's parts are all fetched), `additional_files` more
        patterns to fetch beside it; the download goes to the Hugging Face cache (or cache_dir,
        local_dir)."""
        from ember.hub import hf_pull

        path = hf_pull(repo_id, pattern=filename, cache_dir=cache_dir, local_dir=local_dir,
                       progress=kwargs.get("verbose", True))
        for pattern in additional_files or ():
            hf_pull(repo_id, pattern=pattern, cache_dir=cache_dir, local_dir=local_dir, any_file=True,
                    progress=kwargs.get("verbose", True))
        return cls(model_path=str(path), **kwargs)

    # -- the model ---------------------------------------------------------------------------

    def n_ctx(self) -> int:
        return self._llm.n_ctx

    def n_vocab(self) -> int:
        return self._llm.n_vocab

    def n_embd(self) -> int:
        return self._llm.model.hp.n_embd

    def token_bos(self) -> int:
        return -1 if self._llm.tokenizer.bos_id is None else self._llm.tokenizer.bos_id

    def token_eos(self) -> int:
        return -1 if self._llm.tokenizer.eos_id is None else self._llm.tokenizer.eos_id

    def token_nl(self) -> int:
        ids = self._llm.tokenizer.encode("\n", add_special=False)
        return ids[-1] if ids else -1

    @cached_property
    def metadata(self) -> dict[str, str]:
        """The file's metadata as strings, as llama.cpp formats them (arrays as [a, b, ...])."""
        return {key: _metadata_text(value) for key, value in self._llm.model.gguf.metadata.items()}

    @property
    def scores(self) -> np.ndarray:
        """The logits of the evaluated positions: [n_tokens, n_vocab] with logits_all, else the
        rows `eval` returned (the last position of each call)."""
        if not self._scores:
            return np.zeros((0, self.n_vocab()), np.float32)
        return np.concatenate(self._scores)

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    # -- tokens ------------------------------------------------------------------------------

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 text (bytes, as llama-cpp-python takes it, or str)."""
        return self._llm.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of tokens (pieces of a character stay bytes); with prev_tokens, only the
        bytes the tokens add after them."""
        tokenizer = self._llm.tokenizer
        if prev_tokens:
            whole = tokenizer.decode_bytes(list(prev_tokens) + list(tokens), skip_special=not special)
            return whole[len(tokenizer.decode_bytes(list(prev_tokens), skip_special=not special)):]
        return tokenizer.decode_bytes(list(tokens), skip_special=not special)

    # -- evaluation --------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the evaluated tokens (n_tokens = 0)."""
        self._llm.reset()
        self.input_ids = np.zeros(0, dtype=np.intc)
        self._scores = []

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens after the n_tokens already evaluated (whatever followed them is forgotten)."""
        self._llm.truncate(self.n_tokens)
        rows = self._llm.logits(list(tokens), last_only=not self._logits_all)
        self._scores.append(rows)
        self.input_ids = np.array(self._llm.tokens, dtype=np.intc)

    def save_state(self) -> LlamaState:
        """The evaluated tokens, their scores and the KV cache (bytes), for `load_state`."""
        state = self._llm.save_state()
        return LlamaState(np.array(state.tokens, dtype=np.intc), self.scores.copy(), len(state.tokens), state.kv,
                          len(state.kv), self._seed)

    def load_state(self, state: LlamaState) -> None:
        tokens = tuple(int(t) for t in state.input_ids[:state.n_tokens])
        self._llm.load_state(SequenceState(tokens, bytes(state.llama_state[:state.llama_state_size])))
        self.input_ids = np.array(tokens, dtype=np.intc)
        self._scores = [np.array(state.scores)] if len(state.scores) else []
        self._seed = state.seed

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    # -- completions ---------------------------------------------------------------------------

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = D.temperature, top_p: float = D.top_p, min_p: float = D.min_p,
                          typical_p: float = D.typical_p, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = D.frequency_penalty,
                          presence_penalty: float = D.presence_penalty, repeat_penalty: float = D.repeat_penalty,
                          top_k: int = D.top_k, stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = D.mirostat_mode, mirostat_tau: float = D.mirostat_tau,
                          mirostat_eta: float = D.mirostat_eta, model: str | None = None,
                          stopping_criteria: Any = None, logits_processor: Any = None, grammar: Any = None,
                          logit_bias: Mapping[int, float] | None = None) -> dict | Iterator[dict]:
        """llama-cpp-python's create_completion. echo puts the prompt before the text; suffix
        makes a fill-in-the-middle prompt where the model has FIM tokens, and is otherwise
        appended to the text, as llama-cpp-python does."""
        _refuse_callables(stopping_criteria=stopping_criteria, logits_processor=logits_processor)
        if tfs_z != 1.0:
            raise Unsupported(f"tfs_z={tfs_z}: tail-free sampling is not implemented (llama.cpp removed it)")
        if echo and logprobs is not None:
            raise Unsupported("echo=True with logprobs: the prompt's log-probabilities are not computed")
        tokens, append = self._completion_prompt(prompt, suffix)
        result = self._llm.create_completion(
            tokens, max_tokens=_max_tokens(max_tokens), temperature=temperature, top_p=top_p, min_p=min_p,
            top_k=top_k, stop=stop or None, stream=stream, logprobs=logprobs, seed=self._request_seed(seed),
            repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            logit_bias=logit_bias, grammar=_grammar(grammar), typical_p=typical_p, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, repeat_last_n=self.last_n_tokens_size)
        head = prompt if echo and isinstance(prompt, str) else \
            self._llm.detokenize(prompt) if echo else ""
        name = model or self.model_path
        if stream:
            return _stream_with(result, head, append, name)
        self._sync_tokens()
        choice = result["choices"][0]
        choice["text"] = head + choice["text"] + append
        result["model"] = name
        return result

    __call__ = create_completion

    def create_chat_completion(self, messages: list[dict], functions: Any = None, function_call: Any = None,
                               tools: list[dict] | None = None, tool_choice: Any = None,
                               temperature: float = CHAT_TEMPERATURE, top_p: float = D.top_p, top_k: int = D.top_k,
                               min_p: float = D.min_p, typical_p: float = D.typical_p, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None,
                               response_format: dict | None = None, max_tokens: int | None = None,
                               presence_penalty: float = D.presence_penalty,
                               frequency_penalty: float = D.frequency_penalty,
                               repeat_penalty: float = D.repeat_penalty, tfs_z: float = 1.0,
                               mirostat_mode: int = D.mirostat_mode, mirostat_tau: float = D.mirostat_tau,
                               mirostat_eta: float = D.mirostat_eta, model: str | None = None,
                               logits_processor: Any = None, grammar: Any = None,
                               logit_bias: Mapping[int, float] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None) -> dict | Iterator[dict]:
        """llama-cpp-python's create_chat_completion: message content may be a string, a list of
        text parts, or None (an assistant turn that only called tools)."""
        _refuse_callables(logits_processor=logits_processor)
        if tfs_z != 1.0:
            raise Unsupported(f"tfs_z={tfs_z}: tail-free sampling is not implemented (llama.cpp removed it)")
        if functions is not None or function_call is not None:
            tools = tools if tools is not None else [{"type": "function", "function": f} for f in functions or ()]
            if function_call is not None and tool_choice is None:
                tool_choice = function_call if isinstance(function_call, str) else \
                    {"type": "function", "function": function_call}
        result = self._llm.create_chat_completion(
            [_plain_message(m) for m in messages], temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
            stream=stream, stop=stop or None, seed=self._request_seed(seed), max_tokens=_max_tokens(max_tokens),
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty,
            logit_bias=logit_bias, logprobs=bool(logprobs), top_logprobs=top_logprobs,
            response_format=response_format, grammar=_grammar(grammar), tools=tools, tool_choice=tool_choice,
            typical_p=typical_p, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta, repeat_last_n=self.last_n_tokens_size)
        name = model or self.model_path
        if stream:
            return _renamed(result, name)
        self._sync_tokens()
        result["model"] = name
        return result

    def create_embedding(self, input: Any, model: str | None = None) -> dict:
        """OpenAI's embedding response for a text or a list of texts (see LLM.create_embedding)."""
        return self._llm.create_embedding(input, model=model or self.model_path)

    def embed(self, input: Any, normalize: bool = True, truncate: bool = True, return_count: bool = False):
        """The embedding of a text (a list of floats), or of each of a list of texts (see LLM.embed)."""
        return self._llm.embed(input, normalize=normalize, truncate=truncate, return_count=return_count)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        self._llm.close()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- helpers -----------------------------------------------------------------------------

    def _request_seed(self, seed: int | None) -> int | None:
        if seed is not None:
            return seed
        return None if self._seed in (LLAMA_DEFAULT_SEED, -1) else self._seed

    def _completion_prompt(self, prompt: str | list[int], suffix: str | None) -> tuple[list[int], str]:
        """The prompt's ids, and the text to append to the completion."""
        tokenizer = self._llm.tokenizer
        if suffix is None:
            return (self._llm.prompt_tokens(prompt) if isinstance(prompt, str) else list(prompt)), ""
        fim = [tokenizer.special_id(name) for name in ("fim_pre", "fim_suf", "fim_mid")]
        if None in fim:
            return (self._llm.prompt_tokens(prompt) if isinstance(prompt, str) else list(prompt)), suffix
        pre, suf, mid = fim
        before = tokenizer.encode(prompt, add_special=False) if isinstance(prompt, str) else list(prompt)
        after = tokenizer.encode(suffix, add_special=False)
        bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
        body = [suf] + after + [pre] + before if self.spm_infill else [pre] + before + [suf] + after
        return bos + body + [mid], ""

    def _sync_tokens(self) -> None:
        """After a completion, input_ids are the tokens its KV cache holds (as llama-cpp-python's)."""
        self.input_ids = np.array(self._llm.tokens, dtype=np.intc)
        self._scores = []


def _check_arguments(kwargs: dict, n_gpu_layers: int) -> None:
    asked = [f"n_gpu_layers={n_gpu_layers}"] if n_gpu_layers not in (0, None) else []
    for name, value in kwargs.items():
        if name in _GPU_ONLY:
            if value != _GPU_ONLY[name]:
                asked.append(f"{name}={value!r}")
        elif name in _NOT_IMPLEMENTED:
            if value != _NOT_IMPLEMENTED[name]:
                raise Unsupported(f"Llama({name}={value!r}) is not implemented in ember")
        else:
            raise TypeError(f"Llama() got an unexpected keyword argument {name!r}")
    if asked:
        warnings.warn(EmberWarning(f"{', '.join(asked)} ignored: ember runs on the CPU"), stacklevel=3)


def _refuse_callables(**given: Any) -> None:
    for name, value in given.items():
        if value is not None:
            raise Unsupported(f"{name}: Python callbacks inside sampling are not implemented in ember")


def _grammar(grammar: Any):
    """llama-cpp-python's LlamaGrammar (its GBNF text), GBNF text, or an ember Grammar."""
    if grammar is None or isinstance(grammar, str):
        return grammar
    text = getattr(grammar, "_grammar", None) or getattr(grammar, "grammar", None)
    if isinstance(text, str):
        return text
    return grammar


def _max_tokens(max_tokens: int | None) -> int | None:
    """llama-cpp-python: None or <= 0 means until the end of the context."""
    return None if max_tokens is None or max_tokens <= 0 else max_tokens


def _plain_message(message: Mapping) -> dict:
    """A message with its content as text: a list of text parts joined, None kept (tool calls)."""
    message = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise Unsupported(f"message content of type {kind!r}: ember takes text only")
        message["content"] = "".join(texts)
    return message


def _metadata_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    if isinstance(value, np.ndarray):
        return "[" + ", ".join(str(v) for v in value.tolist()) + "]"
    if hasattr(value, "__len__"):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else _metadata_text(v) for v in value) + "]"
    return str(value)


def _stream_with(chunks: Iterator[dict], head: str, tail: str, name: str) -> Iterator[dict]:
    """A completion stream with the echoed prompt first and the suffix last."""
    first = True
    for chunk in chunks:
        chunk["model"] = name
        choice = chunk["choices"][0] if chunk.get("choices") else None
        if choice is not None and first and head:
            choice["text"] = head + choice["text"]
        if choice is not None and choice.get("finish_reason") is not None and tail:
            choice["text"] = choice["text"] + tail
        first = False
        yield chunk


def _renamed(chunks: Iterator[dict], name: str) -> Iterator[dict]:
    for chunk in chunks:
        chunk["model"] = name
        yield chunk
