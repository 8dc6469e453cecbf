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

Takeover and fencing (with a shared store, ``framespool.processors.shared_snapshots``)
---------------------------------------------------------------------------------
The local store lives on one instance; a partition that moves would be re-folded
from offset 0. With ``shared`` set, step 3 also **publishes** the snapshot to a
store every instance reads (at most every ``publish_interval_s`` per partition,
always on revoke and shutdown), and :meth:`StatefulProcessor.assign`:

a. **claims** the partition: the shared store bumps its owner epoch (a
   compare-and-swap, so two instances never hold the same epoch);
b. loads the newer of the shared and the local snapshot (higher offset) and
   reads only the suffix after it.

A zombie (paused past its session timeout while another instance took over) is
fenced three ways, each enough for correctness on its own terms:

1. before folding a batch (step 0, :meth:`StatefulProcessor.verify`), an instance
   whose last ownership check is older than ``verify_after_s`` (half the session
   timeout: no one can take over sooner) re-reads the owner epoch and drops every
   partition someone else has claimed: it neither produces, snapshots nor commits;
2. the shared store refuses a publish from a lower epoch (:class:`StaleEpoch`);
   the instance then drops the partition and does not commit its offsets;
3. every output carries the owner epoch and its input position in record headers
   (``framespool.schemas.fencing``); output ids are already derived from the
   input position, so a zombie that slips past 1 (paused between the check and
   the produce) can only repeat ids the new owner also writes, and readers keep
   the record with the highest epoch per input position (``EpochFence``).
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rocksdict import Options, Rdict, WriteBatch

from framespool.log import Record
from framespool.private_files import private_dir
from framespool.processors.routing import Outgoing
from framespool.processors.shared_snapshots.port import (
    SharedSnapshots,
    SharedStoreError,
    SnapshotMeta,
    StaleEpoch,
)
from framespool.schemas.deadletter import DeadLetterReason
from framespool.schemas.fencing import fencing_headers

log = logging.getLogger(__name__)


def pickle_state(state: Any) -> bytes:
    """A state's snapshot payload (the local store's and the shared one's)."""
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


class SnapshotStore:
    """Pickled state + input offset per partition of one input topic (``namespace``).

    One store directory per process; ``namespace`` (the input topic's name)
    keeps a data dir pointed at another topic from loading foreign state.
    """

    def __init__(self, path: str | Path, namespace: str) -> None:
        self.path = Path(path)
        private_dir(self.path, existing=False)  # a cell's state holds its jobs' specs
        self.namespace = namespace
        self._db = Rdict(str(self.path), options=Options(raw_mode=True))
        private_dir(self.path)
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

    def offset(self, partition: int) -> int | None:
        """The input offset of ``partition``'s snapshot, without loading its state."""
        raw = self._db.get(self._keys(partition)[1])
        return None if raw is None else int(raw)

    def save(self, snapshots: Mapping[int, tuple[Any, int]]) -> None:
        """Write ``{partition: (state, offset)}`` atomically, in one ``WriteBatch``."""
        self.save_pickled(
            {p: (pickle_state(state), offset) for p, (state, offset) in snapshots.items()}
        )

    def save_pickled(self, snapshots: Mapping[int, tuple[bytes, int]]) -> None:
        """Write ``{partition: (pickled state, offset)}`` atomically, in one ``WriteBatch``."""
        if not snapshots:
            return
        wb = WriteBatch(raw_mode=True)
        for partition, (payload, offset) in snapshots.items():
            state_key, offset_key = self._keys(partition)
            wb.put(state_key, payload)
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
    """What a processor does with one partition's records (decode, core, route, encode).

    A fold may also name ``delivered_last``: the topics (another processor's
    inputs) whose records a turn produces only after its others are acknowledged
    (``framespool.processors.app.delivery_waves``); none by default.
    """

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
    epoch: int = 0  # owner epoch claimed from the shared store; 0 = no shared store
    published_offset: int = -1  # offset of the newest shared snapshot known; -1 = none
    published_at: float = 0.0
    verified_at: float = 0.0  # when the owner epoch was last confirmed
    snapshot_cost: float = 0.0  # seconds the last local snapshot took (pickle + write)
    publish_cost: float = 0.0  # seconds the last shared snapshot took (pickle + upload)


