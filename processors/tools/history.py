"""What the tools share: the log as read, decoding and the re-fold with the processors' own folds.

Theory of operation
-------------------
1. :class:`LogContents` is everything a tool reads: the records of the
   scheduler, job-events, assignments and commands topics, and how far the
   scheduler and admission processors had committed when reading started
   (inputs below a committed offset had all their outputs delivered first).
2. An output of a cell's fold has the event id ``cell-<p>@<offset>/<i>``
   (:func:`framespool.schemas.positions.parse_cell`): the input it came from and its index among that
   input's outputs. That is what orders outputs on their cell's timeline
   across topics and partitions.
3. :class:`Refold` re-folds one scheduler partition with the processor's own
   fold (``SchedulerFold.step``), mirroring the runtime's handling of a fold
   that raises (dead letter ``processing_error``), so a re-fold emits exactly
   what the processor would have. :class:`AdmissionRefold` does the same for
   one commands partition with the admission processor's fold
   (``AdmissionFold.step``), whose outputs are ``admission-<p>@<offset>/<i>``
   (:func:`framespool.schemas.positions.parse_admission`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from framespool.log import Record
from framespool.processors.admission import AdmissionFold
from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.admission import AdmissionConfig, AdmissionState
from framespool.processors.routing import Outgoing
from framespool.processors.scheduler import SchedulerFold
from framespool.processors.tools.decoded import Decoded, fmt_ms
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.deadletter import DeadLetterReason
from framespool.schemas.topics import Topics


def decode_all(records: Iterable[Record]) -> list[Decoded]:
    out = []
    for r in records:
        try:
            out.append(Decoded(r, codec.decode(r.value)))
        except codec.DecodeError as exc:
            out.append(Decoded(r, None, exc.reason))
    return out


@dataclass
class LogContents:
    """Records of the topics the tools read, and the processors' committed positions.

    ``committed``: ``{"scheduler": {partition: next offset}, "admission": {...}}``;
    a partition missing there counts as nothing committed (offset 0).
    """

    scheduler: list[Record] = field(default_factory=list)
    job_events: list[Record] = field(default_factory=list)
    assignments: list[Record] = field(default_factory=list)
    commands: list[Record] = field(default_factory=list)
    committed: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    topics: Topics = catalogue

    def scheduler_partitions(self) -> dict[int, list[Record]]:
        """Scheduler records by partition, each in offset order."""
        parts: dict[int, list[Record]] = {}
        for r in self.scheduler:
            parts.setdefault(r.partition, []).append(r)
        for records in parts.values():
            records.sort(key=lambda r: r.offset)
        return dict(sorted(parts.items()))

    def committed_offset(self, group: str, partition: int) -> int:
        return self.committed.get(group, {}).get(partition, 0)

    def command_partitions(self) -> dict[int, list[Record]]:
        """Commands records by partition, each in offset order."""
        parts: dict[int, list[Record]] = {}
        for r in self.commands:
            parts.setdefault(r.partition, []).append(r)
        for records in parts.values():
            records.sort(key=lambda r: r.offset)
        return dict(sorted(parts.items()))


def as_records(
    topic: str, events: Iterable[Any], partition: int = 0, start: int = 0, key: str | None = None
) -> list[Record]:
    """Events encoded as consecutive records of one partition (tests, forged input)."""
    return [
        Record(
            topic=topic,
            partition=partition,
            offset=start + i,
            key=key.encode() if key else None,
            value=codec.encode(e),
        )
        for i, e in enumerate(events)
    ]


# --------------------------------------------------------------------------
# --until
# --------------------------------------------------------------------------
_EPOCH_MS_MIN = 10**11  # an integer this large is a time in ms, not an offset


@dataclass(frozen=True, slots=True)
class Until:
    """Where a replay stops: after input ``offset`` (inclusive), or before the first
    Tick that moves the cell's clock past ``time_ms``."""

    offset: int | None = None
    time_ms: int | None = None

    def stops_before(self, record: Record, event: Any) -> bool:
        if self.offset is not None:
            return record.offset > self.offset
        return (
            self.time_ms is not None and isinstance(event, ev.Tick) and event.now_ms > self.time_ms
        )

    def describe(self) -> str:
        if self.offset is not None:
            return f"through offset {self.offset}"
        return f"until cell time {fmt_ms(self.time_ms or 0)}"


def parse_until(text: str) -> Until:
    """``123`` (an input offset), ``1790000000000`` (epoch ms) or an ISO-8601 time."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        value = int(text)
        return Until(time_ms=value) if value >= _EPOCH_MS_MIN else Until(offset=value)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--until {text!r} is neither an offset, epoch milliseconds nor an "
            "ISO-8601 time such as 2026-05-01T12:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return Until(time_ms=int(when.timestamp() * 1000))


# --------------------------------------------------------------------------
# The re-fold
# --------------------------------------------------------------------------
class Refold:
    """One scheduler partition re-folded from offset 0 with the processor's own fold."""

    def __init__(
        self, partition: int, config: CellConfig | None = None, topics: Topics = catalogue
    ) -> None:
        self.fold = SchedulerFold(config or CellConfig(), topics)
        self.partition = partition
        self.cell: Cell = self.fold.new_state(partition)
        self.last_offset = -1
        self.processing_errors: list[tuple[int, str]] = []

    @property
    def cell_id(self) -> str:
        return self.cell.cell_id

    def step(self, record: Record) -> list[Outgoing]:
        """What the processor emits for ``record`` (its outputs, or a dead letter)."""
        self.last_offset = record.offset
        try:
            return self.fold.step(self.cell, record)
        except Exception as exc:  # the runtime dead-letters a failing fold and goes on
            self.processing_errors.append((record.offset, repr(exc)))
            return [self.fold.dead_letter(record, DeadLetterReason.PROCESSING_ERROR, repr(exc))]

    def run(self, records: Iterable[Record], until: Until | None = None) -> Refold:
        """Fold ``records`` (in offset order), stopping where ``until`` says."""
        for r in records:
            if until is not None and until.stops_before(
                r, _peek(r) if until.time_ms is not None else None
            ):
                break
            self.step(r)
        return self


class AdmissionRefold:
    """One commands partition re-folded from offset 0 with the admission processor's fold."""

    def __init__(
        self, partition: int, config: AdmissionConfig | None = None, topics: Topics = catalogue
    ) -> None:
        self.fold = AdmissionFold(config or AdmissionConfig(), topics)
        self.partition = partition
        self.state: AdmissionState = self.fold.new_state(partition)
        self.last_offset = -1
        self.processing_errors: list[tuple[int, str]] = []

    @property
    def source(self) -> str:
        """The prefix of this partition's output ids (``admission-<p>``)."""
        return f"admission-{self.partition}"

    def step(self, record: Record) -> list[Outgoing]:
        """What the admission processor emits for ``record`` (outputs, or a dead letter)."""
        self.last_offset = record.offset
        try:
            return self.fold.step(self.state, record)
        except Exception as exc:  # the runtime dead-letters a failing fold and goes on
            self.processing_errors.append((record.offset, repr(exc)))
            return [self.fold.dead_letter(record, DeadLetterReason.PROCESSING_ERROR, repr(exc))]


def _peek(record: Record) -> Any:
    try:
        return codec.decode(record.value)
    except codec.DecodeError:
        return None
