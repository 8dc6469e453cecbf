"""The Compose broker's security on a real Kafka (KRaft, StandardAuthorizer): the
settings and the ACL table of ``compose/init_stack.py``, applied the way init
applies them. A service's principal does what its grant allows (an idempotent
producer, a consumer group, an anonymous consumer) and nothing else; a client
without a principal (a generator's) is not let in at all."""

from __future__ import annotations

import importlib.util
import secrets
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from framespool.broker import KafkaBroker
from framespool.log import read_all
from framespool.log.kafka import security_settings
from framespool.schemas import topics as catalogue

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def init_stack():
    spec = importlib.util.spec_from_file_location(
        "compose_init_stack", ROOT / "compose" / "init_stack.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def env_of(user: str, password: str, mechanism: str) -> dict[str, str]:
    return {
        "FRAMESPOOL_KAFKA_SASL_USERNAME": user,
        "FRAMESPOOL_KAFKA_SASL_PASSWORD": password,
        "FRAMESPOOL_KAFKA_SASL_MECHANISM": mechanism,
        "FRAMESPOOL_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    }


def produce(bootstrap: str, env: dict[str, str], topic: str) -> KafkaError | None:
    """One record through an idempotent producer as ``env``'s principal; its error."""
    errors: list[KafkaError | None] = []
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "message.timeout.ms": 15000,
            **security_settings(env),
        }
    )
    p.produce(topic, b"v", key=b"k", partition=0, on_delivery=lambda e, _m: errors.append(e))
    p.flush(20)
    return errors[0] if errors else KafkaError(KafkaError._MSG_TIMED_OUT)


def consume(
    bootstrap: str, env: dict[str, str], topic: str, group: str, timeout_s: float = 20.0
) -> KafkaError | None:
    """Read partition 0 of ``topic`` from offset 0 and commit under ``group``; the
    first error (None: it read a record and committed; a topic it may not read
    yields nothing, so a time-out)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            **security_settings(env),
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                return msg.error()
            try:
                c.commit(message=msg, asynchronous=False)
            except Exception as exc:  # KafkaException: the group is not ours
                return exc.args[0]
            return None
        return KafkaError(KafkaError._TIMED_OUT)
    finally:
        c.close()


def test_each_principal_gets_its_grant_and_nothing_else(tmp_path, monkeypatch):
    init = init_stack()
    admin_password = secrets.token_hex(16)
    settings = init.broker_security(admin_password, ["PLAINTEXT"], "CONTROLLER")
    admin_env = env_of(init.SUPER_USER, admin_password, init.ADMIN_MECHANISM)
    for k, v in admin_env.items():
        monkeypatch.setenv(k, v)  # the broker's readiness probe and init log in as admin
    with KafkaBroker(tmp_path / "kafka", settings=settings, heap_mb=384) as broker:
        bootstrap = broker.bootstrap_servers
        broker.create_topics(catalogue.ALL_TOPICS)
        table = init.acl_table({"agent-0": ("agent", "node-0"), "api": ("api", None)})
        passwords = {p: secrets.token_hex(16) for p in table}
        assert init.apply_principals(bootstrap, table, passwords) == len(init.acl_bindings(table))
        agent = env_of("agent-0", passwords["agent-0"], init.SERVICE_MECHANISM)
        api = env_of("api", passwords["api"], init.SERVICE_MECHANISM)

        # what the grant allows: an idempotent producer (no cluster permission),
        # its own consumer group, the API's anonymous consumers. A new SCRAM
        # credential reaches the broker through the metadata log: the first
        # login may come before it (a client retries, as the services do).
        for _ in range(5):
            if produce(bootstrap, agent, catalogue.PROGRESS.name) is None:
                break
            time.sleep(1)
        else:
            pytest.fail("agent-0 never produced to its progress topic")
        assert produce(bootstrap, admin_env, catalogue.ASSIGNMENTS.name) is None
        assert (
            consume(bootstrap, agent, catalogue.ASSIGNMENTS.name, "framespool-agent-node-0") is None
        )
        for k, v in api.items():
            monkeypatch.setenv(k, v)
        assert len(read_all(bootstrap, catalogue.PROGRESS.name, partitions=[0])) >= 1

        # what it does not: another topic, another's group, a topic it only reads
        refused = KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert produce(bootstrap, agent, catalogue.COMMANDS.name).code() == refused
        assert produce(bootstrap, agent, catalogue.ASSIGNMENTS.name).code() == refused
        assert produce(bootstrap, api, catalogue.JOB_EVENTS.name).code() == refused
        # the commit asks the group's coordinator first; on a fresh broker that
        # can answer "waiting for coordinator" before the authorizer's refusal
        for _ in range(10):
            denied = consume(
                bootstrap, agent, catalogue.ASSIGNMENTS.name, "framespool-agent-node-1"
            )
            if denied is None or denied.code() != KafkaError._WAIT_COORD:
                break
            time.sleep(1)
        assert denied is not None and denied.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        denied = consume(bootstrap, api, catalogue.ASSIGNMENTS.name, "framespool-anonymous-x", 5)
        assert denied is not None and denied.code() in (refused, KafkaError._TIMED_OUT)

        # no principal (a generator's lot), or a wrong password: not let in
        for who in (env_of("agent-0", "guess", init.SERVICE_MECHANISM), {}):
            failed = produce(bootstrap, who, catalogue.PROGRESS.name)
            assert failed is not None
