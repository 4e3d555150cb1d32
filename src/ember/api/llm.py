"""The Python API: `LLM`, modelled on llama-cpp-python's `Llama`.

    import ember
    llm = ember.LLM("smollm2-135m", n_ctx=2048, seed=42)
    print(llm.generate("The capital of France is", max_tokens=16, temperature=0))
    for piece in llm.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="", flush=True)

`create_completion` and `create_chat_completion` return OpenAI-shaped dicts (or iterators of
chunks with stream=True); `embed` and `create_embedding` the embeddings of texts (an encoder such
as BERT, or a generation model's pooled hidden states); `rerank` and `create_rerank` a
cross-encoder's relevance scores of documents to a query. An LLM holds one KV-cache sequence: a request that shares a prefix
with the previous one (a chat history) only evaluates what is new. It is not thread-safe:
start a request only once the previous one is finished (a newer request ends an unfinished
stream).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Iterator, Mapping, Sequence

import numpy as np

from ember.api.openai_format import ENCODING_FORMATS, ResponseFormat, embedding_response, rerank_response, usage
from ember.api.reasoning import check_format, prompt_opens_thoughts
from ember.engine.embed import Embedder, Embedding
from ember.engine.rerank import Reranker, ranked
from ember.engine.runtime import Model
from ember.api.tool_calls import ChatTools, ToolError, ToolRequest, ToolStyle, tool_style
from ember.engine.constraints import Grammar, grammar_from_request
from ember.engine.generate import Generation, SequenceCache, SequenceState
from ember.engine.load import Loaded, chat_template_of
from ember.engine.load import load as load_model
from ember.engine.lookup import Lookup, lookup_options
from ember.engine.sampling_params import CHAT_TEMPERATURE, SamplingParams
from ember.engine.sampling_params import DEFAULTS as D
from ember.errors import EmberError

Message = Mapping[str, object]


@dataclass
class ChatPrompt:
    """A chat request made ready: its prompt ids, the constraint of the reply, its tools, and
    whether the prompt ends inside the model's thoughts (`<think>`, api/reasoning.py)."""

    tokens: list[int]
    grammar: Grammar | None
    tools: ChatTools | None
    thinking: bool = False


