"""Takeover and fencing of a partition between processor instances, through the
in-memory shared snapshot store (no broker): a new owner starts from the newest
snapshot, a zombie is fenced, outputs carry the owner epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from framespool.processors.shared_snapshots import MemorySharedSnapshots
from framespool.processors.snapshots import SnapshotStore, StatefulProcessor
from framespool.schemas.fencing import INPUT_POSITION, OWNER_EPOCH, EpochFence, read_fencing
from tests.support.snapshots import TOPIC, ListFold, records


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def shared() -> MemorySharedSnapshots:
    return MemorySharedSnapshots()


@pytest.fixture
def stores(tmp_path: Path):
    opened: list[SnapshotStore] = []

    def open_store(name: str) -> SnapshotStore:
        store = SnapshotStore(tmp_path / name, TOPIC)
        opened.append(store)
        return store

    yield open_store
    for s in opened:
        s.close()


def instance(name, shared, stores, clock=None, **kw) -> StatefulProcessor:
    return StatefulProcessor(
        ListFold(),
        stores(name),
        TOPIC,
        shared=shared,
        instance=name,
        clock=clock or Clock(),
        **kw,
    )


def test_a_new_instance_takes_over_from_the_shared_snapshot(shared, stores):
    a = instance("a", shared, stores)
    a.assign(0)
    a.fold(records(0, 0, [b"x", b"y", b"z"]))
    a.snapshot()
    a.revoke(0)
    b = instance("b", shared, stores)  # its own, empty local store
    assert b.assign(0) == 3
    assert b.state(0) == [b"x", b"y", b"z"]
    assert b.epoch(0) == 2


def test_the_newer_of_local_and_shared_snapshot_wins(shared, stores):
    clock = Clock()
    a = instance("a", shared, stores, clock, publish_interval_s=60.0)
    a.assign(0)
    a.fold(records(0, 0, [b"x"]))
    a.snapshot()  # local at 0; the first publish waits for the interval
    clock.now += 60
    a.snapshot(force=True)  # nothing new locally; publishes offset 0
    a.fold(records(0, 1, [b"y", b"z"]))
    a.snapshot()  # local at 2, shared still at 0 (interval)
    assert shared.load(TOPIC, 0)[0].offset == 0
    a.abandon()  # a crash: nothing more published
    again = StatefulProcessor(ListFold(), a.store, TOPIC, shared=shared, instance="a")
    assert again.assign(0) == 3  # local (2) is newer than shared (0)
    assert again.state(0) == [b"x", b"y", b"z"]
    other = instance("b", shared, stores)
    assert other.assign(0) == 1  # only the shared snapshot is visible elsewhere
    assert other.state(0) == [b"x"]


def test_publishing_is_throttled_but_forced_on_revoke(shared, stores):
    clock = Clock()
    a = instance("a", shared, stores, clock, publish_interval_s=5.0)
    a.assign(0)
    a.fold(records(0, 0, [b"x"]))
    a.snapshot()
    assert shared.load(TOPIC, 0) is None
    clock.now += 5
    a.snapshot()
    assert shared.load(TOPIC, 0)[0].offset == 0
    a.fold(records(0, 1, [b"y"]))
    a.snapshot()
    assert shared.load(TOPIC, 0)[0].offset == 0
    a.revoke(0)
    meta, _ = shared.load(TOPIC, 0)
    assert (meta.offset, meta.epoch, meta.instance) == (1, 1, "a")


def test_outputs_carry_the_owner_epoch_and_input_position(shared, stores):
    a = instance("a", shared, stores)
    a.assign(2)
    batch = a.fold(records(2, 0, [b"x", b"boom"]))
    assert [read_fencing(o.headers) for o in batch.outgoing] == [
        (f"{TOPIC}[2]@0", 1),
        (f"{TOPIC}[2]@1", 1),  # the dead letter too
    ]
    assert dict(batch.outgoing[1].headers)["reason"] == b"processing_error"


def test_without_a_shared_store_outputs_are_unchanged(stores):
    local = StatefulProcessor(ListFold(), stores("solo"), TOPIC)
    local.assign(0)
    assert local.fold(records(0, 0, [b"x"])).outgoing[0].headers == ()


def test_a_zombie_is_fenced_before_it_folds_and_commits_nothing(shared, stores):
    clock = Clock()
    zombie = instance("a", shared, stores, clock, verify_after_s=1.0)
    zombie.assign(0)
    zombie.fold(records(0, 0, [b"x"]))
    zombie.snapshot()
    # paused past its session timeout; b takes over meanwhile
    owner = instance("b", shared, stores)
    assert owner.assign(0) == 1
    clock.now += 0.5
    assert zombie.verify([0]) == []  # too soon to suspect anything
    clock.now += 10
    assert zombie.verify([0]) == [0]
    assert zombie.partitions == [] and zombie.fenced == [(0, 1, 2)]
    batch = zombie.fold(records(0, 1, [b"y"]))
    assert batch.outgoing == [] and batch.skipped == 1
    assert zombie.commit_positions(batch) == {}


def test_a_zombies_snapshot_is_refused_and_its_partition_dropped(shared, stores):
    zombie = instance("a", shared, stores, verify_after_s=3600)  # it never re-checks
    zombie.assign(0)
    zombie.fold(records(0, 0, [b"x"]))
    zombie.snapshot()
    owner = instance("b", shared, stores)
    owner.assign(0)
    decided = owner.fold(records(0, 1, [b"y"])).outgoing
    owner.snapshot()
    batch = zombie.fold(records(0, 1, [b"y", b"z"]))  # slipped past the check
    zombie.snapshot()
    assert zombie.fenced == [(0, 1, 2)] and zombie.partitions == []
    assert zombie.commit_positions(batch) == {}
    meta, _ = shared.load(TOPIC, 0)
    assert (meta.instance, meta.epoch, meta.offset) == ("b", 2, 1)
    # readers keep the new owner's record for every input both decided
    decided += owner.fold(records(0, 2, [b"z"])).outgoing
    fence = EpochFence()
    assert [fence.admit(o.headers) for o in decided] == [True, True]
    assert [fence.admit(o.headers) for o in batch.outgoing] == [False, False]
    assert fence.ignored == 2


def test_the_epoch_fence_keeps_the_highest_epoch_per_input():
    fence = EpochFence(limit=2)

    def h(pos: str, epoch: int):
        return ((OWNER_EPOCH, str(epoch).encode()), (INPUT_POSITION, pos.encode()))

    assert fence.admit(h("t[0]@5", 1))
    assert fence.admit(h("t[0]@5", 1))  # a re-delivery of the same epoch: dedupe is by id
    assert fence.admit(h("t[0]@5", 2))
    assert not fence.admit(h("t[0]@5", 1))
    assert fence.admit(())  # a record from a writer without headers
    assert fence.admit(h("t[0]@6", 1)) and fence.admit(h("t[0]@7", 1))
    assert fence.admit(h("t[0]@5", 1))  # forgotten beyond the limit
    assert read_fencing([(OWNER_EPOCH, b"x"), (INPUT_POSITION, b"p")]) is None


def test_projections_ignore_a_zombies_record_for_an_input_a_newer_owner_decided():
    import asyncio
    from dataclasses import replace as with_

    from framespool.log.memory import MemoryProducer
    from framespool.projections.consumer import ProjectionConsumer
    from framespool.projections.store import InMemoryViewStore
    from framespool.schemas.fencing import fencing_headers
    from tests.support.projections import lifecycle, records_for

    done = lifecycle("j1", progress_steps=0)
    failed = lifecycle("j1", progress_steps=0, outcome="FAILED")[-1]
    # the new owner (epoch 2) decided input @k: COMPLETED; a zombie (epoch 1) FAILED it
    k = len(done) - 1
    records = [
        with_(r, headers=fencing_headers(f"sched[0]@{i}", 2))
        for i, r in enumerate(records_for(done))
    ]
    zombie = records_for([failed])[0]
    zombie = with_(
        zombie,
        offset=records[-1].offset + 1,
        partition=records[-1].partition,
        headers=fencing_headers(f"sched[0]@{k}", 1),
    )
    store = InMemoryViewStore()
    consumer = ProjectionConsumer(store, dead_letter_sender=MemoryProducer())
    asyncio.run(consumer.handle([*records, zombie]))
    assert store.get("j1").state == "COMPLETED"
    assert consumer.counters.fenced == 1
    assert store.offset(zombie.topic, zombie.partition) == zombie.offset  # consumed, not folded


def test_agents_ignore_a_zombies_instruction_for_an_input_a_newer_owner_decided(tmp_path):
    import asyncio
    from types import SimpleNamespace

    from framespool.agents.agent import NodeAgent
    from framespool.agents.ledger import Action
    from framespool.log import Record
    from framespool.schemas import codec
    from framespool.schemas import events as ev
    from framespool.schemas.fencing import fencing_headers

    agent = NodeAgent("n0", "cell-0", "unused:9092", None, None, {}, tmp_path)
    decided: list[str] = []

    def decide(cmd):
        decided.append(cmd.event_id)
        return SimpleNamespace(job_id=cmd.job_id, run=cmd.run, action=Action.IGNORE, reason="t")

    agent.ledger = SimpleNamespace(decide=decide)

    def stop(event_id: str, epoch: int, offset: int) -> Record:
        cmd = ev.StopRun(
            event_id=event_id, ts_ms=1, job_id="j1", run=1, node_id="n0", incarnation=1
        )
        return Record(
            "assignments", 0, offset, b"n0", codec.encode(cmd), fencing_headers("s[0]@7", epoch)
        )

    async def feed() -> None:
        for record in (stop("cell-0@7/0", 2, 0), stop("cell-0@7/0", 1, 1)):
            await agent._handle_record(record)

    asyncio.run(feed())
    assert decided == ["cell-0@7/0"]  # the epoch-1 copy never reached the ledger


def test_inputs_missing_between_the_snapshot_and_the_log_are_reported(shared, stores, caplog):
    a = instance("a", shared, stores)
    a.assign(0)
    a.fold(records(0, 0, [b"x"]))
    a.fold(records(0, 1, [b"y"]))
    assert a.gaps == []
    a.fold(records(0, 5, [b"z"]))  # 2..4 were deleted by retention
    assert a.gaps == [(0, 2, 5)]
    assert "inputs 2..4 are no longer in the log" in caplog.text


def test_an_unreachable_shared_store_on_assignment_stops_the_runner(tmp_path):
    """Without an owner epoch the instance could not be fenced: it must not process."""
    import threading

    from framespool.log.memory import MemoryLog
    from framespool.processors.app import ProcessorFailed, ProcessorRunner
    from framespool.processors.shared_snapshots import SharedStoreError
    from framespool.schemas.topics import Topic
    from tests.support.snapshots import Journal, JournalConsumer, JournalProducer

    class Down(MemorySharedSnapshots):
        def claim(self, namespace, partition, instance):
            raise SharedStoreError("s3://bucket: connection refused")

    journal, stop = Journal(), threading.Event()
    log = MemoryLog([Topic(TOPIC, 1, "x"), Topic("out", 1, "x"), Topic("dlq", 1, "x")])
    consumer = JournalConsumer(log, journal, [records(0, 0, [b"a"])], stop, "g")
    store = SnapshotStore(tmp_path / "s", TOPIC)
    runner = ProcessorRunner(
        StatefulProcessor(ListFold(), store, TOPIC, shared=Down()),
        "fake:9092",
        "g",
        input_topic=Topic(TOPIC, 1, "x"),
        consumer_factory=lambda *args, **kwargs: consumer,
        producer_factory=lambda *args, **kwargs: JournalProducer(log, journal),
    )
    try:
        with pytest.raises(ProcessorFailed, match="cannot claim partitions"):
            runner.run(stop)
    finally:
        store.close()
    assert journal == ["assigned", "closed", "producer closed"]  # nothing produced or committed
