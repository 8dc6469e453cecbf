"""The in-memory fake of the log port: the shells' unit tests run against it.

Theory of operation
-------------------
A :class:`MemoryLog` plays the broker: topics with fixed partition counts, each
partition a list of records whose offset is its index, and committed positions per
(group, topic, partition). :class:`MemoryProducer` and :class:`MemoryConsumer`
implement ``framespool.log.port`` against it, and
``tests/integration/test_log_contract.py`` runs one suite against this fake and the
real broker, so they agree on what the shells rely on:

1. Unknown topics are refused: ``produce``/``send`` raise ``DeliveryError``
   (``UNKNOWN_TOPIC_OR_PART``), ``partitions_of`` raises ``LogError``.
2. A keyed record without a partition lands in ``partition_for_key``; unkeyed
   records go round robin. Delivery is immediate: a produced record is readable
   at once and ``on_delivery`` runs before ``produce`` returns.
3. A consumer reads its assignment from its positions, in offset order per
   partition; ``high_watermark`` is the partition's end as of the consumer's last
   fetch (None before one), like the value a Kafka Fetch response carries.
4. ``subscribe`` joins a group: every join or leave starts a new generation, and
   each member, on its next ``poll``/``consume``, has its partitions revoked
   (``on_revoke``) and gets its share through ``on_assign``: range by default,
   round robin with ``partition.assignment.strategy=roundrobin``, members in join
   order. Partitions the callback does not ``assign`` itself start at the
   group's committed position, else 0. Members rebalance one at a time, not
   stop-the-world: tests that need exclusive ownership poll every member.
5. Only ``commit`` moves committed positions; ``close`` revokes (``on_revoke``)
   and leaves the group.

Faults are injected with ``MemoryProducer(fail_with=exc)``: every later write
raises ``exc`` and nothing is written.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from framespool.log.partitioning import partition_for_key
from framespool.log.port import (
    Delivered,
    DeliveryCallback,
    DeliveryError,
    Headers,
    Key,
    LogError,
    PartitionsCallback,
    Record,
    TopicMismatch,
    TopicPartition,
)
from framespool.schemas.topics import ALL_TOPICS, Topic

UNKNOWN_TOPIC = "UNKNOWN_TOPIC_OR_PART: Broker: Unknown topic or partition"


@dataclass(frozen=True, slots=True)
class Assigned:
    """A partition handed to rebalance callbacks (the port's ``TopicPartition``)."""

    topic: str
    partition: int


@dataclass
class _Group:
    members: list[MemoryConsumer] = field(default_factory=list)
    generation: int = 0


class MemoryLog:
    """Topics, partitions, offsets and committed positions, in this process.

    Thread-safe: producers and consumers may be used from different threads, and
    a consumer waiting in ``poll`` wakes as soon as a record arrives.
    """

    def __init__(
        self,
        topics: Iterable[Topic] = ALL_TOPICS,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._partitions: dict[str, list[list[Record]]] = {}
        self._committed: dict[tuple[str, str, int], int] = {}
        self._groups: dict[str, _Group] = {}
        self._clock = clock
        self.changed = threading.Condition()
        self.version = 0  # bumped by every append, join and leave: wakes waiting consumers
        self.create_topics(topics)

    # -- topics ---------------------------------------------------------------------
    def create_topics(self, topics: Iterable[Topic]) -> list[str]:
        """Like ``framespool.log.kafka.create_topics``: idempotent, refuses another count."""
        created = []
        with self.changed:
            for t in topics:
                existing = self._partitions.get(t.name)
                if existing is None:
                    self._partitions[t.name] = [[] for _ in range(t.partitions)]
                    created.append(t.name)
                elif len(existing) != t.partitions:
                    raise TopicMismatch(
                        f"{t.name!r} has {len(existing)} partitions, the catalogue says "
                        f"{t.partitions}; partitions cannot be changed in place"
                    )
        return created

    def partitions_of(self, topic: str) -> int:
        with self.changed:
            parts = self._partitions.get(topic)
        if parts is None:
            raise LogError(
                f"topic {topic!r} is not readable: {UNKNOWN_TOPIC}; create it with create_topics()"
            )
        return len(parts)

    # -- writing ----------------------------------------------------------------------
    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: tuple[tuple[str, bytes], ...],
    ) -> Delivered:
        with self.changed:
            parts = self._partitions.get(topic)
            if parts is None or not 0 <= partition < len(parts):
                raise DeliveryError(topic, key, UNKNOWN_TOPIC)
            offset = len(parts[partition])
            parts[partition].append(
                Record(topic, partition, offset, key, value, headers, self._clock())
            )
            self._bump()
        return Delivered(topic, partition, offset)

    # -- reading ----------------------------------------------------------------------
    def end(self, topic: str, partition: int) -> int:
        with self.changed:
            return len(self._partitions[topic][partition])

    def read(self, topic: str, partition: int, offset: int, limit: int) -> list[Record]:
        with self.changed:
            return self._partitions[topic][partition][offset : offset + limit]

    def read_all(self, topic: str, partitions: Iterable[int] | None = None) -> list[Record]:
        """Every record of ``topic`` (or of ``partitions``), partition by partition."""
        count = self.partitions_of(topic)
        parts = sorted(partitions) if partitions is not None else range(count)
        with self.changed:
            return [r for p in parts for r in self._partitions[topic][p]]

    # -- groups -----------------------------------------------------------------------
    def committed(self, group: str, topic: str, partition: int) -> int | None:
        with self.changed:
            return self._committed.get((group, topic, partition))

    def commit(self, group: str, positions: Mapping[tuple[str, int], int]) -> None:
        with self.changed:
            for (topic, partition), offset in positions.items():
                if topic not in self._partitions:
                    raise LogError(f"commit for group {group!r} failed: {topic}: {UNKNOWN_TOPIC}")
                self._committed[(group, topic, partition)] = offset

    def join(self, group: str, member: MemoryConsumer) -> None:
        with self.changed:
            g = self._groups.setdefault(group, _Group())
            if member not in g.members:
                g.members.append(member)
            g.generation += 1
            self._bump()

    def leave(self, group: str, member: MemoryConsumer) -> None:
        with self.changed:
            g = self._groups.get(group)
            if g is not None and member in g.members:
                g.members.remove(member)
                g.generation += 1
                self._bump()

    def _bump(self) -> None:
        self.version += 1
        self.changed.notify_all()

    def wait_for_change(self, seen: int, timeout: float) -> None:
        """Block until ``version`` moves past ``seen`` or ``timeout`` seconds pass."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != seen, timeout)

    def generation(self, group: str) -> int:
        with self.changed:
            return self._groups[group].generation

    def share(
        self, group: str, member: MemoryConsumer, topics: Sequence[str]
    ) -> list[TopicPartition]:
        """``member``'s share of ``topics`` in the group's current generation, by the
        strategy of the group's first member (Kafka's group leader picks one for all)."""
        with self.changed:
            members = self._groups[group].members
            n, i = len(members), members.index(member)
            out: list[TopicPartition] = []
            if members[0].assignment == "roundrobin":  # every partition of every topic, dealt
                every = [
                    (t, p) for t in sorted(topics) for p in range(len(self._partitions.get(t, ())))
                ]
                return [Assigned(t, p) for k, (t, p) in enumerate(every) if k % n == i]
            for topic in topics:  # range: a contiguous block of each topic
                count = len(self._partitions.get(topic, ()))
                per, extra = divmod(count, n)
                start = i * per + min(i, extra)
                out.extend(
                    Assigned(topic, p) for p in range(start, start + per + (1 if i < extra else 0))
                )
            return out

    # -- factories with the real adapters' signatures -----------------------------
    def producer(self, bootstrap_servers: str = "", **conf: object) -> MemoryProducer:
        """A producer on this log; takes (and ignores) ``LogProducer``'s arguments."""
        return MemoryProducer(self)

    def consumer(
        self, bootstrap_servers: str = "", group_id: str | None = None, **conf: object
    ) -> MemoryConsumer:
        """A consumer on this log; takes ``LogConsumer``'s arguments, honours
        ``partition.assignment.strategy`` and ignores the other broker settings."""
        strategy = str(conf.get("partition.assignment.strategy", "range"))
        return MemoryConsumer(self, group_id, assignment=strategy)


