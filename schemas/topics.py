"""The topic catalogue: every topic, consumer group and store name in one place.

Partition counts are fixed up front: keyed placement depends on them (a key's
partition is murmur2(key) mod count), and the in-memory Tansu broker cannot add
partitions at all (docs/broker-notes.md#tansu-what-is-broken); topics are created
explicitly, never auto-created.

Disk is bounded by time (docs/design.md#the-log): every topic has a retention,
and segments roll daily so that Kafka, which deletes whole segments, frees an
expired day within a day. The scheduler and admission inputs may expire because
recovery starts from the newest snapshot (published every few seconds) and
replays only the suffix after it; job-events keep the audit trail for 30 days;
progress and assignments matter only while a run lives. No topic is compacted:
each is a stream of events whose history matters (a job's timeline, a cell's
inputs), not a table of latest values per key.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic as created: name, partition count, and how long the broker keeps records.

    ``retention_ms``/``retention_bytes``/``segment_ms`` (None: the broker's
    default) become the topic configs ``retention.ms``/``retention.bytes``/
    ``segment.ms``. Kafka honours them; Tansu accepts and ignores them. Bounded retention is safe
    for a stateful processor's input only because recovery starts from the newest
    shared snapshot (``framespool.processors.shared_snapshots``), published every
    few seconds: keep retention far above the publish interval plus the longest
    outage to survive.
    """

    name: str
    partitions: int
    key: str  # what the record key is, for readers of the catalogue
    retention_ms: int | None = None
    retention_bytes: int | None = None  # per partition, as Kafka counts it
    segment_ms: int | None = DAY_MS  # a segment rolls at least this often

    def configs(self) -> dict[str, str]:
        """The topic configs to create it with (and to set on an existing one)."""
        out = {}
        if self.retention_ms is not None:
            out["retention.ms"] = str(self.retention_ms)
        if self.retention_bytes is not None:
            out["retention.bytes"] = str(self.retention_bytes)
        if self.segment_ms is not None:
            out["segment.ms"] = str(self.segment_ms)
        return out


# The processors' inputs are folded into snapshots, so they need not be kept forever.
INPUT_RETENTION_MS = 7 * DAY_MS
AUDIT_RETENTION_MS = 30 * DAY_MS  # job-events and dead letters: the audit trail
LIVE_RETENTION_MS = DAY_MS  # progress and instructions: useful while a run lives

COMMANDS = Topic("framespool.commands", 4, "tenant", retention_ms=INPUT_RETENTION_MS)
SCHEDULER = Topic(
    "framespool.scheduler",
    4,
    "cell id; partition p is cell 'cell-<p>'",
    retention_ms=INPUT_RETENTION_MS,
)
ASSIGNMENTS = Topic("framespool.assignments", 8, "node id", retention_ms=LIVE_RETENTION_MS)
JOB_EVENTS = Topic("framespool.job-events", 4, "job id", retention_ms=AUDIT_RETENTION_MS)
PROGRESS = Topic("framespool.progress", 4, "job id", retention_ms=LIVE_RETENTION_MS)
DEAD_LETTER = Topic("framespool.dead-letter", 1, "original key", retention_ms=AUDIT_RETENTION_MS)

ALL_TOPICS = (COMMANDS, SCHEDULER, ASSIGNMENTS, JOB_EVENTS, PROGRESS, DEAD_LETTER)


class Topics(Protocol):
    """The catalogue's shape, for code that takes its topics as a parameter: this
    module itself (the default everywhere) or a :class:`TopicSet` of renamed copies."""

    @property
    def COMMANDS(self) -> Topic: ...

    @property
    def SCHEDULER(self) -> Topic: ...

    @property
    def ASSIGNMENTS(self) -> Topic: ...

    @property
    def JOB_EVENTS(self) -> Topic: ...

    @property
    def PROGRESS(self) -> Topic: ...

    @property
    def DEAD_LETTER(self) -> Topic: ...


@dataclass(frozen=True, slots=True)
class TopicSet:
    """The catalogue's topics under other names, same partition counts and configs:
    how tests (``fresh_topics``) and ``--topic-suffix`` runs share one broker."""

    COMMANDS: Topic
    SCHEDULER: Topic
    ASSIGNMENTS: Topic
    JOB_EVENTS: Topic
    PROGRESS: Topic
    DEAD_LETTER: Topic
    suffix: str = ""

    @classmethod
    def with_suffix(cls, suffix: str) -> TopicSet:
        """Every catalogue topic renamed ``<name>.<suffix>``."""
        renamed = {
            name: replace(t, name=f"{t.name}.{suffix}")
            for name, t in zip(
                ("COMMANDS", "SCHEDULER", "ASSIGNMENTS", "JOB_EVENTS", "PROGRESS", "DEAD_LETTER"),
                ALL_TOPICS,
                strict=True,
            )
        }
        return cls(**renamed, suffix=suffix)

    @property
    def all(self) -> tuple[Topic, ...]:
        return (
            self.COMMANDS,
            self.SCHEDULER,
            self.ASSIGNMENTS,
            self.JOB_EVENTS,
            self.PROGRESS,
            self.DEAD_LETTER,
        )


# Consumer groups
ADMISSION_GROUP = "framespool-admission"
SCHEDULER_GROUP = "framespool-scheduler"
PROJECTIONS_GROUP = "framespool-projections"
WEBHOOKS_GROUP = "framespool-webhooks"


def agent_group(node_id: str) -> str:
    """Each agent keeps its position under its own group (manual assignment)."""
    return f"framespool-agent-{node_id}"


# Store names (rocksdict directories under a process's data dir)
SCHEDULER_STORE = "scheduler-cells"
ADMISSION_STORE = "admission"
PROJECTION_STORE = "projections"
STORAGE_LEDGER = "storage-ledger"  # the API's count of each tenant's stored objects


def cell_of_partition(partition: int) -> str:
    return f"cell-{partition}"


def partition_of_cell(cell: str) -> int:
    """Cells are named ``cell-<partition>``; anything else is a caller bug."""
    prefix, _, number = cell.partition("-")
    if prefix != "cell" or not (number.isascii() and number.isdigit()):
        raise ValueError(f"cell id {cell!r} is not of the form 'cell-<n>'")
    return int(number)
