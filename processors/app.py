"""The processor runtime: a classic consumer group around a :class:`StatefulProcessor`.

Theory of operation
-------------------
One thread does everything, so a rebalance callback (which librdkafka runs
inside ``poll``) never sees a batch half done. Each turn of :meth:`run`:

0. poll up to ``max_batch`` records (waiting at most ``poll_timeout_s`` for the
   first); with a shared snapshot store, drop the partitions another instance
   has claimed meanwhile (``StatefulProcessor.verify``: a zombie stops here);
1. fold the records (``StatefulProcessor.fold``);
2. produce every output and dead letter, then ``flush``: wait until the broker
   acknowledged all of them (records to a fold's ``delivered_last`` topics, the
   inputs of another processor, in a second wave after the first is
   acknowledged: :func:`delivery_waves`);
3. write the due snapshots (state + offset, one ``WriteBatch``), then publish
   the due shared ones (a refused publish fences that partition);
4. commit the consumer offsets of the partitions still owned, after every
   turn that produced outputs: a crash then re-sends only the batch that
   crashed. A turn that produced none (heartbeats, ticks with nothing to
   say) only remembers its positions; they go with the next commit, at the
   latest after ``commit_interval_s``, before a partition is revoked, and on
   the way out (replaying a quiet input re-sends nothing). A failed commit is
   only logged: it costs replay, never correctness (see
   ``framespool.processors.snapshots``).

Cost per turn: one Fetch's worth of records polled, one produce request (the
flush) and one OffsetCommit when it produced outputs; a quiet turn costs no
broker request of its own.

A failure in 2 or 3 is fatal (:class:`ProcessorFailed`): librdkafka has
already retried delivery for ``delivery.timeout.ms``, and carrying on would
commit inputs whose outputs may be lost. The in-memory states are abandoned
unsaved (they may be ahead of what was delivered), the process exits
non-zero, its partitions move to another instance (or to it, restarted), and
the batch is replayed from the snapshot with the same event ids.

On assignment each partition is claimed (a new owner epoch, with a shared
store), loaded from the newer of its shared and local snapshots and read from its
offset + 1 (0 without one); inputs below the group's committed offset are
folded without re-sending. On revocation a partition's state is snapshotted
and dropped. :meth:`run` returns when ``stop`` is set, after finishing the
batch in hand, snapshotting every partition and leaving the group.

Why not faust: faust-streaming 0.15.3 was tried first. Seeking to the
snapshot offset works (a custom ``Consumer.seek_to_committed``), but its
aiokafka consumer hard-codes ``fetch_max_wait_ms=1500`` (1.5 s per hop on
Tansu, fixable only through a private attribute), and its offset handling
fights the commit order above: ``take_events`` acks a batch in a ``finally``
(also when the handler raised or was cancelled), faust commits acked offsets
on its own timer and at shutdown, and an explicit commit that fails crashes
the worker. A commit could so overtake the delivery of the outputs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from framespool.log import (
    LINGER_MS_PROCESSOR,
    Consumer,
    ConsumerFactory,
    LogConsumer,
    LogError,
    LogProducer,
    Producer,
    ProducerFactory,
    Role,
    TopicPartition,
)
from framespool.processors.routing import Outgoing
from framespool.processors.shared_snapshots.port import SharedStoreError
from framespool.processors.snapshots import StatefulProcessor
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.topics import Topic, Topics, TopicSet

log = logging.getLogger(__name__)

# How long the positions of quiet turns (no outputs) may wait for a commit
# (step 4); a turn with outputs commits at once.
COMMIT_INTERVAL_S = 0.5

# Outputs worth an INFO line each; the rest are DEBUG.
_NOTABLE = (
    ev.JobAdmitted,
    ev.JobRejected,
    ev.JobAssigned,
    ev.JobPreempted,
    ev.JobRequeued,
    ev.JobCancelled,
    ev.JobCompleted,
    ev.JobFailed,
    ev.NodeStateChanged,
    ev.BreakerTripped,
    ev.StopRun,
)


class ProcessorFailed(RuntimeError):
    """Outputs could not be delivered or state not saved; the process must restart."""


class SetupError(RuntimeError):
    """The input topic is missing or has another partition count than the catalogue."""


def topics_with_suffix(suffix: str = "") -> Topics:
    """The catalogue's topics, named ``<name>.<suffix>`` when a suffix is given (as the
    tests' ``fresh_topics`` does); same attribute names and partition counts."""
    if not suffix:
        return catalogue
    return TopicSet.with_suffix(suffix)


