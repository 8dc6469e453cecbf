"""``verify``: log-wide invariants, and a fairness summary.

Theory of operation
-------------------
1. **One terminal event per job** in job-events, after deduplicating by event
   id (an id seen twice with different contents is itself a violation).
2. **No GPU in two runs**, twice over: each cell is re-folded with the core and
   its ownership invariants are asserted after every input (every held GPU has
   one run, within its node, and the node's owner table agrees); and the
   emitted history is walked on its own (``ledger.CellLedger``): every emitted
   ``JobAssigned`` must find its GPUs released by what the log says happened;
   and, from the agents' reports, no GPU runs two started runs at once.
3. **Every allocation released**: at the end of each re-fold, a run holding
   GPUs is either its live job's current run, or stopping within the stop lease.
   What is still held is listed per cell (``held_at_end``): a drill that waited
   for every job to end and every GPU to come back reads leaks from it.
4. **No state change from a stale run or incarnation** (``ledger``), and no
   input that made the fold raise (the runtime dead-letters it: a core bug).
5. **Every submitted job accounted for**: admitted and then terminal, or still
   live in its re-folded cell (in one cell only), or rejected; or in flight (its
   input is past the processor's committed offset). A job a cell drained
   (``JobRerouted``) and that is live nowhere is in flight while admission has
   not committed past the reroute on the commands topic, else lost. A job is
   admitted more than once only after as many ``JobRerouted`` (a second
   ``JobAdmitted`` without one is ``admitted_twice``).
6. **Fairness**: GPU-seconds per tenant (``JobCompleted.gpu_seconds``, and the
   spans of all runs from ``JobAssigned`` to their end), and Jain's index of
   the weight-normalised run GPU-seconds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from framespool.processors.core import Cell, CellConfig
from framespool.processors.tools.history import LogContents, Refold, decode_all
from framespool.processors.tools.ledger import (
    Violation,
    check_cell_history,
    first_terminal_violations,
)
from framespool.schemas import events as ev
from framespool.schemas import positions
from framespool.schemas.states import RunPhase

EXAMPLES_PER_KIND = 20


def ownership_problems(cell: Cell) -> list[str]:
    """What is wrong with the cell's GPU ownership right now (nothing, normally)."""
    problems = []
    seen: dict[tuple[str, int], tuple[str, int]] = {}
    for key, run in cell.runs.items():
        for node_id, gpus in run.held.items():
            node = cell.index.nodes.get(node_id)
            if node is None:
                problems.append(f"{key[0]}#{key[1]} holds GPUs on unknown node {node_id}")
                continue
            for i in gpus:
                if not 0 <= i < node.total:
                    problems.append(
                        f"{key[0]}#{key[1]} holds GPU {node_id}:{i} of a {node.total}-GPU node"
                    )
                    continue
                if (node_id, i) in seen:
                    other = seen[(node_id, i)]
                    problems.append(
                        f"GPU {node_id}:{i} held by {other[0]}#{other[1]} and {key[0]}#{key[1]}"
                    )
                seen[(node_id, i)] = key
    for node in cell.index.nodes.values():
        for i, owner in enumerate(node.owner):
            if owner != seen.get((node.node_id, i)):
                problems.append(
                    f"GPU {node.node_id}:{i}: owner table says {owner}, runs say "
                    f"{seen.get((node.node_id, i))}"
                )
    return problems


def held_gpus(cell: Cell) -> list[dict[str, Any]]:
    """Every GPU a run holds in the cell now, in node and GPU order."""
    return sorted(
        (
            {
                "node": node_id,
                "gpu": i,
                "job_id": job_id,
                "run": number,
                "phase": run.phase,
                "job_live": job_id in cell.jobs,
            }
            for (job_id, number), run in cell.runs.items()
            for node_id, gpus in run.held.items()
            for i in gpus
        ),
        key=lambda h: (h["node"], h["gpu"]),
    )


