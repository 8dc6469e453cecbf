"""The projection shell without a broker: records in, store + hub + outbox out."""

from __future__ import annotations

import asyncio

import pytest

from framespool.log import Record
from framespool.log.memory import MemoryProducer
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.hub import Hub
from framespool.projections.jobs import COMPLETED, fold
from framespool.projections.store import InMemoryViewStore, RocksViewStore
from framespool.schemas import codec
from framespool.schemas.deadletter import DeadLetterReason
from framespool.schemas.events import Tick
from framespool.schemas.topics import DEAD_LETTER, JOB_EVENTS
from tests.support.projections import cell_status, lifecycle, records_for


def to_records(events):
    return records_for(events)


def all_events():
    return (
        lifecycle("j1", runs=2)
        + lifecycle("j2", outcome="FAILED")
        + lifecycle("j3", outcome="REJECTED")
        + [cell_status("cell-0", 9_000)]
        + lifecycle("j4", callback_url="https://example.com/hook")
    )


@pytest.fixture(params=["memory", "rocksdict"])
def make_store(request, tmp_path):
    made = []

    def make(name="views"):
        s = (
            InMemoryViewStore()
            if request.param == "memory"
            else RocksViewStore(str(tmp_path / name))
        )
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def consumer_for(store, **kw):
    kw.setdefault("dead_letter_sender", MemoryProducer())
    return ProjectionConsumer(store, **kw)


def views_of(store, job_ids=("j1", "j2", "j3", "j4")):
    return {j: store.get(j) for j in job_ids}


def test_records_fold_into_views_and_offsets(make_store):
    store = make_store()
    records = to_records(all_events())
    c = consumer_for(store)
    asyncio.run(c.handle(records))
    assert store.get("j1").state == COMPLETED and store.get("j1").run == 2
    assert store.get("j3").state == "REJECTED"
    for r in records:
        assert store.offset(r.topic, r.partition) >= r.offset
    assert store.load_cluster().cells["cell-0"].ts_ms == 9_000
    assert views_of(store)["j2"] == fold(lifecycle("j2", outcome="FAILED"))


def test_input_at_or_below_the_stored_offset_is_a_no_op(make_store):
    store = make_store()
    records = to_records(all_events())
    c = consumer_for(store)
    asyncio.run(c.handle(records))
    before = views_of(store)
    asyncio.run(c.handle(records))
    assert views_of(store) == before
    assert c.counters.skipped_replays == len(records)


@pytest.mark.parametrize("k", [0, 1, 7, 19, 33])
def test_crash_at_k_then_restart_equals_an_uninterrupted_run(make_store, k):
    records = to_records(all_events())
    reference = make_store("reference")
    asyncio.run(consumer_for(reference).handle(records))

    store = make_store("crashy")
    first = consumer_for(store)
    for i in range(0, k, 3):  # several polls, then the process dies
        asyncio.run(first.handle(records[i : min(i + 3, k)]))
    restarted = consumer_for(store)  # re-reads from the beginning of the log
    asyncio.run(restarted.handle(records))
    assert views_of(store) == views_of(reference)
    assert [d.delivery_id for d in store.pending_deliveries()] == [
        d.delivery_id for d in reference.pending_deliveries()
    ]


def test_truncate_and_replay_rebuilds_the_same_views(make_store):
    records = to_records(all_events())
    a, b = make_store("a"), make_store("b")
    asyncio.run(consumer_for(a).handle(records))
    asyncio.run(consumer_for(b).handle(records[:10]))
    asyncio.run(consumer_for(b).handle(records))
    assert views_of(a) == views_of(b)


def test_undecodable_and_unexpected_records_are_dead_lettered_and_skipped(make_store):
    store = make_store()
    dlq = MemoryProducer()
    good = to_records(lifecycle("j1"))
    other = (good[0].partition + 1) % JOB_EVENTS.partitions  # another partition, same poll
    bad = Record(JOB_EVENTS.name, other, 100, b"j1", b"\xc3\x01garbage")
    tick = Record(
        JOB_EVENTS.name,
        other,
        101,
        b"c",
        codec.encode(Tick(event_id="t", ts_ms=1, cell="cell-0", now_ms=1)),
    )
    empty = Record(JOB_EVENTS.name, other, 102, b"j1", None)
    c = consumer_for(store, dead_letter_sender=dlq)
    asyncio.run(c.handle(good[:3] + [bad, tick, empty] + good[3:]))
    assert store.get("j1").state == COMPLETED
    letters = dlq.on(DEAD_LETTER.name)
    reasons = [dict(s.headers)["reason"] for s in letters]
    assert reasons == [b"truncated", DeadLetterReason.UNEXPECTED_TYPE.encode(), b"no_value"]
    assert dict(letters[0].headers)["source_offset"] == b"100"
    assert letters[0].key == b"j1" and letters[0].value == bad.value
    assert store.offset(JOB_EVENTS.name, other) == 102


def test_dead_letter_send_failure_commits_nothing(make_store):
    store = make_store()
    dlq = MemoryProducer(fail_with=RuntimeError("broker down"))
    records = to_records(lifecycle("j1"))
    bad = Record(JOB_EVENTS.name, 0, 50, b"x", b"nope")
    c = consumer_for(store, dead_letter_sender=dlq)
    with pytest.raises(RuntimeError):
        asyncio.run(c.handle(records + [bad]))
    assert store.get("j1") is None and store.offset(JOB_EVENTS.name, 0) == -1


def test_changed_views_are_published_and_webhooks_outboxed(make_store):
    store = make_store()
    hub = Hub()
    woke = []

    async def go():
        sub = hub.subscribe("j4")
        c = consumer_for(
            store, hub=hub, on_deliveries=lambda deliveries: woke.append(len(deliveries))
        )
        await c.handle(to_records(lifecycle("j4", callback_url="https://example.com/hook")))
        return await sub.get(timeout=1)

    published = asyncio.run(go())
    assert published.state == COMPLETED
    assert woke
    states = [d.body for d in store.pending_deliveries()]
    assert len(states) == 4  # QUEUED, ASSIGNED, RUNNING, COMPLETED
    assert all('"job_id":"j4"' in b for b in states)


def test_wait_until_sees_commits():
    store = InMemoryViewStore()
    c = consumer_for(store)

    async def go():
        waiter = asyncio.create_task(c.wait_until(lambda: store.get("j1") is not None, 2))
        await asyncio.sleep(0)
        await c.handle(to_records(lifecycle("j1")))
        await waiter

    asyncio.run(go())
