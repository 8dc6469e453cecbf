"""The projection consumer against a real broker: views appear, restarts add no duplicates."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from framespool.log import LogProducer, read_all
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.jobs import COMPLETED, FAILED, fold
from framespool.projections.store import RocksViewStore
from framespool.schemas import codec
from framespool.schemas.events import RunProgress
from tests.support.projections import cell_status, key_of, lifecycle

pytestmark = pytest.mark.integration


def produce(bootstrap, topics, events, garbage=False):
    with LogProducer(bootstrap) as producer:
        for e in events:
            topic = topics.PROGRESS if isinstance(e, RunProgress) else topics.JOB_EVENTS
            producer.produce(topic.name, key_of(e), codec.encode(e))
        if garbage:
            producer.produce(topics.JOB_EVENTS.name, "j-bad", b"not avro at all")
        producer.flush()


async def run_until(consumer, predicate, timeout=30.0):
    task = asyncio.create_task(consumer.run())
    try:
        await consumer.wait_until(predicate, timeout)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def caught_up_fold(events):
    """What a catch-up folds: job-events first, then progress (see ProjectionConsumer.run)."""
    return fold(
        [e for e in events if not isinstance(e, RunProgress)]
        + [e for e in events if isinstance(e, RunProgress)]
    )


def make_consumer(bootstrap, topics, store, sender):
    return ProjectionConsumer(
        store,
        bootstrap_servers=bootstrap,
        topics=(topics.JOB_EVENTS.name, topics.PROGRESS.name),
        dead_letter_topic=topics.DEAD_LETTER.name,
        dead_letter_sender=sender,
        poll_timeout_s=0.2,
    )


def test_consumer_folds_the_log_and_restarts_without_duplicates(
    kafka_bootstrap, fresh_topics, tmp_path
):
    first = (
        lifecycle("job-a", runs=2)
        + [cell_status("cell-0", 9_000)]
        + lifecycle("job-b", outcome="FAILED")
    )
    produce(kafka_bootstrap, fresh_topics, first, garbage=True)
    path = str(tmp_path / "views")

    async def phase_one():
        store = RocksViewStore(path)
        with LogProducer(kafka_bootstrap) as sender:
            c = make_consumer(kafka_bootstrap, fresh_topics, store, sender)
            await run_until(c, lambda: c.counters.records == len(first) + 1)
        views = {j: store.get(j) for j in ("job-a", "job-b")}
        cells = store.load_cluster().cells
        store.close()
        return views, cells

    views, cells = asyncio.run(phase_one())
    assert views["job-a"] == caught_up_fold(lifecycle("job-a", runs=2))
    assert views["job-a"].state == COMPLETED and views["job-b"].state == FAILED
    assert views["job-b"] == caught_up_fold(lifecycle("job-b", outcome="FAILED"))
    assert cells["cell-0"].ts_ms == 9_000

    letters = read_all(kafka_bootstrap, fresh_topics.DEAD_LETTER.name)
    assert len(letters) == 1
    assert letters[0].header("reason") == b"bad_magic" and letters[0].key == b"j-bad"

    # restart on the same store; a duplicate re-emission and a new job arrive meanwhile
    second = first[3:5] + lifecycle("job-c")
    produce(kafka_bootstrap, fresh_topics, second)

    async def phase_two():
        store = RocksViewStore(path)
        with LogProducer(kafka_bootstrap) as sender:
            c = make_consumer(kafka_bootstrap, fresh_topics, store, sender)
            await run_until(c, lambda: c.counters.records == len(second))
            replays = c.counters.skipped_replays
        views = {j: store.get(j) for j in ("job-a", "job-b", "job-c")}
        store.close()
        return views, replays

    after, replays = asyncio.run(phase_two())
    assert replays == 0  # it resumed at stored offset + 1
    assert after["job-a"] == views["job-a"] and after["job-b"] == views["job-b"]
    assert after["job-c"] == caught_up_fold(lifecycle("job-c"))
    for view in after.values():
        counts = Counter(e.event_id for e in view.timeline)
        assert max(counts.values()) == 1, counts
    assert len(read_all(kafka_bootstrap, fresh_topics.DEAD_LETTER.name)) == 1

    # truncate and replay: an empty store re-folds the whole log to the same views
    async def replay():
        store = RocksViewStore(str(tmp_path / "replayed"))
        with LogProducer(kafka_bootstrap) as sender:
            c = make_consumer(kafka_bootstrap, fresh_topics, store, sender)
            await run_until(c, lambda: c.counters.records == len(first) + 1 + len(second))
        views = {j: store.get(j) for j in ("job-a", "job-b", "job-c")}
        store.close()
        return views

    assert asyncio.run(replay()) == after
