"""The snapshot store and the per-partition commit protocol (rocksdict on a temp dir, no broker)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from framespool.log.memory import MemoryLog
from framespool.processors.snapshots import SnapshotStore, StatefulProcessor
from tests.support.snapshots import (
    TOPIC,
    Journal,
    JournalConsumer,
    JournalProducer,
    ListFold,
    records,
)


@pytest.fixture
def store(tmp_path: Path):
    s = SnapshotStore(tmp_path / "store", TOPIC)
    yield s
    s.close()


# -- the store ---------------------------------------------------------------------
def test_save_and_load_round_trip_per_partition(store: SnapshotStore):
    assert store.load(0) is None
    store.save({0: ({"a": [1, 2]}, 41), 3: ("three", 7)})
    assert store.load(0) == ({"a": [1, 2]}, 41)
    assert store.load(3) == ("three", 7)
    assert store.load(1) is None


def test_namespaces_do_not_see_each_other(tmp_path: Path):
    a = SnapshotStore(tmp_path / "s", "topic-a")
    a.save({0: ("a", 1)})
    a.close()
    b = SnapshotStore(tmp_path / "s", "topic-b")
    assert b.load(0) is None
    b.close()


def test_an_unreadable_snapshot_counts_as_none(store: SnapshotStore, caplog):
    state_key, offset_key = store._keys(0)
    store._db[state_key] = b"not a pickle"
    store._db[offset_key] = b"12"
    assert store.load(0) is None
    assert "unreadable" in caplog.text


class RecordingDb:
    """Delegates to the real Rdict and records which writing calls were made."""

    def __init__(self, db) -> None:
        self.db = db
        self.calls: list[str] = []

    def write(self, batch) -> None:
        self.calls.append(f"write({len(batch)})")
        self.db.write(batch)

    def __setitem__(self, key, value) -> None:
        self.calls.append("put")
        self.db[key] = value

    def __getattr__(self, name):
        if name in ("put", "delete", "__delitem__"):
            self.calls.append(name)
        return getattr(self.db, name)


def test_state_and_offsets_of_a_save_go_in_one_write_batch(store: SnapshotStore):
    recorder = store._db = RecordingDb(store._db)
    store.save({0: ("s0", 4), 1: ("s1", 9)})
    assert recorder.calls == ["write(4)"]  # two partitions x (state, offset), one batch
    store._db = recorder.db


CRASH_WRITER = textwrap.dedent("""
    import sys
    from framespool.processors.snapshots import SnapshotStore
    store = SnapshotStore(sys.argv[1], "in")
    payload = "x" * 200_000
    i = 0
    print("ready", flush=True)
    while True:
        i += 1
        store.save({0: ({"offset": i, "payload": payload}, i), 1: ({"offset": -i}, -i)})
