"""Plain-dict forms of the read models: what the store persists and the API returns.

``*_to_dict`` / ``*_from_dict`` round-trip exactly (a test proves it), so a
view read back from the store folds on exactly like the one that was written.
``public_job`` is the API's shape: no dedupe bookkeeping, timeline optional.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from framespool.projections.cluster import Breaker, CellView
from framespool.projections.jobs import JobView, TimelineEntry
from framespool.schemas.events import GpuStatus, NodeStatus, QueueDepth, RunProgress, Shape


def view_to_dict(v: JobView) -> dict[str, Any]:
    doc = {name: getattr(v, name) for name in JobView.__slots__}
    doc["params"] = dict(v.params)
    doc["shapes"] = [[s.gpus, s.gpus_per_node, s.estimate_s] for s in v.shapes]
    doc["nodes"] = list(v.nodes)
    doc["timeline"] = [[e.seq, e.event_id, e.ts_ms, e.type, e.state, e.summary] for e in v.timeline]
    doc["seen"] = list(v.seen)
    doc["held_progress"] = asdict(v.held_progress) if v.held_progress is not None else None
    return doc


def view_from_dict(doc: dict[str, Any]) -> JobView:
    fields = {k: doc[k] for k in JobView.__slots__ if k in doc}
    fields["params"] = dict(doc.get("params", {}))
    fields["shapes"] = tuple(
        Shape(gpus=g, gpus_per_node=n, estimate_s=float(s)) for g, n, s in doc.get("shapes", ())
    )
    fields["nodes"] = tuple(doc.get("nodes", ()))
    fields["timeline"] = tuple(TimelineEntry(*row) for row in doc.get("timeline", ()))
    fields["seen"] = tuple(doc.get("seen", ()))
    held = doc.get("held_progress")
    fields["held_progress"] = RunProgress(**held) if held else None
    return JobView(**fields)


def entry_to_dict(job_id: str, e: TimelineEntry) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "seq": e.seq,
        "event_id": e.event_id,
        "ts_ms": e.ts_ms,
        "type": e.type,
        "state": e.state,
        "summary": e.summary,
    }


def public_job(v: JobView, *, timeline: bool = True) -> dict[str, Any]:
    """The job as ``GET /v1/jobs/{id}`` shows it."""
    doc: dict[str, Any] = {
        "job_id": v.job_id,
        "tenant": v.tenant,
        "user": v.user,
        "state": v.state,
        "phase": v.phase or None,
        "reason": v.reason or None,
        "tier": v.tier,
        "model": v.model,
        "model_version": v.model_version,
        "prompt": v.prompt,
        "params": dict(v.params),
        "gpus": v.gpus,
        "gpus_per_node": v.gpus_per_node,
        "preemptible": v.preemptible,
        "shapes": [
            {"gpus": s.gpus, "gpus_per_node": s.gpus_per_node, "estimate_s": s.estimate_s}
            for s in v.shapes
        ],
        "callback_url": v.callback_url,
        "cell": v.cell or None,
        "run": v.run,
        "nodes": list(v.nodes),
        "assigned_gpus": v.assigned_gpus,
        "progress": v.progress,
        "step": v.step,
        "total_steps": v.total_steps,
        "progress_message": v.progress_message or None,
        "wait_estimate_s": v.wait_estimate_s if v.wait_estimate_s >= 0 else None,
        "wait_p50_s": v.wait_p50_s if v.wait_p50_s >= 0 else None,
        "wait_p90_s": v.wait_p90_s if v.wait_p90_s >= 0 else None,
        "position": v.position or None,
        "reason_code": v.reason_code or None,
        "artifact_uri": v.artifact_uri or None,
        "created_ms": v.created_ms,
        "updated_ms": v.updated_ms,
        "started_ms": v.started_ms or None,
        "finished_ms": v.finished_ms or None,
        "ignored_events": v.ignored,
    }
    if timeline:
        doc["timeline"] = [entry_to_dict(v.job_id, e) for e in v.timeline]
    return doc


def job_status(v: JobView) -> dict[str, Any]:
    """Where the job stands now, for each event of its stream: its state, and while
    it waits why (words and code), its position and its wait band."""
    return {
        "state": v.state,
        "phase": v.phase or None,
        "reason": v.reason or None,
        "reason_code": v.reason_code or None,
        "position": v.position or None,
        "wait_p50_s": v.wait_p50_s if v.wait_p50_s >= 0 else None,
        "wait_p90_s": v.wait_p90_s if v.wait_p90_s >= 0 else None,
        "progress": v.progress,
    }


def cell_to_dict(c: CellView) -> dict[str, Any]:
    return {
        "cell": c.cell,
        "event_id": c.event_id,
        "ts_ms": c.ts_ms,
        "nodes": [
            [
                n.node_id,
                n.state,
                n.gpu_type,
                n.rail,
                [[g.index, g.state, g.job_id, g.run] for g in n.gpus],
            ]
            for n in c.nodes
        ],
        "queues": [[q.tier, q.tenant, q.queued, q.queued_gpus, q.running_gpus] for q in c.queues],
    }


def cell_from_dict(doc: dict[str, Any]) -> CellView:
    nodes = tuple(
        NodeStatus(
            node_id=n,
            state=s,
            gpu_type=t,
            rail=r,
            gpus=tuple(GpuStatus(index=i, state=gs, job_id=j, run=run) for i, gs, j, run in gpus),
        )
        for n, s, t, r, gpus in doc["nodes"]
    )
    queues = tuple(
        QueueDepth(tier=t, tenant=tn, queued=q, queued_gpus=qg, running_gpus=rg)
        for t, tn, q, qg, rg in doc["queues"]
    )
    return CellView(doc["cell"], doc["event_id"], doc["ts_ms"], nodes, queues)


def breaker_to_dict(b: Breaker) -> dict[str, Any]:
    return {name: getattr(b, name) for name in Breaker.__slots__}


def breaker_from_dict(doc: dict[str, Any]) -> Breaker:
    return Breaker(**doc)
