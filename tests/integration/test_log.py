"""framespool.log against a real broker: what goes in comes out, in order, where expected."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka.admin import AdminClient

from framespool.log import (
    DeliveryError,
    LogConsumer,
    LogError,
    LogProducer,
    Record,
    TopicMismatch,
    create_topics,
    murmur2,
    partition_for_key,
    read_all,
    read_to_end,
)
from framespool.schemas.topics import Topic

pytestmark = pytest.mark.integration

N = 60
# docs/broker-notes.md#consumer-groups: ~1 s joins
FAST_GROUP = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}


def _produce_keyed(bootstrap: str, topic: str, n: int = N) -> dict[int, list[tuple[bytes, bytes]]]:
    """``n`` records over 12 keys, partitioned by key; returns (key, value) per partition in order."""
    expected: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
    with LogProducer(bootstrap) as producer:
        for i in range(n):
            key = f"job-{i % 12}"
            value = f"{i}".encode()
            producer.produce(
                topic, key, value, headers=[("seq", str(i).encode()), ("kind", b"test")]
            )
            expected[partition_for_key(key, 4)].append((key.encode(), value))
    return expected


def _by_partition(records: list[Record]) -> dict[int, list[tuple[bytes, bytes]]]:
    out: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
    for r in records:
        out[r.partition].append((r.key, r.value))
    return out


def _poll_until(consumer: LogConsumer, count: int, timeout_s: float = 30.0) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records.extend(consumer.consume(100, timeout=0.5))
    return records


def test_manual_assignment_reads_every_partition_in_order_with_keys_and_headers(
    kafka_bootstrap, fresh_topics
):
    topic = fresh_topics.JOB_EVENTS
    assert topic.partitions == 4
    expected = _produce_keyed(kafka_bootstrap, topic.name)

    with LogConsumer(kafka_bootstrap) as consumer:
        consumer.assign(topic.name, range(topic.partitions), 0)
        records = _poll_until(consumer, N)

    assert _by_partition(records) == expected
    for r in records:
        assert r.topic == topic.name
        assert r.header("kind") == b"test"
        assert r.header("seq") == r.value
        assert r.timestamp_ms is not None and r.timestamp_ms > 0
    for p in range(topic.partitions):
        offsets = [r.offset for r in records if r.partition == p]
        assert offsets == list(range(len(offsets)))


def test_assignment_from_an_offset_and_resume_from_committed_positions(
    kafka_bootstrap, fresh_topics
):
    topic = fresh_topics.ASSIGNMENTS.name
    with LogProducer(kafka_bootstrap) as producer:
        for i in range(10):
            producer.produce(topic, "node-a", f"{i}".encode(), partition=3)

    with LogConsumer(kafka_bootstrap) as consumer:
        consumer.assign(topic, [3], {3: 7})
        assert [r.value for r in _poll_until(consumer, 3)] == [b"7", b"8", b"9"]

    group = f"framespool-agent-test-{uuid.uuid4().hex[:8]}"
    with LogConsumer(kafka_bootstrap, group) as agent:
        assert agent.resume(topic, [3]) == {3: 0}  # nothing committed yet
        records = _poll_until(agent, 10)
        assert [r.value for r in records] == [f"{i}".encode() for i in range(10)]
        agent.commit_through(records[5])
        assert agent.high_watermark(topic, 3) == 10  # from the Fetch responses
    with LogConsumer(kafka_bootstrap, group) as restarted:
        assert restarted.committed(topic, [3, 2]) == {3: 6, 2: None}
        assert restarted.resume(topic, [3]) == {3: 6}
        assert [r.value for r in _poll_until(restarted, 4)] == [b"6", b"7", b"8", b"9"]


def test_group_subscription_reads_everything_in_order_and_commits(kafka_bootstrap, fresh_topics):
    topic = fresh_topics.PROGRESS
    expected = _produce_keyed(kafka_bootstrap, topic.name)
    group = f"framespool-test-{uuid.uuid4().hex[:8]}"
    assigned = []

    with LogConsumer(kafka_bootstrap, group, **FAST_GROUP) as consumer:
        consumer.subscribe([topic.name], on_assign=assigned.extend)
        records = _poll_until(consumer, N)
        assert sorted(tp.partition for tp in assigned) == list(range(topic.partitions))
        assert _by_partition(records) == expected
        consumer.commit({(r.topic, r.partition): r.offset + 1 for r in records})

    with LogProducer(kafka_bootstrap) as producer:
        producer.produce(topic.name, "late", b"after the commit", partition=0)
    with LogConsumer(kafka_bootstrap, group, **FAST_GROUP) as again:
        committed = again.committed(topic.name, range(topic.partitions))
        assert committed == {p: len(expected[p]) or None for p in range(topic.partitions)}
        again.subscribe([topic.name])
        # It resumes at the committed positions: the only record left is the late one.
        assert [r.value for r in _poll_until(again, 1)] == [b"after the commit"]
        assert again.consume(100, timeout=0.5) == []


def test_read_all_returns_the_whole_topic_up_to_the_high_watermark(kafka_bootstrap, fresh_topics):
    topic = fresh_topics.COMMANDS
    assert read_all(kafka_bootstrap, topic.name, timeout_s=10) == []  # empty partitions end at 0
    expected = _produce_keyed(kafka_bootstrap, topic.name)

    records = read_all(kafka_bootstrap, topic.name, timeout_s=10)
    assert len(records) == N
    assert _by_partition(records) == expected
    assert [r.partition for r in records] == sorted(
        r.partition for r in records
    )  # partition by partition

    some = read_all(kafka_bootstrap, topic.name, partitions=[1, 2], timeout_s=10)
    assert _by_partition(some) == {p: expected[p] for p in (1, 2) if expected[p]}


def test_read_to_end_reads_each_partition_from_its_start_across_topics(
    kafka_bootstrap, fresh_topics
):
    commands, jobs = fresh_topics.COMMANDS, fresh_topics.JOB_EVENTS
    expected = _produce_keyed(kafka_bootstrap, commands.name)
    with LogProducer(kafka_bootstrap) as producer:
        for i in range(5):
            producer.produce(jobs.name, "k", f"j{i}".encode(), partition=3)
    starts = {(commands.name, p): min(2, len(expected[p])) for p in range(4)}
    starts[(jobs.name, 3)] = 4
    starts[(jobs.name, 0)] = 0  # empty: ends at 0
    found = read_to_end(kafka_bootstrap, starts, timeout_s=10)
    assert set(found) == set(starts)
    for p in range(4):
        assert [(r.key, r.value) for r in found[(commands.name, p)]] == expected[p][2:]
    assert [r.value for r in found[(jobs.name, 3)]] == [b"j4"]
    assert found[(jobs.name, 0)] == []
    assert read_to_end(kafka_bootstrap, {}, timeout_s=1) == {}


def test_log_tail_catch_up_takes_what_its_consumers_have_not_polled_yet_once(
    kafka_bootstrap, fresh_topics
):
    from framespool.chaos.drill import LogTail
    from framespool.schemas import codec
    from framespool.schemas import events as ev

    def failed(job: str) -> bytes:
        return codec.encode(ev.JobFailed(event_id=job, ts_ms=1, job_id=job, run=1, reason="r"))

    with LogTail(kafka_bootstrap, fresh_topics, ("JOB_EVENTS", "DEAD_LETTER")) as tail:
        with LogProducer(kafka_bootstrap) as producer:
            producer.produce(fresh_topics.JOB_EVENTS.name, "a", failed("a"))
            producer.produce(fresh_topics.DEAD_LETTER.name, "b", b"not an event")
        tail.catch_up(timeout_s=10)  # nothing polled: all of it comes from catch_up
        assert [e.job_id for e in tail.of(ev.JobFailed)] == ["a"]
        assert len(tail.records) == 2
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            tail.poll()  # the tail's own consumers deliver both again: skipped
        assert len(tail.records) == 2 and len(tail.events) == 1
        # wait_for ends caught up: the dead letter written before job c's end is
        # there even though the dead-letter consumer (made to lag forever) never saw it
        tail._consumers[1] = _Lagging()
        with LogProducer(kafka_bootstrap) as producer:
            producer.produce(fresh_topics.DEAD_LETTER.name, "d", b"the cause")
            producer.flush()
            producer.produce(fresh_topics.JOB_EVENTS.name, "c", failed("c"))
        seen = tail.wait_for(lambda t: t.of(ev.JobFailed, job_id="c"), 10, "job c")
        assert [e.job_id for e in seen] == ["c"]
        assert sorted(e.job_id for e in tail.of(ev.JobFailed)) == ["a", "c"]
        assert [r.value for r in tail.records if r.key == b"d"] == [b"the cause"]


class _Lagging:
    """A consumer that has not fetched yet."""

    def consume(self, max_records: int, timeout: float) -> list[Record]:
        return []

    def close(self) -> None:
        pass


def test_read_all_of_a_missing_topic_fails_and_does_not_create_it(kafka_bootstrap):
    name = f"framespool.missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(LogError, match="not readable"):
        read_all(kafka_bootstrap, name, timeout_s=5)
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert name not in topics


def test_send_returns_once_delivered_where_partition_for_key_says(kafka_bootstrap, fresh_topics):
    topic = fresh_topics.SCHEDULER

    async def scenario():
        with LogProducer(kafka_bootstrap) as producer:
            keyed = [await producer.send(topic.name, f"cell-key-{i}", b"x") for i in range(20)]
            explicit = await asyncio.gather(
                *(
                    producer.send(
                        topic.name, "cell-2", f"{i}".encode(), partition=2, headers={"h": "v"}
                    )
                    for i in range(5)
                )
            )
        return keyed, explicit

    keyed, explicit = asyncio.run(scenario())
    for i, delivered in enumerate(keyed):
        assert delivered.topic == topic.name
        assert delivered.partition == partition_for_key(f"cell-key-{i}", topic.partitions)
    assert all(d.partition == 2 for d in explicit)
    assert len({d.offset for d in explicit}) == 5
    records = read_all(kafka_bootstrap, topic.name, timeout_s=10)
    assert len(records) == 25  # delivered means readable


def test_delivery_to_an_unknown_topic_fails_clearly_and_creates_nothing(kafka_bootstrap):
    fast_fail = {"topic.metadata.propagation.max.ms": 1000}
    awaited, queued = (f"framespool.typo-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with LogProducer(kafka_bootstrap, **fast_fail) as producer:
        with pytest.raises(DeliveryError, match="UNKNOWN_TOPIC"):
            asyncio.run(producer.send(awaited, "k", b"v"))
        with pytest.raises(
            DeliveryError, match="Unknown topic"
        ):  # now known to be missing: refused up front
            producer.produce(awaited, "k", b"v")

        producer.produce(queued, "k", b"v")  # queued; fails in the background
        with pytest.raises(LogError, match=queued):
            producer.flush(10)
        producer.flush(1)  # reported once
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert awaited not in topics and queued not in topics


def test_create_topics_is_idempotent_and_refuses_a_partition_mismatch(kafka_bootstrap):
    name = f"framespool.created-{uuid.uuid4().hex[:8]}"
    assert create_topics(kafka_bootstrap, [Topic(name, 3, "test")]) == [name]
    assert create_topics(kafka_bootstrap, [Topic(name, 3, "test")]) == []
    with pytest.raises(TopicMismatch, match="has 3 partitions, the catalogue says 5"):
        create_topics(kafka_bootstrap, [Topic(name, 5, "test")])


@pytest.mark.parametrize(
    ("key", "java_hash"),
    [  # org.apache.kafka.common.utils.UtilsTest.testMurmur2
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafkas_java_client(key, java_hash):
    assert murmur2(key) == java_hash & 0xFFFFFFFF


def test_partition_for_key_is_stable():
    assert partition_for_key("node-17", 8) == partition_for_key(b"node-17", 8)
    # Pinned values: changing the hash would move every node's and job's partition.
    assert [partition_for_key(f"node-{i}", 8) for i in range(8)] == [7, 2, 1, 1, 4, 7, 3, 3]
    assert partition_for_key("foobar", 4) == (-790332482 & 0x7FFFFFFF) % 4 == 2
    with pytest.raises(ValueError):
        partition_for_key("x", 0)


def test_an_idle_fleet_consumer_rests_and_then_reads_on_where_it_stopped(
    kafka_bootstrap, fresh_topics, monkeypatch
):
    """Idle back-off (framespool.log.kafka, theory of operation 6): a FLEET consumer that
    received nothing for IDLE_AFTER_S pauses its partitions; records written while it
    rests arrive after it looks again, each once, in order, none lost."""
    from framespool.log import Role
    from framespool.log import kafka as adapter

    monkeypatch.setattr(adapter.consumer, "IDLE_AFTER_S", 0.2)
    # the back-off is Tansu's (0 on Kafka by default); the mechanism is the same on both
    monkeypatch.setitem(adapter.settings.IDLE_BACKOFF_MS_BY_ROLE, Role.FLEET, 100)
    topic = fresh_topics.ASSIGNMENTS.name

    def write(values: list[bytes]) -> None:
        with LogProducer(kafka_bootstrap) as producer:
            for v in values:
                producer.produce(topic, b"k", v, partition=0)

    def read(consumer: LogConsumer, n: int, timeout_s: float = 10.0) -> list[Record]:
        got: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < n and time.monotonic() < deadline:
            got += consumer.consume(100, 0.05)
        return got

    write([b"a", b"b", b"c"])
    with LogConsumer(kafka_bootstrap, role=Role.FLEET) as consumer:
        consumer.assign(topic, [0], 0)
        assert [r.value for r in read(consumer, 3)] == [b"a", b"b", b"c"]
        deadline = time.monotonic() + 5
        while consumer.rests < 2 and time.monotonic() < deadline:
            assert consumer.consume(100, 0.05) == []
        assert consumer.rests >= 2  # it rested, looked, and rested again
        write([b"d", b"e"])
        later = read(consumer, 2)
        assert [(r.offset, r.value) for r in later] == [(3, b"d"), (4, b"e")]
        assert consumer.consume(100, 0.3) == []  # nothing twice


def test_on_kafka_an_idle_fleet_consumer_does_not_rest(kafka_bootstrap, fresh_topics, monkeypatch):
    """On Kafka a parked Fetch costs the broker nothing: the default back-off is 0 and a
    FLEET consumer keeps its partitions, so the first record after idling is not delayed."""
    from framespool.log import Role
    from framespool.log import kafka as adapter

    if adapter.settings.ON_TANSU:
        pytest.skip("Tansu's clients rest by design")
    assert adapter.settings.IDLE_BACKOFF_MS_BY_ROLE[Role.FLEET] == 0
    monkeypatch.setattr(adapter.consumer, "IDLE_AFTER_S", 0.05)
    with LogConsumer(kafka_bootstrap, role=Role.FLEET) as consumer:
        consumer.assign(fresh_topics.ASSIGNMENTS.name, [0], 0)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            consumer.consume(100, 0.05)
        assert consumer.rests == 0


def test_a_request_path_consumer_never_rests(kafka_bootstrap, fresh_topics, monkeypatch):
    from framespool.log import kafka as adapter

    monkeypatch.setattr(adapter.consumer, "IDLE_AFTER_S", 0.05)
    with LogConsumer(kafka_bootstrap) as consumer:
        consumer.assign(fresh_topics.ASSIGNMENTS.name, [0], 0)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            consumer.consume(100, 0.05)
        assert consumer.rests == 0


def test_a_consumer_reads_every_record_of_a_partition_several_producers_write(
    kafka_bootstrap, fresh_topics
):
    """framespool.log.kafka, theory of operation 7: with several producers on one
    partition, Tansu sometimes answers a Fetch with the batch after the one asked
    for (verified: 5 skips in 10 s of 4 producers); the consumer reads the skipped
    records again, so it sees every offset, in order."""
    import threading

    topic = fresh_topics.DEAD_LETTER.name  # one partition
    stop = threading.Event()

    def produce(i: int) -> None:
        with LogProducer(kafka_bootstrap, **{"linger.ms": 1}) as producer:
            while not stop.is_set():
                for _ in range(5):
                    producer.produce(topic, f"p{i}", b"x" * 50, partition=0)
                time.sleep(0.002)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    offsets: list[int] = []
    with LogConsumer(kafka_bootstrap) as consumer:
        consumer.assign(topic, [0], 0)
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            offsets += [r.offset for r in consumer.consume(500, 0.05)]
        stop.set()
        for t in threads:
            t.join()
        written = len(read_all(kafka_bootstrap, topic))
        deadline = time.monotonic() + 20
        while len(offsets) < written and time.monotonic() < deadline:
            offsets += [r.offset for r in consumer.consume(500, 0.05)]
    assert offsets == list(range(written)), f"{consumer.refetches} re-fetches"
