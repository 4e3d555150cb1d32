"""ember.server.streaming and the stream chunks of ember.openai_format: events from the
scheduler thread to the event loop, and the JSON of each chunk."""

from __future__ import annotations

import asyncio
import gc
import json
import threading

import pytest

from ember.api.openai_format import ResponseFormat
from ember.engine.generate import Chunk, TokenLogprob
from ember.server.scheduler import Failed, Finished
from ember.server.streaming import JobEvents


class FakeTokenizer:
    def token_bytes(self, token: int) -> bytes:
        return f"t{token}".encode()


TEXTS = ["Hello", " \"quoted\" \\ back", "line\nbreak\ttab", "\x00\x01 control", "naïve 你好 🙂", "é"]


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("model", ["smollm2-135m", 'odd "model" \x00\x01\x02 name'])
def test_chunk_json_is_the_json_of_the_chunk(chat, model):
    response = ResponseFormat(chat, model, FakeTokenizer())
    for text in TEXTS:
        chunk = Chunk(text, [])
        assert json.loads(response.chunk_json(chunk)) == response.chunk(chunk)
        assert response.chunk_json(chunk) == json.dumps(response.chunk(chunk), ensure_ascii=False)
    assert response.chunk_json(Chunk("", [])) is None


@pytest.mark.parametrize("chat", [False, True])
def test_chunk_json_with_logprobs_is_the_json_of_the_chunk(chat):
    response = ResponseFormat(chat, "m", FakeTokenizer(), logprobs=True)
    entries = [TokenLogprob(3, -0.5, [(3, -0.5), (4, -1.5)], 0)]
    for chunk in (Chunk("a", entries), Chunk("", entries), Chunk("b", [])):
        assert response.chunk_json(chunk) == json.dumps(response.chunk(chunk), ensure_ascii=False)
    plain = ResponseFormat(chat, "m", FakeTokenizer())  # logprobs computed but not asked for
    assert plain.chunk_json(Chunk("", entries)) == json.dumps(plain.chunk(Chunk("", entries)), ensure_ascii=False)


def run(coroutine):
    return asyncio.run(coroutine)


def test_events_from_another_thread_arrive_in_order_and_end_with_finished():
    async def main():
        events = JobEvents()
        sent = [Chunk(str(i), []) for i in range(200)] + [Finished("stop", {})]

        def produce():
            for event in sent:
                events.deliver(event)

        threading.Thread(target=produce).start()
        got = [event async for event in events]
        assert got == sent

    run(main())


def test_the_events_of_one_step_wake_the_loop_once():
    async def main():
        loop = asyncio.get_running_loop()
        wakeups = []
        original = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: wakeups.append(1) or original(*args)
        streams = [JobEvents() for _ in range(4)]

        def step():  # what the scheduler thread does: one event per stream
            for n, events in enumerate(streams):
                events.deliver(Chunk(f"s{n}", []))
                events.deliver(Finished("length", {}))

        thread = threading.Thread(target=step)
        thread.start()
        thread.join()  # every event is posted before the loop runs again
        batches = []
        for events in streams:
            batches.append([batch async for batch in events.batches()])
        assert wakeups == [1]
        for n, got in enumerate(batches):
            assert got == [[Chunk(f"s{n}", []), Finished("length", {})]]

    run(main())


def test_with_an_interval_the_steps_between_travel_together_and_the_end_is_not_held():
    interval = 0.2

    async def main():
        loop = asyncio.get_running_loop()
        events = JobEvents()
        start = loop.time()

        def step(i):
            events.push(Chunk(str(i), []))

        for i in range(10):  # a step every 40 ms: 0, 40, ..., 360 ms, then the end at 370 ms
            loop.call_later(0.04 * i, step, i)
        loop.call_later(0.37, events.push, Finished("stop", {}))
        got = []
        async for batch in events.batches(interval):
            got.append((loop.time() - start, [e.text if isinstance(e, Chunk) else "end" for e in batch]))
        return got

    got = run(main())
    times, batches = [t for t, _ in got], [b for _, b in got]
    assert [e for batch in batches for e in batch] == [str(i) for i in range(10)] + ["end"]
    assert batches[0] == ["0"] and times[0] < 0.03  # the first step's events at once
    assert all(later - earlier >= interval - 0.01 for earlier, later in zip(times, times[1:-1]))
    assert len(batches) == 3  # 0 ms; 200 ms: steps 1-5; the end at 370 ms with steps 6-9
    assert times[-1] < 0.37 + 0.05  # not at 400 ms, when the interval would have ended


def test_without_an_interval_each_step_goes_as_it_comes():
    async def main():
        loop = asyncio.get_running_loop()
        events = JobEvents()
        for i in range(5):
            loop.call_later(0.02 * i, events.push, Chunk(str(i), []))
        loop.call_later(0.1, events.push, Finished("stop", {}))
        return [batch async for batch in events.batches()]

    assert len(run(main())) == 6


def test_abandon_ends_the_events_and_a_closed_loop_refuses_more():
    async def main():
        events = JobEvents()
        events.abandon("the client disconnected")
        assert [event async for event in events] == [Failed("the client disconnected")]
        return events

    events = run(main())
    with pytest.raises(RuntimeError, match="closed"):
        events.deliver(Chunk("late", []))


def test_a_finished_event_loop_leaves_no_mailbox_behind():
    from ember.server import streaming

    async def main():
        JobEvents().deliver(Finished("stop", {}))
        await asyncio.sleep(0)

    before = len(streaming._MAILBOXES)
    for _ in range(3):
        run(main())
    gc.collect()
    assert len(streaming._MAILBOXES) <= before