def allocation_problems(cell: Cell) -> tuple[list[Violation], Counter]:
    """Runs still holding GPUs at the end, and whether they may (item 3)."""
    violations: list[Violation] = []
    status: Counter = Counter()
    lease_ms = int(cell.config.stop_lease_s * 1000)
    for (job_id, number), run in cell.runs.items():
        job = cell.jobs.get(job_id)
        current = job is not None and job.run == number
        subject = f"{job_id}#{number}"
        if run.phase != RunPhase.STOPPING:
            if current:
                status["running"] += 1
            else:
                violations.append(
                    Violation(
                        "orphan_run",
                        subject,
                        f"holds {run.gpus} GPU(s) in "
                        f"phase {run.phase} but its job is "
                        f"{cell.finished.get(job_id, 'gone')}",
                        cell.cell_id,
                    )
                )
        elif cell.now_ms - run.stop_sent_ms >= lease_ms:
            violations.append(
                Violation(
                    "dangling_allocation",
                    subject,
                    (
                        f"still holds {dict(run.held)} {(cell.now_ms - run.stop_sent_ms) / 1000:.0f}s "
                        f"after its stop, past the {cell.config.stop_lease_s:.0f}s stop lease"
                    ),
                    cell.cell_id,
                )
            )
        else:
            status["releasing"] += 1
    return violations, status


@dataclass
class VerifyReport:
    violations: list[Violation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    jobs: Counter = field(default_factory=Counter)
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    fairness: dict[str, Any] = field(default_factory=dict)
    in_flight: list[str] = field(default_factory=list)
    first_terminal: dict[str, Any] = field(default_factory=dict)  # job -> its terminal event
    held_at_end: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per cell

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> Counter:
        return Counter(v.kind for v in self.violations)

    def to_dict(self) -> dict[str, Any]:
        shown: Counter = Counter()
        examples = []
        for v in self.violations:
            shown[v.kind] += 1
            if shown[v.kind] <= EXAMPLES_PER_KIND:
                examples.append(v.to_dict())
        return {
            "ok": self.ok,
            "violation_counts": dict(self.by_kind()),
            "violations": examples,
            "warnings": self.warnings,
            "counts": dict(sorted(self.counts.items())),
            "jobs": dict(sorted(self.jobs.items())),
            "in_flight": self.in_flight[:100],
            "cells": self.cells,
            "fairness": self.fairness,
        }

    def render(self, limit: int = 20) -> str:
        c = self.counts
        lines = [
            f"read {c['job_events']} job events, {c['scheduler_inputs']} scheduler inputs, "
            f"{c['assignments']} assignments, {c['commands']} commands",
            "jobs: " + (", ".join(f"{k} {n}" for k, n in sorted(self.jobs.items())) or "none"),
        ]
        for cell, info in self.cells.items():
            lines.append(
                f"{cell}: {info['inputs']} inputs re-folded, {info['runs_running']} "
                f"run(s) running, {info['runs_releasing']} releasing, "
                f"{info['assignments']} assignments checked, {info['stale_reports']} "
                "stale reports"
            )
        f = self.fairness
        if f.get("tenants"):
            lines.append("fairness (GPU-seconds of runs / completed jobs):")
            for name, t in f["tenants"].items():
                lines.append(
                    f"  {name:<16} {t['run_gpu_s']:>12.1f} {t['completed_gpu_s']:>12.1f}"
                    f"  share {t['share']:.3f}  weight {t['weight']:g}  jobs {t['jobs']}"
                )
            lines.append(
                f"  Jain's index {f['jain_index']:.3f} over the {f['jain_over']} "
                "tenant(s) with run time, of weight-normalised run GPU-seconds"
            )
        lines.extend(f"warning: {w}" for w in self.warnings[:limit])
        if self.in_flight:
            lines.append(
                f"in flight (past the processors' committed offsets): "
                f"{', '.join(self.in_flight[:10])}{' ...' if len(self.in_flight) > 10 else ''}"
            )
        if self.ok:
            lines.append("OK: no invariant violated")
            return "\n".join(lines)
        lines.append(
            f"VIOLATED: {len(self.violations)} violation(s): "
            + ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind().items()))
        )
        lines.extend(f"  {v.line()}" for v in self.violations[:limit])
        if len(self.violations) > limit:
            lines.append(
                f"  ... and {len(self.violations) - limit} more (--json shows "
                f"{EXAMPLES_PER_KIND} of each kind)"
            )
        return "\n".join(lines)


