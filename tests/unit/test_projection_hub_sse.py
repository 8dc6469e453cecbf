"""The SSE hub (bounded queue per client, slow clients dropped) and the SSE stream."""

from __future__ import annotations

import asyncio
import json

import pytest

from framespool.producers.client import parse_stream
from framespool.projections.hub import Hub, SlowSubscriber
from framespool.projections.jobs import fold
from framespool.projections.sse import format_event, parse_last_event_id, stream_job
from tests.support.projections import lifecycle


def test_publish_reaches_every_subscriber_of_the_key_only():
    async def go():
        hub = Hub()
        a, b, other = hub.subscribe("j1"), hub.subscribe("j1"), hub.subscribe("j2")
        assert hub.publish("j1", "x") == 2
        assert await a.get(0.1) == "x" and await b.get(0.1) == "x"
        assert await other.get(0.01) is None
        a.close()
        assert hub.subscribers == 2

    asyncio.run(go())


def test_a_slow_client_is_dropped_not_the_hub():
    async def go():
        hub = Hub(queue_size=2)
        slow, fast = hub.subscribe("j"), hub.subscribe("j")
        for i in range(5):
            hub.publish("j", i)
            assert await fast.get(0.1) == i
        assert slow.dropped and hub.dropped_total == 1 and hub.subscribers == 1
        with pytest.raises(SlowSubscriber):
            await slow.get(0.1)

    asyncio.run(go())


def test_format_and_parse_round_trip():
    frames = (
        format_event({"a": 1}, event="JobQueued", id=3)
        + b": keep-alive\n\n"
        + format_event({"b": 2})
    )
    events = list(parse_stream(frames.decode().splitlines(keepends=True)))
    assert events == [
        {"id": "3", "event": "JobQueued", "data": '{"a":1}'},
        {"id": None, "event": "message", "data": '{"b":2}'},
    ]
    assert parse_last_event_id("7") == 7 and parse_last_event_id("junk") == 0
    assert parse_last_event_id(None) == 0


def _frames(chunks):
    events = list(parse_stream(b"".join(chunks).decode().splitlines(keepends=True)))
    return [(e["id"], e["event"], json.loads(e["data"])) for e in events]


def test_stream_sends_backlog_after_last_id_then_live_then_ends():
    events = lifecycle("j1")

    async def go():
        hub, chunks = Hub(), []
        current = {"view": fold(events[:3])}

        async def write(b):
            chunks.append(b)

        task = asyncio.create_task(
            stream_job(write, hub, "j1", lambda: current["view"], 1, keepalive_s=0.05)
        )
        await asyncio.sleep(0.12)  # backlog sent, a keep-alive or two
        current["view"] = fold(events)
        hub.publish("j1", current["view"])
        last = await asyncio.wait_for(task, 2)
        return chunks, last

    chunks, last = asyncio.run(go())
    frames = _frames(chunks)
    ids = [int(i) for i, _, _ in frames if i is not None]
    assert ids == sorted(ids) and ids[0] == 2 and ids[-1] == last == fold(events).seq
    assert frames[-1][1] == "end" and frames[-1][2]["state"] == "COMPLETED"
    assert b": keep-alive\n\n" in chunks


def test_stream_of_a_finished_job_sends_the_rest_and_closes():
    view = fold(lifecycle("j1"))

    async def go():
        chunks = []

        async def write(b):
            chunks.append(b)

        await stream_job(write, Hub(), "j1", lambda: view, view.seq - 1, keepalive_s=5)
        return chunks

    frames = _frames(asyncio.run(go()))
    assert [f[1] for f in frames] == ["JobCompleted", "end"]
