"""Processor state on disk, and the order in which a batch becomes durable.

Theory of operation
-------------------
A stateful processor (admission, scheduler) owns some partitions of its input
topic, through a consumer group. Per partition it keeps a fold state (an
``AdmissionState`` or a ``Cell``) and the offset of the last input folded into
it. :class:`SnapshotStore` keeps, per partition, the pickled state and that
offset under two keys written in ONE rocksdict ``WriteBatch``, so after a crash
they always agree. :class:`StatefulProcessor` applies the protocol; the shell
(``framespool.processors.app``) does the IO. For each batch of polled records:

1. **fold** them (:meth:`StatefulProcessor.fold`): input at or below the
   partition's offset is a no-op; each record is decoded and folded, and its
   outputs (or its dead letter) collected;
2. **produce** every output and wait until the broker has acknowledged all of
   them;
3. **snapshot** the state and offset of each partition the batch advanced, in
   one ``WriteBatch`` (:meth:`StatefulProcessor.snapshot`; with
   ``snapshot_interval_s`` > 0, at most that often per partition, and always
   on revoke and shutdown);
4. **commit** the consumer offsets (next offset = last folded + 1).

On assignment (:meth:`StatefulProcessor.assign`) a partition's state is loaded
from the snapshot and reading starts at its offset + 1, or at 0 without one:
never at a position derived from ListOffsets (wrong on Tansu). Inputs below
the group's committed offset had their outputs delivered before that commit
(2 precedes 4), so they are folded *quietly*: the state is rebuilt, nothing is
re-sent. That makes a partition that moves to an instance with an older (or
no) snapshot resume without replaying its history onto the output topics, and
it makes snapshot loss or throttling cost only replay time.

At-least-once: a crash between 2 and 4 re-emits that batch's outputs on
restart, with the same deterministic event ids (``<position>/<i>``);
consumers dedupe by event id. Nothing is lost: an input's outputs are always
delivered before any commit or snapshot that covers it, and a batch that
fails in 2 or 3 never reaches a snapshot (:meth:`StatefulProcessor.abandon`).
Quiet replay rebuilds exactly what was decided only if the fold code and its
configuration are unchanged since; after a policy change, a partition replayed
from an older snapshot (or from 0) rebuilds its history under the new policy.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rocksdict import Options, Rdict, WriteBatch

from framespool.log import Record
from framespool.processors.routing import Outgoing

log = logging.getLogger(__name__)


class SnapshotStore:
    """Pickled state + input offset per partition of one input topic (``namespace``).

    One store directory per process; ``namespace`` (the input topic's name)
    keeps a data dir pointed at another topic from loading foreign state.
    """

    def __init__(self, path: str | Path, namespace: str) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self._db = Rdict(str(self.path), options=Options(raw_mode=True))
        self._closed = False

    def _keys(self, partition: int) -> tuple[bytes, bytes]:
        base = f"{self.namespace}\x00{partition}".encode()
        return b"s/" + base, b"o/" + base

    def load(self, partition: int) -> tuple[Any, int] | None:
        """``(state, offset)`` of the last snapshot of ``partition``, or None.

        A snapshot that cannot be unpickled (the code changed under it) is
        reported and ignored: replaying the log from 0 rebuilds the state.
        """
        state_key, offset_key = self._keys(partition)
        raw_offset = self._db.get(offset_key)
        raw_state = self._db.get(state_key)
        if raw_offset is None or raw_state is None:
            return None
        try:
            state = pickle.loads(raw_state)
        except Exception as exc:  # any unpickling failure means "no usable snapshot"
            log.warning(
                "snapshot of %s[%d] at offset %s is unreadable (%r); rebuilding it from offset 0",
                self.namespace,
                partition,
                int(raw_offset),
                exc,
                extra={"partition": partition},
            )
            return None
        return state, int(raw_offset)

    def save(self, snapshots: Mapping[int, tuple[Any, int]]) -> None:
        """Write ``{partition: (state, offset)}`` atomically, in one ``WriteBatch``."""
        if not snapshots:
            return
        wb = WriteBatch(raw_mode=True)
        for partition, (state, offset) in snapshots.items():
            state_key, offset_key = self._keys(partition)
            wb.put(state_key, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
            wb.put(offset_key, str(offset).encode())
        self._db.write(wb)

    def close(self) -> None:
        """Release the directory (another process may open it then). Idempotent."""
        if not self._closed:
            self._closed = True
            self._db.close()


# --------------------------------------------------------------------------
# The protocol
# --------------------------------------------------------------------------
class Fold(Protocol):
    """What a processor does with one partition's records (decode, core, route, encode)."""

    name: str

    def new_state(self, partition: int) -> Any: ...

    def adopt(self, state: Any, partition: int) -> Any:
        """A state loaded from a snapshot, made current (e.g. the configured policy)."""
        ...

    def step(self, state: Any, record: Record) -> list[Outgoing]:
        """Fold one record into ``state`` (mutated); bad input becomes a dead letter."""
        ...

    def dead_letter(self, record: Record, reason: str, detail: str) -> Outgoing: ...


@dataclass
class _Partition:
    state: Any
    offset: int  # last input offset folded into ``state``; -1 = none
    quiet_below: int  # inputs below this were delivered before: fold, don't emit
    snapshot_offset: int  # offset of the last snapshot written or loaded; -1 = none
    snapshot_at: float


@dataclass
class Batch:
    """What :meth:`StatefulProcessor.fold` derived from one poll."""

    outgoing: list[Outgoing] = field(default_factory=list)
    advanced: dict[int, int] = field(default_factory=dict)  # partition -> last offset folded
    skipped: int = 0  # at or below the partition's offset, or not assigned
    quiet: int = 0  # outputs not re-sent: their input was committed before
    dead_letters: int = 0


class StatefulProcessor:
    """Per-partition fold states of one input topic, and steps 1 and 3 of the protocol."""

    def __init__(
        self,
        fold: Fold,
        store: SnapshotStore,
        topic: str,
        *,
        snapshot_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fold_ = fold
        self.store = store
        self.topic = topic
        self.snapshot_interval_s = snapshot_interval_s
        self._clock = clock
        self._parts: dict[int, _Partition] = {}

    @property
    def partitions(self) -> list[int]:
        return sorted(self._parts)

    def state(self, partition: int) -> Any:
        return self._parts[partition].state

    def offset(self, partition: int) -> int:
        return self._parts[partition].offset

    # -- assignment -----------------------------------------------------------
    def assign(self, partition: int, committed: int | None = None) -> int:
        """Load ``partition``'s snapshot; return the offset to start reading at.

        ``committed`` is the group's committed next offset (None if none):
        inputs below it are folded quietly (see the module docstring).
        """
        loaded = self.store.load(partition)
        if loaded is None:
            state, offset = self.fold_.new_state(partition), -1
        else:
            state, offset = self.fold_.adopt(loaded[0], partition), loaded[1]
        self._parts[partition] = _Partition(state, offset, committed or 0, offset, self._clock())
        start = offset + 1
        log.info(
            "%s: partition %d from offset %d (snapshot %s, committed %s)",
            self.fold_.name,
            partition,
            start,
            "none" if loaded is None else offset,
            committed,
            extra={"partition": partition, "offset": start},
        )
        return start

    def revoke(self, partition: int) -> None:
        """Snapshot ``partition`` if it moved since the last snapshot, then drop it."""
        if partition in self._parts:
            self._write(self._due([partition], force=True))
            del self._parts[partition]

    def abandon(self) -> None:
        """Forget every partition without snapshotting it: after a failed batch the
        states may reflect inputs whose outputs were never delivered."""
        if self._parts:
            log.warning(
                "%s: abandoning partitions %s unsaved; they resume from their last snapshot",
                self.fold_.name,
                self.partitions,
            )
        self._parts.clear()

    # -- step 1 ---------------------------------------------------------------
    def fold(self, records: Iterable[Record]) -> Batch:
        """Fold records in order; return what to produce and how far each partition got."""
        batch = Batch()
        for record in records:
            part = self._parts.get(record.partition)
            if part is None or record.topic != self.topic or record.offset <= part.offset:
                batch.skipped += 1
                continue
            try:
                outgoing = self.fold_.step(part.state, record)
            except Exception as exc:  # a bug in the fold: keep going, visibly
                log.exception(
                    "%s: folding %s[%d]@%d failed; dead-lettering it",
                    self.fold_.name,
                    record.topic,
                    record.partition,
                    record.offset,
                    extra={"partition": record.partition, "offset": record.offset},
                )
                outgoing = [self.fold_.dead_letter(record, "processing_error", repr(exc))]
            part.offset = record.offset
            batch.advanced[record.partition] = record.offset
            if record.offset < part.quiet_below:
                batch.quiet += len(outgoing)
                continue
            batch.dead_letters += sum(1 for o in outgoing if o.event is None)
            batch.outgoing.extend(outgoing)
        return batch

    def commit_positions(self, batch: Batch) -> dict[tuple[str, int], int]:
        """Step 4's offsets: the next offset to read of each partition the batch advanced."""
        return {(self.topic, p): offset + 1 for p, offset in batch.advanced.items()}

    # -- step 3 ---------------------------------------------------------------
    def snapshot(self, force: bool = False) -> int:
        """Write the snapshots that are due (all that moved, if ``force``); return how many."""
        due = self._due(self.partitions, force)
        self._write(due)
        return len(due)

    def _due(self, partitions: Iterable[int], force: bool) -> list[int]:
        now = self._clock()
        return [
            p
            for p in partitions
            if self._parts[p].offset > self._parts[p].snapshot_offset
            and (force or now - self._parts[p].snapshot_at >= self.snapshot_interval_s)
        ]

    def _write(self, partitions: list[int]) -> None:
        if not partitions:
            return
        self.store.save({p: (self._parts[p].state, self._parts[p].offset) for p in partitions})
        now = self._clock()
        for p in partitions:
            self._parts[p].snapshot_offset = self._parts[p].offset
            self._parts[p].snapshot_at = now
