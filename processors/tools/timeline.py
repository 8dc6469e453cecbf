"""One job's history across the log, in the order things happened (pure).

Theory of operation
-------------------
Event times are not an order: a cell stamps its outputs with its own clock
(the last Tick), agents with theirs. Positions are: an input of a cell sits at
its offset in the cell's partition, and the cell's outputs at
``cell-<p>@<offset>/<i>`` right after it. The timeline is therefore

1. what happened before the cell saw the job (``SubmitJob`` on commands, the
   admission's decisions), by time;
2. the cell's timeline: its inputs about the job (``JobAdmitted``,
   ``CancelJob``, the runs' agent reports) and its outputs about the job
   (job-events and assignments), by position; heartbeats that list one of the
   job's runs are summarised, one entry per (node, run);
3. anything else about the job (events whose id names no position), by time.

An event seen twice (at-least-once, or ``JobAdmitted`` on both job-events
and the scheduler topic) appears once, at its cell position when it has one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from framespool.processors.tools.decoded import Decoded, event_dict, fmt_ms, job_of
from framespool.schemas import events as ev
from framespool.schemas import positions

SOURCES = {
    ev.SubmitJob: "user",
    ev.CancelJob: "user",
    ev.JobAdmitted: "admission",
    ev.StartRun: "scheduler",
    ev.StopRun: "scheduler",
    ev.CheckpointRun: "scheduler",
    ev.BeginRun: "scheduler",
    ev.RunStarted: "agent",
    ev.RunCheckpointed: "agent",
    ev.RunCompleted: "agent",
    ev.RunFailed: "agent",
    ev.RunStopped: "agent",
    ev.NodeHeartbeat: "agent",
}


@dataclass
class Entry:
    order: tuple
    where: str
    ts_ms: int
    kind: str
    source: str
    summary: str
    run: int | None = None
    nodes: tuple[str, ...] = ()
    incarnation: int | None = None
    event: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "ts_ms": self.ts_ms,
            "time": fmt_ms(self.ts_ms),
            "type": self.kind,
            "source": self.source,
            "run": self.run,
            "nodes": list(self.nodes),
            "incarnation": self.incarnation,
            "summary": self.summary,
            "event": event_dict(self.event),
        }

    def line(self) -> str:
        run = f"run {self.run}" if self.run else ""
        nodes = ",".join(self.nodes)
        inc = f"inc {self.incarnation}" if self.incarnation is not None else ""
        meta = "  ".join(x for x in (run, nodes, inc) if x)
        return (
            f"{fmt_ms(self.ts_ms)[11:23] or '-':<12} {self.where:<20} {self.kind:<16} "
            f"{meta:<28} {self.summary}"
        )


def _placement(slices: Iterable[ev.NodeSlice]) -> str:
    return " + ".join(f"{s.node_id}[{','.join(map(str, s.gpus))}]" for s in slices)


def summarize(e: Any) -> str:
    """The decision or report in a few words, with its reason."""
    if isinstance(e, ev.SubmitJob):
        s = e.spec
        return (
            f"submitted by {s.tenant}/{s.user or s.tenant}: tier {s.tier}, {s.gpus} GPU(s) "
            f"({s.gpus_per_node}/node), model {s.model}@{s.model_version}, estimate "
            f"{s.estimate_s:g}s{', preemptible' if s.preemptible else ''}"
        )
    if isinstance(e, ev.JobAdmitted):
        moved = f" after run {e.run} elsewhere" if e.run else ""
        resume = f", resumes from {e.resume_from}" if e.resume_from else ""
        return f"admitted to {e.cell or '?'}{moved}{resume}"
    if isinstance(e, ev.JobRerouted):
        return f"rerouted from {e.from_cell}: {e.reason}"
    if isinstance(e, ev.JobRejected):
        return f"rejected ({e.reason}): {e.detail}"
    if isinstance(e, ev.JobQueued):
        return (
            f"queued ({e.reason}); position {e.position} in its flow, wait estimate "
            f"{e.wait_estimate_s:g}s"
        )
    if isinstance(e, ev.JobWaitEstimated):
        return f"wait estimate {e.wait_estimate_s:g}s: {e.reason}"
    if isinstance(e, ev.JobAssigned):
        resume = f"; resumes from {e.resume_from}" if e.resume_from else ""
        return f"{e.gpus} GPU(s) on {_placement(e.placement)}: {e.reason}{resume}"
    if isinstance(e, ev.StartRun):
        return f"start on GPUs {list(e.gpus)}, estimate {e.estimate_s:g}s"
    if isinstance(e, ev.BeginRun):
        return f"begin: {e.reason}"
    if isinstance(e, ev.RunCheckpointed):
        step = f", step {e.step}" if e.step >= 0 else ""
        return f"checkpoint {e.checkpoint_uri} at {e.progress:.0%}{step}"
    if isinstance(e, ev.RunCompleted):
        return f"completed: {e.artifact_uri} ({e.size_bytes} bytes)"
    if isinstance(e, ev.RunFailed):
        return f"failed ({e.failure_class}, exit {e.exit_code}): {e.reason}"
    if isinstance(e, ev.JobPreempted):
        return f"preempted by {e.by_job_id or '?'}: {e.reason}"
    if isinstance(e, ev.JobRequeued):
        resume = f"; resumes from {e.resume_from}" if e.resume_from else ""
        cause = f"{e.cause}; " if e.cause else ""
        return f"requeued ({cause}{e.retries_left} retries left): {e.reason}{resume}"
    if isinstance(e, ev.JobCompleted):
        return f"COMPLETED: {e.artifact_uri}, {e.gpu_seconds:g} GPU-seconds"
    if isinstance(e, ev.JobFailed):
        cause = f"{e.cause}, " if e.cause and e.cause != e.failure_class else ""
        return f"FAILED ({cause}{e.failure_class}): {e.reason}"
    if isinstance(e, ev.JobCancelled):
        return f"CANCELLED: {e.reason}"
    if isinstance(e, ev.ReportIgnored):
        code = f"{e.code}, " if e.code else ""
        return f"ignored {e.source_event_id or 'input'} ({code}{e.reason})"
    return getattr(e, "reason", "") or ""


def _entry(order: tuple, where: str, e: Any, source: str) -> Entry:
    nodes: tuple[str, ...] = ()
    if isinstance(e, ev.JobAssigned):
        nodes = tuple(s.node_id for s in e.placement)
    elif getattr(e, "node_id", None):
        nodes = (e.node_id,)
    return Entry(
        order,
        where,
        e.ts_ms,
        type(e).__name__,
        source,
        summarize(e),
        run=getattr(e, "run", None) or None,
        nodes=nodes,
        incarnation=getattr(e, "incarnation", None),
        event=e,
    )


@dataclass
class _Listing:
    """A (node, run) as seen in heartbeats."""

    first: Decoded
    last: Decoded
    count: int = 1
    report: Any = None
    incarnations: set = field(default_factory=set)


def job_timeline(
    job_id: str,
    *,
    commands: Iterable[Decoded] = (),
    scheduler: Iterable[Decoded] = (),
    job_events: Iterable[Decoded] = (),
    assignments: Iterable[Decoded] = (),
) -> list[Entry]:
    """Every entry about ``job_id``, in the order of the module docstring."""
    entries: dict[str, Entry] = {}
    listings: dict[tuple[str, str, int], _Listing] = {}
    for d in scheduler:
        e, r = d.event, d.record
        cell = f"cell-{r.partition}"
        if isinstance(e, ev.NodeHeartbeat):
            for report in e.runs:
                if report.job_id == job_id:
                    key = (cell, e.node_id, report.run)
                    seen = listings.get(key)
                    if seen is None:
                        seen = listings[key] = _Listing(d, d)
                    else:
                        seen.count += 1
                        seen.last = d
                    seen.report = report
                    seen.incarnations.add(e.incarnation)
            continue
        if e is None or job_of(e) != job_id:
            continue
        entries[e.event_id] = _entry(
            (1, cell, r.offset, 0, 0), f"{cell}@{r.offset}", e, SOURCES.get(type(e), "agent")
        )
    for (cell, node, run), seen in listings.items():
        first, last = seen.first.record.offset, seen.last.record.offset
        summary = (
            f"listed by {node} in {seen.count} heartbeat(s) at offsets {first}..{last}; "
            f"last progress {seen.report.progress:.0%}, {seen.report.step_rate:g} steps/s"
        )
        entries[f"hb:{cell}:{node}:{run}"] = Entry(
            (1, cell, first, 0, 1),
            f"{cell}@{first}",
            seen.first.event.ts_ms,
            "heartbeats",
            "agent",
            summary,
            run=run,
            nodes=(node,),
            incarnation=max(seen.incarnations),
        )
    for decoded, role in (
        (job_events, "job-events"),
        (assignments, "assignments"),
        (commands, "commands"),
    ):
        for d in decoded:
            e = d.event
            if e is None or job_of(e) != job_id or e.event_id in entries:
                continue
            pos = positions.parse_cell(e.event_id)
            if pos is not None:
                cell, offset, index = pos
                entries[e.event_id] = _entry(
                    (1, cell, offset, 1, index), f"{cell}@{offset}/{index}", e, "scheduler"
                )
                continue
            early = role == "commands" or e.event_id.startswith("admission-")
            source = SOURCES.get(type(e), "admission" if early else "unknown")
            entries[e.event_id] = _entry(
                (0 if early else 2, e.ts_ms, role, d.record.offset),
                f"{role}[{d.record.partition}]@{d.record.offset}",
                e,
                source,
            )
    return sorted(entries.values(), key=lambda x: x.order)
