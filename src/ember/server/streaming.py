"""From the scheduler thread to an HTTP response: a job's events on an asyncio queue, turned
into one JSON body or into server-sent events (`data: {chunk}` ... `data: [DONE]`).

A client that goes away cancels its job: a stream notices when Starlette cancels the
response (it listens for the disconnect), a whole response through a watcher of the
connection, so the slot is free at the scheduler's next step.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

from ember.openai_format import ResponseFormat
from ember.server.scheduler import Failed, Finished, Job, Scheduler
from ember.server.schemas import APIError, error_body


class JobEvents:
    """The events of one job, delivered from the scheduler thread into this event loop."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()

    def deliver(self, event) -> None:
        """Called from the scheduler thread."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def abandon(self, reason: str) -> None:
        """End the events now (in this loop): the client is gone."""
        self._queue.put_nowait(Failed(reason))

    async def __aiter__(self) -> AsyncIterator:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, (Finished, Failed)):
                return


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
                       include_usage: bool) -> AsyncIterator[str]:
    """The job's chunks as server-sent events, ending with `data: [DONE]`."""
    try:
        for chunk in response.opening_chunks():
            yield _event(chunk)
        async for event in events:
            if isinstance(event, Finished):
                yield _event(response.closing_chunk(event.finish_reason))
                if include_usage:
                    yield _event(response.usage_chunk(event.usage))
            elif isinstance(event, Failed):
                yield _event(error_body(event.message, "server_error"))
            else:
                shaped = response.chunk(event)
                if shaped is not None:
                    yield _event(shaped)
        yield "data: [DONE]\n\n"
    finally:  # also when the client went away and Starlette cancelled the response
        if not job.done:
            scheduler.cancel(job)


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _cancel_on_disconnect(request, scheduler: Scheduler, job: Job, events: JobEvents) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scheduler.cancel(job)
            events.abandon("the client disconnected")
            return
