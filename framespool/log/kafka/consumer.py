"""The Kafka adapter's consumer (``framespool.log.port.Consumer``) and the readers to
the end of a topic (theory of operation 3, 6 and 7 in ``framespool.log.kafka``)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from framespool.log.kafka.settings import (
    ANONYMOUS_GROUP_PREFIX,
    FETCH_WAIT_MS_BY_ROLE,
    IDLE_AFTER_S,
    IDLE_BACKOFF_MS_BY_ROLE,
    IDLE_LOOK_FETCHES,
    SOCKET_SETTINGS,
    Role,
    client_stats,
    security_settings,
)
from framespool.log.port import (
    LogError,
    PartitionsCallback,
    Record,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------
# Consumer
# --------------------------------------------------------------------------
# How often a LogConsumer seeks back to an offset it expected and was skipped
# (theory of operation, 7) before it takes the gap for a real one.
SKIP_REFETCHES = 5

# Errors that are a caller's mistake, not a transient broker condition.
_RAISE_ON = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
}


def _to_record(msg) -> Record:
    ts_type, ts = msg.timestamp()
    return Record(
        topic=msg.topic(),
        partition=msg.partition(),
        offset=msg.offset(),
        key=msg.key(),
        value=msg.value(),
        headers=tuple(msg.headers() or ()),
        timestamp_ms=ts if ts_type else None,  # TIMESTAMP_NOT_AVAILABLE == 0
    )


class LogConsumer:
    """A consumer for the two ways framespool reads the log.

    (a) Manual assignment (agents, replay and tools): :meth:`assign` explicit
        partitions from explicit offsets, or :meth:`resume` them from the group's
        committed positions; no group membership, no rebalances; :meth:`commit`
        stores positions under ``group_id`` if one is given.
    (b) Classic group subscription: :meth:`subscribe`; commit explicitly.

    Auto-commit is off, ``auto.offset.reset`` is ``earliest`` (``latest`` relies on
    ListOffsets(latest), which Tansu gets wrong) and the classic group protocol is
    kept (``group.protocol=consumer`` never assigns on Tansu); both are refused if
    passed in ``conf``. ``fetch.wait.max.ms`` is its ``role``'s
    (:data:`FETCH_WAIT_MS_BY_ROLE`) unless ``conf`` sets it. The consumer is not thread-safe: use it from one thread
    at a time (``await asyncio.to_thread(c.poll, 1.0)`` from async code).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str | None = None,
        *,
        session_timeout_ms: int = 6000,
        heartbeat_interval_ms: int = 1000,
        role: Role = Role.REQUEST_PATH,
        **conf: object,
    ) -> None:
        if str(conf.get("group.protocol", "classic")).lower() != "classic":
            raise ValueError(
                "group.protocol must stay 'classic': the broker never assigns under 'consumer'"
            )
        if str(conf.get("auto.offset.reset", "earliest")).lower() not in (
            "earliest",
            "smallest",
            "beginning",
        ):
            raise ValueError(
                "auto.offset.reset must be 'earliest': 'latest' relies on ListOffsets(latest), wrong on Tansu"
            )
        # librdkafka needs a group id even for manual assignment; an anonymous
        # one is never joined and never committed to.
        self._anonymous = group_id is None
        self.group_id = group_id or f"{ANONYMOUS_GROUP_PREFIX}{uuid.uuid4().hex}"
        # librdkafka's settings: values of several types (confluent_kafka types them Any)
        settings: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_interval_ms,
            # On Tansu every Fetch is held for the full wait even when records
            # arrive, so this is the added latency per hop; on Kafka only an idle
            # consumer's pace (theory of operation, 5).
            "fetch.wait.max.ms": FETCH_WAIT_MS_BY_ROLE[role],
            "error_cb": self._on_error,
            **SOCKET_SETTINGS,
            **security_settings(),
        }
        settings.update(conf)
        self._stats = client_stats(settings)
        self._settings = settings
        self._consumer = Consumer(settings)
        self._closed = False
        # idle back-off (theory of operation, 6); a group member never rests
        self._backoff_s = IDLE_BACKOFF_MS_BY_ROLE[role] / 1000
        self._look_s = IDLE_LOOK_FETCHES * int(settings["fetch.wait.max.ms"]) / 1000
        self._resting: list[TopicPartition] = []  # where to read on when waking
        self._starts: dict[tuple[str, int], int] = {}  # of the manual assignment
        # the offset expected next per partition, and the re-fetches of skipped
        # records (theory of operation, 7)
        self._next: dict[tuple[str, int], int] = {}
        self._refetches: dict[tuple[str, int, int], int] = {}
        self.refetches = 0  # seeks back over a skip (tests, diagnostics)
        self._last_record_at = time.monotonic()
        self._wake_at = self._awake_until = 0.0
        self.rests = 0  # how many times it rested for being idle (tests, diagnostics)

    @staticmethod
    def _on_error(error: KafkaError) -> None:
        (log.error if error.fatal() else log.warning)("consumer: %s", error.str())

    # -- pattern (a): manual assignment -------------------------------------------
    def assign(
        self, topic: str, partitions: Iterable[int], offsets: int | Mapping[int, int] = 0
    ) -> None:
        """Read ``partitions`` of ``topic`` starting at ``offsets`` (one for all, or per partition).

        Replaces any previous assignment.
        """
        parts = list(partitions)
        start = offsets if isinstance(offsets, Mapping) else {p: offsets for p in parts}
        self.assign_from({(topic, p): start[p] for p in parts})

    def assign_from(self, starts: Mapping[tuple[str, int], int]) -> None:
        """Read each ``(topic, partition)`` of ``starts`` from its offset, across topics.

        Replaces any previous assignment.
        """
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
        self._starts = dict(starts)
        self._next = {tp: o for tp, o in starts.items() if o >= 0}
        self._resting, self._last_record_at = [], time.monotonic()  # a new assignment reads

    def committed(
        self, topic: str, partitions: Iterable[int], timeout: float = 10.0
    ) -> dict[int, int | None]:
        """The group's committed next-offset per partition (None where nothing is committed)."""
        result = self._consumer.committed(
            [TopicPartition(topic, p) for p in partitions], timeout=timeout
        )
        out: dict[int, int | None] = {}
        for tp in result:
            if tp.error is not None:
                raise LogError(
                    f"cannot fetch committed offset of {topic}[{tp.partition}]: {tp.error.str()}"
                )
            out[tp.partition] = None if tp.offset == OFFSET_INVALID or tp.offset < 0 else tp.offset
        return out

    def resume(
        self, topic: str, partitions: Iterable[int], timeout: float = 10.0
    ) -> dict[int, int]:
        """Assign ``partitions`` from the group's committed positions (0 where none); return them."""
        if self._anonymous:
            raise LogError("resume() needs a group_id to read committed positions from")
        parts = list(partitions)
        start = {
            p: (off if off is not None else 0)
            for p, off in self.committed(topic, parts, timeout).items()
        }
        self.assign(topic, parts, start)
        return start

    # -- pattern (b): group subscription ------------------------------------------
    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None:
        """Join ``group_id`` and read what the group assigns; callbacks run inside :meth:`poll`."""
        if self._anonymous:
            raise LogError("subscribe() needs a group_id")
        self._backoff_s = 0.0  # a rebalance could hand it partitions to read at once
        kwargs = {}

        def assigned(_consumer, parts) -> None:
            self._next.clear()  # read from where the group (or on_assign) says
            if on_assign is not None:
                on_assign(parts)

        def revoked(_consumer, parts) -> None:
            self._next.clear()
            if on_revoke is not None:
                on_revoke(parts)

        kwargs["on_assign"] = assigned
        kwargs["on_revoke"] = revoked
        self._consumer.subscribe(list(topics), **kwargs)

    # -- reading and committing ---------------------------------------------------
    def _pace(self, timeout: float) -> float:
        """Before a poll: rest or wake per the idle back-off; the poll's timeout
        (a resting consumer's poll ends when it is due to look again).

        Cost: a clock read per poll; per rest an unassign and an assignment at
        known offsets (no offset lookup at the broker).
        """
        if not self._backoff_s:
            return timeout
        now = time.monotonic()
        if self._resting:
            if now < self._wake_at:
                return min(timeout, self._wake_at - now)
            self._consumer.assign(self._resting)
            # what position() falls back on until a record is handed out
            self._starts = {(tp.topic, tp.partition): tp.offset for tp in self._resting}
            self._resting, self._awake_until = [], now + self._look_s
            return min(timeout, self._look_s)
        due = max(self._last_record_at + IDLE_AFTER_S, self._awake_until)  # to rest
        if now >= due and self._rest():
            self.rests += 1
            self._wake_at = now + self._backoff_s
            return min(timeout, self._backoff_s)
        return min(timeout, max(due - now, 0.001))

    def _rest(self) -> bool:
        """Let go of every assigned partition, remembering where to read on (the
        position after the last record handed out, else the assignment's start);
        False if none is assigned."""
        parts = self._consumer.assignment()
        if not parts:
            return False
        at = []
        for tp in self._consumer.position(parts):
            offset = tp.offset if tp.offset >= 0 else self._starts.get((tp.topic, tp.partition))
            if offset is None:  # not assigned by assign(): nowhere known to read on
                return False
            at.append(TopicPartition(tp.topic, tp.partition, offset))
        self._consumer.unassign()
        self._resting = at
        return True

    def poll(self, timeout: float = 1.0) -> Record | None:
        """The next record, or None if none arrived within ``timeout`` seconds."""
        msg = self._consumer.poll(self._pace(timeout))
        if msg is None:
            return None
        self._last_record_at = time.monotonic()
        error = msg.error()
        if error is None:
            return _to_record(msg) if self._in_order(msg, set()) else None
        self._handle_error(error, msg)
        return None

    def _in_order(self, msg, rewound: set[tuple[str, int]]) -> bool:
        """Whether to hand ``msg`` out: it is the next record of its partition, or
        its gap is taken for a real one. False: drop it, its partition is sought
        back to the record expected (theory of operation, 7); the partition's
        later records in this batch (``rewound``) are dropped too.

        Cost: a dict lookup and store per record; a seek per skip re-fetched.
        """
        tp = (msg.topic(), msg.partition())
        offset, expected = msg.offset(), self._next.get(tp)
        if expected is not None and offset > expected:
            if tp in rewound:
                return False
            key = (tp[0], tp[1], expected)
            tries = self._refetches.get(key, 0)
            if tries < SKIP_REFETCHES:
                try:
                    self._consumer.seek(TopicPartition(tp[0], tp[1], expected))
                except KafkaException as exc:
                    log.warning("%s[%d]: cannot seek back to %d: %s", *tp, expected, exc)
                else:
                    self._refetches[key] = tries + 1
                    self.refetches += 1
                    rewound.add(tp)
                    log.warning(
                        "%s[%d]: the broker skipped offsets %d..%d; reading them again",
                        *tp,
                        expected,
                        offset - 1,
                    )
                    return False
            log.error(
                "%s[%d]: offsets %d..%d are not in the log; reading on",
                *tp,
                expected,
                offset - 1,
            )
        if self._refetches and expected is not None:  # no key holds None
            self._refetches.pop((tp[0], tp[1], expected), None)
        rewound.discard(tp)
        self._next[tp] = offset + 1
        return True

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records: waits at most ``timeout`` seconds for the first,
        then takes only what has already arrived (librdkafka's own ``consume`` would
        wait out the timeout until it has ``max_records``)."""
        first = self._consumer.poll(self._pace(timeout))
        if first is None:
            return []
        self._last_record_at = time.monotonic()
        records = []
        more = self._consumer.consume(max_records - 1, 0) if max_records > 1 else []
        rewound: set[tuple[str, int]] = set()
        for msg in (first, *more):
            error = msg.error()
            if error is None:
                if self._in_order(msg, rewound):
                    records.append(_to_record(msg))
            else:
                self._handle_error(error, msg)
        return records

    @staticmethod
    def _handle_error(error: KafkaError, msg) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        where = f"{msg.topic()}[{msg.partition()}]" if msg.topic() else "consumer"
        if error.fatal() or error.code() in _RAISE_ON:
            raise LogError(f"{where}: {error.name()}: {error.str()}")
        log.warning("%s: %s", where, error.str())  # transient; librdkafka retries

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Synchronously commit ``{(topic, partition): next offset to read}`` under ``group_id``."""
        if self._anonymous:
            raise LogError("commit() needs a group_id")
        if not positions:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            raise LogError(
                f"commit of {positions} for group {self.group_id!r} failed: {exc.args[0].str()}"
            ) from exc
        failed = [
            (tp.topic, tp.partition, tp.error.str()) for tp in result or () if tp.error is not None
        ]
        if failed:
            raise LogError(f"commit failed for group {self.group_id!r}: {failed}")

    def commit_through(self, record: Record) -> None:
        """Commit everything up to and including ``record``."""
        self.commit({(record.topic, record.partition): record.offset + 1})

    def high_watermark(self, topic: str, partition: int) -> int | None:
        """The partition's high watermark from the latest Fetch response, or None before one.

        Never an uncached ListOffsets: Tansu's ListOffsets(latest) is wrong.
        """
        _low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), cached=True
        )
        return None if high < 0 else high

    def partitions_of(self, topic: str, timeout: float = 10.0) -> int:
        """How many partitions ``topic`` has; raises if it does not exist.

        A consumer's Metadata request does not auto-create topics (an admin's does).
        """
        metadata = self._consumer.list_topics(topic, timeout=timeout)
        entry = metadata.topics.get(topic)
        if entry is None or entry.error is not None or not entry.partitions:
            reason = (
                entry.error.str()
                if entry is not None and entry.error is not None
                else "no partitions"
            )
            raise LogError(
                f"topic {topic!r} is not readable: {reason}; create it with create_topics()"
            )
        return len(entry.partitions)

    def close(self) -> None:
        """Leave the group (if subscribed) and release the connection. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._stats is not None:
                self._stats.log("consumer", self._settings)
            self._consumer.close()

    def __enter__(self) -> LogConsumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# A reader to the end: partition EOF events say where each partition ends, and a
# short fetch wait keeps each Fetch round (Tansu holds it for the whole wait) brief.
_TO_END: dict[str, object] = {"enable.partition.eof": True, "fetch.wait.max.ms": 10}


def read_all(
    bootstrap_servers: str,
    topic: str,
    partitions: Iterable[int] | None = None,
    timeout_s: float = 30.0,
    **conf: object,
) -> list[Record]:
    """Every record of ``topic`` (or of ``partitions``), from offset 0 to the high watermark.

    Records come partition by partition, in offset order within each; where each
    partition ends is :func:`read_to_end`'s. Raises ``TimeoutError`` naming the
    partitions not read to their end in ``timeout_s``.
    """
    settings: dict[str, Any] = {**_TO_END, **conf}  # librdkafka's, as in LogConsumer
    with LogConsumer(bootstrap_servers, **settings) as consumer:
        parts = sorted(
            partitions if partitions is not None else range(consumer.partitions_of(topic))
        )
        found = _read_to_end(consumer, {(topic, p): 0 for p in parts}, timeout_s)
    return [r for p in parts for r in found[(topic, p)]]


def read_to_end(
    bootstrap_servers: str,
    starts: Mapping[tuple[str, int], int],
    timeout_s: float = 30.0,
    **conf: object,
) -> dict[tuple[str, int], list[Record]]:
    """The records of each ``(topic, partition)`` from its offset in ``starts`` to its end.

    Each partition stops where a Fetch response said its high watermark was when
    the reader caught up (librdkafka's partition-EOF event, cross-checked against
    ``get_watermark_offsets(cached=True)``); records appended later are not
    included. The reader is a new consumer, so its first Fetch is sent after the
    call: everything appended before the call is returned (a consistent cut across
    topics, for readers that must see what caused what they already saw). Tansu
    quirk: ListOffsets(latest), i.e. ``end_offsets``, uncached
    ``get_watermark_offsets`` and consumer lag, is wrong there, so "the end" must
    come from a Fetch response as here, never from ListOffsets. Raises
    ``TimeoutError`` naming the partitions not read to their end in ``timeout_s``.

    Cost: one consumer, one Fetch round per partition batch (``fetch.wait.max.ms``
    10 ms on Tansu) plus the records themselves.
    """
    if not starts:
        return {}
    settings: dict[str, Any] = {**_TO_END, **conf}  # librdkafka's, as in LogConsumer
    with LogConsumer(bootstrap_servers, **settings) as consumer:
        return _read_to_end(consumer, starts, timeout_s)


def _read_to_end(
    consumer: LogConsumer, starts: Mapping[tuple[str, int], int], timeout_s: float
) -> dict[tuple[str, int], list[Record]]:
    """:func:`read_to_end` on a consumer made with ``_TO_END`` and not yet assigned."""
    found: dict[tuple[str, int], list[Record]] = {tp: [] for tp in starts}
    consumer.assign_from(starts)
    open_parts = set(starts)
    deadline = time.monotonic() + timeout_s
    while open_parts:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"read_to_end: partitions {sorted(open_parts)} not read to their high "
                f"watermark within {timeout_s} s"
            )
        msg = consumer._consumer.poll(min(left, 0.5))
        if msg is None:
            continue
        tp = (msg.topic(), msg.partition())
        if tp not in open_parts:
            continue  # already at its end: later appends are not ours
        error = msg.error()
        if error is None:
            if consumer._in_order(msg, set()):  # else sought back to a skipped record
                found[tp].append(_to_record(msg))
        elif error.code() == KafkaError._PARTITION_EOF:
            # EOF means "fetch position == the Fetch response's high watermark".
            high = consumer.high_watermark(*tp)
            # an EOF event carries the fetch position as its offset
            if high is not None and cast(int, msg.offset()) < high:
                continue  # stale EOF; more is on its way
            consumer._consumer.pause([TopicPartition(*tp)])
            open_parts.discard(tp)
        else:
            consumer._handle_error(error, msg)
    return found
