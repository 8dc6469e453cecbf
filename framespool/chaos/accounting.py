"""A chaos drill's report, as pure functions over the decoded log: terminal
outcomes, lost jobs, GPU-seconds wasted per fault kind, dead letters, drains and
the log invariants as ``framespool verify`` judged them (see
:mod:`framespool.chaos.plan` for the drill's theory of operation)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from framespool.schemas import events as ev
from framespool.schemas import positions
from framespool.schemas.causes import MOVES, RunCause

from .malformed import Malformed
from .plan import (
    CRASH,
    CRASH_GENERATOR,
    ECC_GPU,
    EMPTY_CELL,
    HANG,
    HANG_GENERATOR,
    NODE_FAULTS,
    NORMAL,
    THROTTLE_GPU,
    WEDGE_GENERATOR,
    Timing,
)

AGENT_REPORTS = (
    ev.RunStarted,
    ev.RunCheckpointed,
    ev.RunCompleted,
    ev.RunFailed,
    ev.RunStopped,
    ev.NodeHeartbeat,
)


def unique(events: Iterable[Any]) -> list[Any]:
    """First occurrence of each event id (a replayed batch re-sends the same ids)."""
    seen: set[str] = set()
    out = []
    for e in events:
        if e.event_id not in seen:
            seen.add(e.event_id)
            out.append(e)
    return out


def cell_ordered(job_events: Iterable[Any]) -> list[Any]:
    """The cells' outputs, deduplicated, in the order the folds emitted them."""
    cell = [(pos, e) for e in unique(job_events) if (pos := positions.parse_cell(e.event_id))]
    return [e for _, e in sorted(cell, key=lambda pe: pe[0])]


def terminal_summary(job_events: Iterable[Any], submitted: Iterable[str]) -> dict[str, Any]:
    submitted = list(dict.fromkeys(submitted))
    records: dict[str, list[Any]] = {}
    for e in job_events:
        if isinstance(e, ev.TERMINAL_EVENTS):
            records.setdefault(e.job_id, []).append(e)
    redelivered = 0
    final: dict[str, Any] = {}
    for job_id, evs in records.items():
        redelivered += len(evs) - len(dict.fromkeys(e.event_id for e in evs))
        final[job_id] = evs[0]
    by_type = Counter(type(final[j]).__name__ for j in submitted if j in final)
    failed = [final[j] for j in submitted if isinstance(final.get(j), ev.JobFailed)]
    return {
        "submitted": len(submitted),
        "completed": by_type.get("JobCompleted", 0),
        "failed": len(failed),
        "failed_by_class": dict(Counter(f.failure_class or "?" for f in failed)),
        "failed_reasons": {f.job_id: f"{f.failure_class}: {f.reason}"[:300] for f in failed},
        "cancelled": by_type.get("JobCancelled", 0),
        "rejected": by_type.get("JobRejected", 0),
        "lost": sum(1 for j in submitted if j not in final),
        "lost_jobs": [j for j in submitted if j not in final][:50],
        "redelivered_terminal_records": redelivered,
    }


def _run_ends(ordered: Sequence[Any]) -> dict[tuple[str, int], Any]:
    """The event that ended each run (the contract's ``RUN_ENDS``): the first, except
    that a preempted run is ended by what released it (its JobRequeued) when one
    follows; a preemption with nothing after it ends its run itself."""
    ends: dict[tuple[str, int], Any] = {}
    for e in ordered:
        if isinstance(e, ev.RUN_ENDS) and e.run > 0:
            key = (e.job_id, e.run)
            if key not in ends or isinstance(ends[key], ev.JobPreempted):
                ends[key] = e
    return ends


def placements(ordered: Sequence[Any]) -> dict[tuple[str, int], ev.JobAssigned]:
    return {(e.job_id, e.run): e for e in ordered if isinstance(e, ev.JobAssigned)}


GPU_CONFLICTS = ("double_booked", "double_started")  # verify's kinds about one GPU, two runs
INVARIANT_KEYS = (
    "duplicate_terminal_events",
    "duplicate_terminal_jobs",
    "double_booked_gpus",
    "double_booking",
    "leaked_gpus",
    "leaks",
    "final_cell_status",
)