class LLM:
    """A model, its tokenizer and chat template, ready to generate.

    model: a registry name (pulled into the cache when missing, see `ember list`) or a .gguf path.
    n_ctx: context length in tokens (default: the model's, capped at 4096).
    n_threads: compute threads (default: the physical cores).
    seed: makes every request without its own seed reproducible: per-request seeds are drawn
      from a generator seeded with it (default: a fresh random seed per request).
    n_batch: prompt tokens evaluated per step.
    activations: "int8" (default, 8-bit activations and integer dot products, as llama.cpp) or
      "f32" (dequantized weights, unrounded activations: closest to a float reference, slower).
    use_mmap: map the file (default) or, False, read it into memory; use_mlock: lock it in RAM;
      huge_pages: back the weights with 2 MiB pages where the kernel can (default), or False: 4 KiB.
    type_k, type_v: the KV cache's types, as llama-cpp-python's Llama takes them: "f16" (default),
      "q8_0" (about half the memory) or "f32", or ggml type ids (1, 8, 0).
    chat_template: instead of the model's template, a built-in format's name (chatml, llama3,
      gemma, ...), a template file or template text.
    pooling: how embed() turns token states into one vector: none, mean, cls or last (default: the
      file's <arch>.pooling_type, else mean with a warning).
    lookup: prompt-lookup decoding for every request (True, or an `ember.Lookup` with its n-gram
      sizes and draft length): tokens guessed from the prompt and the output so far are checked
      in one batched step; the output is the same, faster where it repeats its prompt (editing).
    """

    def __init__(self, model: str | os.PathLike, n_ctx: int | None = None, n_threads: int | None = None,
                 seed: int | None = None, n_batch: int = 512, activations: str = "int8", use_mmap: bool = True,
                 use_mlock: bool = False, chat_template: str | None = None, pooling: str | None = None,
                 lookup: Lookup | bool | None = None, type_k: str | int | None = None,
                 type_v: str | int | None = None, huge_pages: bool = True):
        lookup = lookup_options(lookup)
        loaded = load_model(model, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, activations=activations,
                            use_mmap=use_mmap, use_mlock=use_mlock, chat_template=chat_template, type_k=type_k,
                            type_v=type_v, huge_pages=huge_pages)
        self._setup(loaded.model, loaded.tokenizer, None, loaded.name, seed, lookup)
        self._template_override = chat_template  # parsed on first use, like the file's own
        self._pooling = pooling

    @classmethod
    def from_loaded(cls, loaded: Loaded, seed: int | None = None, lookup: Lookup | bool | None = None) -> "LLM":
        """An LLM over what `ember.engine.load.load` returned (the server builds its model so)."""
        return cls.from_components(loaded.model, loaded.tokenizer, loaded.chat_template, loaded.name, seed, lookup)

    @classmethod
    def from_components(cls, model, tokenizer, chat_template=None, name: str = "model",
                        seed: int | None = None, lookup: Lookup | bool | None = None) -> "LLM":
        """An LLM over an already built runtime model, tokenizer and (optional) chat template."""
        llm = cls.__new__(cls)
        llm._setup(model, tokenizer, chat_template, name, seed, lookup_options(lookup))
        return llm

    def _setup(self, model, tokenizer, chat_template, name: str, seed: int | None, lookup: Lookup | None) -> None:
        self.lookup = lookup
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self._chat_template = chat_template
        self._tool_style: ToolStyle | None = None
        self._template_override: str | None = None
        self._seeds = np.random.Generator(np.random.PCG64(seed)) if seed is not None else None
        self._cache = SequenceCache(model)
        self._embedder: Embedder | None = None
        self._reranker: Reranker | None = None
        self._pooling: str | None = None

    # -- properties --------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def chat_template(self):
        if self._chat_template is None:
            self._chat_template = chat_template_of(self.model.gguf, self._template_override)
        return self._chat_template

    # -- tokens ------------------------------------------------------------------------------

    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of text; `special=True` turns special-token text (e.g. "<|im_end|>") into its id.
        Bytes are UTF-8 text; each byte that is not valid UTF-8 becomes U+FFFD, as in llama.cpp."""
        return self.tokenizer.encode(_text(text), add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """Text of token ids; special tokens (BOS, end of turn, ...) are rendered only with special=True."""
        return self.tokenizer.decode(list(tokens), skip_special=not special)

    def prompt_tokens(self, text: str) -> list[int]:
        """A prompt's ids: special-token text is parsed, and BOS is added unless the text starts with it."""
        bos = self.tokenizer.bos_id
        has_bos = bos is not None and text.startswith(self.tokenizer.token_bytes(bos).decode("utf-8", "replace"))
        return self.tokenizer.encode(text, add_special=not has_bos, parse_special=True)

    def chat_tokens(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    **template_vars) -> list[int]:
        """The ids of messages rendered by the model's chat template (BOS not doubled);
        template_vars reach the template as variables (tools=[...], ...)."""
        text = self.chat_template.render(list(messages), add_generation_prompt=add_generation_prompt,
                                         **template_vars)
        return self.prompt_tokens(text)

    @property
    def tool_style(self) -> ToolStyle:
        """The format this model's chat template calls tools in (ember.api.tool_calls)."""
        if self._tool_style is None:
            self._tool_style = tool_style(getattr(self.chat_template, "source", ""), self.tokenizer)
        return self._tool_style

    def chat_prompt(self, messages: Sequence[Message], tools: Sequence[dict] | None = None, tool_choice=None,
                    parallel_tool_calls: bool | None = None, grammar: Grammar | None = None) -> ChatPrompt:
        """A chat request's prompt ids, the constraint of its reply (`grammar`, or the forced
        tool call of tool_choice "required" / a named function) and its tools, validated."""
        request = ToolRequest.from_openai(tools, tool_choice, parallel_tool_calls)
        style = self.tool_style
        prompt_messages, template_tools = style.prompt(list(messages), request)
        tool_grammar = style.grammar(request)
        if tool_grammar is not None and grammar is not None:
            what = f"tool_choice {request.choice!r}" if request.constrained else "tools"
            raise ToolError(f"{what} cannot be combined with response_format or another constraint "
                            f"for this model (its replies to tools are constrained already)", "tool_choice")
        extra = {"tools": template_tools} if template_tools else {}
        text = self.chat_template.render(prompt_messages, add_generation_prompt=True, **extra)
        return ChatPrompt(self.prompt_tokens(text), tool_grammar or grammar,
                          ChatTools(style, request) if request else None, prompt_opens_thoughts(text))

    # -- evaluation --------------------------------------------------------------------------

    def logits(self, token_ids: Sequence[int], last_only: bool = False) -> np.ndarray:
        """The logits of every position of token_ids, float32 [len(token_ids), n_vocab] (last_only:
        of the last position, [1, n_vocab], which spares the LM head for the others).

        Evaluation is incremental through the KV cache: the tokens continue the sequence the
        cache holds (what earlier calls evaluated, so `logits(prompt)` then `logits([next_id])`
        gives the next position without evaluating the prompt again; after a generation
        request, its prompt and completion) until `reset()`. Prompts longer than n_batch are
        evaluated in chunks. Tokens that would overflow the context raise ContextFullError and
        leave the cache as it was.
        """
        if last_only:
            return self._cache.eval(list(token_ids), logits="last")[None, :]
        return self._cache.eval(list(token_ids), logits="all")

    @property
    def tokens(self) -> list[int]:
        """The tokens the KV cache holds (the last request's prompt and reply, or what `logits` evaluated)."""
        return list(self._cache.tokens)

    def truncate(self, n_tokens: int) -> None:
        """Forget the cached tokens from position n_tokens on."""
        self._cache.truncate(n_tokens)

    def save_state(self) -> SequenceState:
        """The cached tokens and their KV cache, to come back to with `load_state`."""
        return self._cache.save()

    def load_state(self, state: SequenceState) -> None:
        """Continue from a state `save_state` returned (of this model)."""
        self._cache.restore(state)

    # -- generation --------------------------------------------------------------------------

    def generation(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                   max_tokens: int | None = None, stop: Sequence[str] | str | None = None,
                   logprobs: int | None = None, keep_special: bool = False,
                   lookup: Lookup | bool | None = None) -> Generation:
        """A `Generation` (an iterator of chunks with counts and timings) for a prompt: text (str, or
        UTF-8 bytes) or token ids; keep_special: control tokens in the reply keep their text;
        lookup: prompt-lookup decoding for this request (True, False or a `Lookup`; None: the LLM's)."""
        if getattr(self.model, "is_encoder", False) or getattr(self.model, "ranks", False):
            kind, use = (("a reranker", "rerank() or create_rerank()") if getattr(self.model, "ranks", False)
                         else ("an embedding model", "embed() or create_embedding()"))
            raise EmberError(f"{self.name} is {kind} ({self.model.hp.arch}); it cannot generate text: use {use}")
        tokens = self.prompt_tokens(_text(prompt)) if isinstance(prompt, (str, bytes)) else prompt
        params = params or SamplingParams()
        if params.seed is None and self._seeds is not None:
            params = _with_seed(params, int(self._seeds.integers(2**32)))
        lookup = self.lookup if lookup is None else lookup_options(lookup)
        return Generation(self.model, self.tokenizer, tokens, params, max_tokens=max_tokens, stop=stop,
                          logprobs=logprobs, cache=self._cache, keep_special=keep_special, lookup=lookup)

    def generate(self, prompt: str | Sequence[int], max_tokens: int | None = 256,
                 temperature: float = D.temperature, top_k: int = D.top_k, top_p: float = D.top_p,
                 min_p: float = D.min_p, repeat_penalty: float = D.repeat_penalty,
                 stop: Sequence[str] | str | None = None, seed: int | None = None, stream: bool = False,
                 grammar: str | Grammar | None = None, json_schema: dict | str | None = None,
                 regex: str | None = None, choice: Sequence[str] | None = None,
                 lookup: Lookup | bool | None = None, **sampling) -> str | Iterator[str]:
        """Continue a prompt: the generated text, or an iterator of its pieces with stream=True.

        More sampling options (frequency_penalty, presence_penalty, repeat_last_n, logit_bias)
        are accepted as keywords; see `SamplingParams`. max_tokens=None: until the model stops.
        At most one constraint: `grammar` (GBNF or Lark text, or a `Grammar`), `json_schema`,
        `regex` or `choice` (a list of strings); the text then always matches it, and
        generation ends where it is complete. lookup: prompt-lookup decoding (see `LLM`; None:
        the LLM's setting).
        """
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, seed=seed,
                                grammar=grammar_from_request(grammar, json_schema, regex, choice), **sampling)
        generation = self.generation(prompt, params, max_tokens=max_tokens, stop=stop, lookup=lookup)
        return _pieces(generation) if stream else generation.text()

    def chat(self, messages: Sequence[Message], max_tokens: int | None = None,
             temperature: float = D.temperature, top_k: int = D.top_k, top_p: float = D.top_p,
             min_p: float = D.min_p, repeat_penalty: float = D.repeat_penalty,
             stop: Sequence[str] | str | None = None, seed: int | None = None, stream: bool = False,
             grammar: str | Grammar | None = None, json_schema: dict | str | None = None,
             regex: str | None = None, choice: Sequence[str] | None = None,
             **sampling) -> str | Iterator[str]:
        """The assistant's reply to messages ([{"role": ..., "content": ...}]) through the chat
        template; the constraints are generate's."""
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, seed=seed,
                                grammar=grammar_from_request(grammar, json_schema, regex, choice), **sampling)
        generation = self.generation(self.chat_tokens(messages), params, max_tokens=max_tokens, stop=stop)
        return _pieces(generation) if stream else generation.text()

    # -- OpenAI-shaped -----------------------------------------------------------------------

    def create_completion(self, prompt: str | Sequence[int], max_tokens: int | None = 16,
                          temperature: float = D.temperature, top_p: float = D.top_p, min_p: float = D.min_p,
                          top_k: int = D.top_k, stop: Sequence[str] | str | None = None, stream: bool = False,
                          logprobs: int | None = None, seed: int | None = None,
                          repeat_penalty: float = D.repeat_penalty, frequency_penalty: float = D.frequency_penalty,
                          presence_penalty: float = D.presence_penalty,
                          logit_bias: Mapping[int | str, float] | None = None,
                          grammar: str | Grammar | None = None, json_schema: dict | str | None = None,
                          regex: str | None = None, choice: Sequence[str] | None = None,
                          response_format: dict | None = None, **sampling) -> dict | Iterator[dict]:
        """A text completion as OpenAI's /v1/completions returns it (`choices[0].text`, `usage`).

        logprobs=n adds the chosen tokens' log-probabilities and the n most likely alternatives.
        Constraints: generate's, or `response_format` as in create_chat_completion. More sampling
        options (typical_p, repeat_last_n, mirostat_mode, mirostat_tau, mirostat_eta) are
        keywords; see `SamplingParams`.
        """
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, logit_bias=logit_bias, seed=seed,
                                grammar=grammar_from_request(grammar, json_schema, regex, choice, response_format),
                                **sampling)
        generation = self.generation(prompt, params, max_tokens=max_tokens, stop=stop, logprobs=logprobs)
        response = ResponseFormat(False, self.name, self.tokenizer, logprobs=logprobs is not None)
        return _respond(generation, response, stream)

    __call__ = create_completion

    def create_chat_completion(self, messages: Sequence[Message], temperature: float = CHAT_TEMPERATURE,
                               top_p: float = D.top_p, top_k: int = D.top_k, min_p: float = D.min_p,
                               stream: bool = False, stop: Sequence[str] | str | None = None,
                               seed: int | None = None, max_tokens: int | None = None,
                               presence_penalty: float = D.presence_penalty,
                               frequency_penalty: float = D.frequency_penalty,
                               repeat_penalty: float = D.repeat_penalty,
                               logit_bias: Mapping[int | str, float] | None = None, logprobs: bool = False,
                               top_logprobs: int | None = None, response_format: dict | None = None,
                               grammar: str | Grammar | None = None, json_schema: dict | str | None = None,
                               regex: str | None = None, choice: Sequence[str] | None = None,
                               tools: Sequence[dict] | None = None, tool_choice=None,
                               parallel_tool_calls: bool | None = None, reasoning_format: str = "auto",
                               **sampling) -> dict | Iterator[dict]:
        """A chat reply as OpenAI's /v1/chat/completions returns it (`choices[0].message`, `usage`).

        response_format: OpenAI's {"type": "json_object"} or {"type": "json_schema", "json_schema":
        {"name": ..., "schema": {...}, "strict": true}}; or one of generate's constraints.
        tools: OpenAI's [{"type": "function", "function": {"name", "description", "parameters"}}];
        tool_choice "auto" (default), "none", "required" or {"type": "function", "function":
        {"name": ...}}; parallel_tool_calls (default true). Calls come back as
        `message.tool_calls` with finish_reason "tool_calls"; with "required" or a name they are
        constrained to the functions' parameter schemas. reasoning_format "auto" (default) or
        "deepseek": a reasoning model's thoughts (`<think>...</think>`) come back as
        `message.reasoning_content` (streamed as `reasoning_content` deltas), apart from the
        answer in `content`; "none": the reply as the model wrote it, all in `content`. More
        sampling options: as create_completion.
        """
        check_format(reasoning_format)
        constraint = grammar_from_request(grammar, json_schema, regex, choice, response_format)
        prompt = self.chat_prompt(messages, tools, tool_choice, parallel_tool_calls, constraint)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, logit_bias=logit_bias, seed=seed,
                                grammar=prompt.grammar, **sampling)
        n_logprobs = (top_logprobs or 0) if logprobs else None
        generation = self.generation(prompt.tokens, params, max_tokens=max_tokens, stop=stop, logprobs=n_logprobs,
                                     keep_special=prompt.tools is not None)
        thinking = None if reasoning_format == "none" else prompt.thinking
        response = ResponseFormat(True, self.name, self.tokenizer, logprobs=bool(logprobs), tools=prompt.tools,
                                  thinking=thinking)
        return _respond(generation, response, stream)

    # -- embeddings --------------------------------------------------------------------------

    EMBED_SLOTS = 8  # texts a generation model embeds in one run

    @property
    def embedder(self) -> Embedder:
        """What embeds texts: the model itself when it is an encoder; for a generation model a second
        graph over the same mapped weights that returns the normed hidden states (built on first use)."""
        if self._embedder is None:
            model = self.model
            if not model.embeddings:
                model = Model(model.gguf, n_ctx=model.n_ctx, n_threads=model.n_threads, n_seq=self.EMBED_SLOTS,
                              n_batch=model.n_batch, activations=model.activations, embeddings=True,
                              type_k=model.type_k, type_v=model.type_v)
            self._embedder = Embedder(model, self.tokenizer, pooling=self._pooling, name=self.name)
        return self._embedder

    def embeddings(self, input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                   truncate: bool = False) -> list[Embedding]:
        """The pooled, normalised embedding of each input (a text or token ids), with its token count."""
        inputs = _embedding_inputs(input)
        embedder = self.embedder
        if embedder.pooling == "rank":
            raise EmberError(f"{self.name} is a reranker: it scores documents against a query (rerank), "
                             "it does not embed texts")
        return embedder.embed_tokens([embedder.tokenize(_text(x), truncate) if isinstance(x, (str, bytes))
                                      else list(x) for x in inputs])

    def embed(self, input: str | Sequence[str], normalize: bool = True, truncate: bool = True,
              return_count: bool = False):
        """llama-cpp-python's embed: a list of floats for one text, a list of them for a list of texts
        (per token lists where the model pools nothing); normalize=False leaves them unscaled;
        truncate cuts inputs to what the model embeds at once; return_count adds the token count."""
        embedder = self.embedder
        embedder.normalize, was = normalize, embedder.normalize
        try:
            found = self.embeddings(input, truncate=truncate)
        finally:
            embedder.normalize = was
        vectors = [e.vector.tolist() for e in found]
        result = vectors[0] if isinstance(input, (str, bytes)) else vectors
        return (result, sum(e.n_tokens for e in found)) if return_count else result

    def create_embedding(self, input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                         model: str | None = None, encoding_format: str = "float",
                         dimensions: int | None = None) -> dict:
        """OpenAI's /v1/embeddings response (as llama-cpp-python's create_embedding) for one input or
        a list: texts or token ids. `dimensions` must be the model's embedding length, as no
        embedding is shortened."""
        if encoding_format not in ENCODING_FORMATS:
            raise EmberError(f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}, got {encoding_format!r}")
        if dimensions is not None and dimensions != self.embedder.n_embd:
            raise EmberError(f"dimensions={dimensions} is not supported: {self.name}'s embeddings have "
                             f"{self.embedder.n_embd} dimensions and ember does not shorten them")
        found = self.embeddings(input)
        return embedding_response([e.vector for e in found], model or self.name, sum(e.n_tokens for e in found),
                                  encoding_format)

    # -- reranking ---------------------------------------------------------------------------

    @property
    def reranker(self) -> Reranker:
        """What scores documents against a query: a cross-encoder reranker's model and head."""
        if self._reranker is None:
            embedder = self.embedder if getattr(self.model, "ranks", False) else None
            if embedder is None:
                raise EmberError(f"{self.name} is not a reranker: reranking needs a cross-encoder with a "
                                 "classification head (pooling type rank), such as a BertForSequenceClassification")
            self._reranker = Reranker(embedder)
        return self._reranker

    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None,
               truncate: bool = True) -> list[dict]:
        """The documents by relevance to the query, best first, as llama-server's results:
        [{"index": place in documents, "relevance_score": the model's score}], the top_n best
        (default all); truncate cuts a query-document pair to what the model reads at once."""
        return self.create_rerank(query, documents, top_n=top_n, truncate=truncate)["results"]

    def create_rerank(self, query: str, documents: Sequence[str], top_n: int | None = None,
                      model: str | None = None, return_documents: bool = False, truncate: bool = True) -> dict:
        """llama-server's /v1/rerank response: {"model", "object": "list", "usage", "results"}."""
        if not isinstance(query, str) or isinstance(documents, str) or \
                not all(isinstance(d, str) for d in documents):
            raise EmberError("rerank takes a query text and a list of document texts")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
            raise EmberError(f"top_n must be a non-negative integer, got {top_n!r}")
        scores = self.reranker.score(query, list(documents), truncate=truncate)
        return rerank_response(ranked(scores, top_n), list(documents), model or self.name,
                               sum(s.n_tokens for s in scores), return_documents)

    # -- lifetime ----------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the cached tokens: the next request, or `logits` call, starts from position 0."""
        self._cache.clear()

    def close(self) -> None:
        if self._embedder is not None and self._embedder.model is not self.model:
            self._embedder.model.graph = None  # the file is the generation model's, closed below
        close = getattr(self.model, "close", None)
        if close:
            close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(model: str | os.PathLike, **kwargs) -> LLM:
    """`LLM(model, **kwargs)`: load a registry model or a .gguf file."""
    return LLM(model, **kwargs)