def verify(log: LogContents, config: CellConfig | None = None) -> VerifyReport:
    config = config or CellConfig()
    report = VerifyReport()
    job_events = decode_all(log.job_events)
    assignments = decode_all(log.assignments)
    commands = decode_all(log.commands)
    c = report.counts
    c["job_events"], c["assignments"], c["commands"] = (
        len(job_events),
        len(assignments),
        len(commands),
    )
    undecodable = sum(1 for d in (*job_events, *assignments, *commands) if d.event is None)
    if undecodable:
        report.warnings.append(
            f"{undecodable} record(s) on job-events/assignments/commands could not be decoded"
        )
    emitted = [d.event for d in (*job_events, *assignments) if d.event is not None]
    violations, first_terminal = first_terminal_violations(
        d.event for d in job_events if d.event is not None
    )
    report.violations.extend(violations)
    report.first_terminal = first_terminal
    cells: dict[str, Cell] = {}
    finished_at: dict[str, tuple[int, int]] = {}  # job -> (partition, input offset)
    admitted_in_cell: dict[str, str] = {}
    rerouted_from: dict[str, str] = {}  # job -> the cell that gave it up last (re-fold)
    for p, records in log.scheduler_partitions().items():
        refold = Refold(p, config, log.topics)
        problems: list[Violation] = []
        reported: set[str] = set()  # a broken state persists: report it where it starts
        for record in records:
            for o in refold.step(record):
                if isinstance(o.event, ev.TERMINAL_EVENTS):
                    finished_at.setdefault(o.event.job_id, (p, record.offset))
                elif isinstance(o.event, ev.JobRerouted):
                    rerouted_from[o.event.job_id] = refold.cell_id
            for text in ownership_problems(refold.cell):
                if text not in reported:
                    reported.add(text)
                    problems.append(
                        Violation(
                            "gpu_ownership",
                            refold.cell_id,
                            text,
                            f"{refold.cell_id}@{record.offset}",
                        )
                    )
        cell = cells[refold.cell_id] = refold.cell
        report.violations.extend(problems)
        for offset, error in refold.processing_errors:
            report.violations.append(
                Violation(
                    "fold_error",
                    refold.cell_id,
                    f"the fold raised {error}; the processor "
                    "dead-letters such an input (a core bug)",
                    f"{refold.cell_id}@{offset}",
                )
            )
        decoded = decode_all(records)
        for d in decoded:
            if isinstance(d.event, ev.JobAdmitted):
                admitted_in_cell[d.event.spec.job_id] = refold.cell_id
        ledger = check_cell_history(
            refold.cell_id, [(d.record.offset, d.event) for d in decoded], emitted
        )
        report.violations.extend(ledger.violations)
        alloc_violations, status = allocation_problems(cell)
        report.violations.extend(alloc_violations)
        c["scheduler_inputs"] += len(records)
        report.cells[refold.cell_id] = {
            "inputs": len(records),
            "now_ms": cell.now_ms,
            "live_jobs": len(cell.jobs),
            "runs_running": status["running"],
            "runs_releasing": status["releasing"],
            "assignments": ledger.assignments,
            "stale_reports": ledger.stale_reports,
            "outputs_beyond_inputs": ledger.unplaced,
            "last_input": f"{refold.cell_id}@{records[-1].offset}" if records else None,
            "gpus_held_at_end": len(report.held_at_end.setdefault(refold.cell_id, held_gpus(cell))),
        }
    _accounting(
        report,
        log,
        commands,
        job_events,
        first_terminal,
        cells,
        finished_at,
        admitted_in_cell,
        set(rerouted_from),
    )
    _reroutes(report, log, commands, job_events, first_terminal, cells, rerouted_from)
    report.fairness = fairness(job_events, commands, cells, config)
    return report