def invariants(verdict: Any) -> dict[str, Any]:
    """The report's log invariants as verify judged them (``verdict``: its
    ``VerifyReport``; None when it could not run: then nothing is known and
    every key is None, which :func:`failures` counts as a failure).

    - duplicate terminal events: verify's ``duplicate_terminal`` violations;
    - double-booked GPUs: the (node, GPU)s of its ``double_booked`` (an
      assignment onto GPUs not yet released and confirmed) and
      ``double_started`` (two runs started on one GPU) violations;
    - leaked GPUs: every GPU a run still holds at the end of its re-fold of each
      cell (the drill ends only once every job is terminal and every GPU free).
    """
    if verdict is None:
        return dict.fromkeys(INVARIANT_KEYS)
    duplicates = [v for v in verdict.violations if v.kind == "duplicate_terminal"]
    jobs: dict[str, list[str]] = {}
    for v in duplicates:
        first = verdict.first_terminal.get(v.subject)
        jobs.setdefault(v.subject, [first.event_id] if first is not None else []).append(v.where)
    conflicts = [v for v in verdict.violations if v.kind in GPU_CONFLICTS]
    leaks = [
        {"cell": cell, **held}
        for cell, gpus in sorted(verdict.held_at_end.items())
        for held in gpus
    ]
    last = sorted(info["last_input"] for info in verdict.cells.values() if info.get("last_input"))
    return {
        "duplicate_terminal_events": len(duplicates),
        "duplicate_terminal_jobs": jobs,
        "double_booked_gpus": len({gpu for v in conflicts for gpu in v.gpus}),
        "double_booking": [v.to_dict() for v in conflicts[:20]],
        "leaked_gpus": len(leaks),
        "leaks": leaks[:50],
        "final_cell_status": ", ".join(last) or None,
    }


def ignored_reports(ordered: Sequence[Any]) -> dict[str, int]:
    """ReportIgnored counted by their code (``framespool.schemas.refusals``);
    ``unrecorded`` counts those written before codes existed."""
    return dict(
        Counter(
            e.code or "unrecorded" for e in ordered if isinstance(e, ev.ReportIgnored)
        ).most_common()
    )


# A checkpoint-and-move's cause -> the fault kind that cost the run.
MOVE_KINDS = {
    RunCause.GPU_ECC: ECC_GPU,
    RunCause.GPU_THROTTLED: THROTTLE_GPU,
    RunCause.STRAGGLER: "straggler",
    RunCause.NODE_DRAINING: "move",
}


def classify_run_end(
    end: Any,
    preempted: bool,
    role: str,
    wedged: bool,
    nodes: Sequence[str],
    fault_log: Sequence[Mapping[str, Any]],
) -> str:
    """Which fault kind cost a run, from the cause code of the event that ended it
    (``framespool.schemas.causes``) and the fault log."""
    cause = getattr(end, "cause", RunCause.UNRECORDED)
    if preempted or cause == RunCause.PREEMPTED:
        return "preemption"
    if isinstance(end, ev.JobCancelled):
        return "cancel"
    cls = getattr(end, "failure_class", "")
    if cause in MOVES:
        return MOVE_KINDS[cause]
    if cause == RunCause.HUNG and role == HANG:
        return HANG_GENERATOR
    if cause == RunCause.HUNG and wedged:
        return WEDGE_GENERATOR
    if cause == RunCause.GENERATOR_ERROR and role == CRASH:
        return CRASH_GENERATOR
    if cause == RunCause.TIMEOUT:
        return "timeout"
    # Anything else is blamed on the latest node fault on one of the run's nodes (a
    # stalled agent may also take a healthy generator for hung), if there is one.
    at = end.ts_ms
    hits = [
        f
        for f in fault_log
        if (f.get("node") in nodes or any(n in nodes for n in f.get("nodes", ())))
        and f["t_ms"] <= at + 1000
        and at - f["t_ms"] <= 120_000
        and f["kind"] in NODE_FAULTS + (EMPTY_CELL, "supervisor")
    ]
    if hits:
        return max(hits, key=lambda f: f["t_ms"])["kind"]
    return f"{cls or 'other'} (no injected fault)"


