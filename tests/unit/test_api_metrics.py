"""``/metrics`` of the API: cluster figures from the read model, projection counters,
and submit -> assigned latency observed from the views the projection publishes."""

from __future__ import annotations

import asyncio
import re

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest

from framespool.callbacks.lookups import CallbackLookups
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, record_for
from framespool.producers.metrics import ProjectionCollector, PublishTap, projection_parts
from framespool.projections import cluster
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.hub import Hub
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.projections.webhooks import WebhookConfig, WebhookDispatcher
from framespool.schemas.events import NodeStateChanged
from tests.support.projections import cell_status, lifecycle, records_for


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (labels in any order)."""
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:\{{(.*)\}})? (\S+)$", line)
        if m:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            if got == labels:
                return float(m.group(2))
    raise AssertionError(f"no sample {name}{labels} in:\n{text}")


def test_cluster_queue_and_latency_metrics():
    async def go():
        store = InMemoryViewStore()
        config = ApiConfig(
            auth=ApiKeys([record_for("k.s", "acme")]),
            store=store,
            producer=MemoryProducer(),
            operator_key="ops-key",
        )
        view = cluster.apply(None, cell_status("cell-0", 1_000, busy=3))
        view = cluster.apply(
            view,
            NodeStateChanged(
                event_id="n",
                ts_ms=2_000,
                node_id="cell-0-node-1",
                incarnation=1,
                state="DOWN",
                reason="lost",
            ),
        )
        store.commit(Batch(cells=dict(view.cells)))
        async with TestClient(TestServer(make_app(config))) as client:
            consumer = ProjectionConsumer(
                store, hub=config.hub, dead_letter_sender=MemoryProducer()
            )
            events = lifecycle("job-1", ts0=10_000, runs=2)
            await consumer.handle(records_for(events[:5]))  # through the first assignment
            await consumer.handle(records_for(events[5:]))  # the second run's assignment too
            await consumer.handle(records_for(lifecycle("job-2", ts0=20_000)))
            text = await (
                await client.get("/metrics", headers={"Authorization": "Bearer ops-key"})
            ).text()
        assert sample(text, "framespool_gpus", cell="cell-0", state="busy") == 3
        assert sample(text, "framespool_gpus", cell="cell-0", state="free") == 5
        assert sample(text, "framespool_gpus", cell="cell-0", state="down") == 8
        assert sample(text, "framespool_nodes", cell="cell-0", state="DOWN") == 1
        assert sample(text, "framespool_queue_jobs", tier="free", tenant="acme") == 4
        assert sample(text, "framespool_queue_gpus", tier="paid", tenant="globex") == 8
        assert sample(text, "framespool_running_gpus", tier="free", tenant="acme") == 3
        # one observation per job: its first JobAssigned (event 3, 30 ms after submission)
        assert sample(text, "framespool_job_submit_to_assigned_seconds_count", tier="free") == 2
        assert sample(text, "framespool_job_submit_to_assigned_seconds_sum", tier="free") == 0.06
        assert (
            sample(text, "framespool_job_submit_to_assigned_seconds_bucket", tier="free", le="0.1")
            == 2
        )

    asyncio.run(go())


def test_projection_counters_from_the_background_parts():
    store, hub = InMemoryViewStore(), Hub()
    consumer = ProjectionConsumer(store, hub=hub, dead_letter_sender=MemoryProducer())
    dispatcher = WebhookDispatcher(store, WebhookConfig(secret=b"s"))
    assert projection_parts([consumer.run, dispatcher.run, consumer.run, lambda: None]) == [
        consumer,
        dispatcher,
    ]
    consumer.counters.dead_lettered = 2
    consumer.behind = {"job-events": 7, "progress": 0}
    dispatcher.delivered, dispatcher.failed = 5, 1
    dispatcher.lookups.skipped = 4
    submit_lookups = CallbackLookups()
    submit_lookups.skipped = 9
    hub.dropped_total = 3
    registry = CollectorRegistry()
    registry.register(ProjectionCollector([consumer, dispatcher], hub, submit_lookups))
    text = generate_latest(registry).decode()
    assert sample(text, "framespool_projection_dead_lettered_total") == 2
    assert sample(text, "framespool_webhook_deliveries_total", outcome="delivered") == 5
    assert sample(text, "framespool_webhook_deliveries_total", outcome="failed") == 1
    assert sample(text, "framespool_sse_dropped_clients_total") == 3
    assert sample(text, "framespool_projection_behind_records", topic="job-events") == 7
    assert sample(text, "framespool_projection_behind_records", topic="progress") == 0
    assert sample(text, "framespool_callback_lookups_skipped_total", where="submit") == 9
    assert sample(text, "framespool_callback_lookups_skipped_total", where="webhook") == 4


def test_publish_tap_never_breaks_publishing_and_is_removed():
    hub = Hub()
    seen = []

    def observer(key, item):
        seen.append(key)
        raise RuntimeError("broken metric")

    tap = PublishTap(hub, observer)
    sub = hub.subscribe("job-1")
    assert hub.publish("job-1", "view") == 1 and seen == ["job-1"]
    assert sub.queue.get_nowait() == "view"
    tap.remove()
    hub.publish("job-1", "again")
    assert seen == ["job-1"] and "publish" not in vars(hub)
