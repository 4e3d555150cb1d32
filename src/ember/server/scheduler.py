"""Continuous batching: one thread owns the model and serves every request a token at a time.

Each step of the scheduler thread:

1. requests whose client went away leave, and their sequence slots are free again;
2. waiting requests take free slots: the slot whose cached tokens share the longest prefix
   with the prompt, so the next turn of a conversation only evaluates what is new (a slot that
   shares less than half of what it holds is left to its conversation: the request takes the
   least recently used free slot instead);
3. prompts are evaluated, at most `prefill_chunk` tokens per step over all of them, so a long
   prompt delays the running streams by a bounded time per token;
4. one `Model.decode_batch` advances every generating slot by one token: one graph run, each
   weight read once for all of them;
5. each request samples from its own row of logits with its own `Sampler` (its seed, its
   penalties), and its text goes to its consumer through `Job.deliver`; requests that
   finished leave.

Rows of a batched decode equal single-sequence decodes bit for bit, so a request with a fixed
seed produces the same text alone or among others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from ember.api.openai_format import usage
from ember.engine.generate import Chunk, Continuation, SequenceCache
from ember.engine.sampling import Sampler, SamplingParams
from ember.errors import ContextFullError, EmberError

log = logging.getLogger("ember.server")


@dataclass
class Finished:
    """The last event of a job that ran to its end."""

    finish_reason: str
    usage: dict


@dataclass
class Failed:
    """The last event of a job that could not run to its end."""

    message: str


class QueueFull(EmberError):
    """Every slot is busy and the waiting queue is full."""


class Job:
    """One request as the scheduler sees it: a prompt, how to continue it, and where its
    events go (`deliver(event)` is called from the scheduler thread with a `Chunk`, then one
    `Finished` or `Failed`)."""

    def __init__(self, prompt: Sequence[int], continuation: Continuation, deliver: Callable[[object], None]):
        self.prompt = list(prompt)
        self.reply = continuation
        self.deliver = deliver
        self.cancelled = False
        self.done = False
        self.slot: SequenceCache | None = None
        self.n_evaluated = 0  # prompt tokens in the slot's cache, a reused prefix included

    @property
    def prefilled(self) -> bool:
        return self.n_evaluated == len(self.prompt)

    def usage(self) -> dict:
        return usage(len(self.prompt), len(self.reply.tokens))


class Scheduler:
    """Serves jobs on `model.n_seq` sequence slots; at most `queue_size` more wait for one."""

    def __init__(self, model, tokenizer, queue_size: int = 64, prefill_chunk: int = 256, metrics=None):
        self.model = model
        self.tokenizer = tokenizer
        self.queue_size = queue_size
        self.prefill_chunk = max(1, min(prefill_chunk, model.n_batch))
        self.metrics = metrics
        self.slots = [SequenceCache(model, seq) for seq in range(model.n_seq)]
        self._free = list(self.slots)
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._n_generated = 0  # tokens sampled, ever
        self._n_admitted = 0  # jobs given a slot, ever
        self._last_admitted: dict[int, int] = {}  # slot's seq -> _n_admitted when it was last given out

    # -- the request side (any thread) -------------------------------------------------------

    def job(self, prompt: Sequence[int], params: SamplingParams, max_tokens: int | None,
            stops: Sequence[str], n_logprobs: int | None, deliver: Callable[[object], None],
            keep_special: bool = False) -> Job:
        """A job for a prompt (see Continuation for keep_special); raises ContextFullError when
        the prompt cannot fit a slot."""
        if not prompt:
            raise EmberError("the prompt is empty")
        n_ctx = self.model.n_ctx
        if len(prompt) > n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}")
        if max(prompt) >= self.model.n_vocab or min(prompt) < 0:
            raise EmberError(f"token ids must be in [0, {self.model.n_vocab})")
        sampler = Sampler(params, self.model.n_vocab, history=prompt, tokenizer=self.tokenizer)
        continuation = Continuation(self.tokenizer, sampler, max_tokens, stops, n_logprobs, keep_special=keep_special)
        return Job(prompt, continuation, deliver)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise EmberError("the server is shutting down")
            if len(self._waiting) + len(self._running) >= len(self.slots) + self.queue_size:
                raise QueueFull(f"all {len(self.slots)} slots are busy and {len(self._waiting)} requests wait")
            self._waiting.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Forget a job whose client went away; its slot is free at the next step."""
        with self._cond:
            job.cancelled = True
            if job in self._waiting:
                self._waiting.remove(job)
            self._cond.notify()

    def slot_states(self) -> list[dict]:
        """What each sequence slot holds and does, in llama-server's /slots shape."""
        with self._cond:
            by_slot = {id(job.slot): job for job in self._running if job.slot is not None}
            states = []
            for slot in self.slots:
                state = {"id": slot.seq, "n_ctx": self.model.n_ctx, "speculative": False,
                         "is_processing": id(slot) in by_slot, "n_cached": len(slot.tokens)}
                job = by_slot.get(id(slot))
                if job is not None:
                    n_decoded = len(job.reply.tokens)
                    limit = job.reply.max_tokens
                    state.update({
                        "n_prompt_tokens": len(job.prompt), "n_prompt_tokens_processed": job.n_evaluated,
                        "next_token": [{"has_next_token": not job.done,
                                        "n_remain": -1 if limit is None else max(0, limit - n_decoded),
                                        "n_decoded": n_decoded}]})
                states.append(state)
            return states

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    @property
    def n_running(self) -> int:
        return len(self._running)

    @property
    def alive(self) -> bool:
        """Whether the scheduler thread runs (started and not stopped)."""
        return self._thread is not None and self._thread.is_alive()

    # -- lifetime ----------------------------------------------------------------------------

    def start(self) -> "Scheduler":
        self._thread = threading.Thread(target=self._loop, name="ember-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        for job in list(self._waiting) + self._running:
            self._end(job, Failed("the server is shutting down"))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self._running):
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                self.run_once()
            except Exception:  # keep serving: a bug here must not silence the server
                log.exception("scheduler failed")

    # -- the scheduler thread ----------------------------------------------------------------

    def run_once(self) -> None:
        """One step: cancelled jobs leave, waiting jobs take free slots, prompts are evaluated,
        every generating slot gets one token, finished jobs leave."""
        with self._cond:
            self._leave(job for job in self._running if job.cancelled)
            self._admit()
            if not self._running:
                return
        try:
            self._step()
        except Exception:  # a bug must not take the server down: fail what was running
            log.exception("scheduler step failed")
            for job in self._running:
                if job.slot is not None:
                    job.slot.clear()
                self._end(job, Failed("internal error while generating"))
        with self._cond:
            self._leave(job for job in self._running if job.done)

    def _step(self) -> None:
        """Evaluate a share of the waiting prompts, then one token for every generating slot."""
        start, n_generated = time.perf_counter(), self._n_generated
        self._prefill()
        self._decode()
        if self.metrics is not None:
            self.metrics.on_step(self._n_generated - n_generated, time.perf_counter() - start)

    def _admit(self) -> None:
        while self._waiting and self._free:
            job = self._waiting.popleft()
            job.slot = self._slot_for(job.prompt)
            self._free.remove(job.slot)
            self._n_admitted += 1
            self._last_admitted[job.slot.seq] = self._n_admitted
            self._running.append(job)
            job.n_evaluated = job.slot.keep_prefix(job.prompt)
            if job.reply.at_limit(context_full=False):  # max_tokens=0
                self._send(job, job.reply.finish("length"))

    def _slot_for(self, prompt: list[int]) -> SequenceCache:
        """The free slot whose cache the prompt continues furthest; where that is under half of
        what the slot holds (another conversation's cache, sharing a system prompt at most), the
        free slot used least recently instead, empty ones first, so that conversations keep their
        caches (llama-server's slot similarity of 0.5 does the same)."""
        best = max(self._free, key=lambda slot: slot.common_prefix(prompt))
        if 2 * best.common_prefix(prompt) >= len(best.tokens):
            return best
        return min(self._free, key=lambda slot: self._last_admitted.get(slot.seq, 0))

    def _leave(self, jobs) -> None:
        for job in list(jobs):
            if job in self._running:
                self._running.remove(job)
                self._free.append(job.slot)

    def _prefill(self) -> None:
        budget = self.prefill_chunk
        for job in self._running:
            if budget == 0:
                break
            if job.done or job.prefilled:
                continue
            end = min(len(job.prompt), job.n_evaluated + budget)
            try:
                logits = job.slot.eval(job.prompt[job.n_evaluated:end])
            except EmberError as error:
                self._end(job, Failed(str(error)))
                continue
            if self.metrics is not None:
                self.metrics.on_prompt_tokens(end - job.n_evaluated)
            budget -= end - job.n_evaluated
            job.n_evaluated = end
            if job.prefilled:
                self._advance(job, logits)

    def _decode(self) -> None:
        jobs = [job for job in self._running if job.prefilled and not job.done]
        if not jobs:
            return
        items = [(job.slot.seq, job.reply.tokens[-1]) for job in jobs]
        try:
            logits = self.model.decode_batch(items)
        except EmberError as error:
            for job in jobs:
                job.slot.clear()
                self._end(job, Failed(str(error)))
            return
        for job, row in zip(jobs, logits):
            job.slot.tokens.append(job.reply.tokens[-1])
            self._advance(job, row)

    def _advance(self, job: Job, logits) -> None:
        """Sample the job's next token; end it at an end token, a stop string or its limit."""
        reply = job.reply
        n_tokens = len(reply.tokens)
        chunk = reply.step(logits)
        self._n_generated += len(reply.tokens) - n_tokens
        if reply.finish_reason is None and reply.at_limit(job.slot.full):
            last = reply.finish("length")
            chunk = Chunk(chunk.text + last.text, chunk.logprobs + last.logprobs)
        self._send(job, chunk)

    def _send(self, job: Job, chunk: Chunk) -> None:
        if chunk.text or chunk.logprobs:
            self._deliver(job, chunk)
        if job.reply.finish_reason is not None:
            if self.metrics is not None:
                self.metrics.on_finished()
            self._end(job, Finished(job.reply.finish_reason, job.usage()))

    def _end(self, job: Job, event) -> None:
        if not job.done:
            job.done = True
            self._deliver(job, event)

    def _deliver(self, job: Job, event) -> None:
        if job.cancelled:
            return
        try:
            job.deliver(event)
        except Exception:  # the consumer is gone (its event loop closed)
            job.cancelled = True
