"""Where each output of a fold goes: topic, key and partition (pure).

The rules (docs/design.md#the-log):

- ``StartRun``/``StopRun``/``CheckpointRun`` (``framespool.processors.core.AGENT_COMMANDS``)
  go to the assignments topic, keyed by ``node_id``, at the partition the
  node's agent reads (``partition_for_key(node_id)``);
- ``JobAdmitted`` goes to the scheduler topic at its cell's partition (key: the
  cell id) *and* to job-events (key: the job id);
- a :class:`~framespool.processors.core.admission.CellCommand` (a forwarded ``CancelJob``)
  goes to the scheduler topic at its cell's partition;
- ``CellOffer`` goes to *every* partition of the commands topic (key: the cell
  id), so each admission partition folds every cell's offer in its own log
  order and routing stays a pure function of that log, *and* to job-events
  (key: the cell id), where the API's cluster projection keeps each cell's
  latest offer to refuse at submit a job past its tier's wait limit;
- ``JobRerouted`` goes to job-events (key: the job id) *and* to the commands
  topic keyed by its tenant, the partition whose admission state decided it;
- every other output is a job event for job-events, keyed by its ``job_id``, or
  by ``node_id`` (``NodeStateChanged``), ``cell`` (``CellStatus``, ``CellOffer``), ``subject``
  (``ReportIgnored``) or ``key`` (``BreakerTripped``);
- a node's own ``NodeStateChanged`` (``gpu == -1``: registered, DOWN, ...) goes
  to the assignments topic too, keyed by ``node_id``: its agent reads only
  that partition, and heals itself from a ``DOWN`` there.

Partitions are always computed here (Kafka's murmur2 for keyed topics, the
cell number for the scheduler topic), so placement never depends on which
producer client sends the record. ``topics`` is anything with the catalogue's
attribute names (``framespool.schemas.topics`` itself, or a test's ``TopicSet``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from framespool.log.partitioning import partition_for_key
from framespool.log.port import Record
from framespool.processors.core import AGENT_COMMANDS
from framespool.processors.core.admission import CellCommand
from framespool.schemas import codec, deadletter
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.deadletter import DeadLetterReason
from framespool.schemas.topics import Topics, partition_of_cell


class RoutingError(ValueError):
    """An output the router has no rule for, or a cell with no partition: a bug upstream."""


@dataclass(frozen=True, slots=True)
class Destination:
    topic: str
    key: str
    partition: int | None


# A job's events (queued, assigned, completed, ...) and a node's commands reuse
# one key: its murmur2 (pure Python, ~3.5 us) is computed once while it is recent.
_partition = functools.lru_cache(maxsize=16384)(partition_for_key)


def _keyed(topic: Any, key: str) -> Destination:
    """Cost: one LRU lookup; a miss adds murmur2 of the key (pure, so replay-safe)."""
    return Destination(topic.name, key, _partition(key, topic.partitions))


def cell_destination(cell: str, topics: Topics = catalogue) -> Destination:
    """The scheduler topic's partition for ``cell`` (``cell-<p>`` lives in partition p)."""
    try:
        partition = partition_of_cell(cell)
    except ValueError as exc:
        raise RoutingError(str(exc)) from None
    if partition >= topics.SCHEDULER.partitions:
        raise RoutingError(
            f"cell {cell!r} needs partition {partition} but {topics.SCHEDULER.name} "
            f"has {topics.SCHEDULER.partitions}"
        )
    return Destination(topics.SCHEDULER.name, cell, partition)


def job_event_key(output: Any) -> str:
    """The job-events key of a job event (see the module docstring)."""
    if isinstance(output, ev.NodeStateChanged):
        return output.node_id
    if isinstance(output, (ev.CellStatus, ev.CellOffer)):
        return output.cell
    if isinstance(output, ev.ReportIgnored):
        return output.subject
    if isinstance(output, ev.BreakerTripped):
        return output.key
    job_id = getattr(output, "job_id", None)
    if job_id is None:
        spec = getattr(output, "spec", None)
        job_id = getattr(spec, "job_id", None)
    if not isinstance(job_id, str):
        raise RoutingError(f"no job-events key for {type(output).__name__}")
    return job_id


