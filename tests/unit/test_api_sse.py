"""GET /v1/jobs/{id}/events: backlog, Last-Event-ID resume, live updates, end, keep-alive."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer

from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, record_for
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.hub import Hub
from framespool.projections.store import InMemoryViewStore
from tests.support.projections import lifecycle, records_for

ALICE, BOB = "acme-key.alice", "globex-key.bob"
H = {"Authorization": f"Bearer {ALICE}"}


async def read_events(resp, until_end=True, limit=100):
    """Parsed SSE frames ``(id, event, data)`` and comment lines."""
    frames, comments, cur = [], [], {}
    while len(frames) < limit:
        line = await asyncio.wait_for(resp.content.readline(), 5)
        if not line:
            break
        text = line.decode().rstrip("\n")
        if text.startswith(":"):
            comments.append(text)
        elif text == "":
            if "data" in cur:
                frames.append((cur.get("id"), cur.get("event"), json.loads(cur["data"])))
                if until_end and cur.get("event") == "end":
                    break
            cur = {}
        else:
            name, _, value = text.partition(": ")
            cur[name] = value
    return frames, comments


def setup(keepalive=15.0):
    store, hub = InMemoryViewStore(), Hub()
    keys = ApiKeys([record_for(ALICE, "acme"), record_for(BOB, "globex")])
    config = ApiConfig(
        auth=keys,
        store=store,
        producer=MemoryProducer(),
        hub=hub,
        sse_keepalive_s=keepalive,
        operator_key="ops-key",
    )
    consumer = ProjectionConsumer(store, hub=hub, dead_letter_sender=MemoryProducer())
    return config, consumer


def test_backlog_then_live_then_end():
    events = lifecycle("j1", progress_steps=3)

    async def go():
        config, consumer = setup()
        records = records_for(events)
        await consumer.handle(records[:3])  # admitted, queued, wait estimate
        async with TestClient(TestServer(make_app(config))) as client:
            resp = await client.get("/v1/jobs/j1/events", headers=H)
            assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"

            async def feed():
                await asyncio.sleep(0.05)
                for r in records[3:]:
                    await consumer.handle([r])
                    await asyncio.sleep(0.01)

            feeder = asyncio.create_task(feed())
            frames, _ = await read_events(resp)
            await feeder
            return frames

    frames = asyncio.run(go())
    types = [f[1] for f in frames]
    assert types[:3] == ["JobAdmitted", "JobQueued", "JobWaitEstimated"]
    assert types[-2:] == ["JobCompleted", "end"]
    assert types.count("RunProgress") == 3  # every live progress is streamed
    ids = [int(f[0]) for f in frames if f[0] is not None]
    assert ids == sorted(ids) and len(ids) == len(set(ids))
    assert frames[-1][2]["state"] == "COMPLETED" and frames[-2][2]["state"] == "COMPLETED"


def test_last_event_id_resumes_without_repeats():
    events = lifecycle("j1", runs=2)

    async def go():
        config, consumer = setup()
        await consumer.handle(records_for(events))
        async with TestClient(TestServer(make_app(config))) as client:
            full, _ = await read_events(await client.get("/v1/jobs/j1/events", headers=H))
            cut = int(full[3][0])
            resumed, _ = await read_events(
                await client.get("/v1/jobs/j1/events", headers={**H, "Last-Event-ID": str(cut)})
            )
            by_query, _ = await read_events(
                await client.get(f"/v1/jobs/j1/events?last_event_id={cut}", headers=H)
            )
            last = int(full[-2][0])
            tail, _ = await read_events(
                await client.get("/v1/jobs/j1/events", headers={**H, "Last-Event-ID": str(last)})
            )
            return full, resumed, by_query, tail

    full, resumed, by_query, tail = asyncio.run(go())
    assert resumed == full[4:] and by_query == resumed
    assert [f[1] for f in tail] == ["end"]


def test_keep_alive_comments_while_waiting_and_tenant_isolation():
    async def go():
        config, consumer = setup(keepalive=0.05)
        await consumer.handle(records_for(lifecycle("j1")[:2]))
        async with TestClient(TestServer(make_app(config))) as client:
            other = await client.get("/v1/jobs/j1/events", headers={"X-API-Key": BOB})
            assert other.status == 404
            resp = await client.get("/v1/jobs/j1/events", headers=H)
            frames, comments = await read_events(resp, until_end=False, limit=2)
            more = await asyncio.wait_for(resp.content.readline(), 2)
            more += await asyncio.wait_for(resp.content.readline(), 2)
            metrics = await (
                await client.get("/metrics", headers={"Authorization": "Bearer ops-key"})
            ).text()
            resp.close()
            return frames, more, metrics

    frames, more, metrics = asyncio.run(go())
    assert [f[1] for f in frames] == ["JobAdmitted", "JobQueued"]
    assert b": keep-alive" in more
    assert "framespool_api_sse_clients 1.0" in metrics