# Background snapshots (``StatefulProcessor(background=True)``): a forked child
# pickles the states into files named after it beside the store, the parent reads them
_PICKLING = ".pickling."


@dataclass
class _Pending:
    """A snapshot a forked child is pickling: the states as they were at the fork."""

    pid: int
    forked_at: float  # the processor's clock
    fork_s: float  # the parent's cost of the fork (timer)
    parts: dict[int, tuple[_Partition, int]]  # partition -> (its record then, its offset then)
    files: dict[int, Path]


def background_snapshots_supported() -> bool:
    """Whether this platform can pickle snapshots in a forked child: Linux only
    (``fork`` is missing on Windows and unsafe beside threads on macOS)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def _pickle_in_child(states: Mapping[int, Any], files: Mapping[int, Path]) -> None:
    """The forked child's whole life: pickle each state into its file, then
    ``_exit`` (status 0, or 1 on any failure) without running the parent's
    exit handlers or flushing its buffers. A signal to the process group ends
    it at once (default dispositions): the parent then finds no snapshot."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        gc.disable()  # a collection would touch (and so copy) every page of the heap
        for partition, state in states.items():
            fd = os.open(files[partition], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(pickle_state(state))
        code = 0
    finally:
        os._exit(code)


@dataclass
class Batch:
    """What :meth:`StatefulProcessor.fold` derived from one poll."""

    outgoing: list[Outgoing] = field(default_factory=list)
    advanced: dict[int, int] = field(default_factory=dict)  # partition -> last offset folded
    skipped: int = 0  # at or below the partition's offset, or not assigned
    quiet: int = 0  # outputs not re-sent: their input was committed before
    dead_letters: int = 0


class StatefulProcessor:
    """Per-partition fold states of one input topic, and steps 0, 1 and 3 of the protocol."""

    def __init__(
        self,
        fold: Fold,
        store: SnapshotStore,
        topic: str,
        *,
        snapshot_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedSnapshots | None = None,
        instance: str = "default",
        publish_interval_s: float = 0.0,
        verify_after_s: float = 1.0,
        namespace: str | None = None,
        snapshot_budget: float = 0.0,
        timer: Callable[[], float] = time.perf_counter,
        background: bool = False,
    ) -> None:
        self.fold_ = fold
        self.store = store
        self.topic = topic
        self.snapshot_interval_s = snapshot_interval_s
        self._clock = clock
        self.shared = shared
        self.instance = instance
        self.publish_interval_s = publish_interval_s
        self.verify_after_s = verify_after_s
        if not 0.0 <= snapshot_budget < 1.0:
            raise ValueError(f"snapshot_budget={snapshot_budget} must be in [0, 1)")
        # the share of the fold thread's time snapshots may take (0: no bound): a
        # partition's next snapshot waits its last one's cost / budget at least
        self.snapshot_budget = snapshot_budget
        self._timer = timer  # measures the snapshots' cost (a fake in tests)
        if background and not background_snapshots_supported():
            raise ValueError(f"background snapshots need fork on Linux, not {sys.platform}")
        # pickle due snapshots in a forked child, off the fold thread (``snapshot``)
        self.background = background
        self._pending: _Pending | None = None
        self.background_failures = 0  # children that wrote no snapshot
        if background:
            self._remove_leftovers()
        # the shared snapshots' key; another topic's name to seed a fresh topic from them
        self.namespace = namespace or topic
        self._parts: dict[int, _Partition] = {}
        self.published = 0  # shared snapshots written
        self.fenced: list[tuple[int, int, int]] = []  # (partition, my epoch, owner epoch)
        self.gaps: list[tuple[int, int, int]] = []  # (partition, first missing, first read)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._parts)

    def state(self, partition: int) -> Any:
        return self._parts[partition].state

    def offset(self, partition: int) -> int:
        return self._parts[partition].offset

    def epoch(self, partition: int) -> int:
        return self._parts[partition].epoch

    # -- assignment -----------------------------------------------------------
    def assign(self, partition: int, committed: int | None = None) -> int:
        """Claim and load ``partition``'s newest snapshot; return the offset to start at.

        ``committed`` is the group's committed next offset (None if none):
        inputs below it are folded quietly (see the module docstring). Raises
        :class:`SharedStoreError` if the shared store cannot be reached: without
        an epoch the instance could not be fenced.
        """
        epoch = 0
        found: tuple[SnapshotMeta, bytes] | None = None
        if self.shared is not None:
            epoch = self.shared.claim(self.namespace, partition, self.instance)
            try:
                found = self.shared.load(self.namespace, partition)
            except SharedStoreError as exc:  # a corrupt body: the local snapshot or the log
                log.warning("%s: %s; not using the shared snapshot", self.fold_.name, exc)
        shared_meta = found[0] if found is not None else None
        local_offset = self.store.offset(partition)
        source, loaded = "none", None
        if found is not None and (local_offset is None or found[0].offset > local_offset):
            meta, payload = found
            try:
                loaded = (pickle.loads(payload), meta.offset)
                source = f"shared ({meta.instance}, epoch {meta.epoch})"
            except Exception as exc:  # written by other code: fall back to local / the log
                log.warning("%s: shared snapshot unreadable (%r)", self.fold_.name, exc)
        if loaded is None and local_offset is not None:
            loaded = self.store.load(partition)
            source = "local" if loaded is not None else "none"
        if loaded is None:
            state, offset = self.fold_.new_state(partition), -1
        else:
            state, offset = self.fold_.adopt(loaded[0], partition), loaded[1]
        now = self._clock()
        self._parts[partition] = _Partition(
            state,
            offset,
            committed or 0,
            offset,
            now,
            epoch=epoch,
            published_offset=shared_meta.offset if shared_meta is not None else -1,
            published_at=now,
            verified_at=now,
        )
        start = offset + 1
        log.info(
            "%s: partition %d from offset %d (snapshot %s %s, committed %s, owner epoch %d)",
            self.fold_.name,
            partition,
            start,
            source,
            "-" if loaded is None else offset,
            committed,
            epoch,
            extra={"partition": partition, "offset": start},
        )
        return start

    def revoke(self, partition: int) -> None:
        """Snapshot ``partition`` if it moved since the last snapshot, then drop it."""
        if partition in self._parts:
            self._write(self._due([partition], force=True))
            self._publish([partition], force=True)
            self._parts.pop(partition, None)

    def abandon(self) -> None:
        """Forget every partition without snapshotting it: after a failed batch the
        states may reflect inputs whose outputs were never delivered."""
        if self._parts:
            log.warning(
                "%s: abandoning partitions %s unsaved; they resume from their last snapshot",
                self.fold_.name,
                self.partitions,
            )
        self._drop_pending()
        self._parts.clear()

    def _fence(self, partition: int, owner_epoch: int, by: str, why: str) -> None:
        mine = self._parts.pop(partition).epoch
        self.fenced.append((partition, mine, owner_epoch))
        log.warning(
            "%s: fenced off partition %d (%s): my owner epoch %d, %r claimed epoch %d; "
            "dropping it without producing, snapshotting or committing more",
            self.fold_.name,
            partition,
            why,
            mine,
            by,
            owner_epoch,
            extra={"partition": partition},
        )

    # -- step 0 ---------------------------------------------------------------
    def verify(self, partitions: Iterable[int]) -> list[int]:
        """Drop the partitions another instance has claimed since we last looked
        (checked at most every ``verify_after_s``); return them."""
        if self.shared is None:
            return []
        now = self._clock()
        fenced = []
        for p in sorted(set(partitions)):
            part = self._parts.get(p)
            if part is None or now - part.verified_at < self.verify_after_s:
                continue
            try:
                owner = self.shared.owner(self.namespace, p)
            except SharedStoreError as exc:  # unverified: the headers still fence it
                log.warning("%s: cannot verify ownership of %d: %s", self.fold_.name, p, exc)
                continue
            if owner.epoch != part.epoch:
                self._fence(p, owner.epoch, owner.instance, "ownership check")
                fenced.append(p)
            else:
                part.verified_at = now
        return fenced

    # -- step 1 ---------------------------------------------------------------
    def fold(self, records: Iterable[Record]) -> Batch:
        """Fold records in order; return what to produce and how far each partition got."""
        batch = Batch()
        for record in records:
            part = self._parts.get(record.partition)
            if part is None or record.topic != self.topic or record.offset <= part.offset:
                batch.skipped += 1
                continue
            if record.offset > part.offset + 1:
                self._gap(record.partition, part.offset + 1, record.offset)
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
                outgoing = [
                    self.fold_.dead_letter(record, DeadLetterReason.PROCESSING_ERROR, repr(exc))
                ]
            part.offset = record.offset
            batch.advanced[record.partition] = record.offset
            if record.offset < part.quiet_below:
                batch.quiet += len(outgoing)
                continue
            if part.epoch:
                stamp = fencing_headers(
                    f"{record.topic}[{record.partition}]@{record.offset}", part.epoch
                )
                outgoing = [o.with_headers(stamp) for o in outgoing]
            batch.dead_letters += sum(1 for o in outgoing if o.event is None)
            batch.outgoing.extend(outgoing)
        return batch

    def _gap(self, partition: int, missing: int, found: int) -> None:
        """Inputs between the state's offset and the next record are gone: the log's
        retention deleted them before any snapshot covered them (or the snapshot was
        unreadable). Nothing can bring them back; say so loudly and go on."""
        self.gaps.append((partition, missing, found))
        log.error(
            "%s: partition %d: inputs %d..%d are no longer in the log and no snapshot "
            "covers them; the state goes on from a partial history (raise the topic's "
            "retention or publish shared snapshots more often)",
            self.fold_.name,
            partition,
            missing,
            found - 1,
            extra={"partition": partition, "offset": missing},
        )

    def commit_positions(self, batch: Batch) -> dict[tuple[str, int], int]:
        """Step 4's offsets: the next offset to read of each partition the batch
        advanced and this instance still owns."""
        return {
            (self.topic, p): offset + 1 for p, offset in batch.advanced.items() if p in self._parts
        }

    # -- step 3 ---------------------------------------------------------------
    def snapshot(self, force: bool = False) -> int:
        """Write the local snapshots that are due (all that moved, if ``force``), then
        publish the shared ones that are due; return how many local ones were written.

        Cost, inline (the default): a due partition's state is pickled once
        (O(state size): the whole state, every time) and the bytes serve both
        stores. That cost lands in the turn, before its offsets are committed,
        and delays the next batch's outputs; with a ``snapshot_budget`` b, a
        partition whose last snapshot took c seconds is next due no sooner than
        c / b seconds later, so snapshots take at most about b of the
        processor's time however big the state grows (a crash then re-folds
        more, quietly, from the older snapshot).

        With ``background``, a turn only starts and collects snapshots
        (``collect``): the due partitions' states are pickled by a forked child
        (copy-on-write: the states as they are now, whatever the fold does
        next), one child at a time; a later turn reads its files and writes
        them, each with the offset it had at the fork, and publishes them.
        The turn pays the fork (O(the process's page tables): 2-10 ms at
        300 MB) and, when the child is done, reading and writing the bytes
        (O(bytes): ~15 ms for 5 MB) instead of the pickling (~150 ms for the
        same state); c counts the child's CPU too, so the budget still bounds
        what snapshots cost the machine. A forced snapshot (revoke, shutdown)
        stops a running child and is written inline, as are all snapshots
        where ``fork`` is missing.
        """
        if self.background and not force:
            written = self.collect()
            if self._pending is None:
                due = self._due(self.partitions, False)
                publish = self._publish_due(self.partitions) if self.shared is not None else []
                if due or publish:
                    self._fork(sorted(set(due) | set(publish)))
            return written
        self._drop_pending()
        due = self._due(self.partitions, force)
        pickled = self._write(due)
        self._publish(self.partitions, force, pickled)
        return len(due)

    # -- background snapshots -------------------------------------------------
    def _remove_leftovers(self) -> None:
        """Delete the files of children that outlived a killed parent."""
        pattern = self._pickling_file("*", "*")
        for stale in pattern.parent.glob(pattern.name):
            stale.unlink(missing_ok=True)

    def _pickling_file(self, pid: int | str, partition: int | str) -> Path:
        """Where the child ``pid`` pickles ``partition``: beside the store, so on
        its file system, under a name only this store's children use."""
        store = self.store.path
        return store.parent / f".{store.name}{_PICKLING}{pid}.{partition}"

    def _fork(self, partitions: list[int]) -> None:
        started, forked_at = self._timer(), self._clock()
        states = {p: self._parts[p].state for p in partitions}
        pid = os.fork()
        if pid == 0:  # the child: never returns
            me = os.getpid()
            _pickle_in_child(states, {p: self._pickling_file(me, p) for p in states})
        files = {p: self._pickling_file(pid, p) for p in partitions}
        parts = {p: (self._parts[p], self._parts[p].offset) for p in partitions}
        self._pending = _Pending(pid, forked_at, self._timer() - started, parts, files)

    def _drop_pending(self) -> None:
        """Stop and reap a running child, and forget what it was writing."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            os.kill(pending.pid, signal.SIGKILL)
        except ProcessLookupError:  # already exited (a zombie until reaped)
            pass
        try:
            os.waitpid(pending.pid, 0)
        except ChildProcessError:
            pass
        for path in pending.files.values():
            path.unlink(missing_ok=True)

    def collect(self) -> int:
        """Write (and publish, where due) the snapshots of a child that has
        finished; return how many local ones were written (0 while it runs).

        A partition revoked, fenced or snapshotted by force since the fork is
        skipped: its record is no longer the one forked, or its snapshot is
        already newer. A child that failed costs only replay: logged, counted
        in ``background_failures``, its partitions due again after their spacing.

        Cost: one ``wait4`` (a syscall) while the child runs; then O(bytes)."""
        pending = self._pending
        if pending is None:
            return 0
        try:
            pid, status, usage = os.wait4(pending.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: its outcome is unknown
            pid, status, usage = pending.pid, 1 << 8, None
        if pid == 0:
            return 0
        self._pending = None
        started = self._timer()
        cpu_s = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
        child_s = cpu_s / max(1, len(pending.parts))
        ok = os.waitstatus_to_exitcode(status) == 0
        payloads: dict[int, bytes] = {}
        try:
            for p, (part, offset) in pending.parts.items():
                if ok and self._parts.get(p) is part and part.snapshot_offset < offset:
                    payloads[p] = pending.files[p].read_bytes()
        finally:
            for path in pending.files.values():
                path.unlink(missing_ok=True)
        if not ok:
            self.background_failures += 1
            log.warning(
                "%s: the child pickling snapshots of %s exited with %s; they are due again",
                self.fold_.name,
                sorted(pending.parts),
                os.waitstatus_to_exitcode(status),
            )
        written = list(payloads)
        if written:
            self.store.save_pickled({p: (payloads[p], pending.parts[p][1]) for p in written})
        own_s = pending.fork_s + (self._timer() - started)
        for p, (part, offset) in pending.parts.items():
            if self._parts.get(p) is not part:
                continue
            if p in written:
                part.snapshot_offset = offset
            part.snapshot_at = pending.forked_at
            part.snapshot_cost = child_s + own_s / len(pending.parts)
        for p, payload in payloads.items():
            offset = pending.parts[p][1]
            if self._publish_due([p], offset=offset, now=pending.forked_at):
                self._publish_one(p, payload, offset, pending.forked_at, child_s)
        return len(written)

    def _spacing(self, interval: float, cost: float) -> float:
        budget = self.snapshot_budget
        return max(interval, cost / budget) if budget > 0.0 else interval

    def _due(self, partitions: Iterable[int], force: bool) -> list[int]:
        now = self._clock()
        due = []
        for p in partitions:
            part = self._parts[p]
            if part.offset > part.snapshot_offset and (
                force
                or now - part.snapshot_at
                >= self._spacing(self.snapshot_interval_s, part.snapshot_cost)
            ):
                due.append(p)
        return due

    def _write(self, partitions: list[int]) -> dict[int, tuple[bytes, float]]:
        """Pickle and save ``partitions``; ``{partition: (payload, seconds pickling)}``."""
        if not partitions:
            return {}
        pickled: dict[int, tuple[bytes, float]] = {}
        for p in partitions:
            started = self._timer()
            payload = pickle_state(self._parts[p].state)
            pickled[p] = (payload, self._timer() - started)
        started = self._timer()
        self.store.save_pickled({p: (pickled[p][0], self._parts[p].offset) for p in partitions})
        write_s = (self._timer() - started) / len(partitions)
        now = self._clock()
        for p, (_, pickle_s) in pickled.items():
            part = self._parts[p]
            part.snapshot_offset = part.offset
            part.snapshot_at = now
            part.snapshot_cost = pickle_s + write_s
        return pickled

    def _publish_due(
        self, partitions: Iterable[int], offset: int | None = None, now: float | None = None
    ) -> list[int]:
        """The ``partitions`` whose shared snapshot is due: they moved past their
        last one (to ``offset``, by default where they are) and their spacing
        (``publish_interval_s``, or its cost over the budget) has passed by ``now``."""
        if self.shared is None:
            return []
        now = self._clock() if now is None else now
        due = []
        for p in partitions:
            part = self._parts.get(p)
            if part is None or (part.offset if offset is None else offset) <= part.published_offset:
                continue
            if now - part.published_at >= self._spacing(self.publish_interval_s, part.publish_cost):
                due.append(p)
        return due

    def _publish(
        self,
        partitions: Iterable[int],
        force: bool,
        pickled: Mapping[int, tuple[bytes, float]] | None = None,
    ) -> None:
        """Publish due snapshots to the shared store; a refused one fences its partition.

        Other failures are logged, not raised: the local snapshot is written and the
        log holds every input, so a missing shared snapshot costs replay, never
        correctness.
        """
        if self.shared is None:
            return
        now = self._clock()
        if force:
            due = [
                p
                for p in partitions
                if p in self._parts and self._parts[p].offset > self._parts[p].published_offset
            ]
        else:
            due = self._publish_due(partitions, now=now)
        for p in due:
            part = self._parts[p]
            started = self._timer()
            fresh = (pickled or {}).get(p)
            payload = fresh[0] if fresh is not None else pickle_state(part.state)
            extra_s = (fresh[1] if fresh else 0.0) + self._timer() - started
            self._publish_one(p, payload, part.offset, now, extra_s)

    def _publish_one(self, p: int, payload: bytes, offset: int, now: float, extra_s: float) -> None:
        part, shared = self._parts[p], self.shared
        if shared is None:
            return
        meta = SnapshotMeta(self.namespace, p, offset, part.epoch, self.instance)
        started = self._timer()
        try:
            shared.publish(meta, payload)
        except StaleEpoch as exc:
            self._fence(p, exc.owner, exc.by, f"its snapshot at offset {offset} was refused")
            return
        except SharedStoreError as exc:
            log.warning("%s: shared snapshot of %d not published: %s", self.fold_.name, p, exc)
            return
        part.published_offset = offset
        part.published_at = now
        part.publish_cost = self._timer() - started + extra_s
        self.published += 1


def same_config(loaded: object, configured: object) -> bool:
    """Whether a snapshot's config equals the configured one. A frozen, slotted
    config pickled before a field existed lacks that field (comparing it raises
    AttributeError): it differs."""
    try:
        return loaded == configured
    except AttributeError:
        return False
