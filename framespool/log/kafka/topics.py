"""Topic creation (theory of operation 1 in ``framespool.log.kafka``): every topic
of the catalogue with its partition count and configs, idempotent, refusing a
topic that exists with another count."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from confluent_kafka import (
    KafkaError,
    KafkaException,
)
from confluent_kafka.admin import AdminClient, NewTopic

from framespool.log.kafka.settings import (
    security_settings,
)
from framespool.log.port import (
    LogError,
    TopicMismatch,
)
from framespool.schemas.topics import ALL_TOPICS, Topic

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------
# Topics
# --------------------------------------------------------------------------
def create_topics(
    bootstrap_servers: str,
    topics: Iterable[Topic] = ALL_TOPICS,
    timeout: float = 10.0,
    **conf: str | int | float | bool,
) -> list[str]:
    """Create ``topics`` with their partition counts; return the names newly created.

    Idempotent: a topic that already exists with the same partition count is fine;
    one with a different count raises :class:`TopicMismatch` (partitions cannot be
    added on Tansu, and keyed placement depends on the count). The replication
    factor is the broker's default; ``Topic.configs()`` (retention) goes along
    with the creation only (an existing topic keeps its configs).
    """
    topics = list(topics)
    wanted = {t.name: t.partitions for t in topics}
    if not wanted:
        return []
    configs = {t.name: t.configs() for t in topics}
    # The AdminClient must stay referenced until its futures resolve
    # (docs/broker-notes.md#confluent-kafka); ``admin`` lives until this function returns.
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **security_settings(), **conf})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=n, config=configs[name]) for name, n in wanted.items()],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        # exception() rather than result(): raising here would tie this frame (and
        # the admin's open connection) into a traceback cycle until the next GC,
        # and Tansu waits ~5 s for open connections when stopped.
        exc = future.exception(timeout=timeout)
        if exc is None:
            created.append(name)
        elif not (
            isinstance(exc, KafkaException)
            and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
        ):
            reason = exc.args[0].str() if isinstance(exc, KafkaException) else repr(exc)
            raise LogError(f"cannot create topic {name!r}: {reason}") from exc
    _check_partition_counts(admin, wanted, timeout)
    existing = [name for name in wanted if name not in created and configs[name]]
    if existing:
        _set_configs(admin, {name: configs[name] for name in existing}, timeout)
    return created


def _set_configs(
    admin: AdminClient, configs: Mapping[str, Mapping[str, str]], timeout: float
) -> None:
    """Bring existing topics' configs (retention) to the catalogue's: incremental
    SETs, so configs the catalogue does not name are left as they are. A broker
    that cannot alter configs (Tansu) is logged and skipped: its topics keep
    what they were created with."""
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                for key, value in entries.items()
            ],
        )
        for name, entries in configs.items()
    ]
    try:
        futures = admin.incremental_alter_configs(resources, request_timeout=timeout)
        for resource, future in futures.items():
            exc = future.exception(timeout=timeout)
            if exc is not None:
                log.warning("topic %s keeps its configs: %s", resource.name, exc)
    except (KafkaException, NotImplementedError) as exc:
        log.warning("topic configs not updated: %s", exc)


def _check_partition_counts(admin: AdminClient, wanted: Mapping[str, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        # All topics, never one by name: a Metadata request for a named topic
        # auto-creates it on Tansu.
        metadata = admin.list_topics(timeout=max(0.1, deadline - time.monotonic()))
        actual = {n: len(metadata.topics[n].partitions) for n in wanted if n in metadata.topics}
        if len(actual) == len(wanted):
            break
        if time.monotonic() >= deadline:  # creation propagates asynchronously on Kafka
            missing = sorted(set(wanted) - set(actual))
            raise LogError(f"topics {missing} not visible in metadata after {timeout} s")
        time.sleep(0.05)
    wrong = {n: (actual[n], wanted[n]) for n in wanted if actual[n] != wanted[n]}
    if wrong:
        detail = ", ".join(
            f"{n!r} has {a} partitions, the catalogue says {w}" for n, (a, w) in wrong.items()
        )
        raise TopicMismatch(
            f"{detail}; partitions cannot be changed in place: recreate the topic "
            "(or the broker's storage) or fix schemas/topics.py"
        )
