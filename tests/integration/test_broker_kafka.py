"""The durable embedded broker (Apache Kafka, KRaft): formatted once, its log and
cluster id kept across stop and SIGKILL, nothing acknowledged lost, clients that
outlive its death."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest

from framespool.broker import KafkaBroker
from framespool.log import LogConsumer, LogProducer, read_all
from framespool.schemas.topics import ALL_TOPICS, Topic

pytestmark = pytest.mark.integration


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_formatted_once_and_the_log_survives_stop_and_sigkill(tmp_path):
    topic = Topic(f"durable-{uuid.uuid4().hex[:8]}", 2, "test")
    broker = KafkaBroker(tmp_path / "kafka")
    with broker:
        cluster_id = broker.cluster_id()
        assert cluster_id and broker.formatted
        port = broker.port
        assert broker.create_topics([*ALL_TOPICS, topic])
        with LogProducer(broker.bootstrap_servers) as producer:
            for i in range(20):
                producer.produce(topic.name, f"k{i}", f"v{i}".encode(), partition=i % 2)
    assert not broker.running and _bindable(port)

    broker = KafkaBroker(tmp_path / "kafka")
    broker.start()
    try:
        assert (broker.port, broker.cluster_id()) == (port, cluster_id)  # same place, same log
        assert broker.create_topics([topic]) == []  # still there
        with LogProducer(broker.bootstrap_servers) as producer:
            for i in range(20, 30):
                producer.produce(topic.name, f"k{i}", f"v{i}".encode(), partition=i % 2)
        broker.kill()
        broker.start()  # after SIGKILL: log recovery, same cluster
        assert broker.cluster_id() == cluster_id
        records = read_all(broker.bootstrap_servers, topic.name, timeout_s=30)
    finally:
        broker.stop()
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(30))


def test_no_acknowledged_record_is_lost_when_the_broker_is_killed_mid_stream(tmp_path):
    """acks=all: every record whose delivery was confirmed is in the log after a
    SIGKILL of the broker in the middle of a produce stream, and a group member
    that was reading resumes on its own once the broker is back."""
    topic = Topic(f"acked-{uuid.uuid4().hex[:8]}", 2, "test")
    broker = KafkaBroker(tmp_path / "kafka")
    broker.start()
    acked: set[bytes] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def confirm(value: bytes):
        def on_delivery(error, delivered) -> None:
            if error is None and delivered is not None:
                with lock:
                    acked.add(value)

        return on_delivery

    def produce(producer: LogProducer) -> None:
        i = 0
        while not stop.is_set():
            value = f"v{i}".encode()
            producer.produce(topic.name, f"k{i}", value, on_delivery=confirm(value))
            i += 1
            time.sleep(0.002)

    try:
        broker.create_topics([topic])
        consumer = LogConsumer(
            broker.bootstrap_servers,
            f"reader-{uuid.uuid4().hex[:6]}",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        consumer.subscribe([topic.name])
        seen: set[bytes] = set()
        with LogProducer(broker.bootstrap_servers, **{"message.timeout.ms": 120_000}) as producer:
            writer = threading.Thread(target=produce, args=(producer,))
            writer.start()
            deadline = time.monotonic() + 30
            while len(seen) < 200 and time.monotonic() < deadline:
                seen.update(r.value for r in consumer.consume(500, timeout=0.5))
            assert len(seen) >= 200, "the reader did not start reading"
            broker.kill()
            time.sleep(1.0)
            broker.start()
            time.sleep(1.0)
            stop.set()
            writer.join()
            producer.flush(120)
        with lock:
            confirmed = set(acked)
        assert len(confirmed) > 200
        stored = {r.value for r in read_all(broker.bootstrap_servers, topic.name, timeout_s=60)}
        assert confirmed <= stored, f"{len(confirmed - stored)} acknowledged records lost"
        deadline = time.monotonic() + 60  # the same group member reads on after the restart
        while not confirmed <= seen and time.monotonic() < deadline:
            seen.update(r.value for r in consumer.consume(500, timeout=0.5))
        consumer.close()
        assert confirmed <= seen, f"the reader is stuck: {len(confirmed - seen)} records unread"
    finally:
        stop.set()
        broker.stop()


def test_a_stored_port_taken_by_someone_else_is_replaced(tmp_path):
    broker = KafkaBroker(tmp_path / "kafka")
    broker.command()  # chooses and stores the ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", broker.port))
        squatter.listen()
        again = KafkaBroker(tmp_path / "kafka")
        again.command()
        assert again.port != broker.port
        assert again.controller_port == broker.controller_port


def test_existing_topics_take_the_catalogues_retention(kafka_bootstrap):
    """Disk stays bounded on a deployment created with other settings: create_topics
    sets the catalogue's configs on topics that already exist."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from framespool.log import create_topics

    name = f"retained-{uuid.uuid4().hex[:8]}"
    old = Topic(name, 1, "test", retention_ms=999_000, segment_ms=None)
    new = Topic(name, 1, "test", retention_ms=86_400_000)
    assert create_topics(kafka_bootstrap, [old]) == [name]
    assert create_topics(kafka_bootstrap, [new]) == []
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, name)
    deadline = time.monotonic() + 20
    while True:
        entries = admin.describe_configs([resource])[resource].result(10)
        got = (entries["retention.ms"].value, entries["segment.ms"].value)
        if got == ("86400000", "86400000") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got == ("86400000", "86400000")
