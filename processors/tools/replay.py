"""``replay``: re-fold the scheduler and commands topics with the cores and compare
with what was emitted.

Theory of operation
-------------------
Outputs are deterministic and their event ids name their input
(``cell-<p>@<offset>/<i>``), so the re-fold's output and the emitted record with
the same (topic, event id) must carry the same bytes, on the same partition.
For each replayed input, each expected output is:

- **matched**: emitted, every copy byte-identical on the expected partition
  (extra identical copies are at-least-once re-deliveries: counted, fine);
- **differing**: emitted with other bytes or on another partition;
- **missing**: not emitted although its input is below the scheduler's committed
  offset (the processor commits only after its outputs were acknowledged);
- **pending**: not emitted, input not committed yet (the processor is behind).

A cell's ``CellOffer`` (on every commands partition) and ``JobRerouted`` (on
job-events and the commands topic) are checked like any output, each copy on
its own partition; when the commands topic was not read they are counted
``not_read``.

An emitted output of a replayed cell whose id the re-fold never produced is
**unexpected** if its input was replayed (it names an offset at or below the
last one replayed); outputs of later inputs are left out (``beyond``).
Differing, missing and unexpected are divergences; the first one, in input
order, is reported exactly: input position, expected and emitted event.

Admission promises the same determinism (docs/design.md#the-log), so the
commands topic is re-folded too, one ``AdmissionState`` per partition through
the admission processor's own fold, and its outputs (``admission-<p>@<offset>/<i>``:
``JobAdmitted`` on the cell's scheduler partition and on job-events,
``JobRejected``/``ReportIgnored`` on job-events, forwarded ``CancelJob`` on the
scheduler topic) are held to the same rules, against the admission group's
committed offsets. Its counts are kept apart (``admission``); its divergences
join the cells' (position ``admission-<p>@<offset>``). ``until`` and ``cells``
bound the cell replay only; a replay of chosen cells leaves admission out.

When the log's head is gone (retention, docs/design.md#the-log), a cell whose
first stored input is past offset 0 cannot be re-folded from an empty cell. It
starts instead from a **snapshot** (``starts``: the processors' shared snapshot,
state and offset) at or after the offset before its first stored input: what
replay then proves is that every output of an input after the snapshot matches
the re-fold of the log from that state on; outputs of inputs before it are
counted ``before_snapshot`` and not checked (``verify``'s log-wide invariants
still hold over what is left). A cell with a gone head and no such snapshot is
**unprovable**: nothing of it is compared, the report says so and is not ok.
A snapshot may also be used with the whole log there (``framespool replay
--from-snapshot``): faster, and proves the suffix only. Admission partitions
with a gone head are reported unprovable (their snapshots are not loaded).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from framespool.log import Record
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig
from framespool.processors.routing import payload
from framespool.processors.tools.decoded import diff_fields, event_dict
from framespool.processors.tools.history import (
    AdmissionRefold,
    LogContents,
    Refold,
    Until,
    decode_all,
)
from framespool.schemas import codec, positions
from framespool.schemas import topics as catalogue
from framespool.schemas.topics import Topics

MISSING, DIFFERING, UNEXPECTED = "missing", "differing", "unexpected"


@dataclass
class Divergence:
    kind: str
    cell: str
    offset: int  # the input's offset in the cell's partition
    index: int  # the output's index among that input's outputs
    topic: str
    event_id: str
    input: Any = None  # the input event (None if undecodable or not replayed)
    expected: Any = None
    expected_partition: int | None = None
    emitted: Any = None
    emitted_at: tuple[int, int] = (-1, -1)  # (partition, offset) of the emitted record
    fields: list[str] = field(default_factory=list)

    @property
    def position(self) -> str:
        return f"{self.cell}@{self.offset}"

    def sort_key(self) -> tuple:
        return (self.cell, self.offset, self.index, self.topic)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "position": self.position,
            "index": self.index,
            "topic": self.topic,
            "event_id": self.event_id,
            "input": event_dict(self.input),
            "expected": event_dict(self.expected),
            "expected_partition": self.expected_partition,
            "emitted": event_dict(self.emitted),
            "emitted_at": (
                {"partition": self.emitted_at[0], "offset": self.emitted_at[1]}
                if self.emitted is not None
                else None
            ),
            "differing_fields": self.fields,
        }

    def describe(self) -> str:
        where = f"{self.position} output #{self.index} on {self.topic}"
        head = {
            MISSING: "missing output",
            DIFFERING: "emitted output differs",
            UNEXPECTED: "unexpected output",
        }[self.kind]
        lines = [f"{head} at {where}"]
        if self.input is not None:
            lines.append(f"  input:    {type(self.input).__name__} {self.input.event_id}")
        if self.expected is not None:
            lines.append(
                f"  expected: {_one_line(self.expected)} (partition {self.expected_partition})"
            )
        if self.emitted is not None:
            lines.append(
                f"  emitted:  {_one_line(self.emitted)} "
                f"(partition {self.emitted_at[0]}, offset {self.emitted_at[1]})"
            )
        if self.fields:
            lines.append(f"  differing fields: {', '.join(self.fields)}")
        return "\n".join(lines)


def _one_line(event: Any, limit: int = 400) -> str:
    text = repr(event)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass
class ReplayReport:
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)
    divergences: list[Divergence] = field(default_factory=list)
    until: str = ""
    committed_known: bool = True
    admission: dict[str, dict[str, Any]] = field(default_factory=dict)  # per commands partition
    admission_counts: Counter = field(default_factory=Counter)
    # position -> why it cannot be re-folded (its log's head is gone, no snapshot covers it)
    unprovable: dict[str, str] = field(default_factory=dict)
    # (topic, partition) whose head expired: an output expected there and not found
    # may have been there (counted ``expired``, not missing)
    expired: set[tuple[str, int]] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.divergences and not self.unprovable

    @property
    def first(self) -> Divergence | None:
        return min(self.divergences, key=Divergence.sort_key) if self.divergences else None

    def to_dict(self, limit: int = 50) -> dict[str, Any]:
        ordered = sorted(self.divergences, key=Divergence.sort_key)
        return {
            "ok": self.ok,
            "until": self.until,
            "committed_known": self.committed_known,
            "cells": self.cells,
            "counts": dict(sorted(self.counts.items())),
            "admission": {
                "partitions": self.admission,
                "counts": dict(sorted(self.admission_counts.items())),
            },
            "unprovable": self.unprovable,
            "first_divergence": ordered[0].to_dict() if ordered else None,
            "divergences": [d.to_dict() for d in ordered[:limit]],
            "divergences_total": len(ordered),
        }

    def render(self, limit: int = 5) -> str:
        c = self.counts
        lines = []
        for cell, info in self.cells.items():
            start = info.get("from_snapshot")
            lines.append(
                f"{cell}: replayed {info['inputs']} inputs (offsets "
                f"{info['first_offset']}..{info['last_offset']}), committed below "
                f"{info['committed']}"
                + (f"; from its snapshot at offset {start}" if start is not None else "")
            )
        for where, why in self.unprovable.items():
            lines.append(f"{where}: UNPROVABLE: {why}")
        if self.until:
            lines.append(f"stopped {self.until}")
        lines.append(
            f"inputs {c['inputs']}, outputs {c['outputs']}: matched {c['matched']}, "
            f"missing {c['missing']}, unexpected {c['unexpected']}, differing {c['differing']}, "
            f"pending {c['pending']} (inputs not committed yet), duplicates {c['duplicates']} "
            f"(identical re-deliveries), dead letters {c['dead_letters']}, processing errors "
            f"{c['processing_errors']}, beyond the replay {c['beyond']}"
            + (f", before the snapshot {c['before_snapshot']}" if c["before_snapshot"] else "")
            + (f", expected where the log expired {c['expired']}" if c["expired"] else "")
        )
        if self.admission:
            a = self.admission_counts
            lines.append(
                f"admission: replayed {a['inputs']} commands on {len(self.admission)} "
                f"partition(s), outputs {a['outputs']}: matched {a['matched']}, missing "
                f"{a['missing']}, unexpected {a['unexpected']}, differing {a['differing']}, "
                f"pending {a['pending']}, duplicates {a['duplicates']}, dead letters "
                f"{a['dead_letters']}, processing errors {a['processing_errors']}"
            )
        if not self.committed_known:
            lines.append(
                "warning: the scheduler's committed offsets could not be read; "
                "unemitted outputs count as pending, not missing"
            )
        if self.ok:
            lines.append("OK: every emitted output matches the re-fold")
            return "\n".join(lines)
        if not self.divergences:
            lines.append("NOT PROVEN: no divergence in what could be replayed (see above)")
            return "\n".join(lines)
        ordered = sorted(self.divergences, key=Divergence.sort_key)
        lines.append(f"DIVERGED: {len(ordered)} divergence(s); the first:")
        lines.extend(d.describe() for d in ordered[:limit])
        if len(ordered) > limit:
            lines.append(f"... and {len(ordered) - limit} more (--json lists up to 50)")
        return "\n".join(lines)


# --------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------
@dataclass
class _Emitted:
    partition: int
    offset: int
    value: bytes | None
    event: Any


def index_emitted(
    records: Iterable[Record],
    cells: set[str],
    counts: Counter,
    parse: Callable[[str], tuple[str, int, int] | None] = positions.parse_cell,
) -> dict[tuple[str, str], list[_Emitted]]:
    """Emitted outputs of ``cells`` (the sources ``parse`` finds in event ids) by
    (topic, event id); others are only counted."""
    out: dict[tuple[str, str], list[_Emitted]] = {}
    for d in decode_all(records):
        if d.event is None:
            counts["emitted_undecodable"] += 1
            continue
        pos = parse(d.event_id)
        if pos is None or pos[0] not in cells:
            counts["emitted_by_others"] += 1
            continue
        out.setdefault((d.record.topic, d.event_id), []).append(
            _Emitted(d.record.partition, d.record.offset, d.record.value, d.event)
        )
    return out


def compare(
    partitions: Mapping[int, list[Record]],
    emitted_records: Iterable[Record],
    config: CellConfig | None = None,
    topics: Topics | None = None,
    committed: Mapping[int, int] | None = None,
    until: Until | None = None,
    unread_topics: tuple[str, ...] = (),
    starts: Mapping[int, tuple[Any, int]] | None = None,
    expired: set[tuple[str, int]] | None = None,
) -> ReplayReport:
    """Re-fold each partition's records and compare with the emitted records.

    ``starts``: per partition, a snapshot ``(cell, offset)`` to re-fold from
    instead of offset 0 (theory of operation: a gone head).

    ``committed``: the scheduler's committed next offset per partition (None:
    unknown, nothing counts as missing). ``unread_topics``: topics the emitted
    records leave out (the commands topic when it was not read): outputs for
    them are counted ``not_read``, not checked.
    """
    topics = topics or catalogue
    report = ReplayReport(
        until=until.describe() if until else "",
        committed_known=committed is not None,
        expired=set(expired or ()),
    )
    counts = report.counts
    refolds = {p: Refold(p, config, topics) for p in partitions}
    emitted = index_emitted(emitted_records, {r.cell_id for r in refolds.values()}, counts)
    expected_ids: set[tuple[str, str]] = set()
    skipped_below: dict[str, int] = {}  # cell -> inputs at or below this are not replayed
    for p, records in partitions.items():
        refold = refolds[p]
        cell = refold.cell_id
        limit = (committed or {}).get(p, 0) if committed is not None else -1
        start = (starts or {}).get(p)
        head = records[0].offset if records else 0
        if start is not None and start[1] >= head - 1:
            refold.cell, refold.last_offset = start
            skipped_below[cell] = start[1]
            records = [r for r in records if r.offset > start[1]]
        elif head > 0:
            report.unprovable[cell] = (
                f"its log starts at offset {head} (the head expired) and no snapshot at or "
                f"after offset {head - 1} was given: its decisions cannot be re-derived"
            )
            skipped_below[cell] = records[-1].offset
            report.cells[cell] = {
                "inputs": 0,
                "first_offset": head,
                "last_offset": None,
                "committed": limit if committed is not None else None,
            }
            continue
        inputs = 0
        for record in records:
            input_event = _decode_or_none(record)
            if until is not None and until.stops_before(record, input_event):
                break
            inputs += 1
            for index, out in enumerate(refold.step(record)):
                if out.event is None:
                    counts["dead_letters"] += 1
                    continue
                counts["outputs"] += 1
                if out.topic in unread_topics:
                    counts["not_read"] += 1
                    continue
                key = (out.topic, out.event.event_id)
                expected_ids.add(key)
                _check_output(
                    report,
                    key,
                    out,
                    emitted.get(key),
                    cell,
                    record,
                    input_event,
                    index,
                    committed_below=limit,
                )
        counts["inputs"] += inputs
        counts["processing_errors"] += len(refold.processing_errors)
        report.cells[cell] = {
            "inputs": inputs,
            "first_offset": records[0].offset if records else None,
            "last_offset": refold.last_offset,
            "committed": limit if committed is not None else None,
        }
        if cell in skipped_below:
            report.cells[cell]["from_snapshot"] = skipped_below[cell]
    last = {r.cell_id: r.last_offset for r in refolds.values()}
    for key, copies in emitted.items():
        if key in expected_ids:
            continue
        pos = positions.parse_cell(key[1])
        assert pos is not None  # index_emitted kept only the ids parse_cell reads
        cell, offset, index = pos
        if offset <= skipped_below.get(cell, -1):
            counts["before_snapshot"] += 1
            continue
        if offset > last[cell]:
            counts["beyond"] += 1
            continue
        counts["unexpected"] += 1
        first = copies[0]
        report.divergences.append(
            Divergence(
                UNEXPECTED,
                cell,
                offset,
                index,
                key[0],
                key[1],
                emitted=first.event,
                emitted_at=(first.partition, first.offset),
            )
        )
    return report


def _check_output(
    report: ReplayReport,
    key: tuple[str, str],
    out: Any,
    copies: list[_Emitted] | None,
    cell: str,
    record: Record,
    input_event: Any,
    index: int,
    committed_below: int,
    counts: Counter | None = None,
) -> None:
    counts = report.counts if counts is None else counts
    if not copies:
        if (key[0], out.partition) in report.expired:
            counts["expired"] += 1
            return
        if committed_below < 0 or record.offset >= committed_below:
            counts["pending"] += 1
            return
        counts["missing"] += 1
        report.divergences.append(
            Divergence(
                MISSING,
                cell,
                record.offset,
                index,
                key[0],
                key[1],
                input=input_event,
                expected=out.event,
                expected_partition=out.partition,
            )
        )
        return
    # an output sent to several partitions of one topic (a CellOffer) is checked
    # against its copies on the partition at hand
    here = [c for c in copies if c.partition == out.partition]
    bad = next((c for c in here if c.value != out.value), None) if here else copies[0]
    if bad is None:
        counts["matched"] += 1
        counts["duplicates"] += len(copies) - 1
        return
    counts["differing"] += 1
    fields = diff_fields(out.event, bad.event)
    if bad.partition != out.partition:
        fields.append("(partition)")
    report.divergences.append(
        Divergence(
            DIFFERING,
            cell,
            record.offset,
            index,
            key[0],
            key[1],
            input=input_event,
            expected=out.event,
            expected_partition=out.partition,
            emitted=bad.event,
            emitted_at=(bad.partition, bad.offset),
            fields=fields,
        )
    )


def compare_admission(
    report: ReplayReport,
    partitions: Mapping[int, list[Record]],
    emitted_records: Iterable[Record],
    config: AdmissionConfig | None = None,
    topics: Topics | None = None,
    committed: Mapping[int, int] | None = None,
) -> ReplayReport:
    """Re-fold each commands partition with admission and compare with the emitted
    records (job-events and scheduler), into ``report`` (see the module docstring)."""
    topics = topics or catalogue
    counts = report.admission_counts
    refolds = {p: AdmissionRefold(p, config, topics) for p in partitions}
    emitted = index_emitted(
        emitted_records, {r.source for r in refolds.values()}, Counter(), positions.parse_admission
    )
    expected_ids: set[tuple[str, str]] = set()
    for p, records in partitions.items():
        refold = refolds[p]
        limit = (committed or {}).get(p, 0) if committed is not None else -1
        for record in records:
            counts["inputs"] += 1
            for out in refold.step(record):
                if out.event is None:
                    counts["dead_letters"] += 1
                    continue
                counts["outputs"] += 1
                out = dataclasses.replace(
                    out, event=payload(out.event)
                )  # a CellCommand's CancelJob
                key = (out.topic, out.event.event_id)
                expected_ids.add(key)
                _check_output(
                    report,
                    key,
                    out,
                    emitted.get(key),
                    refold.source,
                    record,
                    _decode_or_none(record),
                    (positions.parse_admission(out.event.event_id) or ("", 0, -1))[2],
                    committed_below=limit,
                    counts=counts,
                )
        counts["processing_errors"] += len(refold.processing_errors)
        report.admission[refold.source] = {
            "inputs": len(records),
            "first_offset": records[0].offset if records else None,
            "last_offset": refold.last_offset,
            "committed": limit if committed is not None else None,
        }
    last = {r.source: r.last_offset for r in refolds.values()}
    for key, copies in emitted.items():
        source, offset, index = positions.parse_admission(key[1]) or ("", -1, -1)
        if key in expected_ids or offset > last.get(source, -1):
            continue  # matched, or the output of a command read after this replay's
        counts["unexpected"] += 1
        first = copies[0]
        report.divergences.append(
            Divergence(
                UNEXPECTED,
                source,
                offset,
                index,
                key[0],
                key[1],
                emitted=first.event,
                emitted_at=(first.partition, first.offset),
            )
        )
    return report


def _decode_or_none(record: Record) -> Any:
    try:
        return codec.decode(record.value)
    except codec.DecodeError:
        return None


def expired_heads(records: Iterable[Record]) -> set[tuple[str, int]]:
    """The (topic, partition) pairs whose first stored record is past offset 0."""
    first: dict[tuple[str, int], int] = {}
    for r in records:
        tp = (r.topic, r.partition)
        if r.offset < first.get(tp, r.offset + 1):
            first[tp] = r.offset
    return {tp for tp, offset in first.items() if offset > 0}


def replay(
    log: LogContents,
    config: CellConfig | None = None,
    cells: Iterable[int] | None = None,
    until: Until | None = None,
    admission_config: AdmissionConfig | None = None,
    starts: Mapping[int, tuple[Any, int]] | None = None,
) -> ReplayReport:
    """Replay the scheduler partitions in ``log`` (only ``cells`` if given) and,
    unless ``cells`` is given, the commands partitions through admission;
    ``starts``: snapshots to start cells from (theory of operation)."""
    partitions = log.scheduler_partitions()
    if cells is not None:
        wanted = set(cells)
        partitions = {p: r for p, r in partitions.items() if p in wanted}
        for p in wanted - set(partitions):
            partitions[p] = []
    committed = log.committed.get("scheduler")
    expired = expired_heads([*log.scheduler, *log.job_events, *log.assignments, *log.commands])
    # cells send CellOffer and JobRerouted to the commands topic too
    report = compare(
        partitions,
        [*log.job_events, *log.assignments, *log.commands],
        config,
        log.topics,
        committed=committed,
        until=until,
        unread_topics=() if log.commands else (log.topics.COMMANDS.name,),
        starts=starts,
        expired=expired,
    )
    whole = {}
    for p, records in log.command_partitions().items():
        if records and records[0].offset > 0:
            if cells is None:
                report.unprovable[f"admission-{p}"] = (
                    f"its log starts at offset {records[0].offset} (the head expired): "
                    "admission's decisions cannot be re-derived (replay loads no admission "
                    "snapshot)"
                )
        else:
            whole[p] = records
    if cells is None:
        compare_admission(
            report,
            whole,
            [*log.job_events, *log.scheduler],
            admission_config,
            log.topics,
            committed=log.committed.get("admission"),
        )
    return report
