"""The log port: what the shells ask of the log, as small Protocols, plus the values
and errors that cross it.

Two adapters implement it: ``framespool.log.kafka`` (confluent-kafka against a
Kafka-compatible broker) and ``framespool.log.memory`` (an in-memory fake for unit
tests). ``tests/integration/test_log_contract.py`` runs one suite against both, so
a shell tested with the fake behaves the same against the broker.

The semantics the shells rely on (both adapters honour them):

1. Topics exist before use; producing to or reading an unknown topic is refused
   (:class:`DeliveryError` / :class:`LogError`), never auto-created.
2. A keyed record without an explicit partition lands in
   ``partition_for_key(key, partitions)``; an explicit partition wins.
3. Within a partition, offsets start at 0, grow by 1 and records are read in
   offset order with their key, value and headers unchanged.
4. A consumer reads from explicit offsets (``assign``) or from its group's
   committed positions (``resume``/``subscribe``); nothing is committed unless
   ``commit`` is called, and a commit stores "the next offset to read".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

Key = str | bytes | None
Headers = Mapping[str, bytes | str] | Sequence[tuple[str, bytes | str]] | None


class LogError(Exception):
    """The log refused or lost something; the message says which topic and why."""


class DeliveryError(LogError):
    """A record was not written; ``reason`` is the adapter's (e.g. librdkafka's) error."""

    def __init__(self, topic: str, key: bytes | None, reason: str) -> None:
        self.topic = topic
        self.key = key
        self.reason = reason
        super().__init__(f"delivery to topic {topic!r} (key {key!r}) failed: {reason}")


class TopicMismatch(LogError):
    """A topic exists with another partition count than the catalogue says."""


@dataclass(frozen=True, slots=True)
class Delivered:
    """Where a record landed."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed record. ``timestamp_ms`` is the broker/producer timestamp, if any."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or None."""
        found = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found


class TopicPartition(Protocol):
    """A partition handed to rebalance callbacks (confluent's ``TopicPartition`` is one)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


PartitionsCallback = Callable[[list[TopicPartition]], None]
DeliveryCallback = Callable[[DeliveryError | None, Delivered | None], None]


class Sender(Protocol):
    """Writes one record and waits for it: the HTTP API and the dead-letter path."""

    async def send(
        self,
        topic: str,
        key: Key,
        value: bytes | None,
        partition: int | None = None,
        headers: Headers = None,
    ) -> Delivered: ...


class Producer(Sender, Protocol):
    """Queues records (``produce``) and makes them durable (``flush``): every shell."""

    def produce(
        self,
        topic: str,
        key: Key,
        value: bytes | None,
        partition: int | None = None,
        headers: Headers = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None: ...

    def flush(self, timeout: float = 30.0) -> None: ...

    def close(self, timeout: float = 30.0) -> None: ...


class Consumer(Protocol):
    """Reads partitions from explicit offsets or a group's positions; commits explicitly."""

    def assign(
        self, topic: str, partitions: Iterable[int], offsets: int | Mapping[int, int] = 0
    ) -> None: ...

    def committed(
        self, topic: str, partitions: Iterable[int], timeout: float = 10.0
    ) -> dict[int, int | None]: ...

    def resume(
        self, topic: str, partitions: Iterable[int], timeout: float = 10.0
    ) -> dict[int, int]: ...

    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None: ...

    def poll(self, timeout: float = 1.0) -> Record | None: ...

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]: ...

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None: ...

    def commit_through(self, record: Record) -> None: ...

    def high_watermark(self, topic: str, partition: int) -> int | None: ...

    def partitions_of(self, topic: str, timeout: float = 10.0) -> int: ...

    def close(self) -> None: ...


class ProducerFactory(Protocol):
    """How shells make producers: ``LogProducer(bootstrap, **conf)`` or a fake's factory."""

    def __call__(self, bootstrap_servers: str, **conf: object) -> Producer: ...


class ConsumerFactory(Protocol):
    """How shells make consumers: ``LogConsumer(bootstrap, group_id, **conf)`` or a fake's."""

    def __call__(
        self,
        bootstrap_servers: str,
        group_id: str | None = None,
        *,
        session_timeout_ms: int = ...,
        heartbeat_interval_ms: int = ...,
        **conf: object,
    ) -> Consumer: ...