""")


@pytest.mark.slow
def test_state_and_offset_agree_after_a_crash_mid_write(tmp_path: Path):
    """SIGKILL a process that rewrites (state, offset) in a loop; whatever survived agrees."""
    path = tmp_path / "crash"
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", CRASH_WRITER, str(path)],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).parents[2],
        )
        try:
            assert proc.stdout.readline().strip() == b"ready"
            time.sleep(0.2 + 0.1 * attempt)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()
        store = SnapshotStore(path, "in")
        try:
            (state0, offset0), (state1, offset1) = store.load(0), store.load(1)
        finally:
            store.close()
        assert state0["offset"] == offset0 > 0
        assert state1["offset"] == offset1 == -offset0  # both partitions from one batch


# -- the protocol --------------------------------------------------------------------
def test_a_fresh_partition_starts_at_zero_and_a_snapshotted_one_after_its_offset(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC)
    assert proc.assign(0) == 0
    proc.fold(records(0, 0, [b"a", b"b", b"c"]))
    assert proc.snapshot() == 1
    again = StatefulProcessor(ListFold(), store, TOPIC)
    assert again.assign(0) == 3
    assert again.state(0) == [b"a", b"b", b"c"]


def test_input_at_or_below_the_snapshot_offset_is_a_no_op(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC)
    proc.assign(0)
    proc.fold(records(0, 0, [b"a", b"b"]))
    proc.snapshot()
    restarted = StatefulProcessor(ListFold(), store, TOPIC)
    restarted.assign(0)
    batch = restarted.fold(records(0, 0, [b"a", b"b", b"c"]))  # a redelivery overlapping the state
    assert [o.value for o in batch.outgoing] == [b"c"]
    assert batch.skipped == 2
    assert restarted.state(0) == [b"a", b"b", b"c"]
    assert restarted.commit_positions(batch) == {(TOPIC, 0): 3}


def test_input_below_the_committed_offset_is_folded_without_re_sending(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC)
    assert proc.assign(1, committed=2) == 0  # no snapshot here, but the group got to 2
    batch = proc.fold(records(1, 0, [b"a", b"b", b"c", b"d"]))
    assert [o.value for o in batch.outgoing] == [b"c", b"d"]
    assert batch.quiet == 2
    assert proc.state(1) == [b"a", b"b", b"c", b"d"]


def test_partitions_are_independent_and_unassigned_ones_skipped(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC)
    proc.assign(0)
    proc.assign(2)
    batch = proc.fold(records(0, 0, [b"a"]) + records(1, 0, [b"x"]) + records(2, 0, [b"b"]))
    assert [o.event for o in batch.outgoing] == ["0@0", "2@0"]
    assert batch.skipped == 1
    assert batch.advanced == {0: 0, 2: 0}


def test_a_fold_error_dead_letters_the_record_and_processing_continues(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC)
    proc.assign(0)
    batch = proc.fold(records(0, 0, [b"a", b"boom", b"c"]))
    assert [(o.topic, o.value) for o in batch.outgoing] == [
        ("out", b"a"),
        ("dlq", b"boom"),
        ("out", b"c"),
    ]
    assert batch.dead_letters == 1
    assert proc.offset(0) == 2


def test_snapshots_are_throttled_by_interval_but_forced_on_revoke(store):
    now = [100.0]
    proc = StatefulProcessor(
        ListFold(), store, TOPIC, snapshot_interval_s=5.0, clock=lambda: now[0]
    )
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    assert proc.snapshot() == 0 and store.load(0) is None
    now[0] += 5.0
    assert proc.snapshot() == 1 and store.load(0) == ([b"a"], 0)
    proc.fold(records(0, 1, [b"b"]))
    assert proc.snapshot() == 0
    proc.revoke(0)
    assert store.load(0) == ([b"a", b"b"], 1)
    assert proc.partitions == []


def test_an_unchanged_partition_is_not_rewritten(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC)
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    assert proc.snapshot() == 1
    assert proc.snapshot() == 0
    assert proc.snapshot(force=True) == 0


# -- the commit order, through the runner with a fake consumer and producer ----------


class JournalStore(SnapshotStore):
    def __init__(self, path, journal):
        super().__init__(path, TOPIC)
        self.journal = journal

    def save_pickled(self, snapshots):
        self.journal.append(f"snapshot {snapshots[0][1]}")
        super().save_pickled(snapshots)


def run_fake(tmp_path, polls, fail_flush=False, committed=None, commit_interval_s=0.0):
    import threading

    from framespool.processors.app import ProcessorRunner
    from framespool.schemas.topics import Topic

    journal, stop = Journal(), threading.Event()
    store = JournalStore(tmp_path / "j", journal)
    log = MemoryLog([Topic(TOPIC, 1, "x"), Topic("out", 1, "x"), Topic("dlq", 1, "x")])
    log.commit("g", {(TOPIC, p): offset for p, offset in (committed or {}).items()})
    consumer = JournalConsumer(log, journal, polls, stop, "g")
    producer = JournalProducer(log, journal, fail_flush)
    runner = ProcessorRunner(
        StatefulProcessor(ListFold(), store, TOPIC),
        "fake:9092",
        "g",
        input_topic=Topic(TOPIC, 1, "x"),
        commit_interval_s=commit_interval_s,
        consumer_factory=lambda *args, **kwargs: consumer,
        producer_factory=lambda *args, **kwargs: producer,
    )
    try:
        runner.run(stop)
        return journal, store.load(0), None
    except Exception as exc:
        return journal, store.load(0), exc
    finally:
        store.close()


def test_each_batch_is_produced_then_snapshotted_then_committed(tmp_path):
    journal, snapshot, error = run_fake(
        tmp_path, [records(0, 0, [b"a", b"b"]), records(0, 2, [b"c"])]
    )
    assert error is None
    assert journal == [
        "assigned",
        "seek {0: 0}",
        "produce a",
        "produce b",
        "flush",
        "snapshot 1",
        "commit 2",
        "produce c",
        "flush",
        "snapshot 2",
        "commit 3",
        "closed",
        "producer closed",
    ]
    assert snapshot == ([b"a", b"b", b"c"], 2)


def test_a_turn_with_outputs_commits_and_a_quiet_one_only_remembers(tmp_path):
    """A crash re-sends only the batch that crashed, so a turn that produced outputs
    commits at once; a quiet one (no outputs) waits for the next commit, here the
    one on the way out, after the last snapshot and before the group is left."""
    journal, snapshot, error = run_fake(
        tmp_path,
        [records(0, 0, [b"a"]), records(0, 1, [b"silent", b"silent"]), records(0, 3, [b"b"])]
        + [records(0, 4, [b"silent"])],
        commit_interval_s=3600.0,
    )
    assert error is None
    assert [j for j in journal if j.startswith("commit")] == ["commit 1", "commit 4", "commit 5"]
    assert journal[-4:] == ["snapshot 4", "commit 5", "closed", "producer closed"]
    assert snapshot == ([b"a", b"silent", b"silent", b"b", b"silent"], 4)


def test_a_processor_producer_does_not_linger(tmp_path):
    """Its flush ends every batch, and librdkafka's flush does not cut a short
    linger short (framespool.log.kafka.settings.LINGER_MS_PROCESSOR)."""
    import threading

    from framespool.log.kafka import LINGER_MS_PROCESSOR
    from framespool.processors.app import ProcessorRunner
    from framespool.schemas.topics import Topic

    asked: list[dict] = []
    journal, stop = Journal(), threading.Event()
    store = JournalStore(tmp_path / "j", journal)
    log = MemoryLog([Topic(TOPIC, 1, "x"), Topic("out", 1, "x"), Topic("dlq", 1, "x")])
    consumer = JournalConsumer(log, journal, [], stop, "g")

    def producer(*args, **kwargs):
        asked.append(kwargs)
        return JournalProducer(log, journal)

    runner = ProcessorRunner(
        StatefulProcessor(ListFold(), store, TOPIC),
        "fake:9092",
        "g",
        input_topic=Topic(TOPIC, 1, "x"),
        consumer_factory=lambda *args, **kwargs: consumer,
        producer_factory=producer,
    )
    runner.run(stop)
    store.close()
    assert LINGER_MS_PROCESSOR == 0 and asked[0]["linger.ms"] == 0


def test_remembered_positions_are_committed_before_a_partition_is_revoked(tmp_path):
    """A partition that moves hands its delivered positions to the next owner."""
    import threading

    from framespool.processors.app import ProcessorRunner
    from framespool.schemas.topics import Topic

    journal, stop = Journal(), threading.Event()
    store = JournalStore(tmp_path / "j", journal)
    log = MemoryLog([Topic(TOPIC, 1, "x"), Topic("out", 1, "x"), Topic("dlq", 1, "x")])
    consumer = JournalConsumer(log, journal, [records(0, 0, [b"silent", b"silent"])], stop, "g")
    producer = JournalProducer(log, journal)
    runner = ProcessorRunner(
        StatefulProcessor(ListFold(), store, TOPIC),
        "fake:9092",
        "g",
        input_topic=Topic(TOPIC, 1, "x"),
        commit_interval_s=3600.0,
        consumer_factory=lambda *args, **kwargs: consumer,
        producer_factory=lambda *args, **kwargs: producer,
    )
    runner._consumer = consumer
    consumer.subscribe([TOPIC], on_assign=runner._on_assign, on_revoke=runner._on_revoke)
    runner.turn(consumer, producer)
    assert not [j for j in journal if j.startswith("commit")]
    consumer.close()  # leaving the group revokes the partition
    assert [j for j in journal if j.startswith("commit")] == ["commit 2"]
    assert journal.index("commit 2") < journal.index("closed")
    store.close()


def test_a_failed_delivery_is_fatal_and_never_snapshotted_or_committed(tmp_path):
    from framespool.processors.app import ProcessorFailed

    journal, snapshot, error = run_fake(tmp_path, [records(0, 0, [b"a"])], fail_flush=True)
    assert isinstance(error, ProcessorFailed) and "broker gone" in str(error)
    assert not [j for j in journal if j.startswith(("snapshot", "commit"))], journal
    assert snapshot is None  # leaving the group (revoke) did not save the undelivered state


def test_inputs_below_the_committed_offset_are_not_re_sent(tmp_path):
    journal, snapshot, _ = run_fake(tmp_path, [records(0, 0, [b"a", b"b", b"c"])], committed={0: 2})
    assert [j for j in journal if j.startswith("produce ")] == ["produce c"]
    assert snapshot == ([b"a", b"b", b"c"], 2)


def _ticking(step: float):
    """A timer that moves ``step`` seconds per reading: every measured span costs ``step``."""
    t = [0.0]

    def read() -> float:
        t[0] += step
        return t[0]

    return read


def test_a_snapshot_budget_spaces_snapshots_by_their_cost(store):
    """Budget 0.1 and a snapshot that costs 0.2 s (pickle + write, each 0.1 s on the
    ticking timer): the next one waits 2 s although the interval says every batch."""
    now = [100.0]
    proc = StatefulProcessor(
        ListFold(),
        store,
        TOPIC,
        snapshot_interval_s=0.0,
        clock=lambda: now[0],
        snapshot_budget=0.1,
        timer=_ticking(0.1),
    )
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    assert proc.snapshot() == 1
    proc.fold(records(0, 1, [b"b"]))
    now[0] += 1.9
    assert proc.snapshot() == 0 and store.load(0) == ([b"a"], 0)
    now[0] += 0.1
    assert proc.snapshot() == 1 and store.load(0) == ([b"a", b"b"], 1)
    proc.fold(records(0, 2, [b"c"]))
    assert proc.snapshot(force=True) == 1  # revoke and shutdown are never held back


def test_without_a_budget_the_interval_alone_decides(store):
    now = [100.0]
    proc = StatefulProcessor(ListFold(), store, TOPIC, clock=lambda: now[0], timer=_ticking(10.0))
    proc.assign(0)
    for offset, value in enumerate([b"a", b"b", b"c"]):
        proc.fold(records(0, offset, [value]))
        assert proc.snapshot() == 1


def test_a_snapshot_budget_outside_0_to_1_is_refused(store):
    with pytest.raises(ValueError, match="snapshot_budget"):
        StatefulProcessor(ListFold(), store, TOPIC, snapshot_budget=1.0)


def test_a_turn_that_writes_and_publishes_pickles_the_state_once(store, monkeypatch):
    from framespool.processors import snapshots as module
    from framespool.processors.shared_snapshots import MemorySharedSnapshots

    pickles = []
    real = module.pickle_state
    monkeypatch.setattr(module, "pickle_state", lambda state: pickles.append(1) or real(state))
    shared = MemorySharedSnapshots()
    proc = StatefulProcessor(ListFold(), store, TOPIC, shared=shared, instance="a")
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    assert proc.snapshot() == 1
    assert len(pickles) == 1 and proc.published == 1
    meta, payload = shared.load(TOPIC, 0)
    assert meta.offset == 0 and pickle.loads(payload) == [b"a"]
