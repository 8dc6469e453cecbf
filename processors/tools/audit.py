"""``audit JOB``: a job's timeline with reasons, and why a waiting job still waits.

:func:`explain_wait` is a query (no IO) of a re-folded :class:`~framespool.processors.core.Cell`:
it asks the core's own predicates (``node_filter``, ``index.find``,
``cap_hit``, ``guarantees_allow``, ``index.earliest_fit``) the questions a
scheduling pass asks, so the answer is the scheduler's, not a second opinion.
It only reads the cell (the predicates it calls read, and ``leaf_of`` finds
the job's existing flow).

Reservations: every reservation (the first, then conservative backfill's
further ones) is listed with its holder, tier, nodes and shadow time, and
whether it binds the job: the core's rule (``reserved_for_others``), a
reservation binds only jobs of its holder's tier or a less important one, and
only past its shadow time; a job that holds one is told which.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.model import Job, Node
from framespool.processors.tools.decoded import event_dict
from framespool.processors.tools.history import (
    LogContents,
    Refold,
    decode_all,
)
from framespool.processors.tools.timeline import Entry, job_timeline
from framespool.schemas import events as ev
from framespool.schemas import positions
from framespool.schemas.states import GpuSlot, GpuState, JobState, NodeState


# --------------------------------------------------------------------------
# Why is it waiting? (pure)
# --------------------------------------------------------------------------
def explain_wait(cell: Cell, job_id: str) -> dict[str, Any]:
    """What holds ``job_id`` back in ``cell`` and what would unblock it."""
    job = cell.jobs.get(job_id)
    if job is None:
        state = cell.finished.get(job_id, "UNKNOWN")
        return {"job_id": job_id, "state": state, "waiting": False, "blockers": [], "unblock": []}
    out: dict[str, Any] = {
        "job_id": job_id,
        "state": job.state,
        "waiting": job.state == JobState.QUEUED,
        "cell": cell.cell_id,
        "now_ms": cell.now_ms,
        "queued_for_s": round((cell.now_ms - job.queued_ms) / 1000, 3),
        "cell_reason": job.reason,
        "wait_estimate_s": round(job.wait_estimate_s, 3),
    }
    if job.state != JobState.QUEUED:
        out["run"] = run_status(cell, job)
        return out
    out["fair_share"] = fair_position(cell, job)
    out["quota"] = quota(cell, job)
    out["shapes"] = [shape_view(cell, job, s) for s in cell.shapes_of(job)]
    out["capacity"] = capacity(cell)
    out["reservation"] = {
        "holder": cell.reservation_job or None,
        "nodes": list(cell.reservation_nodes),
        "shadow_in_s": _in_s(cell, cell.reservation_shadow_ms) if cell.reservation_job else None,
    }
    out["reservations"] = reservations_view(cell, job, job.shape[2])
    out["claims"] = {
        j: {"nodes": list(nodes), "expires_in_s": _in_s(cell, until)}
        for j, (nodes, until) in cell.claims.items()
    }
    model = f"{job.spec.model}@{job.spec.model_version}"
    out["breakers"] = [
        {
            "scope": scope,
            "key": key,
            "for_s": _in_s(cell, until),
            "probe": "#".join(map(str, cell.breaker_probes.get((m, scope, key), ()))),
        }
        for (m, scope, key), until in cell.breakers.items()
        if m == model and until > cell.now_ms
    ]
    tier = cell.config.tier(job.tier)
    out["preemption"] = {
        "tier_may_preempt": bool(tier and tier.may_preempt),
        "sla_wait_s": tier.sla_wait_s if tier else None,
        "under_guarantee": cell.under_guarantee(job),
        "claim": job_id in cell.claims,
    }
    out["blockers"], out["unblock"] = _verdict(cell, job, out)
    return out


def _in_s(cell: Cell, ms: int) -> float:
    return round((ms - cell.now_ms) / 1000, 3)


def _rank(cell: Cell, tier_name: str) -> int | None:
    tier = cell.config.tier(tier_name)
    return tier.rank if tier is not None else None


def reservations_view(cell: Cell, job: Job, estimate_s: float) -> list[dict[str, Any]]:
    """Every reservation in the cell (the first, then the further ones of
    conservative backfill, in order) as ``job`` sees it: who holds which nodes
    until when, and whether it binds ``job``. The rule is the core's
    (``Reservations.reserved_for_others``): the first reservation's holder is
    bound by none; any other job may not use a reservation's nodes past its
    shadow time if the holder's tier is the job's own or a more important one
    (a reservation binds only jobs of its holder's tier or less important ones)."""
    rows = []
    entries = []
    if cell.reservation_job:
        entries.append((cell.reservation_job, cell.reservation_shadow_ms, cell.reservation_nodes))
    entries.extend((j, shadow, nodes) for j, (shadow, nodes) in cell.more_reservations().items())
    rank = _rank(cell, job.tier)
    rank = 0 if rank is None else rank
    first_holder = job.job_id == cell.reservation_job
    end_ms = cell.now_ms + estimate_s * 1000
    for i, (holder, shadow_ms, nodes) in enumerate(entries):
        other = cell.jobs.get(holder)
        tier = other.tier if other is not None else None
        holder_rank = _rank(cell, tier) if tier is not None else None
        if holder == job.job_id:
            binds, why = False, "its own"
        elif first_holder:
            binds, why = False, "the first reservation's holder goes before every other"
        elif holder_rank is not None and holder_rank > rank:
            binds, why = (
                False,
                (
                    f"held for a less important tier ({tier}); it binds only {tier} "
                    "and less important tiers"
                ),
            )
        elif end_ms <= shadow_ms:
            binds, why = False, "this job would end before the shadow time (backfill)"
        else:
            binds, why = (
                True,
                (
                    f"held for tier {tier}, "
                    + (
                        "this job's own tier"
                        if tier == job.tier
                        else f"more important than {job.tier}"
                    )
                    + "; this job would not end before the shadow time"
                ),
            )
        rows.append(
            {
                "holder": holder,
                "tier": tier,
                "first": i == 0 and holder == cell.reservation_job,
                "order": i + 1,
                "nodes": list(nodes),
                "shadow_in_s": _in_s(cell, shadow_ms),
                "binds": binds,
                "why": why,
            }
        )
    return rows


def run_status(cell: Cell, job: Job) -> dict[str, Any]:
    run = cell.runs.get((job.job_id, job.run))
    if run is None:
        return {"run": job.run, "phase": None}
    return {
        "run": run.run,
        "phase": run.phase,
        "held": {n: list(g) for n, g in run.held.items()},
        "started_s_ago": round((cell.now_ms - run.started_ms) / 1000, 3),
        "projected_end_in_s": _in_s(cell, run.projected_end_ms(cell.now_ms)),
        "limit_in_s": _in_s(cell, run.limit_ms),
        "last_report_s_ago": round((cell.now_ms - run.last_report_ms) / 1000, 3),
        "exit": run.exit_intent or None,
    }


def fair_position(cell: Cell, job: Job) -> dict[str, Any]:
    """The job's place in its user's queue, and each of its flows' rank among
    backlogged siblings by virtual time (the pass serves the lowest first)."""
    leaf = cell.leaf_of(job)
    queued = job.job_id in leaf.requeued or job.job_id in leaf.queue
    pos, own_ahead = cell.own_place(job) if queued else (0, job.cost)
    levels = []
    for flow, level in zip(leaf.chain(), ("user", "organisation", "tier")):
        assert flow.parent is not None  # chain() yields only the flows below the root
        siblings = list(flow.parent.active.values())
        ranked = sorted(range(len(siblings)), key=lambda i: (siblings[i].vt(), i))
        rank = ranked.index(siblings.index(flow)) + 1 if flow in siblings else None
        ahead = [siblings[i].name for i in ranked[: (rank or 1) - 1]]
        levels.append(
            {
                "level": level,
                "name": flow.name,
                "weight": flow.weight,
                "usage_gpu_s": round(flow.usage, 3),
                "virtual_time": round(flow.vt(), 3),
                "rank": rank,
                "backlogged": len(siblings),
                "served_before": ahead[:5],
            }
        )
    return {
        "position_in_queue": pos,
        "queue_length": leaf.queued,
        "requeued": job.job_id in leaf.requeued,
        "gpu_seconds_ahead": round(cell.fair.work_ahead(leaf, own_ahead) - job.cost, 3),
        "predicted_wait_s": round(cell.predicted_wait_s(job, own_ahead), 3),
        "levels": levels,
    }


def quota(cell: Cell, job: Job) -> dict[str, Any]:
    tenant = cell.config.tenant(job.tenant)
    org = cell.org_use.get(job.tenant)
    user = cell.user_use.get((job.tenant, job.user))
    return {
        "verdict": cell.cap_hit(job) or None,
        "gpus_asked": job.shape[0],
        "org": {
            "name": job.tenant,
            "gpus": org.gpus if org else 0,
            "max_gpus": tenant.max_gpus,
            "running": org.running if org else 0,
            "max_running": tenant.max_running,
        },
        "user": {
            "name": job.user,
            "gpus": user.gpus if user else 0,
            "max_gpus": tenant.user_max_gpus,
            "running": user.running if user else 0,
            "max_running": tenant.user_max_running,
        },
    }


def _why_not(cell: Cell, job: Job, node: Node, estimate_s: float, holder: bool) -> str:
    """The first thing that keeps a node with enough free GPUs from the job (labels
    for the core's ``node_filter`` verdict)."""
    spec = job.spec
    if node.node_id in cell.claimed_nodes(job.job_id):
        return "claimed by a preemptor"
    if node.node_id in cell.reserved_for_others(job.job_id, estimate_s, holder):
        if cell.reservation_job and node.node_id in cell.reservation_nodes:
            return "reserved for the reservation holder"
        return "reserved for a further reservation (conservative backfill)"
    if spec.gpu_type and node.gpu_type != spec.gpu_type:
        return f"GPU type {node.gpu_type}, job needs {spec.gpu_type}"
    model = f"{spec.model}@{spec.model_version}"
    if cell.breakers and cell.breaker_bars(job, estimate_s, model, node):
        if any(
            cell.breakers.get(k, 0) > cell.now_ms
            for k in ((model, "node", node.node_id), (model, "gpu_type", node.gpu_type))
        ):
            return f"breaker open for {model}"
        return (
            f"breaker half-open for {model}: this job may not probe it (estimate over "
            "breaker_probe_max_s, its tenant tripped it and another tenant goes first, "
            "or its tenant's probe did not succeed)"
        )
    return "CPU or memory"


def shape_view(cell: Cell, job: Job, shape: tuple[int, int, float]) -> dict[str, Any]:
    gpus, per_node, estimate = shape
    per, nodes_needed = min(per_node, gpus), -(-gpus // per_node)
    holder = cell.reservation_job == job.job_id
    ok_now = cell.node_filter(job, estimate, holder=holder, claim_only=False)
    ok_unreserved = cell.node_filter(job, estimate, holder=True, claim_only=False)
    now = cell.index.find(gpus, per_node, job.spec.model, ok_now)
    # try_start refuses a non-preemptible job the free GPUs of others' idle guarantees
    refused = not job.spec.preemptible and not cell.guarantees_allow(job, gpus)
    fitting = [cell.index.nodes[n] for n, free in cell.index.bucket_of.items() if free >= per]
    excluded = Counter(_why_not(cell, job, n, estimate, holder) for n in fitting if not ok_now(n))
    by_rail = Counter(n.rail for n in fitting if ok_now(n))
    releases = sorted(
        (run.projected_end_ms(cell.now_ms), node_id, len(g), run.key)
        for run in cell.runs.values()
        for node_id, g in run.held.items()
    )
    fit = cell.index.earliest_fit(per, nodes_needed, releases, ok_unreserved)
    exists = sum(
        1
        for n in cell.index.nodes.values()
        if n.state != NodeState.DOWN
        and n.total >= per
        and (not job.spec.gpu_type or n.gpu_type == job.spec.gpu_type)
    )
    return {
        "gpus": gpus,
        "gpus_per_node": per_node,
        "nodes_needed": nodes_needed,
        "estimate_s": estimate,
        "fits_now": now is not None and not refused,
        "placement": now.reason if now else None,
        "fits_ignoring_reservation": cell.index.find(gpus, per_node, job.spec.model, ok_unreserved)
        is not None,
        "blocked_by_guarantees": refused and now is not None,
        "nodes_with_room": len(fitting),
        "eligible_nodes": sum(by_rail.values()),
        "eligible_by_rail": dict(sorted(by_rail.items())),
        "excluded": dict(excluded),
        "nodes_that_could_ever_fit": exists,
        "earliest_start_in_s": _in_s(cell, max(fit[0], cell.now_ms)) if fit else None,
        "backfill_before_reservation": bool(
            cell.reservation_job
            and not holder
            and cell.now_ms + estimate * 1000 <= cell.reservation_shadow_ms
        ),
    }


def capacity(cell: Cell) -> dict[str, Any]:
    gpus: Counter = Counter()
    nodes: Counter = Counter()
    unhealthy = []
    for node in cell.index.nodes.values():
        nodes[node.state] += 1
        if node.state != NodeState.UP:
            unhealthy.append(
                {"node": node.node_id, "state": node.state, "reason": node.state_reason}
            )
        for i in range(node.total):
            if node.state == NodeState.DOWN:
                gpus[GpuSlot.DOWN] += 1
            elif node.owner[i] is not None:
                gpus[GpuSlot.BUSY] += 1
            elif node.gpu_state[i] != GpuState.OK:
                gpus[node.gpu_state[i]] += 1
            else:
                gpus[GpuSlot.FREE if node.schedulable else "idle_not_schedulable"] += 1
    return {
        "free_schedulable": cell.index.free_total,
        "gpus": dict(gpus),
        "nodes": dict(nodes),
        "unhealthy_nodes": unhealthy[:20],
    }


def _verdict(cell: Cell, job: Job, view: dict[str, Any]) -> tuple[list[dict], list[str]]:
    """Blockers (machine-readable code + detail) and what would unblock the job."""
    blockers: list[dict] = []
    unblock: list[str] = []

    def block(code: str, detail: str, fix: str) -> None:
        blockers.append({"code": code, "detail": detail})
        unblock.append(fix)

    if job.job_id in cell.claims:
        nodes, until = cell.claims[job.job_id]
        block(
            "preempting",
            f"{job.reason}; it holds a claim on {', '.join(nodes)}",
            f"the victims checkpoint and stop (within {_in_s(cell, until):.0f}s); then it "
            "starts on the claimed nodes",
        )
    q = view["quota"]
    if q["verdict"]:
        scope = q[q["verdict"]]
        block(
            f"quota_{q['verdict']}",
            f"{q['verdict']} {scope['name']} uses {scope['gpus']} GPUs "
            f"(max {scope['max_gpus'] or 'unlimited'}) in {scope['running']} runs "
            f"(max {scope['max_running'] or 'unlimited'}); this job asks {q['gpus_asked']}",
            f"one of {scope['name']}'s runs ends, or its quota is raised",
        )
    shapes = view["shapes"]
    if any(s["fits_now"] for s in shapes):
        fair = view["fair_share"]
        if not q["verdict"]:
            block(
                "next_pass",
                f"it fits now ({next(s['placement'] for s in shapes if s['fits_now'])})"
                f"; {fair['position_in_queue'] - 1} job(s) ahead of it in its own queue",
                "nothing: the next scheduling pass (every Tick) places it unless work ahead "
                "of it in fair order takes the GPUs first",
            )
        return blockers, unblock
    best = min(
        shapes, key=lambda s: (s["earliest_start_in_s"] is None, s["earliest_start_in_s"] or 0)
    )
    shape = f"{best['gpus']} GPU(s) as {best['nodes_needed']} node(s) x {best['gpus_per_node']}"
    if best["nodes_that_could_ever_fit"] < best["nodes_needed"]:
        block(
            "topology",
            f"{shape}: only {best['nodes_that_could_ever_fit']} live node(s) are "
            f"big enough{' and of type ' + job.spec.gpu_type if job.spec.gpu_type else ''}",
            "more (or repaired) nodes of that shape join the cell, or the job asks for fewer "
            "GPUs per node",
        )
    reservations = view.get("reservations", [])
    own = next((r for r in reservations if r["holder"] == job.job_id), None)
    binding = [r for r in reservations if r["binds"]]
    per = min(best["gpus_per_node"], best["gpus"])
    with_room = [
        r
        for r in binding
        if any(
            n in cell.index.nodes and cell.index.nodes[n].free_count() >= per for n in r["nodes"]
        )
    ]
    binding = with_room or binding  # the ones that keep it off GPUs free now first
    tier_note = "others of its tier or a less important one backfill around it"
    if view["reservation"]["holder"] == job.job_id:
        block(
            "reservation_holder",
            f"it holds the reservation on "
            f"{', '.join(view['reservation']['nodes'])} from t+"
            f"{view['reservation']['shadow_in_s']:.0f}s; {tier_note} only if they end "
            "before then (more important tiers are not held back)",
            "the reserved nodes free up (running runs end) and it starts there",
        )
    elif own is not None:
        block(
            "reservation_holder",
            f"it holds reservation {own['order']} of {len(reservations)} (conservative "
            f"backfill) on {', '.join(own['nodes'])} from t+{own['shadow_in_s']:.0f}s; "
            f"{tier_note} only if they end before then",
            "the reserved nodes free up (running runs end) and it starts there",
        )
    if view["reservation"]["holder"] != job.job_id and best["fits_ignoring_reservation"]:
        res = view["reservation"]
        for r in binding or [
            {"holder": res["holder"], "nodes": res["nodes"], "shadow_in_s": res["shadow_in_s"], "tier": None, "first": True, "why": ""}
        ]:  # fmt: skip
            kind = "EASY backfill" if r["first"] else "conservative backfill"
            rule = (
                f" (tier {r['tier']}: a reservation binds jobs of its holder's tier or a "
                f"less important one, and {job.tier} is "
                + ("the same tier" if r["tier"] == job.tier else f"less important than {r['tier']}")
                + ")"
                if r["tier"]
                else ""
            )
            block(
                "reservation",
                f"{r['holder']} holds {', '.join(r['nodes'])} until t+"
                f"{r['shadow_in_s']:.0f}s and this job ({best['estimate_s']:g}s) would not "
                f"finish before then ({kind}){rule}",
                f"{r['holder']} starts, or a shape that ends before the reservation's shadow time",
            )
    if any(s["blocked_by_guarantees"] for s in shapes):
        block(
            "guarantees",
            "the free GPUs are other tenants' or tiers' idle reserved capacity, "
            "which non-preemptible work may not borrow",
            "submit it preemptible, or wait for unreserved GPUs",
        )
    if best["fits_ignoring_reservation"] and view["reservation"]["holder"] != job.job_id:
        return blockers, unblock
    excluded = ", ".join(f"{n} {why}" for why, n in best["excluded"].items())
    free = view["capacity"]["free_schedulable"]
    block(
        "capacity",
        f"{shape}: {best['eligible_nodes']} eligible node(s) have "
        f"{min(best['gpus_per_node'], best['gpus'])} free GPUs, {best['nodes_needed']} needed; "
        f"{free} GPU(s) free in the cell" + (f"; excluded: {excluded}" if excluded else ""),
        f"running work ends: projected start in {best['earliest_start_in_s']:.0f}s"
        if best["earliest_start_in_s"] is not None
        else "no projected release frees enough nodes: nodes must recover or join",
    )
    for b in view["breakers"]:
        block(
            "breaker",
            f"breaker open for {job.spec.model}@{job.spec.model_version} on "
            f"{b['scope']} {b['key']}",
            f"probe run {b['probe']} is running: its success closes the breaker"
            if b["probe"]
            else f"half-open in {b['for_s']:.0f}s: the next placement probes it",
        )
    if view["capacity"]["unhealthy_nodes"]:
        bad = ", ".join(
            f"{n['node']} {n['state']}" for n in view["capacity"]["unhealthy_nodes"][:5]
        )
        blockers.append({"code": "health", "detail": f"nodes not UP: {bad}"})
    return blockers, unblock


# --------------------------------------------------------------------------
# The audit of one job
# --------------------------------------------------------------------------
@dataclass
class AuditReport:
    job_id: str
    cell: str = ""
    state: str = "UNKNOWN"
    spec: Any = None
    terminal: Any = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[Entry] = field(default_factory=list)
    explanation: dict[str, Any] | None = None
    # what the audit cannot show because the log's head expired (retention)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "cell": self.cell,
            "state": self.state,
            "spec": event_dict(self.spec),
            "terminal": event_dict(self.terminal),
            "runs": self.runs,
            "timeline": [e.to_dict() for e in self.timeline],
            "explanation": self.explanation,
            "notes": self.notes,
        }

    def render(self) -> str:
        s = self.spec
        head = f"job {self.job_id}: {self.state}" + (f" in {self.cell}" if self.cell else "")
        if s is not None:
            head += (
                f"  tenant {s.tenant}/{s.user or s.tenant}, tier {s.tier}, {s.gpus} GPU(s),"
                f" model {s.model}@{s.model_version}"
            )
        lines = [head, ""]
        lines.extend(e.line() for e in self.timeline)
        for r in self.runs:
            lines.append(
                f"run {r['run']}: {r['gpus']} GPU(s) on {', '.join(r['nodes'])}: "
                f"{r['reason']} -> {r['end'] or 'live'}"
            )
        x = self.explanation
        if x and x.get("waiting"):
            lines += ["", f"waiting {x['queued_for_s']:.0f}s; cell says: {x['cell_reason'] or '-'}"]
            fair = x["fair_share"]
            lines.append(
                f"fair share: #{fair['position_in_queue']} of {fair['queue_length']} in "
                f"its queue; {fair['gpu_seconds_ahead']:.0f} GPU-s ahead; ranks "
                + ", ".join(
                    f"{lv['level']} {lv['name']} {lv['rank']}/{lv['backlogged']}"
                    for lv in fair["levels"]
                )
            )
            for r in x.get("reservations", []):
                lines.append(
                    f"reservation {r['order']}: {r['holder']} (tier {r['tier'] or '?'}) holds "
                    f"{', '.join(r['nodes'])} from t+{r['shadow_in_s']:.0f}s: "
                    + ("binds this job" if r["binds"] else "does not bind this job")
                    + f" ({r['why']})"
                )
            for b in x["blockers"]:
                lines.append(f"blocked ({b['code']}): {b['detail']}")
            for u in x["unblock"]:
                lines.append(f"unblocks when: {u}")
        elif x and x.get("run"):
            lines += ["", f"live run: {x['run']}"]
        if self.notes:
            lines.append("")
            lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def audit(
    log: LogContents,
    job_id: str,
    config: CellConfig | None = None,
    starts: Mapping[int, tuple[Any, int]] | None = None,
) -> AuditReport:
    """The job's timeline; for a live job, its re-folded cell's view of it.

    Where the log's head expired, the timeline shows what is left and says so;
    a live job's cell is re-folded from its snapshot (``starts``: per partition,
    ``(cell, offset)``), or not explained when none covers the gap."""
    commands = decode_all(log.commands)
    job_events = decode_all(log.job_events)
    assignments = decode_all(log.assignments)
    report = AuditReport(job_id)
    for d in (*commands, *job_events):
        if isinstance(d.event, (ev.SubmitJob, ev.JobAdmitted)) and d.event.spec.job_id == job_id:
            report.spec = d.event.spec
            report.cell = getattr(d.event, "cell", "") or report.cell
    partitions = log.scheduler_partitions()
    if report.cell:
        wanted = int(report.cell.split("-")[1])
        partitions = {p: r for p, r in partitions.items() if p == wanted}
    scheduler = [d for records in partitions.values() for d in decode_all(records)]
    report.timeline = job_timeline(
        job_id,
        commands=commands,
        scheduler=scheduler,
        job_events=job_events,
        assignments=assignments,
    )
    report.runs = _runs(report.timeline)
    gone = sorted(
        f"{topic}[{p}]"
        for topic, p in _expired([*log.commands, *log.job_events, *log.assignments, *log.scheduler])
    )
    if gone:
        report.notes.append(
            "the log's head expired on "
            + ", ".join(gone)
            + ": the timeline shows what is left (events before may be missing)"
        )
    terminals = [e.event for e in report.timeline if isinstance(e.event, ev.TERMINAL_EVENTS)]
    if terminals:
        report.terminal = terminals[0]
        report.state = type(terminals[0]).__name__.removeprefix("Job").upper()
    elif report.cell and partitions:
        p = int(report.cell.split("-")[1])
        records = partitions[p]
        head = records[0].offset if records else 0
        start = (starts or {}).get(p)
        refold = Refold(p, config, log.topics)
        if start is not None and start[1] >= head - 1:
            refold.cell, refold.last_offset = start
            records = [r for r in records if r.offset > start[1]]
            head = 0
        if head > 0:
            report.notes.append(
                f"{report.cell}'s log starts at offset {head} (its head expired) and no snapshot "
                "covers the gap: the cell's view of this job cannot be re-derived"
            )
        else:
            refold.run(records)
            report.explanation = explain_wait(refold.cell, job_id)
            report.state = report.explanation["state"]
    elif report.spec is not None:
        report.state = "SUBMITTED"
    return report


def _expired(records: list[Any]) -> set[tuple[str, int]]:
    first: dict[tuple[str, int], int] = {}
    for r in records:
        tp = (r.topic, r.partition)
        first[tp] = min(first.get(tp, r.offset), r.offset)
    return {tp for tp, offset in first.items() if offset > 0}


def _runs(timeline: list[Entry]) -> list[dict[str, Any]]:
    runs: dict[int, dict[str, Any]] = {}
    for e in timeline:
        x = e.event
        if isinstance(x, ev.JobAssigned) and positions.parse_cell(x.event_id):
            runs[x.run] = {
                "run": x.run,
                "gpus": x.gpus,
                "nodes": list(e.nodes),
                "reason": x.reason,
                "assigned_ms": x.ts_ms,
                "end": None,
            }
        elif isinstance(x, ev.RUN_ENDS) and x.run in runs and runs[x.run]["end"] is None:
            runs[x.run]["end"] = f"{type(x).__name__}: {e.summary}"
    return list(runs.values())
