"""A tiny deterministic language model, byte tokenizer and chat template for tests of the
generation loop, the Python API and the chat command, with the interfaces of
ember.runtime.Model, ember.tokenizer.Tokenizer and ember.chat.ChatTemplate.

Token ids 0-255 are bytes; the special tokens follow. The models' logits are a function of
the tokens in the (fake) KV cache, so prefix reuse and truncation behave as in the runtime.
"""

from __future__ import annotations

import codecs
import re
import time
from typing import Callable, Sequence

import numpy as np

from ember.errors import ContextFullError

SPECIALS = ["<s>", "</s>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
BOS, EOS, END, USER, ASSISTANT, SYSTEM = range(256, 256 + len(SPECIALS))
N_VOCAB = 256 + len(SPECIALS)
_SPECIAL_RE = re.compile("|".join(re.escape(s) for s in SPECIALS))


class ByteTokenizer:
    n_vocab = N_VOCAB
    bos_id = BOS
    eos_id = EOS
    eog_ids = frozenset({EOS, END})

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = [BOS] if add_special else []
        if not parse_special:
            return ids + list(text.encode("utf-8"))
        position = 0
        for match in _SPECIAL_RE.finditer(text):
            ids += list(text[position:match.start()].encode("utf-8"))
            ids.append(256 + SPECIALS.index(match.group()))
            position = match.end()
        return ids + list(text[position:].encode("utf-8"))

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else SPECIALS[token - 256].encode()

    def piece(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        data = b"".join(self.token_bytes(t) for t in ids if t < 256 or not skip_special)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Complete UTF-8 characters only."""

    def __init__(self, tokenizer: ByteTokenizer, skip_special: bool):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        if token >= 256 and self._skip_special:
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class FakeModel:
    """Logits from `next_logits(tokens in the cache)`; records every eval call."""

    def __init__(self, next_logits: Callable[[list[int]], np.ndarray], n_ctx: int = 256, n_ctx_train: int = 1024,
                 delay: float = 0.0):
        self.next_logits = next_logits
        self.n_vocab = N_VOCAB
        self.n_ctx = n_ctx
        self.n_ctx_train = n_ctx_train
        self.delay = delay
        self.tokens: list[int] = []
        self.eval_calls: list[list[int]] = []

    def n_past(self, seq: int = 0) -> int:
        return len(self.tokens)

    def eval(self, tokens: Sequence[int], seq: int = 0, logits: str = "last") -> np.ndarray:
        """The logits after the last token ("last"), or after each of them ("all")."""
        tokens = [int(t) for t in tokens]
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ContextFullError(f"{len(self.tokens) + len(tokens)} tokens do not fit in {self.n_ctx}")
        if self.delay:
            time.sleep(self.delay)
        self.eval_calls.append(tokens)
        if logits == "all":  # a row after each of the tokens, as the runtime returns them
            rows = []
            for token in tokens:
                self.tokens.append(token)
                rows.append(self.next_logits(list(self.tokens)))
            return np.stack(rows)
        self.tokens.extend(tokens)
        return self.next_logits(list(self.tokens))

    def truncate(self, n: int, seq: int = 0) -> None:
        del self.tokens[n:]

    def reset(self, seq: int = 0) -> None:
        self.tokens.clear()


def peaked_logits(token: int, seed: int = 0, peak: float = 12.0) -> np.ndarray:
    """Low random logits with one clear winner."""
    logits = np.random.default_rng(seed).normal(0.0, 1.0, N_VOCAB).astype(np.float32)
    logits[token] += peak
    return logits


def continuation(prompt: Sequence[int], reply: Sequence[int], then: int = EOS) -> Callable[[list[int]], np.ndarray]:
    """A model that, after `prompt`, says `reply` and then `then`."""
    prompt = list(prompt)

    def next_logits(tokens: list[int]) -> np.ndarray:
        k = len(tokens) - len(prompt)
        target = reply[k] if tokens[:len(prompt)] == prompt and 0 <= k < len(reply) else then
        return peaked_logits(target, seed=len(tokens))

    return next_logits


def echo(tokens: list[int]) -> np.ndarray:
    """A chat model: it answers the last user message with "You said: <message>"; to "long" it
    says "la " until it is stopped."""
    user = len(tokens) - 1 - tokens[::-1].index(USER)
    end = tokens.index(END, user)
    said = bytes(tokens[user + 1:end])
    reply = b"la " * 10_000 if said == b"long" else b"You said: " + said
    k = tokens[::-1].index(ASSISTANT)  # reply tokens so far
    target = reply[k] if k < len(reply) else END
    return peaked_logits(target, seed=len(tokens))


class TagTemplate:
    """<s><|role|>content<|end|>... then <|assistant|>."""

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        text = "<s>" + "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")


def fake_llm(next_logits=echo, n_ctx: int = 256, delay: float = 0.0, seed: int | None = None):
    from ember.api.llm import LLM

    model = FakeModel(next_logits, n_ctx=n_ctx, delay=delay)
    return LLM.from_components(model, ByteTokenizer(), TagTemplate(), name="fake", seed=seed)
