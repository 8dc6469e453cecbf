"""The log: the port the shells write and read through, its Kafka adapter and its fake.

``port`` (Protocols, records, errors), ``partitioning`` (where a key lives),
``kafka`` (the confluent-kafka adapter every process uses) and ``memory`` (the
in-memory fake for unit tests); the names below are the public ones.
"""

from framespool.log.kafka import (
    FETCH_WAIT_MS,
    LINGER_MS_PROCESSOR,
    LogConsumer,
    LogProducer,
    Role,
    create_topics,
    read_all,
    read_to_end,
)
from framespool.log.partitioning import murmur2, partition_for_key
from framespool.log.port import (
    Consumer,
    ConsumerFactory,
    Delivered,
    DeliveryError,
    Headers,
    Key,
    LogError,
    Producer,
    ProducerFactory,
    Record,
    Sender,
    TopicMismatch,
    TopicPartition,
)

__all__ = [
    "FETCH_WAIT_MS",
    "LINGER_MS_PROCESSOR",
    "Consumer",
    "ConsumerFactory",
    "Delivered",
    "DeliveryError",
    "Headers",
    "Key",
    "LogConsumer",
    "LogError",
    "LogProducer",
    "Producer",
    "ProducerFactory",
    "Record",
    "Role",
    "Sender",
    "TopicMismatch",
    "TopicPartition",
    "create_topics",
    "murmur2",
    "partition_for_key",
    "read_all",
    "read_to_end",
]
