"""From the scheduler thread to an HTTP response: a job's events handed to the event loop,
turned into one JSON body or into server-sent events (`data: {chunk}` ... `data: [DONE]`).

The scheduler delivers one event per stream per step. Each hand-over to the event loop costs a
wake-up through its self-pipe, so the events of one step travel together: the first one
delivered wakes the loop, the ones that follow before it runs ride along (a `_Mailbox` per
loop). A stream writes the events it finds waiting as one piece.

A client that goes away cancels its job: a stream notices when Starlette cancels the
response (it listens for the disconnect), a whole response through a watcher of the
connection, so the slot is free at the scheduler's next step.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections import deque
from typing import AsyncIterator

from ember.api.openai_format import ResponseFormat
from ember.server.scheduler import Failed, Finished, Job, Scheduler
from ember.server.schemas import APIError, error_body


class _Mailbox:
    """Events from the scheduler thread for one event loop, delivered in one callback."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = weakref.ref(loop)  # the loop keys the table of mailboxes: no strong reference
        self._lock = threading.Lock()
        self._items: list[tuple[JobEvents, object]] = []

    def post(self, events: JobEvents, event) -> None:
        loop = self._loop()
        if loop is None or loop.is_closed():
            raise RuntimeError("the event loop is closed")
        with self._lock:
            self._items.append((events, event))
            if len(self._items) > 1:
                return  # a delivery is already on its way and takes this one along
        loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for events, event in items:
            events.push(event)


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()
_MAILBOXES_LOCK = threading.Lock()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    with _MAILBOXES_LOCK:
        box = _MAILBOXES.get(loop)
        if box is None:
            box = _MAILBOXES[loop] = _Mailbox(loop)
        return box


class JobEvents:
    """The events of one job, delivered from the scheduler thread into this event loop."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self._mailbox = _mailbox(self._loop)
        self._pending: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._holding = False  # the waiter wakes only for the job's end (batches' interval)

    def deliver(self, event) -> None:
        """Called from the scheduler thread."""
        self._mailbox.post(self, event)

    def abandon(self, reason: str) -> None:
        """End the events now (in this loop): the client is gone."""
        self.push(Failed(reason))

    def push(self, event) -> None:
        """Add an event (in this loop)."""
        self._pending.append(event)
        if self._waiter is not None and not self._waiter.done() and (not self._holding or _ends(event)):
            self._waiter.set_result(None)

    async def _wait(self, timeout: float | None = None) -> None:
        self._waiter = self._loop.create_future()
        self._holding = timeout is not None
        try:
            if timeout is None:
                await self._waiter
            else:
                await asyncio.wait([self._waiter], timeout=timeout)
        finally:
            self._waiter, self._holding = None, False

    async def batches(self, interval: float = 0.0) -> AsyncIterator[list]:
        """The events as they come, those already waiting together; the last list ends with
        the job's Finished or Failed. With an interval (seconds), a list follows the one before
        it no sooner than that: the events of the steps between travel together (the job's end
        is not held back)."""
        last = None
        while True:
            while not self._pending:
                await self._wait()
            if interval > 0 and last is not None and not _ends(self._pending[-1]):  # nothing follows the end
                remaining = last + interval - self._loop.time()
                if remaining > 0:
                    await self._wait(remaining)
            last = self._loop.time()
            batch = []
            while self._pending:
                event = self._pending.popleft()
                batch.append(event)
                if _ends(event):
                    yield batch
                    return
            yield batch

    async def __aiter__(self) -> AsyncIterator:
        async for batch in self.batches():
            for event in batch:
                yield event


async def whole_response(request, scheduler: Scheduler, job: Job, events: JobEvents,
                         response: ResponseFormat) -> dict:
    """Wait for the job's end and return its response body."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, scheduler, job, events))
    texts, entries = [], []
    try:
        async for event in events:
            if isinstance(event, Finished):
                return response.whole("".join(texts), entries, event.finish_reason, event.usage)
            if isinstance(event, Failed):
                raise APIError(500, event.message, kind="server_error")
            texts.append(event.text)
            entries.extend(event.logprobs)
    finally:
        watcher.cancel()
        if not job.done:
            scheduler.cancel(job)


async def event_stream(scheduler: Scheduler, job: Job, events: JobEvents, response: ResponseFormat,
                       include_usage: bool, interval: float = 0.0) -> AsyncIterator[str]:
    """The job's chunks as server-sent events, ending with `data: [DONE]`; a piece of the
    response at most every `interval` seconds after the first (JobEvents.batches)."""
    try:
        for chunk in response.opening_chunks():
            yield _event(chunk)
        async for batch in events.batches(interval):
            out = []
            for event in batch:
                if isinstance(event, Finished):
                    out.extend(_event(chunk) for chunk in response.closing_chunks(event.finish_reason))
                    if include_usage:
                        out.append(_event(response.usage_chunk(event.usage)))
                    out.append("data: [DONE]\n\n")
                elif isinstance(event, Failed):
                    out.append(_event(error_body(event.message, "server_error")))
                    out.append("data: [DONE]\n\n")
                else:
                    shaped = response.chunk_json(event)
                    if shaped is not None:
                        out.append(f"data: {shaped}\n\n")
            if out:
                yield "".join(out)
    finally:  # also when the client went away and Starlette cancelled the response
        if not job.done:
            scheduler.cancel(job)


def _ends(event) -> bool:
    return isinstance(event, (Finished, Failed))


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _cancel_on_disconnect(request, scheduler: Scheduler, job: Job, events: JobEvents) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scheduler.cancel(job)
            events.abandon("the client disconnected")
            return