def _kafka_consumer(
    bootstrap_servers: str,
    group_id: str | None = None,
    *,
    session_timeout_ms: int = 6000,
    heartbeat_interval_ms: int = 1000,
    **conf: object,
) -> Consumer:
    """``LogConsumer`` as a :class:`ConsumerFactory`: the processors are on the
    request path (its ``role`` is not a librdkafka setting the factory may pass)."""
    return LogConsumer(
        bootstrap_servers,
        group_id,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
        role=Role.REQUEST_PATH,
        **conf,
    )


def _kafka_producer(bootstrap_servers: str, **conf: object) -> Producer:
    """``LogProducer`` as a :class:`ProducerFactory` (the request path's role)."""
    return LogProducer(bootstrap_servers, role=Role.REQUEST_PATH, **conf)


@dataclass
class Counters:
    batches: int = 0
    records: int = 0
    produced: int = 0
    quiet: int = 0
    skipped: int = 0
    dead_letters: int = 0
    snapshots: int = 0
    commit_failures: int = 0
    fenced: int = 0
    gaps: int = 0


class ProcessorRunner:
    """Runs one processor instance in the calling thread until ``stop`` is set."""

    def __init__(
        self,
        processor: StatefulProcessor,
        bootstrap: str,
        group_id: str,
        *,
        input_topic: Topic,
        instance: str = "",
        session_timeout_ms: int = 6000,
        heartbeat_interval_ms: int = 1000,
        max_batch: int = 500,
        poll_timeout_s: float = 0.1,
        flush_timeout_s: float = 60.0,
        commit_interval_s: float = COMMIT_INTERVAL_S,
        consumer_factory: ConsumerFactory | None = None,
        producer_factory: ProducerFactory | None = None,
    ) -> None:
        self.processor = processor
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.input_topic = input_topic
        self.instance = instance or "default"
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_batch = max_batch
        self.poll_timeout_s = poll_timeout_s
        self.flush_timeout_s = flush_timeout_s
        self.commit_interval_s = commit_interval_s
        self._uncommitted: dict[tuple[str, int], int] = {}
        self._committed_at = time.monotonic()
        self._new_consumer: ConsumerFactory = consumer_factory or _kafka_consumer  # fakes in tests
        self._new_producer: ProducerFactory = producer_factory or _kafka_producer
        self.counters = Counters()
        # topics whose records a turn produces only once the rest are acknowledged
        self._last_topics: frozenset[str] = frozenset(
            getattr(processor.fold_, "delivered_last", ())
        )
        self.assigned = threading.Event()  # set after the first assignment (tests, readiness)
        self._consumer: Consumer | None = None

    # -- rebalance callbacks (run inside poll, in this thread) -------------------
    def _on_assign(self, parts: list[TopicPartition]) -> None:
        consumer = self._consumer
        assert consumer is not None  # called inside the poll of the consumer run() made
        numbers = sorted(p.partition for p in parts if p.topic == self.input_topic.name)
        try:
            committed = consumer.committed(self.input_topic.name, numbers) if numbers else {}
        except LogError as exc:  # without it every input is re-sent: duplicates, never loss
            log.warning("cannot read committed offsets (%s); replayed outputs will be re-sent", exc)
            committed = {}
        try:
            starts = {p: self.processor.assign(p, committed.get(p)) for p in numbers}
        except SharedStoreError as exc:  # no owner epoch, no fencing: do not process
            raise ProcessorFailed(f"cannot claim partitions {numbers}: {exc}") from exc
        consumer.assign(self.input_topic.name, numbers, starts)
        # machine-readable (the chaos drill times takeovers from these lines)
        log.info(
            "assigned %s partitions %s",
            self.input_topic.name,
            numbers,
            extra={"rebalance": "assigned", "partitions": numbers},
        )
        self.assigned.set()

    def _on_revoke(self, parts: list[TopicPartition]) -> None:
        numbers = sorted(p.partition for p in parts if p.topic == self.input_topic.name)
        # the outputs behind these positions are delivered: hand them to the next owner
        self._commit(only=set(numbers))
        for p in numbers:
            self.processor.revoke(p)
        log.info(
            "revoked %s partitions %s",
            self.input_topic.name,
            numbers,
            extra={"rebalance": "revoked", "partitions": numbers},
        )

    # -- the loop ----------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Process until ``stop`` is set; raises :class:`ProcessorFailed` on a fatal error."""
        client_id = f"{self.group_id}-{self.instance}"
        consumer = self._consumer = self._new_consumer(
            self.bootstrap,
            self.group_id,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            # round-robin, not the default range assignor: cells are the low partitions
            # of the scheduler topic, and range gives every cell to the first instance
            **{"client.id": client_id, "partition.assignment.strategy": "roundrobin"},
        )
        # its flush ends every batch: a linger would only delay it (LINGER_MS_PROCESSOR)
        producer = self._new_producer(
            self.bootstrap, **{"client.id": client_id, "linger.ms": LINGER_MS_PROCESSOR}
        )
        clean = False
        try:
            try:
                found = consumer.partitions_of(self.input_topic.name)
            except LogError as exc:
                raise SetupError(str(exc)) from None
            if found != self.input_topic.partitions:
                raise SetupError(
                    f"topic {self.input_topic.name!r} has {found} partitions, the "
                    f"catalogue says {self.input_topic.partitions}"
                )
            consumer.subscribe(
                [self.input_topic.name], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
            while not stop.is_set():
                self.turn(consumer, producer)
            self.counters.snapshots += self.processor.snapshot(force=True)
            self._commit()
            clean = True
        except BaseException:
            # The failed batch's state may be ahead of what was delivered: it must not
            # reach a snapshot (leaving the group below runs the revoke callback).
            self.processor.abandon()
            raise
        finally:
            try:
                consumer.close()  # leaves the group: the partitions move at once
            finally:
                try:
                    producer.close(timeout=self.flush_timeout_s if clean else 1.0)
                except LogError as exc:
                    log.error("producer close: %s", exc)
            self.counters.fenced = len(self.processor.fenced)
            self.counters.gaps = len(self.processor.gaps)
            log.info("stopped (%s): %s", "clean" if clean else "failed", self.counters)

    def turn(self, consumer: Consumer, producer: Producer) -> None:
        """One poll-fold-produce-snapshot-commit cycle."""
        records = consumer.consume(self.max_batch, self.poll_timeout_s)  # 0
        if not records:
            # a snapshot pickled in the background lands without waiting for input
            self.counters.snapshots += self.processor.collect()
            return
        self.processor.verify(r.partition for r in records)
        batch = self.processor.fold(records)  # 1
        c = self.counters
        c.batches += 1
        c.records += len(records)
        c.quiet += batch.quiet
        c.skipped += batch.skipped
        c.dead_letters += batch.dead_letters
        try:
            for wave in delivery_waves(batch.outgoing, self._last_topics):  # 2
                for out in wave:
                    producer.produce(
                        out.topic, out.key, out.value, out.partition, out.headers or None
                    )
                producer.flush(self.flush_timeout_s)
        except LogError as exc:
            raise ProcessorFailed(
                f"outputs of {len(records)} input records were not delivered: {exc}"
            ) from exc
        c.produced += len(batch.outgoing)
        _log_outputs(batch.outgoing)
        try:
            c.snapshots += self.processor.snapshot()  # 3
        except Exception as exc:
            raise ProcessorFailed(
                f"cannot write snapshots to {self.processor.store.path}: {exc!r}"
            ) from exc
        c.fenced, c.gaps = len(self.processor.fenced), len(self.processor.gaps)
        self._uncommitted.update(self.processor.commit_positions(batch))  # 4
        if batch.outgoing or time.monotonic() - self._committed_at >= self.commit_interval_s:
            self._commit()

    def _commit(self, only: set[int] | None = None) -> None:
        """Commit the remembered positions of the partitions this instance still
        owns (of ``only``, if given); a failure is logged and counted."""
        consumer = self._consumer
        owned = set(self.processor.partitions)
        positions = {
            tp: offset
            for tp, offset in self._uncommitted.items()
            if tp[1] in owned and (only is None or tp[1] in only)
        }
        for tp in list(self._uncommitted):
            if only is None or tp[1] in only:
                del self._uncommitted[tp]
        if only is None:
            self._committed_at = time.monotonic()
        if not positions or consumer is None:
            return
        try:
            consumer.commit(positions)
        except LogError as exc:
            self.counters.commit_failures += 1
            log.warning(
                "offset commit failed (the batches will be replayed quietly or re-sent "
                "after a restart): %s",
                exc,
            )


def delivery_waves(outgoing: list[Outgoing], last: frozenset[str]) -> list[list[Outgoing]]:
    """A turn's records in the order of their flushes: the records to a ``last``
    topic (a fold's ``delivered_last``: another processor's input) are produced
    only after the others are acknowledged.

    Causes before effects across processes: admission's ``JobAdmitted`` reaches
    job-events before its copy reaches the cell, so the cell's ``JobQueued`` (or
    anything later) cannot precede it in the job's partition; a cell's
    ``JobRerouted`` reaches job-events before admission can read it and admit the
    job elsewhere. One wave, one flush, when the turn has records on only one side
    (every turn but those). Cost: O(records); a second flush (one broker round
    trip) only for a turn with records on both sides.
    """
    if not last:
        return [outgoing]
    late = [out for out in outgoing if out.topic in last]
    if not late or len(late) == len(outgoing):
        return [outgoing]
    return [[out for out in outgoing if out.topic not in last], late]


def _log_outputs(outgoing: list[Outgoing]) -> None:
    """One line per output event, naming every topic its records went to (a
    ``JobAdmitted`` is one line, not one per destination), one per dead letter.

    Cost: O(records) identity checks, plus one log call per event at an enabled
    level (a JSON line at INFO: the per-job cost that matters, so not per record).
    """
    n, i = len(outgoing), 0
    while i < n:
        out, j = outgoing[i], i + 1
        if out.event is not None:
            # encode_outputs emits an event's records next to each other
            while j < n and outgoing[j].event is out.event:
                j += 1
        _log_output(out, [o.topic for o in outgoing[i:j]] if j - i > 1 else [out.topic])
        i = j


def _log_output(out: Outgoing, topics: list[str]) -> None:
    event = out.event
    if event is None:
        source = dict(out.headers)
        log.warning(
            "dead-lettered %s[%s]@%s: %s",
            source.get("source_topic", b"?").decode(),
            source.get("source_partition", b"?").decode(),
            source.get("source_offset", b"?").decode(),
            out.reason,
            extra={"reason": out.reason, "detail": source.get("detail", b"").decode()},
        )
        return
    level = logging.INFO if isinstance(event, _NOTABLE) else logging.DEBUG
    if not log.isEnabledFor(level):
        return
    inner = getattr(event, "command", event)  # a CellCommand wraps a forwarded CancelJob
    topic = ",".join(topics)
    fields = {"event_type": type(inner).__name__, "event_id": inner.event_id, "topic": topic}
    for name in ("job_id", "run", "node_id", "cell", "reason"):
        value = getattr(inner, name, None)
        if value not in (None, ""):
            fields[name] = value
    if isinstance(inner, (ev.JobAdmitted, ev.StartRun)):
        fields["job_id"] = inner.spec.job_id
    if isinstance(inner, ev.JobAssigned):
        fields["node_id"] = ",".join(s.node_id for s in inner.placement)
    log.log(
        level,
        "%s %s -> %s",
        fields["event_type"],
        fields.get("job_id", ""),
        topic,
        extra=fields,
    )
