"""Shared fixtures: a Kafka-compatible broker, an S3 API server, scratch dirs.

Broker (``kafka_bootstrap``, one per session), first that applies:

1. ``KAFKA_BOOTSTRAP_SERVERS`` if set (an external Kafka);
2. ``FRAMESPOOL_TEST_BROKER=tansu``: the in-memory Tansu broker
   (``framespool.broker.TansuBroker``), the old embedded default, for comparison;
3. a testcontainers Kafka (KRaft) when a Docker engine answers, unless
   ``FRAMESPOOL_TEST_BROKER=embedded``;
4. the same Apache Kafka as ``framespool up`` (``framespool.broker.KafkaBroker``,
   KRaft, jars from Maven Central at the pinned version), its log in the
   session's temporary directory.

The catalogue's topics are created on it once. The log is shared by every test
in the session and cannot be truncated, so tests isolate themselves by topic:
a test that needs empty topics takes ``fresh_topics``, a ``TopicSet`` with the
catalogue's attribute names (``fresh_topics.COMMANDS.name`` ...) whose topics
carry a unique suffix and the catalogue's partition counts. Code under test must
therefore take topic names as parameters rather than import them.

The whole stack (``stack``, one per module, for the integration and e2e tiers): the
module says which by its own ``stack_config`` fixture (a ``StackConfig``: nodes, cells,
time scale, tenants, or the chaos drill's), so what differs between modules stays in
them and starting and stopping is written once.

S3 (``s3_endpoint``, one per session): ``AWS_ENDPOINT_URL`` if set (a real S3 or
MinIO, with the caller's credentials); else moto's server in this process on a
loopback port, with dummy ``AWS_*`` credentials in the environment.
``s3_bucket`` makes an empty bucket per test.

Everything binds 127.0.0.1 on free ports and is stopped at the end.
"""

from __future__ import annotations

import os

# The log adapter tunes its fetch waits for the broker it talks to, at import.
if os.environ.get("FRAMESPOOL_TEST_BROKER") == "tansu":
    os.environ.setdefault("FRAMESPOOL_BROKER", "tansu")
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from framespool.broker import KafkaBroker, TansuBroker, free_port
from framespool.log import create_topics
from framespool.schemas.topics import TopicSet

if TYPE_CHECKING:
    from framespool.stack import Stack, StackConfig

# The helpers' asserts report like the tests' own (they did while they lived in test modules).
pytest.register_assert_rewrite("tests.support")


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:  # no engine, no socket, no permission: all mean "not here"
        return False


TIERS_THAT_START_THINGS = ("integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every integration and e2e test is ``slow`` (it starts a broker, an S3 server or the
    stack), so ``-m "not slow"`` leaves the unit tests that run in well under 2 s."""
    tests = Path(__file__).parent
    for item in items:
        tier = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        if tier in TIERS_THAT_START_THINGS:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """bootstrap.servers of a broker that has the catalogue's topics."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    choice = os.environ.get("FRAMESPOOL_TEST_BROKER", "auto")
    if external:
        create_topics(external)
        yield external
    elif choice == "tansu":
        log_path = tmp_path_factory.mktemp("broker") / "tansu.log"
        with TansuBroker(log_path=log_path) as tansu:
            tansu.create_topics()
            yield tansu.bootstrap_servers
    elif choice not in ("embedded", "kafka") and _docker_answers():
        try:
            from testcontainers.community.kafka import KafkaContainer
        except ImportError:  # testcontainers < 4.15
            from testcontainers.kafka import KafkaContainer
        container = KafkaContainer().with_kraft()
        container.start()
        try:
            bootstrap = container.get_bootstrap_server()
            create_topics(bootstrap)
            yield bootstrap
        finally:
            container.stop()
    else:
        with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
            broker.create_topics()
            yield broker.bootstrap_servers


@pytest.fixture
def fresh_topics(kafka_bootstrap: str) -> TopicSet:
    """Empty copies of the catalogue's topics, created for this test only."""
    topic_set = TopicSet.with_suffix(uuid.uuid4().hex[:10])
    create_topics(kafka_bootstrap, topic_set.all)
    return topic_set


@pytest.fixture(scope="module")
def stack(stack_config: StackConfig) -> Iterator[Stack]:
    """The module's stack, started from its ``stack_config`` before the module's first
    test that takes it and stopped after the module's last."""
    from framespool.stack import Stack  # not at import: the unit tier never starts one

    with Stack(stack_config) as running:
        yield running


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of an S3 API endpoint; credentials are in the environment."""
    external = os.environ.get("AWS_ENDPOINT_URL")
    if external:
        yield external
        return
    from moto.server import ThreadedMotoServer

    env = pytest.MonkeyPatch()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        env.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
        env.delenv(name, raising=False)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        env.undo()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A new, empty bucket on ``s3_endpoint``."""
    import boto3

    name = f"framespool-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def tmp_data_dir(tmp_path: Path) -> Path:
    """An empty directory for one test's process data (rocksdict stores, artifacts)."""
    path = tmp_path / "data"
    path.mkdir()
    return path