def _accounting(
    report: VerifyReport,
    log: LogContents,
    commands: list,
    job_events: list,
    first_terminal: dict[str, Any],
    cells: dict[str, Cell],
    finished_at: dict[str, tuple[int, int]],
    admitted_in_cell: dict[str, str],
    rerouted: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Item 5: every submitted job ends somewhere the log can show (a rerouted
    job that is live nowhere and not ended: ``_reroutes``)."""
    submitted: dict[str, list] = {}
    for d in commands:
        if isinstance(d.event, ev.SubmitJob):
            submitted.setdefault(d.event.spec.job_id, []).append(d.record)
    admitted = {d.event.spec.job_id for d in job_events if isinstance(d.event, ev.JobAdmitted)}
    admitted |= set(admitted_in_cell)
    live = {job_id: job.state for cell in cells.values() for job_id, job in cell.jobs.items()}
    jobs = report.jobs
    for job_id in dict.fromkeys([*submitted, *admitted]):
        terminal = first_terminal.get(job_id)
        if terminal is not None:
            jobs[type(terminal).__name__.removeprefix("Job").upper()] += 1
        elif job_id in live:
            jobs[live[job_id]] += 1
        elif job_id in finished_at:
            p, offset = finished_at[job_id]
            if offset >= log.committed_offset("scheduler", p):
                jobs["in_flight"] += 1
                report.in_flight.append(job_id)
            else:
                report.violations.append(
                    Violation(
                        "terminal_not_emitted",
                        job_id,
                        f"the re-fold ends it at cell-{p}@{offset} "
                        "(committed) but job-events has no terminal event",
                        f"cell-{p}@{offset}",
                    )
                )
        elif job_id in rerouted:
            continue  # between cells: _reroutes accounts for it
        elif job_id in admitted:
            if job_id in admitted_in_cell:
                report.violations.append(
                    Violation(
                        "lost_in_cell",
                        job_id,
                        f"admitted to {admitted_in_cell[job_id]} but neither live there nor ended",
                    )
                )
            else:
                jobs["in_flight"] += 1  # on job-events, not yet read on the scheduler topic
                report.in_flight.append(job_id)
        elif any(
            r.offset >= log.committed_offset("admission", r.partition) for r in submitted[job_id]
        ):
            jobs["in_flight"] += 1
            report.in_flight.append(job_id)
        else:
            report.violations.append(
                Violation(
                    "submission_unaccounted",
                    job_id,
                    "SubmitJob was committed by admission but no JobAdmitted or JobRejected exists",
                )
            )
    for job_id, terminal in first_terminal.items():
        if job_id not in submitted and job_id not in admitted:
            report.violations.append(
                Violation(
                    "terminal_for_unknown_job",
                    job_id,
                    f"{type(terminal).__name__} "
                    f"{terminal.event_id} for a job never submitted or admitted",
                    terminal.event_id,
                )
            )
    if commands and admitted - set(submitted):
        report.warnings.append(
            f"{len(admitted - set(submitted))} job(s) admitted without a "
            "SubmitJob on the commands topic"
        )


def _reroutes(
    report: VerifyReport,
    log: LogContents,
    commands: list,
    job_events: list,
    first_terminal: dict[str, Any],
    cells: dict[str, Cell],
    rerouted_from: dict[str, str],
) -> None:
    """Item 5 for jobs that moved between cells: live in one cell at most, each
    admission after the first preceded by a reroute, and a rerouted job that is
    live nowhere and not ended is in flight or lost."""
    holders: dict[str, list[str]] = {}
    for cell_id, cell in cells.items():
        for job_id in cell.jobs:
            holders.setdefault(job_id, []).append(cell_id)
    for job_id, where in holders.items():
        if len(where) > 1:
            report.violations.append(
                Violation("live_in_two_cells", job_id, f"live in {', '.join(where)} at once")
            )
    admits: Counter = Counter()
    reroutes: Counter = Counter()
    seen: set[str] = set()
    for d in job_events:
        e = d.event
        if e is None or e.event_id in seen:
            continue
        seen.add(e.event_id)
        if isinstance(e, ev.JobAdmitted):
            admits[e.spec.job_id] += 1
        elif isinstance(e, ev.JobRerouted):
            reroutes[e.job_id] += 1
    for job_id, n in admits.items():
        if n > 1 + reroutes[job_id]:
            report.violations.append(
                Violation(
                    "admitted_twice",
                    job_id,
                    f"admitted {n} times on job-events after {reroutes[job_id]} reroute(s)",
                )
            )
    reroute_at: dict[str, Any] = {}  # job -> its last JobRerouted record on the commands topic
    for d in commands:
        if isinstance(d.event, ev.JobRerouted):
            reroute_at[d.event.job_id] = d.record
    for job_id, cell_id in rerouted_from.items():
        if job_id in holders or job_id in first_terminal:
            continue
        record = reroute_at.get(job_id)
        if record is None and commands:
            # the cell's output was not delivered (yet): replay reports a missing one
            report.warnings.append(
                f"{job_id}: rerouted by {cell_id}, not yet on the commands topic"
            )
        elif record is None or record.offset >= log.committed_offset("admission", record.partition):
            report.jobs["in_flight"] += 1
            report.in_flight.append(job_id)
        else:
            report.violations.append(
                Violation(
                    "lost_in_reroute",
                    job_id,
                    f"{cell_id} gave it up and admission read that, but no cell holds it "
                    "and it has not ended",
                )
            )


def fairness(
    job_events: list, commands: list, cells: dict[str, Cell], config: CellConfig
) -> dict[str, Any]:
    """Item 6: GPU-seconds per tenant and Jain's index of weight-normalised shares."""
    tenant_of: dict[str, str] = {}
    for d in (*commands, *job_events):
        if isinstance(d.event, (ev.SubmitJob, ev.JobAdmitted)):
            tenant_of[d.event.spec.job_id] = d.event.spec.tenant
    seen: set[str] = set()
    starts: dict[tuple[str, int], tuple[int, int, str]] = {}  # run -> (ts, gpus, cell)
    ends: dict[tuple[str, int], int] = {}
    completed: dict[str, float] = {}  # GPU-seconds per tenant (a Counter holds ints)
    jobs: Counter[str] = Counter()
    for d in job_events:
        e = d.event
        if e is None or e.event_id in seen:
            continue
        seen.add(e.event_id)
        if isinstance(e, ev.JobAssigned) and (pos := positions.parse_cell(e.event_id)):
            starts[(e.job_id, e.run)] = (e.ts_ms, e.gpus, pos[0])
        elif isinstance(e, ev.RUN_ENDS):
            ends.setdefault((e.job_id, e.run), e.ts_ms)
            if isinstance(e, ev.JobCompleted):
                tenant = tenant_of.get(e.job_id, "?")
                completed[tenant] = completed.get(tenant, 0) + e.gpu_seconds
                jobs[tenant] += 1
    used: dict[str, float] = {}  # GPU-seconds per tenant
    for key, (start, gpus, cell) in starts.items():
        end = ends.get(key, cells[cell].now_ms if cell in cells else start)
        tenant = tenant_of.get(key[0], "?")
        used[tenant] = used.get(tenant, 0) + gpus * max(0, end - start) / 1000
    names = sorted(set(used) | set(completed))
    total = sum(used.values()) or 1.0
    tenants = {
        n: {
            "run_gpu_s": round(used.get(n, 0), 3),
            "completed_gpu_s": round(completed.get(n, 0), 3),
            "share": round(used.get(n, 0) / total, 4),
            "weight": config.tenant(n).weight,
            "jobs": jobs[n],
        }
        for n in names
    }
    normalised = [used[n] / config.tenant(n).weight for n in names if used.get(n, 0) > 0]
    return {"tenants": tenants, "jain_index": jain(normalised), "jain_over": len(normalised)}


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    if not values:
        return 1.0
    square = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square) if square else 1.0
