"""The cluster read model: a pure fold of ``CellStatus`` (and node/breaker events,
and the cells' ``CellOffer``).

Theory of operation
-------------------
Each cell's scheduler periodically publishes a ``CellStatus``: its GPU map and
its queue depths per (tier, tenant). The latest status per cell *is* that cell's
view; the cluster view is the set of cells, and totals are computed from it.

1. A ``CellStatus`` older than (or a duplicate of) the cell's current one is a
   no-op, so duplicates and replays leave the view unchanged.
2. ``NodeStateChanged`` between two statuses patches the node (``gpu == -1``)
   or one GPU in place, if it is newer than the cell's status; the next
   ``CellStatus`` supersedes it anyway.
3. ``BreakerTripped`` keeps the latest breaker per (model version, scope, key);
   a breaker past ``until_ms`` is shown as expired by ``to_dict(now_ms)``.
4. ``CellOffer`` keeps each cell's newest offer in ``offers`` (an older or
   duplicate one is a no-op). The API refuses at submit, from these, a job whose
   predicted wait exceeds its tier's limit
   (``framespool.processors.core.offers.wait_refusal``). Offers live in memory
   only, in the consumer's view: they are stale within seconds, so a restarted
   API has none until the next one arrives (one status interval), and none means
   "unknown": nothing is refused on it.

GPU counting: a GPU of a node that is DOWN counts as down; a free GPU of a node
that is DEGRADED or DRAINING counts as degraded (it takes no new work).

Who sees what: ``to_dict(view, tenant=..., owns_job=...)`` is a tenant's view. It
keeps every total (GPUs per bucket, queue depth per tier) but shows only the
caller's row of the per-tenant queues, and a busy GPU's job id and run only
when the caller owns that job; other tenants' names and job ids never appear.
Breaker reasons name no job (the scheduler's since issue #33); a reason from an
older log that names a probe run (``probe run <job>#<run>``) or an API job id
(``job_<hex>``) is shown to a tenant with another tenant's job left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from framespool.schemas.events import (
    BreakerTripped,
    CellOffer,
    CellStatus,
    GpuStatus,
    NodeStateChanged,
    NodeStatus,
)
from framespool.schemas.states import GpuSlot, NodeState

CLUSTER_EVENT_TYPES = frozenset({"CellStatus", "NodeStateChanged", "BreakerTripped", "CellOffer"})
GPU_BUCKETS = (GpuSlot.BUSY, GpuSlot.FREE, GpuSlot.DEGRADED, GpuSlot.DOWN)
_NODE_OUT = frozenset({NodeState.DEGRADED, NodeState.DRAINING})  # up, but takes no new work
# job ids in reasons from logs older than issue #33: "probe run <job>#<run>", "job_<hex>"
_PROBE_RUN = re.compile(r"(probe run) (\S+?)#([0-9]+)")
_API_JOB_ID = re.compile(r"\bjob_[0-9a-f]{6,}(?:#[0-9]+)?\b")


def public_reason(reason: str, visible: Callable[[str], bool]) -> str:
    """``reason`` without the ids of jobs the reader may not see (``visible``)."""
    reason = _PROBE_RUN.sub(lambda m: m.group(0) if visible(m.group(2)) else m.group(1), reason)
    return _API_JOB_ID.sub(
        lambda m: m.group(0) if visible(m.group(0).split("#", 1)[0]) else "another job", reason
    )


@dataclass(frozen=True, slots=True)
class CellView:
    cell: str
    event_id: str
    ts_ms: int
    nodes: tuple[NodeStatus, ...] = ()
    queues: tuple[Any, ...] = ()  # QueueDepth records


@dataclass(frozen=True, slots=True)
class Breaker:
    model_version: str
    scope: str
    key: str
    until_ms: int
    reason: str
    ts_ms: int


@dataclass(frozen=True, slots=True)
class ClusterView:
    cells: dict[str, CellView] = field(default_factory=dict)
    breakers: dict[str, Breaker] = field(default_factory=dict)
    updated_ms: int = 0
    offers: dict[str, CellOffer] = field(default_factory=dict)  # cell -> newest (not stored)


def is_cluster_event(event: Any) -> bool:
    return type(event).__name__ in CLUSTER_EVENT_TYPES


def apply(view: ClusterView | None, event: Any) -> ClusterView:
    """Fold one event into the cluster view; unrelated events are no-ops."""
    view = view or ClusterView()
    if isinstance(event, CellStatus):
        current = view.cells.get(event.cell)
        if current is not None and (event.ts_ms, event.event_id) <= (
            current.ts_ms,
            current.event_id,
        ):
            return view
        cell = CellView(
            event.cell, event.event_id, event.ts_ms, tuple(event.nodes), tuple(event.queues)
        )
        return _touch(replace(view, cells={**view.cells, event.cell: cell}), event.ts_ms)
    if isinstance(event, NodeStateChanged):
        return _node_changed(view, event)
    if isinstance(event, CellOffer):
        held = view.offers.get(event.cell)
        if held is not None and (event.ts_ms, event.event_id) <= (held.ts_ms, held.event_id):
            return view
        return replace(view, offers={**view.offers, event.cell: event})
    if isinstance(event, BreakerTripped):
        key = f"{event.model_version}|{event.scope}|{event.key}"
        old = view.breakers.get(key)
        if old is not None and old.ts_ms >= event.ts_ms:
            return view
        breaker = Breaker(
            event.model_version, event.scope, event.key, event.until_ms, event.reason, event.ts_ms
        )
        return _touch(replace(view, breakers={**view.breakers, key: breaker}), event.ts_ms)
    return view


def changed_cells(before: ClusterView, after: ClusterView) -> list[str]:
    """Cells whose view differs (what a store has to rewrite)."""
    return sorted(c for c, v in after.cells.items() if before.cells.get(c) is not v)


def _touch(view: ClusterView, ts_ms: int) -> ClusterView:
    return replace(view, updated_ms=max(view.updated_ms, ts_ms))


def _node_changed(view: ClusterView, e: NodeStateChanged) -> ClusterView:
    for name, cell in view.cells.items():
        if e.ts_ms < cell.ts_ms:
            continue
        for i, node in enumerate(cell.nodes):
            if node.node_id != e.node_id:
                continue
            if e.gpu < 0:
                node = replace(node, state=e.state)
            else:
                node = replace(
                    node,
                    gpus=tuple(
                        replace(g, state=e.state) if g.index == e.gpu else g for g in node.gpus
                    ),
                )
            nodes = cell.nodes[:i] + (node,) + cell.nodes[i + 1 :]
            cells = {**view.cells, name: replace(cell, nodes=nodes)}
            return _touch(replace(view, cells=cells), e.ts_ms)
    return view


# --------------------------------------------------------------------------
# Derived figures
# --------------------------------------------------------------------------
def gpu_bucket(node: NodeStatus, gpu: GpuStatus) -> str:
    """Which of busy/free/degraded/down a GPU counts as."""
    if node.state == NodeState.DOWN or gpu.state in (GpuSlot.DOWN, GpuSlot.FAILED):
        return GpuSlot.DOWN
    if gpu.state == GpuSlot.BUSY:
        return GpuSlot.BUSY
    if gpu.state == GpuSlot.FREE and node.state not in _NODE_OUT:
        return GpuSlot.FREE
    return GpuSlot.DEGRADED


def totals(view: ClusterView) -> dict[str, int]:
    out: dict[str, int] = {b: 0 for b in GPU_BUCKETS}
    nodes = 0
    for cell in view.cells.values():
        for node in cell.nodes:
            nodes += 1
            for gpu in node.gpus:
                out[gpu_bucket(node, gpu)] += 1
    out["total"] = sum(out[b] for b in GPU_BUCKETS)
    out["nodes"] = nodes
    return out


def queue_depths(view: ClusterView) -> dict[str, dict[str, dict[str, int]]]:
    """Queued jobs and GPUs summed over cells, per tier and per tenant."""
    by_tier: dict[str, dict[str, int]] = {}
    by_tenant: dict[str, dict[str, int]] = {}
    for cell in view.cells.values():
        for q in cell.queues:
            for bucket, name in ((by_tier, q.tier), (by_tenant, q.tenant)):
                row = bucket.setdefault(name, {"queued": 0, "queued_gpus": 0, "running_gpus": 0})
                row["queued"] += q.queued
                row["queued_gpus"] += q.queued_gpus
                row["running_gpus"] += q.running_gpus
    return {"by_tier": dict(sorted(by_tier.items())), "by_tenant": dict(sorted(by_tenant.items()))}


def to_dict(
    view: ClusterView,
    now_ms: int | None = None,
    *,
    detail: bool = True,
    tenant: str | None = None,
    owns_job: Callable[[str], bool] | None = None,
) -> dict:
    """The ``GET /v1/cluster`` document; with ``tenant``, that tenant's view of it
    (``owns_job(job_id)`` says whether a running job is the caller's)."""
    queues = queue_depths(view)
    if tenant is not None:
        queues["by_tenant"] = {k: v for k, v in queues["by_tenant"].items() if k == tenant}

    def visible(job_id: str) -> bool:
        return tenant is None or (bool(job_id) and owns_job is not None and owns_job(job_id))

    doc: dict[str, Any] = {
        "updated_ms": view.updated_ms,
        "totals": totals(view),
        "queues": queues,
        "cells": [],
    }
    for name in sorted(view.cells):
        cell = view.cells[name]
        cell_doc: dict[str, Any] = {
            "cell": name,
            "ts_ms": cell.ts_ms,
            "totals": totals(ClusterView(cells={name: cell})),
        }
        if detail:
            cell_doc["nodes"] = [
                {
                    "node_id": n.node_id,
                    "state": n.state,
                    "gpu_type": n.gpu_type,
                    "rail": n.rail,
                    "gpus": [
                        {
                            "index": g.index,
                            "state": g.state,
                            "bucket": gpu_bucket(n, g),
                            "job_id": g.job_id if visible(g.job_id) else None,
                            "run": g.run if visible(g.job_id) else 0,
                        }
                        for g in n.gpus
                    ],
                }
                for n in cell.nodes
            ]
        doc["cells"].append(cell_doc)
    doc["breakers"] = [
        {
            "model_version": b.model_version,
            "scope": b.scope,
            "key": b.key,
            "until_ms": b.until_ms,
            "reason": b.reason if tenant is None else public_reason(b.reason, visible),
            "active": now_ms is None or b.until_ms > now_ms,
        }
        for _, b in sorted(view.breakers.items())
    ]
    return doc