def wasted_by_fault(
    ordered: Sequence[Any],
    scheduler_events: Sequence[Any],
    specs: Mapping[str, ev.JobSpec],
    roles: Mapping[str, str],
    wedged: Iterable[str],
    fault_log: Sequence[Mapping[str, Any]],
    time_scale: float,
) -> dict[str, dict[str, Any]]:
    """GPU-seconds each fault kind wasted: for every run that did not complete, its
    GPUs x the time from its last durable point (last checkpoint, else its start)
    to the event that ended it; compared with the job's checkpoint interval."""
    placed = placements(ordered)
    ends = _run_ends(ordered)
    preempted = {(e.job_id, e.run) for e in ordered if isinstance(e, ev.JobPreempted)}
    wedged = set(wedged)
    started: dict[tuple[str, int], int] = {}
    checkpointed: dict[tuple[str, int], int] = {}
    for e in unique(scheduler_events):
        key = (getattr(e, "job_id", ""), getattr(e, "run", 0))
        if isinstance(e, ev.RunStarted):
            started[key] = min(started.get(key, e.ts_ms), e.ts_ms)
        elif isinstance(e, ev.RunCheckpointed):
            checkpointed[key] = max(checkpointed.get(key, e.ts_ms), e.ts_ms)
    rows: dict[str, dict[str, Any]] = {}
    for key, end in ends.items():
        if isinstance(end, ev.JobCompleted) or key not in placed:
            continue
        assigned = placed[key]
        start = started.get(key, assigned.ts_ms)
        durable = max(start, checkpointed.get(key, start))
        lost_s = max(0.0, (end.ts_ms - durable) / 1000)
        spec = specs.get(key[0])
        interval = (spec.checkpoint_interval_s / time_scale) if spec and time_scale > 0 else 0.0
        kind = classify_run_end(
            end,
            key in preempted,
            roles.get(key[0], NORMAL),
            key[0] in wedged,
            [p.node_id for p in assigned.placement],
            fault_log,
        )
        row = rows.setdefault(
            kind,
            {
                "runs": 0,
                "gpu_s": 0.0,
                "checkpointable_runs": 0,
                "intervals": [],
                "resumed_from_checkpoint": 0,
            },
        )
        row["runs"] += 1
        row["gpu_s"] += assigned.gpus * lost_s
        if isinstance(end, ev.JobRequeued) and end.resume_from:
            row["resumed_from_checkpoint"] += 1
        if interval > 0:
            row["checkpointable_runs"] += 1
            row["intervals"].append(lost_s / interval)
    out = {}
    for kind, row in sorted(rows.items()):
        iv = row.pop("intervals")
        out[kind] = {
            **row,
            "gpu_s": round(row["gpu_s"], 1),
            "gpu_s_per_run": round(row["gpu_s"] / row["runs"], 2),
            "lost_intervals_mean": round(sum(iv) / len(iv), 2) if iv else None,
            "lost_intervals_max": round(max(iv), 2) if iv else None,
        }
    return out


def dead_letter_check(injected: Sequence[Malformed], dead: Sequence[Any]) -> dict[str, Any]:
    """Every injected record must be in dead-letter, by value, with a reason header."""
    reasons: dict[bytes, str] = {}
    for rec in dead:
        reason = rec.header("reason")
        if rec.value is not None and reason:
            reasons.setdefault(rec.value, reason.decode(errors="replace"))
    missing = [{"topic": m.topic, "kind": m.kind} for m in injected if m.value not in reasons]
    got = Counter(reasons[m.value] for m in injected if m.value in reasons)
    return {
        "injected": len(injected),
        "dead_lettered": len(injected) - len(missing),
        "missing": missing,
        "reasons": dict(got),
        "by_topic": dict(Counter(m.topic for m in injected)),
    }


def drain_checks(
    job_events: Sequence[Any], fault_log: Sequence[Mapping[str, Any]], timing: Timing
) -> list[dict[str, Any]]:
    """Per ``empty_cell`` fault: the most jobs the emptied cell's ``CellStatus``
    showed queued inside its drain window (:meth:`Timing.drain_window_ms`: DOWN,
    with a whole grace left before the restart), and the ``JobRerouted`` out of
    it from the kill to a grace past the restart. ``expected``: some job was
    queued in the window, so at least one reroute must have happened (a fault
    whose restart is not in the log counts to the last event)."""
    events = unique(job_events)
    last_ms = max((e.ts_ms for e in events), default=0)
    rows = []
    for start in fault_log:
        if start["kind"] != EMPTY_CELL or start.get("op") != "crash" or not start["ok"]:
            continue
        end_ms = next(
            (
                e["t_ms"]
                for e in fault_log
                if e["fault_id"] == start["fault_id"] and e.get("op") == "restart"
            ),
            last_ms,
        )
        cell = start["target"]
        lo, hi = timing.drain_window_ms(start["t_ms"], end_ms)
        queued = [
            sum(q.queued for q in e.queues)
            for e in events
            if isinstance(e, ev.CellStatus) and e.cell == cell and lo <= e.ts_ms <= hi
        ]
        out = [
            e
            for e in events
            if isinstance(e, ev.JobRerouted)
            and e.from_cell == cell
            and start["t_ms"] <= e.ts_ms <= end_ms + int(timing.drain_grace_s * 1000)
        ]
        rows.append(
            {
                "fault_id": start["fault_id"],
                "cell": cell,
                "nodes": list(start.get("nodes", ())),
                "statuses_in_window": len(queued),
                "queued_max": max(queued, default=0),
                "rerouted": len(out),
                "rerouted_jobs": sorted({e.job_id for e in out})[:50],
                "expected": max(queued, default=0) > 0,
            }
        )
    return rows


