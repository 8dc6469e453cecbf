"""The projection shell: read ``job-events`` and ``progress``, fold, store, notify.

Theory of operation
-------------------
Each input topic has its own ``LogConsumer`` with every partition assigned
manually, starting at the stored offset + 1 (0 when none): no group, no
rebalances, the store's offsets are the only position. A poll's records go
through ``prepare`` (no IO but store reads) and ``finish``:

1. skip a record at or below the offset already stored (or already in this
   batch) for its (topic, partition): replays are no-ops;
2. decode it; an undecodable record, or one of a type this projection does
   not take, goes to ``dead-letter`` with a ``reason`` header and the source
   position, and the consumer keeps going;
3. fold job events into job views (``framespool.projections.jobs``) and cluster events
   into the cluster view (``framespool.projections.cluster``); a state change of a job
   with a callback becomes a webhook delivery (``framespool.projections.webhooks``);
4. send the dead letters and wait for the broker's acknowledgement;
5. commit views, cells, outbox and offsets in one store batch;
6. publish every changed view to the SSE hub and wake the webhook dispatcher.

Steps 1-3 and 5 (decoding, folding, store reads and the commit) run on one
thread of the consumer's own (``fold_thread``), not on the event loop the API
shares: an HTTP request never waits for a fold, only (for a store call) for
the one store call in progress. The store must then be safe to share
(``framespool.projections.serialized_store``, which the service wires in).
Steps 4 and 6 run on the loop (the producer's futures, the hub's queues).

The polls run on threads of their own too, one per topic, never on the
event loop's default executor: whatever else in the API process blocks a
thread of that executor (work a tenant's input can make hang, as a DNS
lookup of its callback host did before ``framespool.callbacks.lookups``)
must not stop the fold, and so every tenant's status and progress.

A crash between 4 and 5 re-sends a dead letter (at-least-once, like every
topic); a crash before 5 re-folds the records, which the store makes a no-op.

Lag watch. Every ``LAG_CHECK_S`` each topic's watch compares, per partition,
the high watermark its consumer last saw in a Fetch response with the offset
folded and committed so far: ``behind[topic]`` (the API's
``framespool_projection_behind_records`` gauge) is the sum of the gaps, and a
partition whose gap has not moved for ``STALL_WARN_S`` is logged once as a
warning (naming the offsets), its catching up as info. Records on the log
that the views do not show for seconds are otherwise invisible: no error is
raised anywhere. Cost: one cached watermark read per partition per check, on
the event loop (no store call, no broker request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from framespool.log import Consumer, LogConsumer, Record, Role, Sender
from framespool.projections import cluster as cluster_fold
from framespool.projections import jobs as job_fold
from framespool.projections import storage as storage_fold
from framespool.projections.cluster import ClusterView
from framespool.projections.delivery_lanes import Delivery
from framespool.projections.hub import Hub
from framespool.projections.jobs import COMPLETED, JobView
from framespool.projections.retention import JobFacts, StoredObject
from framespool.projections.storage import StorageLedger
from framespool.projections.store.port import Batch, ViewStore
from framespool.projections.webhooks import delivery_for
from framespool.schemas import codec, deadletter
from framespool.schemas.deadletter import DeadLetterReason
from framespool.schemas.events import ProcessorConfigured
from framespool.schemas.fencing import EpochFence
from framespool.schemas.topics import DEAD_LETTER, JOB_EVENTS, PROGRESS

log = logging.getLogger(__name__)

PROCESSOR = "projections"  # the ``processor`` header of its dead letters
LAG_CHECK_S = 1.0  # lag watch period (theory of operation)
STALL_WARN_S = 10.0  # a partition this long behind without folding anything is logged


@dataclass
class DeadLetter:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def _facts(job_id: str, view: JobView | None) -> JobFacts:
    """What the storage ledger needs of a job's view (nothing yet: unknown)."""
    if view is None:
        return JobFacts(job_id, "", "")
    return JobFacts(
        job_id,
        view.tenant,
        view.tier,
        finished_ms=(view.finished_ms or view.updated_ms) if view.terminal else 0,
        result_uri=view.artifact_uri if view.state == COMPLETED else "",
    )


