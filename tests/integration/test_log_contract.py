"""One suite, two adapters: the in-memory fake and the real broker honour the log port alike.

Every shell's unit tests run against ``framespool.log.memory``; this suite is what
entitles them to: each test runs once against the fake and once against the broker
(``kafka_bootstrap``), on topics of its own. What only the broker does (read_all's
high-watermark stop, topic creation on the admin API, murmur2's pinned values) stays
in ``test_log.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pytest

from framespool.log import (
    Consumer,
    DeliveryError,
    LogConsumer,
    LogError,
    LogProducer,
    Producer,
    Record,
    create_topics,
    partition_for_key,
)
from framespool.log.memory import MemoryLog
from framespool.schemas.topics import Topic

N = 40
# Short group timeouts: the broker holds a join for half the session (docs/broker-notes.md#consumer-groups).
FAST_GROUP = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
# An unknown topic fails after 1 s rather than 10 (the producer's metadata wait).
FAST_FAIL = {"topic.metadata.propagation.max.ms": 1000}


@dataclass
class Adapter:
    """How a test reaches one adapter: create topics, make producers and consumers."""

    name: str
    create_topics: Callable[[Iterable[Topic]], list[str]]
    producer: Callable[..., Producer]  # (**conf)
    consumer: Callable[..., Consumer]  # (group_id=None, **conf)

    def topic(self, partitions: int = 4) -> Topic:
        """A new, empty topic for one test."""
        t = Topic(f"framespool.contract-{uuid.uuid4().hex[:10]}", partitions, "test")
        self.create_topics([t])
        return t


def _memory() -> Adapter:
    log = MemoryLog(())
    return Adapter(
        "memory",
        log.create_topics,
        lambda **conf: log.producer(**conf),
        lambda group_id=None, **conf: log.consumer(group_id=group_id, **conf),
    )


def _broker(bootstrap: str) -> Adapter:
    return Adapter(
        "broker",
        lambda topics: create_topics(bootstrap, topics),
        lambda **conf: LogProducer(bootstrap, **conf),
        lambda group_id=None, **conf: LogConsumer(bootstrap, group_id, **conf),
    )


@pytest.fixture(params=["memory", pytest.param("broker", marks=pytest.mark.integration)])
def log(request: pytest.FixtureRequest) -> Adapter:
    if request.param == "memory":
        return _memory()
    return _broker(request.getfixturevalue("kafka_bootstrap"))


def _poll_until(consumer: Consumer, count: int, timeout_s: float = 30.0) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records.extend(consumer.consume(100, timeout=0.5))
    return records


def _produce_keyed(log: Adapter, topic: Topic, n: int = N) -> dict[int, list[tuple[bytes, bytes]]]:
    """``n`` records over 7 keys with headers; returns (key, value) per partition in order."""
    expected: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
    with log.producer() as producer:
        for i in range(n):
            key = f"job-{i % 7}"
            value = f"{i}".encode()
            headers = (
                [("seq", value), ("kind", b"test")] if i % 2 else {"seq": value, "kind": "test"}
            )
            producer.produce(topic.name, key, value, headers=headers)
            expected[partition_for_key(key, topic.partitions)].append((key.encode(), value))
        producer.flush(10)
    return dict(expected)


def _by_partition(records: list[Record]) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    out: dict[int, list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
    for r in records:
        out[r.partition].append((r.key, r.value))
    return dict(out)


def test_round_trip_keeps_keys_headers_and_per_partition_order(log: Adapter):
    topic = log.topic()
    expected = _produce_keyed(log, topic)
    with log.consumer() as consumer:
        assert consumer.partitions_of(topic.name) == topic.partitions
        consumer.assign(topic.name, range(topic.partitions), 0)
        records = _poll_until(consumer, N)
        assert consumer.consume(100, timeout=0.2) == []  # nothing more
    assert _by_partition(records) == expected
    for r in records:
        assert r.topic == topic.name
        assert r.header("kind") == b"test"  # str header values arrive as UTF-8 bytes
        assert r.header("seq") == r.value
        assert r.timestamp_ms is not None and r.timestamp_ms > 0
    for p in range(topic.partitions):
        offsets = [r.offset for r in records if r.partition == p]
        assert offsets == list(range(len(offsets)))


def test_send_lands_where_partition_for_key_says_unless_a_partition_is_given(log: Adapter):
    topic = log.topic()

    async def scenario():
        with log.producer() as producer:
            keyed = [await producer.send(topic.name, f"cell-key-{i}", b"x") for i in range(12)]
            explicit = [
                await producer.send(topic.name, "cell-key-0", f"{i}".encode(), partition=2)
                for i in range(5)
            ]
        return keyed, explicit

    keyed, explicit = asyncio.run(scenario())
    for i, delivered in enumerate(keyed):
        assert delivered.topic == topic.name
        assert delivered.partition == partition_for_key(f"cell-key-{i}", topic.partitions)
    assert [d.partition for d in explicit] == [2] * 5
    offsets = [d.offset for d in explicit]
    assert offsets == list(range(offsets[0], offsets[0] + 5))  # consecutive, in send order
    with log.consumer() as consumer:
        consumer.assign(topic.name, [2], {2: offsets[0]})
        got = _poll_until(consumer, 5)
    assert [(r.offset, r.value) for r in got] == [
        (o, f"{i}".encode()) for i, o in enumerate(offsets)
    ]


def test_assign_reads_from_explicit_offsets_and_reassigning_seeks(log: Adapter):
    topic = log.topic()
    with log.producer() as producer:
        for i in range(10):
            producer.produce(topic.name, "node-a", f"{i}".encode(), partition=3)
            producer.produce(topic.name, "node-b", f"b{i}".encode(), partition=1)
        producer.flush(10)
    with log.consumer() as consumer:
        consumer.assign(topic.name, [3, 1], {3: 7, 1: 9})
        got = _poll_until(consumer, 4)
        assert sorted((r.partition, r.value) for r in got) == [
            (1, b"b9"),
            (3, b"7"),
            (3, b"8"),
            (3, b"9"),
        ]
        consumer.assign(topic.name, [3], 8)  # replaces the assignment: a seek back
        assert [r.value for r in _poll_until(consumer, 2)] == [b"8", b"9"]


def test_positions_are_committed_only_by_commit_and_resume_from_there(log: Adapter):
    topic = log.topic()
    with log.producer() as producer:
        for i in range(10):
            producer.produce(topic.name, "node-a", f"{i}".encode(), partition=3)
        producer.flush(10)
    group = f"framespool-contract-{uuid.uuid4().hex[:8]}"

    with log.consumer() as anonymous, pytest.raises(LogError, match="group_id"):
        anonymous.commit({(topic.name, 3): 1})

    with log.consumer(group) as reader:  # reads everything, commits nothing
        assert reader.resume(topic.name, [3]) == {3: 0}
        assert len(_poll_until(reader, 10)) == 10
    with log.consumer(group) as agent:
        assert agent.committed(topic.name, [3]) == {3: None}
        assert agent.resume(topic.name, [3]) == {3: 0}
        records = _poll_until(agent, 10)
        assert [r.value for r in records] == [f"{i}".encode() for i in range(10)]
        agent.commit_through(records[5])  # commits "the next offset to read"
        assert agent.high_watermark(topic.name, 3) == 10  # from the latest fetch
    with log.consumer(group) as restarted:
        assert restarted.committed(topic.name, [3, 2]) == {3: 6, 2: None}
        assert restarted.resume(topic.name, [3]) == {3: 6}
        assert [r.value for r in _poll_until(restarted, 4)] == [b"6", b"7", b"8", b"9"]
        restarted.commit({(topic.name, 3): 10, (topic.name, 0): 0})
        assert restarted.committed(topic.name, [3, 0]) == {3: 10, 0: 0}


def test_group_subscription_assigns_every_partition_and_resumes_at_commits(log: Adapter):
    topic = log.topic()
    expected = _produce_keyed(log, topic)
    group = f"framespool-contract-{uuid.uuid4().hex[:8]}"
    assigned, revoked = [], []

    with log.consumer(group, **FAST_GROUP) as consumer:
        consumer.subscribe([topic.name], on_assign=assigned.extend, on_revoke=revoked.extend)
        records = _poll_until(consumer, N)
        assert sorted((tp.topic, tp.partition) for tp in assigned) == [
            (topic.name, p) for p in range(topic.partitions)
        ]
        assert _by_partition(records) == expected
        consumer.commit({(r.topic, r.partition): r.offset + 1 for r in records})
    assert sorted(tp.partition for tp in revoked) == list(range(topic.partitions))  # on leaving

    with log.producer() as producer:
        producer.produce(topic.name, "late", b"after the commit", partition=0)
        producer.flush(10)
    with log.consumer(group, **FAST_GROUP) as again:
        committed = again.committed(topic.name, range(topic.partitions))
        assert committed == {p: len(expected.get(p, ())) or None for p in range(topic.partitions)}
        again.subscribe([topic.name])
        assert [r.value for r in _poll_until(again, 1)] == [b"after the commit"]
        assert again.consume(100, timeout=0.5) == []


def test_unknown_topics_are_refused_not_created(log: Adapter):
    awaited, queued = (f"framespool.typo-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with log.producer(**FAST_FAIL) as producer:
        with pytest.raises(DeliveryError, match="UNKNOWN_TOPIC"):
            asyncio.run(producer.send(awaited, "k", b"v"))
        with pytest.raises(LogError, match=queued):  # refused up front or at the flush
            producer.produce(queued, "k", b"v")
            producer.flush(10)
    with log.consumer() as consumer:
        for name in (awaited, queued):
            with pytest.raises(LogError, match="not readable"):
                consumer.partitions_of(name)


def test_a_subscribe_or_resume_needs_a_group(log: Adapter):
    topic = log.topic()
    with log.consumer() as anonymous:
        with pytest.raises(LogError, match="group_id"):
            anonymous.subscribe([topic.name])
        with pytest.raises(LogError, match="group_id"):
            anonymous.resume(topic.name, [0])


@pytest.mark.parametrize(
    ("strategy", "shares"),
    [("range", [[0, 1], [2, 3]]), ("roundrobin", [[0, 2], [1, 3]])],
)
def test_two_members_of_a_group_share_the_partitions_by_the_strategy(
    log: Adapter, strategy, shares
):
    topic = log.topic()
    group = f"framespool-contract-{uuid.uuid4().hex[:8]}"
    conf = {**FAST_GROUP, "partition.assignment.strategy": strategy}
    owned: list[set[int]] = [set(), set()]

    def tracker(mine: set[int]):
        return (
            lambda parts: mine.update(tp.partition for tp in parts),
            lambda parts: mine.difference_update(tp.partition for tp in parts),
        )

    with log.consumer(group, **conf) as a, log.consumer(group, **conf) as b:
        for member, mine in zip((a, b), owned):
            on_assign, on_revoke = tracker(mine)
            member.subscribe([topic.name], on_assign=on_assign, on_revoke=on_revoke)
        deadline = time.monotonic() + 30
        while sorted(sorted(m) for m in owned) != shares and time.monotonic() < deadline:
            a.consume(10, timeout=0.1)  # both must poll for a rebalance to complete
            b.consume(10, timeout=0.1)
        assert sorted(sorted(m) for m in owned) == shares