def account(
    job_events: Sequence[Any],
    scheduler_events: Sequence[Any],
    dead: Sequence[Any],
    submitted: Sequence[str],
    roles: Mapping[str, str],
    injected: Sequence[Malformed],
    fault_log: Sequence[Mapping[str, Any]],
    wedged: Iterable[str],
    time_scale: float,
    *,
    verdict: Any,
    timing: Timing = Timing(),
) -> dict[str, Any]:
    """The run's report from what the log says (see the module docstring);
    ``verdict`` is verify's report on the same log (None: it could not run)."""
    ordered = cell_ordered(job_events)
    report = terminal_summary(job_events, submitted)
    report.update(invariants(verdict))
    expected = {j for j, r in roles.items() if r != NORMAL}
    report["failed_unexpected"] = {
        j: r for j, r in report["failed_reasons"].items() if j not in expected
    }
    report["failed_as_planned"] = sum(1 for j in report["failed_reasons"] if j in expected)
    specs = {e.spec.job_id: e.spec for e in unique(job_events) if isinstance(e, ev.JobAdmitted)}
    report["wasted_by_fault"] = wasted_by_fault(
        ordered, scheduler_events, specs, roles, wedged, fault_log, time_scale
    )
    report["resumed_runs"] = sum(
        1 for e in ordered if isinstance(e, ev.JobAssigned) and e.resume_from
    )
    report["reports_ignored"] = ignored_reports(ordered)
    report["dead_letter"] = dead_letter_check(injected, dead)
    report["reroutes"] = sum(1 for e in unique(job_events) if isinstance(e, ev.JobRerouted))
    report["drains"] = drain_checks(job_events, fault_log, timing)
    return report


def failures(report: Mapping[str, Any]) -> list[str]:
    """What makes a run fail, in words (empty: it passed)."""
    out = [
        f"{name} = {report[name]}"
        for name in ("lost", "duplicate_terminal_events", "leaked_gpus", "double_booked_gpus")
        if report.get(name)
    ]
    missing = report.get("dead_letter", {}).get("missing")
    if missing:
        out.append(f"{len(missing)} malformed record(s) never reached dead-letter")
    if report.get("submit_errors"):
        out.append(f"{len(report['submit_errors'])} job(s) could not be submitted")
    for row in report.get("drains", ()):
        if row["expected"] and not row["rerouted"]:
            out.append(
                f"no reroute: empty_cell #{row['fault_id']} left {row['queued_max']} job(s) "
                f"queued in {row['cell']} past the drain grace and none was rerouted"
            )
    verdict = report.get("verify") or {}
    if "verify" in report and verdict.get("ok") is None:
        out.append(
            f"verify could not run ({verdict.get('error', 'no verdict')}): the log invariants "
            "are unknown"
        )
    elif verdict.get("ok") is False:
        counts = ", ".join(f"{k} {n}" for k, n in sorted(verdict["violation_counts"].items()))
        out.append(f"verify: {counts}")
    return out


