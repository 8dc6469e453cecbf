"""Malformed records for a chaos drill: one undecodable record of each kind per
consumed topic, plus misplaced valid events (wrong type, wrong cell), each made
unique by a marker so that its dead letter can be found by value (pure: the
marker is an argument)."""

from __future__ import annotations

from dataclasses import dataclass

from framespool.schemas import events as ev
from framespool.schemas.topics import Topics


@dataclass(frozen=True, slots=True)
class Malformed:
    topic: str
    key: bytes | None
    partition: int
    value: bytes
    kind: str


def malformed_records(topics: Topics, node: str, marker: str) -> list[Malformed]:
    """One undecodable record of each kind per consumed topic (the assignments one
    keyed for ``node``, whose agent reads it), plus misplaced valid events where a
    consumer can tell (wrong type, wrong cell). ``marker`` makes every value
    unique, so its dead letter can be found by value."""
    from framespool.log.partitioning import partition_for_key
    from framespool.schemas import codec

    def undecodable(topic: str) -> list[tuple[str, bytes]]:
        tag = f"{marker}/{topic}".encode()
        valid = codec.encode(
            ev.Tick(event_id=f"chaos-{marker}-{topic}", ts_ms=0, cell="cell-0", now_ms=0)
        )
        return [
            ("bad_magic", b"chaos:" + tag),
            ("unknown_fingerprint", codec.MAGIC + b"\xfe" * 8 + tag),
            ("malformed_body", valid[: codec.HEADER_LEN] + b"\xff" * 12 + tag),
            ("truncated", valid[:-3]),
        ]

    out: list[Malformed] = []
    placements = [
        (topics.COMMANDS.name, b"acme", partition_for_key("acme", topics.COMMANDS.partitions)),
        (topics.SCHEDULER.name, b"cell-0", 0),
        (
            topics.ASSIGNMENTS.name,
            node.encode(),
            partition_for_key(node, topics.ASSIGNMENTS.partitions),
        ),
        (
            topics.JOB_EVENTS.name,
            b"chaos",
            partition_for_key("chaos", topics.JOB_EVENTS.partitions),
        ),
        (topics.PROGRESS.name, b"chaos", partition_for_key("chaos", topics.PROGRESS.partitions)),
    ]
    for topic, key, partition in placements:
        for kind, value in undecodable(topic):
            out.append(Malformed(topic, key, partition, value, kind))
    wrong_type = codec.encode(
        ev.Tick(event_id=f"chaos-{marker}-type", ts_ms=0, cell="cell-0", now_ms=0)
    )
    out.append(Malformed(topics.COMMANDS.name, b"acme", placements[0][2], wrong_type, "wrong_type"))
    out.append(
        Malformed(
            topics.ASSIGNMENTS.name,
            node.encode(),
            placements[2][2],
            codec.encode(
                ev.Tick(event_id=f"chaos-{marker}-atype", ts_ms=0, cell="cell-0", now_ms=0)
            ),
            "wrong_type",
        )
    )
    out.append(
        Malformed(
            topics.SCHEDULER.name,
            b"cell-0",
            0,
            codec.encode(
                ev.JobCompleted(event_id=f"chaos-{marker}-stype", ts_ms=0, job_id="chaos", run=1)
            ),
            "wrong_type",
        )
    )
    out.append(
        Malformed(
            topics.SCHEDULER.name,
            b"cell-0",
            0,
            codec.encode(
                ev.Tick(event_id=f"chaos-{marker}-cell", ts_ms=0, cell="cell-1", now_ms=1)
            ),
            "wrong_cell",
        )
    )
    return out