def _embedding_inputs(value) -> list:
    """One input (a text or token ids) or a list of them, as a list of inputs."""
    if isinstance(value, (str, bytes)):
        return [value]
    items = list(value)
    if not items:
        raise EmberError("no input to embed")
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
        return [items]
    if all(isinstance(v, (str, bytes, list, tuple, np.ndarray)) for v in items):
        return items
    raise EmberError("the input to embed must be a text, token ids, or a list of texts or of token id lists")


def _text(text: str | bytes) -> str:
    """Text given as str, or as UTF-8 bytes in which each invalid byte stands for U+FFFD."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text).decode("utf-8", errors="surrogateescape")  # the tokenizer maps each to U+FFFD
    if not isinstance(text, str):
        raise EmberError(f"text must be str or bytes, got {type(text).__name__}")
    return text


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return replace(params, seed=seed)


def _pieces(generation: Generation) -> Iterator[str]:
    for chunk in generation:
        if chunk.text:
            yield chunk.text


def _respond(generation: Generation, response: ResponseFormat, stream: bool) -> dict | Iterator[dict]:
    if stream:
        return response.stream(generation, lambda: generation.finish_reason)
    texts, entries = [], []
    for chunk in generation:
        texts.append(chunk.text)
        entries.extend(chunk.logprobs)
    return response.whole("".join(texts), entries, generation.finish_reason,
                          usage(generation.n_prompt, generation.n_generated))