@dataclass(frozen=True, slots=True)
class Sent:
    """One write as the producer was given it (key and headers unconverted), and where it landed."""

    topic: str
    key: Key
    value: bytes | None
    headers: Headers = None
    partition: int | None = None
    delivered: Delivered | None = None


def _header_tuple(headers: Headers) -> tuple[tuple[str, bytes], ...]:
    if headers is None:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((k, v.encode() if isinstance(v, str) else bytes(v)) for k, v in items)


class MemoryProducer:
    """The port's producer on a :class:`MemoryLog` (by default a fresh one with the
    catalogue's topics). ``sent`` lists what it wrote, in order; ``on(topic)`` those
    for one topic."""

    def __init__(self, log: MemoryLog | None = None, *, fail_with: Exception | None = None):
        self.log = log if log is not None else MemoryLog()
        self.fail_with = fail_with
        self.sent: list[Sent] = []
        self._round_robin = itertools.count()
        self._closed = False

    def on(self, topic: str) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic]

    def _write(
        self, topic: str, key: Key, value: bytes | None, partition: int | None, headers: Headers
    ) -> Delivered:
        if self._closed:
            raise LogError("producer is closed; create a new one")
        if self.fail_with is not None:
            raise self.fail_with
        raw_key = key.encode("utf-8") if isinstance(key, str) else key
        target = partition
        if target is None:
            try:
                count = self.log.partitions_of(topic)
            except LogError:
                raise DeliveryError(topic, raw_key, UNKNOWN_TOPIC) from None
            target = (
                partition_for_key(raw_key, count)
                if raw_key is not None
                else next(self._round_robin) % count
            )
        delivered = self.log.append(topic, raw_key, value, target, _header_tuple(headers))
        self.sent.append(Sent(topic, key, value, headers, partition, delivered))
        return delivered

    def produce(
        self,
        topic: str,
        key: Key,
        value: bytes | None,
        partition: int | None = None,
        headers: Headers = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        delivered = self._write(topic, key, value, partition, headers)
        if on_delivery is not None:
            on_delivery(None, delivered)

    async def send(
        self,
        topic: str,
        key: Key,
        value: bytes | None,
        partition: int | None = None,
        headers: Headers = None,
    ) -> Delivered:
        return self._write(topic, key, value, partition, headers)

    def flush(self, timeout: float = 30.0) -> None:
        """Every write is already delivered; nothing to wait for."""

    def close(self, timeout: float = 30.0) -> None:
        self._closed = True

    def __enter__(self) -> MemoryProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class MemoryConsumer:
    """The port's consumer on a :class:`MemoryLog`; see the module docstring for the
    group semantics."""

    def __init__(
        self, log: MemoryLog, group_id: str | None = None, *, assignment: str = "range"
    ) -> None:
        if assignment not in ("range", "roundrobin"):
            raise ValueError(
                f"partition.assignment.strategy {assignment!r} is not modelled by the fake; "
                "use 'range' or 'roundrobin'"
            )
        self.log = log
        self.group_id = group_id
        self.assignment = assignment
        self._positions: dict[tuple[str, int], int] = {}
        self._watermarks: dict[tuple[str, int], int] = {}
        self._subscribed: tuple[str, ...] = ()
        self._on_assign: PartitionsCallback | None = None
        self._on_revoke: PartitionsCallback | None = None
        self._generation = -1
        self._assigned_by_callback = False
        self._closed = False

    # -- manual assignment ----------------------------------------------------------
    def assign(
        self, topic: str, partitions: Iterable[int], offsets: int | Mapping[int, int] = 0
    ) -> None:
        parts = list(partitions)
        start = offsets if isinstance(offsets, Mapping) else {p: offsets for p in parts}
        self._positions = {(topic, p): start[p] for p in parts}
        self._assigned_by_callback = True

    def committed(
        self, topic: str, partitions: Iterable[int], timeout: float = 10.0
    ) -> dict[int, int | None]:
        if self.group_id is None:
            return {p: None for p in partitions}
        return {p: self.log.committed(self.group_id, topic, p) for p in partitions}

    def resume(
        self, topic: str, partitions: Iterable[int], timeout: float = 10.0
    ) -> dict[int, int]:
        if self.group_id is None:
            raise LogError("resume() needs a group_id to read committed positions from")
        parts = list(partitions)
        start = {p: (o if o is not None else 0) for p, o in self.committed(topic, parts).items()}
        self.assign(topic, parts, start)
        return start

    # -- group subscription ---------------------------------------------------------
    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None:
        if self.group_id is None:
            raise LogError("subscribe() needs a group_id")
        self._subscribed = tuple(topics)
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self.log.join(self.group_id, self)

    def _assignment(self) -> list[TopicPartition]:
        return [Assigned(t, p) for t, p in self._positions]

    def _rebalance(self) -> None:
        if not self._subscribed or self.group_id is None:
            return
        generation = self.log.generation(self.group_id)
        if generation == self._generation:
            return
        self._generation = generation
        if self._positions and self._on_revoke is not None:
            self._on_revoke(self._assignment())
        self._positions = {}
        share = self.log.share(self.group_id, self, self._subscribed)
        self._assigned_by_callback = False
        if self._on_assign is not None:
            self._on_assign(share)
        if not self._assigned_by_callback:  # as librdkafka: assign the share itself
            for a in share:
                committed = self.log.committed(self.group_id, a.topic, a.partition)
                self._positions[(a.topic, a.partition)] = committed or 0

    # -- reading and committing -----------------------------------------------------
    def _fetch(self, limit: int) -> list[Record]:
        out: list[Record] = []
        for (topic, partition), position in sorted(self._positions.items()):
            if len(out) >= limit:
                break
            got = self.log.read(topic, partition, position, limit - len(out))
            self._watermarks[(topic, partition)] = self.log.end(topic, partition)
            if got:
                self._positions[(topic, partition)] = got[-1].offset + 1
                out.extend(got)
        return out

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        if self._closed:
            raise LogError("consumer is closed")
        deadline = time.monotonic() + timeout
        while True:
            seen = self.log.version
            self._rebalance()  # callbacks run outside the log's lock, as in librdkafka's poll
            records = self._fetch(max_records)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            self.log.wait_for_change(seen, left)

    def poll(self, timeout: float = 1.0) -> Record | None:
        records = self.consume(1, timeout)
        return records[0] if records else None

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        if self.group_id is None:
            raise LogError("commit() needs a group_id")
        self.log.commit(self.group_id, positions)

    def commit_through(self, record: Record) -> None:
        self.commit({(record.topic, record.partition): record.offset + 1})

    def high_watermark(self, topic: str, partition: int) -> int | None:
        return self._watermarks.get((topic, partition))

    def partitions_of(self, topic: str, timeout: float = 10.0) -> int:
        return self.log.partitions_of(topic)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._subscribed and self.group_id is not None:
            if self._positions and self._on_revoke is not None:
                self._on_revoke(self._assignment())
            self.log.leave(self.group_id, self)
        self._positions = {}

    def __enter__(self) -> MemoryConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
