"""The in-memory Tansu broker (`framespool up --broker tansu`): starts, takes the
catalogue, stops, frees its port; its s3 storage keeps a log across a restart."""

from __future__ import annotations

import socket
import uuid

import boto3
import pytest
from confluent_kafka.admin import AdminClient

from framespool.broker import BrokerError, TansuBroker, free_port
from framespool.log import LogProducer, read_all
from framespool.schemas.topics import ALL_TOPICS, Topic

pytestmark = pytest.mark.integration


def _port_is_bindable(port: int) -> bool:
    """Could a new listener take ``port``? (SO_REUSEADDR: TIME_WAIT leftovers don't count.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _partition_counts(bootstrap: str) -> dict[str, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # All topics: asking Tansu for one topic by name would create it.
    return {name: len(t.partitions) for name, t in admin.list_topics(timeout=10).topics.items()}


def test_broker_starts_takes_the_catalogue_and_frees_its_port_on_stop(tmp_path):
    broker = TansuBroker(log_path=tmp_path / "tansu.log")
    with pytest.raises(BrokerError):
        _ = broker.bootstrap_servers  # not started yet
    with broker:
        assert broker.running
        host, port = broker.bootstrap_servers.split(":")
        assert host == "127.0.0.1"
        assert not _port_is_bindable(int(port))

        created = broker.create_topics()
        assert sorted(created) == sorted(t.name for t in ALL_TOPICS)
        counts = _partition_counts(broker.bootstrap_servers)
        for topic in ALL_TOPICS:
            assert counts[topic.name] == topic.partitions, topic.name
        assert broker.create_topics() == []  # idempotent
    assert not broker.running
    assert broker.pid is None
    assert _port_is_bindable(int(port))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
    assert "listening on" in (tmp_path / "tansu.log").read_text()
    broker.stop()  # idempotent


def test_broker_on_a_given_port_refuses_a_taken_one(tmp_path):
    port = free_port()
    with TansuBroker(port, log_path=tmp_path / "a.log") as broker:
        assert broker.bootstrap_servers == f"127.0.0.1:{port}"
        with pytest.raises(BrokerError, match="already in use"):
            TansuBroker(port, log_path=tmp_path / "b.log").start()
        assert broker.running


def test_s3_storage_keeps_the_log_across_a_restart(tmp_path, s3_endpoint):
    """The durable variant (docs/broker-notes.md#durable-storage-on-s3): same cluster id and bucket → same log."""
    bucket = f"tansu-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    env = {"AWS_ENDPOINT": s3_endpoint, "AWS_ALLOW_HTTP": "true"}  # credentials: inherited
    topic = Topic("durable", 2, "test")
    port = free_port()

    def broker() -> TansuBroker:
        return TansuBroker(
            port,
            storage_url=f"s3://{bucket}/",
            cluster_id="framespool-test",
            env=env,
            log_path=tmp_path / "tansu.log",
        )

    with broker() as first:
        first.create_topics([topic])
        with LogProducer(first.bootstrap_servers) as producer:
            for i in range(10):
                producer.produce(topic.name, f"k{i}", f"v{i}".encode(), partition=i % 2)
    with broker() as second:
        assert second.create_topics([topic]) == []  # still there
        records = read_all(second.bootstrap_servers, topic.name, timeout_s=20)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(10))
