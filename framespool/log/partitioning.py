"""Where a keyed record lives: Kafka's default partitioner, shared by every adapter.

Keyed records are partitioned with Kafka's murmur2 (the Java client's and
aiokafka's default), not librdkafka's default CRC32, so that
:func:`partition_for_key`, ``LogProducer`` (``partitioner=murmur2_random``) and the
in-memory fake agree on where a key lives. Pure: no IO.
"""

from __future__ import annotations


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (``org.apache.kafka.common.utils.Utils.murmur2``), unsigned 32 bit."""
    m = 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    tail = length & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for_key(key: str | bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner puts ``key`` in.

    ``(murmur2(utf8(key)) & 0x7fffffff) % partitions``: the same as the Java client,
    aiokafka (faust) and :class:`LogProducer` (``partitioner=murmur2_random``), so
    a record produced without an explicit partition lands where this says.
    """
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return (murmur2(raw) & 0x7FFFFFFF) % partitions