@dataclass
class Step:
    """What ``prepare`` derived from one poll; ``finish`` makes it durable and visible."""

    batch: Batch = field(default_factory=Batch)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    # the cluster view after the step (prepare() starts it from the consumer's)
    cluster: ClusterView = field(default_factory=ClusterView)
    # reports of stored objects, with what the job's view knew (the storage ledger's)
    stored: list[tuple[JobFacts, StoredObject]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.batch.views
            or self.batch.cells
            or self.batch.breakers
            or self.batch.offsets
            or self.dead_letters
        )


class Stall(NamedTuple):
    """A partition behind the log: the offset it is stuck at, since when, whether logged."""

    folded: int
    since: float
    warned: bool


@dataclass
class Counters:
    records: int = 0
    applied: int = 0
    skipped_replays: int = 0
    dead_lettered: int = 0
    commits: int = 0
    fenced: int = 0  # a zombie processor's records, superseded by a newer owner's


class ProjectionConsumer:
    """Folds the log into the store; ``run()`` until cancelled."""

    def __init__(
        self,
        store: ViewStore,
        *,
        bootstrap_servers: str = "",
        topics: Sequence[str] = (JOB_EVENTS.name, PROGRESS.name),
        dead_letter_topic: str = DEAD_LETTER.name,
        dead_letter_sender: Sender | None = None,
        hub: Hub | None = None,
        on_deliveries: Callable[[list[Delivery]], None] | None = None,  # after the commit
        consumer_factory: Callable[[], Consumer] | None = None,
        max_records: int = 500,
        poll_timeout_s: float = 0.5,
        fold_thread: bool = False,
        storage: StorageLedger | None = None,
    ) -> None:
        self.store = store
        self.storage = storage
        self.topics = tuple(topics)
        self.dead_letter_topic = dead_letter_topic
        self._sender = dead_letter_sender
        self.hub = hub
        self._on_deliveries = on_deliveries
        # a read model, not a hop of submit -> assigned: the background fetch wait
        self._factory = consumer_factory or (
            lambda: LogConsumer(bootstrap_servers, role=Role.BACKGROUND)
        )
        self._max_records = max_records
        self._poll_timeout_s = poll_timeout_s
        self.cluster = store.load_cluster()
        self.counters = Counters()
        self._progress = asyncio.Condition()
        self._lock = asyncio.Lock()  # one fold-and-commit at a time across topics
        self._fence = EpochFence()
        # lag watch (theory of operation): the next offset folded and committed per
        # (topic, partition), records behind per topic, the partitions behind
        self.folded: dict[tuple[str, int], int] = {}
        self.behind: dict[str, int] = {}
        self._stalls: dict[tuple[str, int], Stall] = {}
        # the polls' own threads (theory of operation): one per topic
        self._pollers = ThreadPoolExecutor(
            max_workers=len(self.topics), thread_name_prefix="projection-poll"
        )
        # the lag watch's reads may wait out a poll: never on the loop, never a poller
        self._watcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projection-lag")
        # one thread: folds stay in order, and prepare/commit never race each other
        self._folder = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="projection-fold")
            if fold_thread
            else None
        )

    # -- the pure-ish part ------------------------------------------------------
    def prepare(self, records: Sequence[Record]) -> Step:
        step = Step(cluster=self.cluster)
        views = step.batch.views
        for rec in records:
            self.counters.records += 1
            tp = (rec.topic, rec.partition)
            if rec.offset <= max(self.store.offset(*tp), step.batch.offsets.get(tp, -1)):
                self.counters.skipped_replays += 1
                continue
            step.batch.advance(rec.topic, rec.partition, rec.offset)
            if not self._fence.admit(rec.headers):  # see framespool.schemas.fencing
                self.counters.fenced += 1
                continue
            if rec.value is None:
                self._dead_letter(step, rec, DeadLetterReason.NO_VALUE, "record has no value")
                continue
            try:
                event = codec.decode(rec.value)
            except codec.DecodeError as exc:
                self._dead_letter(step, rec, exc.reason, str(exc))
                continue
            job_id = job_fold.job_id_of(event)
            stored = storage_fold.stored_object(event)
            if stored is not None:
                view = views.get(event.job_id) or self.store.get(event.job_id)
                step.stored.append((_facts(event.job_id, view), stored))
                self.counters.applied += 1
            elif job_id is not None:
                before = views.get(job_id) or self.store.get(job_id)
                after = job_fold.apply(before, event)
                if after is not None and after is not before:
                    views[job_id] = after
                    delivery = delivery_for(before, after, event)
                    if delivery is not None:
                        step.batch.deliveries.append(delivery)
                self.counters.applied += 1
            elif isinstance(event, ProcessorConfigured):
                self.counters.applied += 1  # for the tools (replay, audit), not a view
            elif cluster_fold.is_cluster_event(event):
                new = cluster_fold.apply(step.cluster, event)
                for cell in cluster_fold.changed_cells(step.cluster, new):
                    step.batch.cells[cell] = new.cells[cell]
                for key, breaker in new.breakers.items():
                    if step.cluster.breakers.get(key) is not breaker:
                        step.batch.breakers[key] = breaker
                step.cluster = new
                self.counters.applied += 1
            else:
                self._dead_letter(
                    step,
                    rec,
                    DeadLetterReason.UNEXPECTED_TYPE,
                    f"{type(event).__name__} does not belong on {rec.topic}",
                )
        return step

    def _dead_letter(self, step: Step, rec: Record, reason: str, detail: str) -> None:
        self.counters.dead_lettered += 1
        log.warning(
            "dead-lettering %s[%d]@%d: %s (%s)",
            rec.topic,
            rec.partition,
            rec.offset,
            reason,
            detail,
        )
        headers = deadletter.headers(
            reason, detail, PROCESSOR, rec.topic, rec.partition, rec.offset
        )
        step.dead_letters.append(DeadLetter(rec.key, rec.value, [*rec.headers, *headers]))

    async def finish(self, step: Step) -> None:
        if step.empty:
            return
        if self.storage is not None:
            # before the views and offsets: a crash between the two folds the
            # records again, and the ledger counts an object (by URI) once
            self.storage.record(
                step.stored, (_facts(v.job_id, v) for v in step.batch.views.values())
            )
        for dl in step.dead_letters:
            if self._sender is None:
                raise RuntimeError(
                    "a record must be dead-lettered but no dead-letter sender is set"
                )
            await self._sender.send(self.dead_letter_topic, dl.key, dl.value, headers=dl.headers)
        if self._folder is None:
            self.store.commit(step.batch)
        else:
            await asyncio.get_running_loop().run_in_executor(
                self._folder, self.store.commit, step.batch
            )
        self.counters.commits += 1
        for tp, offset in step.batch.offsets.items():
            self.folded[tp] = max(self.folded.get(tp, 0), offset + 1)
        self.cluster = step.cluster
        if self.hub is not None:
            for job_id, view in step.batch.views.items():
                self.hub.publish(job_id, view)
        if step.batch.deliveries and self._on_deliveries is not None:
            self._on_deliveries(list(step.batch.deliveries))
        async with self._progress:
            self._progress.notify_all()

    async def handle(self, records: Sequence[Record]) -> None:
        async with self._lock:
            if self._folder is None:
                step = self.prepare(records)
            else:
                loop = asyncio.get_running_loop()
                step = await loop.run_in_executor(self._folder, self.prepare, records)
            await self.finish(step)

    def close(self) -> None:
        """Stop the fold thread (after the fold in progress, if any) and the poll threads."""
        if self._folder is not None:
            self._folder.shutdown(wait=True)
        self._pollers.shutdown(wait=False)
        self._watcher.shutdown(wait=False)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds after some commit (tests, readiness checks)."""
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(predicate), timeout)

    def check_lag(self, consumer: Consumer, topic: str, partitions: int, now: float) -> int:
        """One lag-watch check of ``topic`` (theory of operation); returns its records behind."""
        behind = 0
        for p in range(partitions):
            tp = (topic, p)
            high = consumer.high_watermark(topic, p)
            folded = self.folded.get(tp, 0)
            if high is None or high <= folded:
                stall = self._stalls.pop(tp, None)
                if stall is not None and stall.warned:
                    log.info("projection caught up on %s[%d] at offset %d", topic, p, folded)
                continue
            behind += high - folded
            stall = self._stalls.get(tp)
            if stall is None or stall.folded != folded:
                self._stalls[tp] = Stall(folded, now, False)
            elif not stall.warned and now - stall.since >= STALL_WARN_S:
                self._stalls[tp] = stall._replace(warned=True)
                log.warning(
                    "projection has folded nothing of %s[%d] for %.1f s: folded to offset %d, "
                    "the log has records to %d (fold or commit stuck, or the store failing)",
                    topic,
                    p,
                    now - stall.since,
                    folded,
                    high,
                )
        self.behind[topic] = behind
        return behind

    async def _watch_lag(self, consumer: Consumer, topic: str, partitions: int) -> None:
        """The lag watch runs on a thread of its own: librdkafka's cached watermark
        read waits while another thread polls the same consumer (up to the poll's
        timeout, 0.5 s on an idle topic), which on the event loop stalled every
        request of the API that long once a check (measured on Kafka: /healthz
        p50 1.1 ms, max 490 ms, one stall per check)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(LAG_CHECK_S)
            await loop.run_in_executor(
                self._watcher, self.check_lag, consumer, topic, partitions, time.monotonic()
            )

    # -- the IO loop --------------------------------------------------------------
    async def run(self) -> None:
        """Consume every topic until cancelled.

        A topic starts only after the one before it in ``topics`` first caught
        up (a poll came back empty), so a catch-up folds job-events before
        progress: the fold holds at most one report per job read ahead of its
        run's ``JobAssigned`` (``framespool.projections.jobs``, theory of
        operation 3), and a catch-up would read a whole backlog of them ahead.
        Live, the topics interleave, and a report read ahead is held.
        """
        caught_up = [asyncio.Event() for _ in self.topics]
        await asyncio.gather(
            *(
                self._run_topic(topic, caught_up[i], caught_up[i - 1] if i else None)
                for i, topic in enumerate(self.topics)
            )
        )

    async def _run_topic(
        self, topic: str, caught_up: asyncio.Event, after: asyncio.Event | None
    ) -> None:
        if after is not None:
            await after.wait()
        loop = asyncio.get_running_loop()
        consumer = self._factory()
        pending: asyncio.Future | None = None
        watch: asyncio.Task | None = None
        try:
            partitions = await loop.run_in_executor(self._pollers, consumer.partitions_of, topic)
            start = {p: self.store.offset(topic, p) + 1 for p in range(partitions)}
            consumer.assign(topic, list(start), start)
            log.info("projection reading %s from %s", topic, start)
            for p, offset in start.items():
                self.folded[(topic, p)] = max(self.folded.get((topic, p), 0), offset)
            watch = asyncio.create_task(self._watch_lag(consumer, topic, partitions))
            failures = 0
            while True:
                pending = loop.run_in_executor(
                    self._pollers, consumer.consume, self._max_records, self._poll_timeout_s
                )
                try:
                    records = await asyncio.shield(pending)
                    pending = None
                    if records:
                        await self.handle(records)
                    else:
                        caught_up.set()
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except Exception:
                    pending = None
                    failures += 1
                    log.exception(
                        "projection consumer on %s failed (%d in a row); retrying", topic, failures
                    )
                    await asyncio.sleep(min(30.0, 0.5 * 2 ** min(failures, 6)))
                    # what was folded but not committed must be read again
                    start = {p: self.store.offset(topic, p) + 1 for p in range(partitions)}
                    consumer.assign(topic, list(start), start)
        finally:
            if watch is not None:
                watch.cancel()
                # a check in flight on the watcher thread ends before the consumer closes
                # (the thread runs one thing at a time, in order)
                await loop.run_in_executor(self._watcher, lambda: None)
            if pending is not None:  # let the poll thread finish before closing under it
                try:
                    await pending
                except Exception:
                    pass
            consumer.close()