def route(output: Any, topics: Topics = catalogue) -> Destination:
    """The one destination of a cell output (``Cell.apply``)."""
    if isinstance(output, AGENT_COMMANDS):
        return _keyed(topics.ASSIGNMENTS, output.node_id)
    if isinstance(output, (CellCommand, ev.JobAdmitted, ev.CellOffer, ev.JobRerouted)):
        raise RoutingError(f"{type(output).__name__} is not a cell output; use destinations()")
    return _keyed(topics.JOB_EVENTS, job_event_key(output))


def destinations(output: Any, topics: Topics = catalogue) -> tuple[Destination, ...]:
    """Every destination of an output of either fold (admission or cell)."""
    if isinstance(output, CellCommand):
        return (cell_destination(output.cell, topics),)
    if isinstance(output, ev.JobAdmitted):
        return (
            cell_destination(output.cell, topics),
            _keyed(topics.JOB_EVENTS, output.spec.job_id),
        )
    if isinstance(output, ev.CellOffer):
        return tuple(
            Destination(topics.COMMANDS.name, output.cell, p)
            for p in range(topics.COMMANDS.partitions)
        ) + (_keyed(topics.JOB_EVENTS, output.cell),)
    if isinstance(output, ev.JobRerouted):
        return (
            _keyed(topics.JOB_EVENTS, output.job_id),
            _keyed(topics.COMMANDS, output.tenant),
        )
    if isinstance(output, ev.NodeStateChanged) and output.gpu < 0:
        # the node's agent reads only its assignments partition: that is where it
        # learns it was declared DOWN (agents/healing.py)
        return (route(output, topics), _keyed(topics.ASSIGNMENTS, output.node_id))
    return (route(output, topics),)


def payload(output: Any) -> Any:
    """The event to encode for an output (unwraps a :class:`CellCommand`)."""
    return output.command if isinstance(output, CellCommand) else output


# --------------------------------------------------------------------------
# Records in, records out
# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Outgoing:
    """One record to produce. ``event`` is the output (None for a dead letter)."""

    topic: str
    key: bytes | None
    partition: int | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    event: Any = None
    reason: str = ""  # why a dead letter was dead-lettered

    def with_headers(self, extra: tuple[tuple[str, bytes], ...]) -> Outgoing:
        """This record with ``extra`` headers appended (the fencing stamp, per output).
        Built field by field: half the cost of ``dataclasses.replace``; a new field
        must be passed on here too."""
        return Outgoing(
            self.topic,
            self.key,
            self.partition,
            self.value,
            (*self.headers, *extra),
            self.event,
            self.reason,
        )


def encode_outputs(outputs: list[Any], topics: Topics = catalogue) -> list[Outgoing]:
    """Every record the outputs of one input become, in output order."""
    records = []
    for output in outputs:
        value = codec.encode(payload(output))
        for d in destinations(output, topics):
            records.append(Outgoing(d.topic, d.key.encode(), d.partition, value, event=output))
    return records


def dead_letter(
    record: Record, reason: str, detail: str, processor: str, topics: Topics = catalogue
) -> Outgoing:
    """``record`` for the dead-letter topic: original key and value, its own headers
    plus the dead-letter headers (``framespool.schemas.deadletter``)."""
    headers = tuple(record.headers) + deadletter.headers(
        reason, detail, processor, record.topic, record.partition, record.offset
    )
    return Outgoing(topics.DEAD_LETTER.name, record.key, None, record.value, headers, reason=reason)


def decode_input(
    record: Record, accepted: tuple[type, ...], processor: str, topics: Topics = catalogue
) -> tuple[Any, Outgoing | None]:
    """``(event, None)`` for a record ``processor`` folds, else ``(None, dead letter)``."""
    if record.value is None:
        return None, dead_letter(
            record, DeadLetterReason.NO_VALUE, "record has no value", processor, topics
        )
    try:
        event = codec.decode(record.value)
    except codec.DecodeError as exc:
        return None, dead_letter(record, exc.reason, str(exc), processor, topics)
    if not isinstance(event, accepted):
        return None, dead_letter(
            record,
            DeadLetterReason.UNEXPECTED_TYPE,
            f"{type(event).__name__} is not an input of the {processor} processor",
            processor,
            topics,
        )
    return event, None