def format_report(report: Mapping[str, Any]) -> str:
    """The human summary ``framespool chaos`` prints."""
    r = report
    cfg = r.get("config", {})
    lines = [
        f"chaos seed {cfg.get('seed')}: {r['submitted']} jobs on {cfg.get('nodes')} nodes x "
        f"{cfg.get('gpus_per_node')} GPUs in {cfg.get('cells', 1)} cell(s), "
        f"{cfg.get('schedulers', 1)} scheduler instance(s), time scale {cfg.get('time_scale')}, "
        f"wall {r.get('wall_s', 0):.0f} s"
    ]
    by_class = ", ".join(f"{k} {v}" for k, v in sorted(r["failed_by_class"].items())) or "none"
    lines.append(
        f"  submitted {r['submitted']}  completed {r['completed']}  failed {r['failed']} "
        f"({by_class}; {r['failed_as_planned']} as planned)  cancelled {r['cancelled']}  "
        f"rejected {r['rejected']}"
    )
    lines.append(
        f"  lost {r['lost']}  duplicate terminal events {r['duplicate_terminal_events']}  "
        f"leaked GPUs {r['leaked_gpus']}  double-booked GPUs {r['double_booked_gpus']}"
    )
    for job_id, reason in list(r["failed_unexpected"].items())[:5]:
        lines.append(f"  unplanned failure {job_id}: {reason.splitlines()[0][:160]}")
    for job_id, reason in list(r["failed_reasons"].items())[:3]:
        if job_id not in r["failed_unexpected"]:
            lines.append(f"  planned failure {job_id}: {reason.splitlines()[0][:160]}")
    injected = ", ".join(f"{k} {v}" for k, v in sorted(r.get("faults_injected", {}).items()))
    lines.append(f"  faults injected: {injected}")
    if r.get("faults_skipped"):
        lines.append(f"  faults skipped: {r['faults_skipped']}")
    if r.get("supervisor_restarts"):
        lines.append(
            f"  agents restarted by the supervisor (node out of service without a "
            f"fault of ours): {r['supervisor_restarts']}"
        )
    dl = r["dead_letter"]
    lines.append(
        f"  malformed records dead-lettered {dl['dead_lettered']}/{dl['injected']} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(dl['reasons'].items()))})"
    )
    ignored = ", ".join(f"{k} {v}" for k, v in list(r["reports_ignored"].items())[:6])
    lines.append(f"  reports ignored: {ignored or 'none'}")
    lines.append(
        f"  runs resumed from a checkpoint: {r['resumed_runs']}; "
        f"terminal records redelivered with the same id: "
        f"{r['redelivered_terminal_records']}"
    )
    lines.append(
        "  wasted GPU-seconds by fault (from each lost run's last checkpoint to the event "
        "that ended it; lost time in checkpoint intervals):"
    )
    for kind, w in r["wasted_by_fault"].items():
        iv = (
            f"mean {w['lost_intervals_mean']} max {w['lost_intervals_max']} intervals over "
            f"{w['checkpointable_runs']} checkpointable"
            if w["lost_intervals_mean"] is not None
            else "no checkpointable runs"
        )
        lines.append(
            f"    {kind:<34} runs {w['runs']:>3}  {w['gpu_s']:>8.1f} GPU-s  "
            f"({w['gpu_s_per_run']} per run; {iv})"
        )
    if "takeovers" in r:
        lines.append(
            f"  scheduler takeovers {r['takeovers']}: partition revoked -> first decision of "
            f"the new owner max {r['takeover_s_max']} s (assigned -> decision max "
            f"{r.get('takeover_decide_s_max')} s; fault -> revoked max "
            f"{r.get('takeover_detect_s_max')} s; fault -> decision max "
            f"{r.get('takeover_from_fault_s_max')} s); unfinished "
            f"{len(r.get('takeovers_unfinished', ()))}"
        )
    lines.append(f"  jobs rerouted to another cell: {r.get('reroutes', 0)}")
    for row in r.get("drains", ()):
        lines.append(
            f"  empty_cell #{row['fault_id']} {row['cell']}: up to {row['queued_max']} job(s) "
            f"queued while it was empty, {row['rerouted']} rerouted"
        )
    for row in r.get("self_healing", ()):
        lines.append(
            f"  down_agent #{row['fault_id']} {row['node']}: declared DOWN "
            f"{row['declared_down']}, self-healed {row['self_healed']}"
            + (f" after {row['heal_s']} s" if row.get("heal_s") is not None else "")
        )
    verdict = r.get("verify")
    if verdict is not None:
        state = {True: "OK", False: "VIOLATED", None: f"could not run ({verdict.get('error')})"}
        lines.append(
            f"  framespool.processors.tools.verify: {state[verdict.get('ok')]}"
            + "".join(f"\n    {v}" for v in verdict.get("violation_counts", {}).items())
        )
    problems = failures(r)
    lines.append("  result: " + ("OK" if not problems else "FAILED: " + "; ".join(problems)))
    return "\n".join(lines)


SUMMARY_KEYS = (
    "submitted",
    "completed",
    "failed",
    "lost",
    "duplicate_terminal_events",
    "leaked_gpus",
    "double_booked_gpus",
    "takeovers",
    "takeover_s_max",
    "takeover_decide_s_max",
    "takeover_detect_s_max",
    "takeover_from_fault_s_max",
    "reroutes",
    "supervisor_restarts",
    "finished_before_timeout",
    "wall_s",
)


def summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The one-line JSON summary ``framespool chaos`` prints last: the figures a
    run is judged by, the shape it ran at, and each down_agent fault's healing."""
    cfg = report.get("config", {})
    out: dict[str, Any] = {k: cfg.get(k) for k in ("jobs", "seed", "nodes", "cells", "schedulers")}
    out.update({k: report.get(k) for k in SUMMARY_KEYS})
    out["self_healed"] = [row.get("self_healed") for row in report.get("self_healing", ())]
    out["verify_ok"] = (report.get("verify") or {}).get("ok")
    out["result"] = "OK" if not failures(report) else "FAILED"
    return out
