"""Snapshots pickled by a forked child (``StatefulProcessor(background=True)``).

The child pickles the states as they were at the fork while the fold goes on;
a later turn writes them with the offsets they had then. Each test forks real
children on a rocksdict store in a temp dir (no broker)."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import pytest

from framespool.processors.shared_snapshots import MemorySharedSnapshots
from framespool.processors.snapshots import (
    SnapshotStore,
    StatefulProcessor,
    background_snapshots_supported,
)
from tests.support.snapshots import TOPIC, ListFold, records

pytestmark = pytest.mark.skipif(
    not background_snapshots_supported(), reason="background snapshots fork: Linux only"
)


@pytest.fixture
def store(tmp_path: Path):
    s = SnapshotStore(tmp_path / "store", TOPIC)
    yield s
    s.close()


def settle(proc: StatefulProcessor, timeout_s: float = 20.0) -> int:
    """Collect until the running child (if any) has been reaped; what it wrote."""
    deadline = time.monotonic() + timeout_s
    written = 0
    while proc._pending is not None:
        assert time.monotonic() < deadline, "the snapshot child never finished"
        written += proc.collect()
        time.sleep(0.005)
    return written


def leftovers(store: SnapshotStore) -> list[Path]:
    return sorted(store.path.parent.glob(f".{store.path.name}.pickling.*"))


class Slow:
    """Pickles as ``b"slow"`` after burning ``BURN_S`` of CPU (in the child)."""

    BURN_S = 0.15

    def __reduce__(self):
        end = time.process_time() + self.BURN_S
        while time.process_time() < end:
            pass
        return (bytes, (b"slow",))


def test_the_child_writes_the_state_as_it_was_at_the_fork(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC, background=True)
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    assert proc.snapshot() == 0  # forked: nothing written in this turn
    proc.fold(records(0, 1, [b"b"]))  # the fold goes on while the child pickles
    assert settle(proc) == 1
    assert store.load(0) == ([b"a"], 0)
    assert proc.state(0) == [b"a", b"b"] and not leftovers(store)
    assert proc.snapshot() == 0 and settle(proc) == 1  # the next one catches up
    assert store.load(0) == ([b"a", b"b"], 1)


def test_a_forced_snapshot_stops_the_child_and_writes_the_latest_inline(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC, background=True)
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    proc.state(0).append(Slow())  # keeps the child busy
    proc.snapshot()
    pid = proc._pending.pid
    proc.fold(records(0, 1, [b"b"]))
    proc.state(0).pop(-2)  # what the inline pickle sees: a, b
    assert proc.snapshot(force=True) == 1
    assert store.load(0) == ([b"a", b"b"], 1)
    assert proc._pending is None and not leftovers(store)
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie left
        os.waitpid(pid, 0)


def test_a_partition_revoked_while_its_child_runs_keeps_the_revoke_snapshot(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC, background=True)
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    proc.state(0).append(Slow())
    proc.snapshot()
    proc.state(0).pop()
    proc.fold(records(0, 1, [b"b"]))
    proc.revoke(0)  # inline, at offset 1
    assert store.load(0) == ([b"a", b"b"], 1)
    assert settle(proc) == 0  # the child's older state is not written over it
    assert store.load(0) == ([b"a", b"b"], 1) and not leftovers(store)


def test_a_child_that_fails_writes_nothing_and_the_processor_goes_on(store, caplog):
    now = [100.0]
    proc = StatefulProcessor(ListFold(), store, TOPIC, background=True, clock=lambda: now[0])
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    proc.state(0).append(lambda: 0)  # unpicklable
    proc.snapshot()
    assert settle(proc) == 0
    assert proc.background_failures == 1 and store.load(0) is None and not leftovers(store)
    assert "exited with 1" in caplog.text
    proc.state(0).pop()
    proc.fold(records(0, 1, [b"b"]))
    proc.snapshot()
    assert settle(proc) == 1 and store.load(0) == ([b"a", b"b"], 1)


def test_the_budget_counts_the_childs_cpu(store):
    """Budget 0.1 and a child that burns 0.15 s of CPU: the next fork waits >= 1.5 s
    of the processor's clock. The turn's own cost reads 0 here (a frozen timer), so
    the child's CPU (its rusage, which a loaded machine does not inflate) alone
    spaces them; were it not counted, the next one would be due at once."""
    now = [100.0]
    proc = StatefulProcessor(
        ListFold(),
        store,
        TOPIC,
        background=True,
        clock=lambda: now[0],
        snapshot_budget=0.1,
        timer=lambda: 0.0,
    )
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    proc.state(0).append(Slow())
    proc.snapshot()
    assert settle(proc) == 1
    proc.fold(records(0, 1, [b"b"]))
    now[0] += 1.0
    proc.snapshot()
    assert proc._pending is None  # not due yet
    now[0] += 1.5  # 2.5 s: the child's 0.15 s plus up to 0.1 s of its own pickling
    proc.snapshot()
    assert proc._pending is not None
    assert settle(proc) == 1 and store.load(0)[1] == 1


def test_a_background_snapshot_is_published_at_its_fork_offset(store):
    shared = MemorySharedSnapshots()
    proc = StatefulProcessor(ListFold(), store, TOPIC, shared=shared, background=True)
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    proc.snapshot()
    proc.fold(records(0, 1, [b"b"]))
    settle(proc)
    meta, payload = shared.load(TOPIC, 0)
    assert meta.offset == 0 and pickle.loads(payload) == [b"a"] and proc.published == 1


def test_files_left_by_a_killed_processor_are_removed_at_start(store):
    stale = store.path.parent / f".{store.path.name}.pickling.12345.0"
    stale.write_bytes(b"half a pickle")
    StatefulProcessor(ListFold(), store, TOPIC, background=True)
    assert not stale.exists()


def test_abandon_stops_the_child(store):
    proc = StatefulProcessor(ListFold(), store, TOPIC, background=True)
    proc.assign(0)
    proc.fold(records(0, 0, [b"a"]))
    proc.state(0).append(Slow())
    proc.snapshot()
    proc.abandon()
    assert proc._pending is None and store.load(0) is None and not leftovers(store)
