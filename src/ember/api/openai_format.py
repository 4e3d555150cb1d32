"""OpenAI-shaped results of text and chat completions, whole or as a stream of chunks.

The Python API (`LLM.create_completion`, `LLM.create_chat_completion`) and the HTTP server
build their responses here, so both speak the same format:

- completion: `{"id": "cmpl-…", "object": "text_completion", "choices": [{"text", "index",
  "logprobs", "finish_reason"}], "usage"}`; logprobs in the legacy format (parallel lists
  `tokens`, `text_offset`, `token_logprobs`, `top_logprobs` as {token text: logprob}).
- chat: `{"id": "chatcmpl-…", "object": "chat.completion", "choices": [{"index", "message":
  {"role": "assistant", "content"}, "logprobs", "finish_reason"}], "usage"}`; logprobs as
  `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
- a stream: chunks sharing one id; chat opens with a `{"role": "assistant"}` delta; the last
  chunk carries the finish_reason; `usage_chunk` (OpenAI's stream_options.include_usage) has
  empty choices and the usage.
- with tools (`tools=ChatTools`): the reply is parsed into `message.tool_calls` ({"id", "type":
  "function", "function": {"name", "arguments"}}), `content` is the text outside the calls or
  null, and finish_reason is "tool_calls"; a stream sends the text outside calls as content
  deltas as it comes and each call, once complete, as a `tool_calls` delta ({"index", "id",
  "type", "function": {"name", "arguments"}}).
- with reasoning (`thinking` not None, api/reasoning.py): the thoughts go to
  `message.reasoning_content` (in a stream, `reasoning_content` deltas), the answer to `content`
  (and tool calls are read from the answer alone).
- embeddings: `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
  "usage": {"prompt_tokens", "total_tokens"}}`; an embedding is a list of floats, or with
  encoding_format "base64" the base64 of its little-endian float32 bytes.
- rerank (llama-server's, after Jina's): `{"model", "object": "list", "usage": {"prompt_tokens",
  "total_tokens"}, "results": [{"index", "relevance_score"}]}`, best first, with `"document":
  {"text"}` when asked; in TEI's form (a request with `texts`) just the list of `{"index",
  "score"}` (and `"text"` with return_text).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Iterable, Sequence

import numpy as np

from ember.api.reasoning import ReasoningSplitter, split_reasoning
from ember.api.tool_calls import ChatTools, ToolCall
from ember.engine.generate import Chunk, TokenLogprob


def usage(n_prompt: int, n_generated: int) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_generated, "total_tokens": n_prompt + n_generated}


ENCODING_FORMATS = ("float", "base64")


def embedding_response(vectors: Sequence[np.ndarray], model: str, n_tokens: int,
                       encoding_format: str = "float") -> dict:
    """OpenAI's /v1/embeddings response for the vectors of the inputs, in input order."""
    def encoded(vector: np.ndarray):
        if encoding_format == "base64":
            return base64.b64encode(np.ascontiguousarray(vector, "<f4").tobytes()).decode("ascii")
        return vector.astype(np.float32).tolist()

    return {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)],
            "model": model, "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def rerank_response(ranked: Sequence, documents: Sequence[str], model: str, n_tokens: int,
                    return_documents: bool = False, tei: bool = False) -> dict | list:
    """llama-server's /v1/rerank response for scores already ranked (engine.rerank.ranked)."""
    label = "score" if tei else "relevance_score"
    results = []
    for s in ranked:
        result = {"index": s.index, label: s.score}
        if return_documents:
            result.update({"text": documents[s.index]} if tei else {"document": {"text": documents[s.index]}})
        results.append(result)
    if tei:
        return results
    return {"model": model, "object": "list", "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results}


class ResponseFormat:
    """The shapes of one response (chat or text completion) of the model named `model`.

    thinking: None leaves the reply whole; False or True separates a chat reply's reasoning, True
    where the prompt ended inside the thoughts (`reasoning.prompt_opens_thoughts`)."""

    def __init__(self, chat: bool, model: str, tokenizer, logprobs: bool = False, tools: ChatTools | None = None,
                 thinking: bool | None = None):
        self.chat = chat
        self.tokenizer = tokenizer
        self.logprobs = logprobs
        self.tools = tools
        self.thinking = thinking if chat else None
        self._tool_stream = tools.stream() if tools is not None else None
        self._reasoning = ReasoningSplitter(thinking) if self.thinking is not None else None
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self._text_template: tuple[str, ...] | None = None  # (head, tail), or () when unusable

    def whole(self, text: str, entries: list[TokenLogprob], finish_reason: str | None, usage: dict) -> dict:
        logprobs = self._logprobs(entries) if self.logprobs else None
        if self.chat:
            reasoning = None
            if self.thinking is not None:
                reasoning, text = split_reasoning(text, self.thinking)
            message: dict = {"role": "assistant", "content": text}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if self.tools is not None:
                message["content"], calls = self.tools.parse(text)
                if calls:
                    message["tool_calls"] = [call.openai() for call in calls]
                    finish_reason = _tool_finish(finish_reason)
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage}

    def opening_chunks(self) -> list[dict]:
        """The chunks a stream starts with: chat announces the assistant's role."""
        if not self.chat:
            return []
        return [self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None})]

    def chunk(self, chunk: Chunk) -> dict | None:
        """The stream chunk of a piece of generated text (None when it holds nothing)."""
        reasoning = ""
        if self._reasoning is not None:
            reasoning, text = self._reasoning.feed(chunk.text)
            chunk = Chunk(text, chunk.logprobs)
        if self._tool_stream is not None:
            chunk = Chunk(self._tool_stream.feed(chunk.text), chunk.logprobs)
        if not chunk.text and not reasoning and not chunk.logprobs:
            return None
        logprobs = self._logprobs(chunk.logprobs) if self.logprobs else None
        if self.chat:
            return self._chunk({"index": 0, "delta": _delta(reasoning, chunk.text), "logprobs": logprobs,
                                "finish_reason": None})
        return self._chunk({"text": chunk.text, "index": 0, "logprobs": logprobs, "finish_reason": None})

    def chunk_json(self, chunk: Chunk) -> str | None:
        """`chunk(chunk)` as JSON (ensure_ascii off). Without logprobs only the text differs from
        chunk to chunk, so it is written into a template of the rest."""
        if (self.logprobs or self._tool_stream is not None or self._reasoning is not None
                or (not chunk.text and not chunk.logprobs)):
            shaped = self.chunk(chunk)
            return None if shaped is None else json.dumps(shaped, ensure_ascii=False)
        if self._text_template is None:
            marker = "\x00\x01\x02"
            parts = json.dumps(self.chunk(Chunk(marker, [])), ensure_ascii=False).split(json.dumps(marker))
            self._text_template = (parts[0], parts[1]) if len(parts) == 2 else ()
        if not self._text_template:  # the marker occurs elsewhere (in the model's name)
            return json.dumps(self.chunk(chunk), ensure_ascii=False)
        head, tail = self._text_template
        return head + json.dumps(chunk.text, ensure_ascii=False) + tail

    def closing_chunks(self, finish_reason: str | None) -> list[dict]:
        """The chunks a stream ends with: held-back text and tool calls, then the finish_reason."""
        if not self.chat:
            return [self._chunk({"text": "", "index": 0, "logprobs": None, "finish_reason": finish_reason})]
        chunks, reasoning, text = [], "", ""
        if self._reasoning is not None:
            reasoning, text = self._reasoning.finish()
        calls: list[ToolCall] = []
        if self._tool_stream is not None:
            text = self._tool_stream.feed(text)
            held, calls = self._tool_stream.finish()
            text += held
        if reasoning or text:
            chunks.append(self._chunk({"index": 0, "delta": _delta(reasoning, text), "logprobs": None,
                                       "finish_reason": None}))
        if self._tool_stream is not None:
            chunks += [self._tool_call_chunk(index, call) for index, call in enumerate(calls)]
            if calls:
                finish_reason = _tool_finish(finish_reason)
        chunks.append(self._chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}))
        return chunks

    def _tool_call_chunk(self, index: int, call: ToolCall) -> dict:
        delta = {"tool_calls": [{"index": index, **call.openai()}]}
        return self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._head(self._chunk_object), "choices": [], "usage": usage}

    def stream(self, chunks: Iterable[Chunk], finish_reason) -> Iterable[dict]:
        """All the stream chunks of `chunks`; `finish_reason()` is asked once they are exhausted."""
        yield from self.opening_chunks()
        for chunk in chunks:
            shaped = self.chunk(chunk)
            if shaped is not None:
                yield shaped
        yield from self.closing_chunks(finish_reason())

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, choice: dict) -> dict:
        return {**self._head(self._chunk_object), "choices": [choice]}

    def _logprobs(self, entries: list[TokenLogprob]) -> dict:
        return self._chat_logprobs(entries) if self.chat else self._completion_logprobs(entries)

    def _token_text(self, token: int) -> str:
        return self.tokenizer.token_bytes(token).decode("utf-8", errors="replace")

    def _completion_logprobs(self, entries: list[TokenLogprob]) -> dict:
        """The legacy completions format: parallel lists, alternatives as {token text: logprob}."""
        return {
            "tokens": [self._token_text(e.token) for e in entries],
            "text_offset": [e.text_offset for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self._token_text(t): lp for t, lp in e.top} for e in entries],
        }

    def _chat_logprobs(self, entries: list[TokenLogprob]) -> dict:
        def item(token: int, logprob: float) -> dict:
            return {"token": self._token_text(token), "logprob": logprob,
                    "bytes": list(self.tokenizer.token_bytes(token))}

        return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                            for e in entries]}


def _delta(reasoning: str, content: str) -> dict:
    """A chat delta of reasoning and answer text (a piece may close the thoughts and begin the answer)."""
    if not reasoning:
        return {"content": content}
    return {"reasoning_content": reasoning, "content": content} if content else {"reasoning_content": reasoning}


def _tool_finish(finish_reason: str | None) -> str | None:
    """A reply that called tools and ended by itself finishes with "tool_calls"."""
    return "tool_calls" if finish_reason == "stop" else finish_reason
