"""The dead-letter topic's vocabulary: why a record was dead-lettered, and the
headers that say so.

Every process that consumes (the admission and scheduler processors, the
projections, the node agents) dead-letters a record it cannot take with these
reasons and these headers, built by :func:`headers`, so operators, ``replay``
and the chaos drill read one format whoever wrote it. The dead letter keeps
the original key and value (and the record's own headers before these).

| reason (``reason`` header) | the record                                              | found by         |
|----------------------------|---------------------------------------------------------|------------------|
| ``truncated``              | ends before its single-object header or body is whole   | the codec        |
| ``bad_magic``              | does not start with the Avro single-object marker       | the codec        |
| ``unknown_fingerprint``    | names a writer schema nobody registered                 | the codec        |
| ``malformed_body``         | has a body its writer schema cannot read                | the codec        |
| ``no_value``               | has no value (a tombstone)                              | every consumer   |
| ``unexpected_type``        | decodes, but is not an input of the consumer that read it | every consumer |
| ``wrong_partition``        | is a cell's input on another cell's partition           | scheduler        |
| ``processing_error``       | made the fold raise (a core bug: ``verify`` reports it) | processors       |

| header             | value                                                            |
|--------------------|------------------------------------------------------------------|
| ``reason``         | one of the reasons above                                         |
| ``detail``         | what was wrong, for a person (at most 500 characters)            |
| ``processor``      | who dead-lettered it: ``admission``, ``scheduler``, ``projections`` or the agent's group id |
| ``source_topic``   | the topic the record was read from                               |
| ``source_partition`` | its partition (decimal)                                        |
| ``source_offset``  | its offset (decimal)                                             |

Header values are UTF-8 bytes.
"""

from __future__ import annotations

from enum import StrEnum

DETAIL_LIMIT = 500


class DeadLetterReason(StrEnum):
    TRUNCATED = "truncated"
    BAD_MAGIC = "bad_magic"
    UNKNOWN_FINGERPRINT = "unknown_fingerprint"
    MALFORMED_BODY = "malformed_body"
    NO_VALUE = "no_value"
    UNEXPECTED_TYPE = "unexpected_type"
    WRONG_PARTITION = "wrong_partition"
    PROCESSING_ERROR = "processing_error"


class DeadLetterHeader(StrEnum):
    REASON = "reason"
    DETAIL = "detail"
    PROCESSOR = "processor"
    SOURCE_TOPIC = "source_topic"
    SOURCE_PARTITION = "source_partition"
    SOURCE_OFFSET = "source_offset"


def headers(
    reason: str, detail: str, processor: str, topic: str, partition: int, offset: int
) -> tuple[tuple[str, bytes], ...]:
    """The headers a dead letter carries (after the record's own), in table order."""
    return (
        (DeadLetterHeader.REASON.value, str(reason).encode()),
        (DeadLetterHeader.DETAIL.value, detail[:DETAIL_LIMIT].encode()),
        (DeadLetterHeader.PROCESSOR.value, processor.encode()),
        (DeadLetterHeader.SOURCE_TOPIC.value, topic.encode()),
        (DeadLetterHeader.SOURCE_PARTITION.value, str(partition).encode()),
        (DeadLetterHeader.SOURCE_OFFSET.value, str(offset).encode()),
    )
