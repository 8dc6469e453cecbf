"""Scheduler takeovers and node self-healing, measured from the log (pure).

Theory of operation
-------------------
A **takeover** is a cell changing owner after the drill killed (SIGKILL) or
paused (SIGSTOP) the scheduler instance that owned it. Each is measured as:

1. **which cells the instance owned** at the fault's time ``T``: its own
   ``assigned``/``revoked`` log lines (``processors/app.py`` logs them as JSON
   with ``rebalance`` and ``partitions`` fields; every scheduler instance logs
   to ``logs/scheduler-<i>.log``), folded up to ``T``; only partitions that
   are cells of the stack count. Without such lines (logs unreadable), every
   cell is taken to be the instance's and every interval starts at ``T``;
2. **the new owner**: the first ``assigned`` line of any instance, after ``T``,
   that lists the cell (an instance restarted by the drill may win it back;
   that is a takeover too);
3. **the revocation**: the rebalance that moved the cell began when the group
   gave up on the old owner (its session timed out) and revoked every
   member's partitions; the new owner logs that as its own ``revoked`` line,
   the last one after ``T`` and before its assignment (eager rebalancing: a
   member that held nothing logs ``revoked []``). Without one: the assignment;
4. **the first decision** of the new owner: the first output record of the
   cell (a ``job-events`` record whose event id names ``cell-<p>`` as its
   source, a ``CellStatus`` among them) whose producer timestamp is at or
   after the assignment.

Per row: ``takeover_s`` = 4 - 3 (partition revoked -> first decision of the
new owner: the group's rebalance, claiming and loading the cell, folding what
queued up meanwhile); ``decide_s`` = 4 - 2 (assigned -> first decision, what
``framespool bench takeover`` times); ``detect_s`` = 3 - ``T`` (mostly the
session timeout: a dead or stopped member is noticed only when it expires);
``from_fault_s`` = 4 - ``T``, the whole outage of the cell. Log lines carry
the processes' wall clock, records their producers' (all on one host here).
A resumed zombie that flushes a batch it had in hand before it notices it was
fenced could put an output of the cell after 2; its event ids are those of
the new owner's re-fold, and ``verify`` judges them.

**Self-healing** (a ``down_agent`` fault): the agent was paused past its
heartbeat lease at ``P`` and resumed at ``R``; it healed itself if the
scheduler declared the node ``DOWN`` after ``P`` and then ``UP`` with a
higher incarnation than before ``P``, at or after ``R`` and before any
supervisor restart of that node after ``R``. ``heal_s`` is that UP's time
minus ``R``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from framespool.chaos.plan import DOWN_AGENT, SCHEDULER_FAULTS
from framespool.schemas import events as ev
from framespool.schemas.states import NodeState

_MSG = re.compile(r"^(?P<op>assigned|revoked) \S+ partitions \[(?P<parts>[0-9, ]*)\]$")
_CELL = re.compile(r"^cell-(?P<p>[0-9]+)$")


@dataclass(frozen=True, slots=True)
class OwnershipChange:
    """One rebalance callback of one instance, from its log."""

    ts_ms: int
    instance: str
    op: str  # "assigned" or "revoked"
    partitions: tuple[int, ...]


def ownership_changes(lines: Iterable[str], instance: str) -> list[OwnershipChange]:
    """The ``assigned``/``revoked`` lines of one instance's JSON log, in order.
    Lines that are not JSON, or not about a rebalance, are skipped; a line from
    before the ``rebalance`` field existed is read from its message."""
    out = []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict) or "ts" not in doc:
            continue
        op, parts = doc.get("rebalance"), doc.get("partitions")
        if op not in ("assigned", "revoked"):
            m = _MSG.match(str(doc.get("msg", "")))
            if not m:
                continue
            op = m["op"]
            parts = [int(p) for p in m["parts"].replace(" ", "").split(",") if p]
        out.append(
            OwnershipChange(
                int(round(float(doc["ts"]) * 1000)),
                str(doc.get("instance") or instance),
                op,
                tuple(sorted(int(p) for p in parts or ())),
            )
        )
    return out


def owned_at(changes: Iterable[OwnershipChange], instance: str, t_ms: int) -> set[int] | None:
    """The partitions ``instance`` held at ``t_ms`` (None: it logged no rebalance by then)."""
    owned: set[int] | None = None
    for c in sorted(changes, key=lambda c: c.ts_ms):
        if c.instance != instance or c.ts_ms > t_ms:
            continue
        owned = owned or set()
        if c.op == "assigned":
            owned |= set(c.partitions)
        else:
            owned -= set(c.partitions)
    return owned


def cell_partition(event: Any) -> int | None:
    """The cell partition whose fold emitted ``event`` (from its event id, else its
    ``cell`` field), or None for an output of no cell."""
    source = str(getattr(event, "event_id", "")).split("@", 1)[0]
    m = _CELL.match(source) or _CELL.match(str(getattr(event, "cell", "")))
    return int(m["p"]) if m else None


def cell_outputs(records: Iterable[tuple[int | None, Any]]) -> list[tuple[int, int]]:
    """``(producer timestamp ms, cell partition)`` of each decoded ``job-events``
    record ``(timestamp_ms, event)`` that a cell's fold emitted."""
    out = []
    for ts, event in records:
        p = cell_partition(event)
        if ts is not None and p is not None:
            out.append((ts, p))
    return out


def takeovers(
    fault_log: Sequence[Mapping[str, Any]],
    changes: Sequence[OwnershipChange],
    outputs: Sequence[tuple[int, int]],
    cells: int,
) -> list[dict[str, Any]]:
    """One row per (scheduler fault, cell its instance owned): who took the cell
    over and the intervals of the module docstring (None when no new owner or no
    decision of it was seen)."""
    by_cell: dict[int, list[int]] = {}
    for ts, p in outputs:
        by_cell.setdefault(p, []).append(ts)
    for stamps in by_cell.values():
        stamps.sort()
    ordered = sorted(changes, key=lambda c: c.ts_ms)

    def secs(a: int | None, b: int | None) -> float | None:
        return None if a is None or b is None else round((b - a) / 1000, 3)

    rows = []
    for f in fault_log:
        if f.get("kind") not in SCHEDULER_FAULTS or f.get("op") not in ("crash", "pause"):
            continue
        if not f.get("ok", True):
            continue
        t, victim = int(f["t_ms"]), str(f.get("target", ""))
        owned = owned_at(changes, victim, t)
        from_logs = owned is not None
        for p in sorted(q for q in (range(cells) if owned is None else owned) if q < cells):
            new = next(
                (c for c in ordered if c.ts_ms > t and c.op == "assigned" and p in c.partitions),
                None,
            )
            assigned = revoked = None
            if new is not None and from_logs:
                assigned = new.ts_ms
                revoked = max(
                    (
                        c.ts_ms
                        for c in ordered
                        if c.instance == new.instance
                        and c.op == "revoked"
                        and t < c.ts_ms
                        and c.ts_ms <= new.ts_ms
                    ),
                    default=assigned,
                )
            elif not from_logs:
                assigned = revoked = t
            first = None
            if assigned is not None:
                first = next((ts for ts in by_cell.get(p, ()) if ts >= assigned), None)
            rows.append(
                {
                    "fault_id": f.get("fault_id"),
                    "kind": f["kind"],
                    "instance": victim,
                    "cell": f"cell-{p}",
                    "by": new.instance if new is not None else None,
                    "measured_from": "rebalance" if from_logs else "fault",
                    "detect_s": secs(t, revoked) if from_logs else None,
                    "takeover_s": secs(revoked, first),
                    "decide_s": secs(assigned, first),
                    "from_fault_s": secs(t, first),
                }
            )
    return rows


def takeover_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The report's ``takeovers`` (how many were measured to a decision) and the
    worst of each interval."""
    measured = [r for r in rows if r["takeover_s"] is not None]

    def worst(key: str) -> float | None:
        return max((r[key] for r in rows if r.get(key) is not None), default=None)

    return {
        "takeovers": len(measured),
        "takeover_s_max": worst("takeover_s"),
        "takeover_decide_s_max": worst("decide_s"),
        "takeover_detect_s_max": worst("detect_s"),
        "takeover_from_fault_s_max": worst("from_fault_s"),
        "takeovers_unfinished": [dict(r) for r in rows if r["takeover_s"] is None],
        "takeover_details": [dict(r) for r in rows],
    }


def self_healing(
    fault_log: Sequence[Mapping[str, Any]], node_changes: Sequence[Any]
) -> list[dict[str, Any]]:
    """One row per ``down_agent`` fault: was the node declared DOWN, did its agent
    re-register by itself with a new incarnation, and how long after its SIGCONT."""
    whole = sorted(
        (e for e in node_changes if isinstance(e, ev.NodeStateChanged) and e.gpu < 0),
        key=lambda e: e.ts_ms,
    )
    steps: dict[Any, dict[str, Any]] = {}
    for f in fault_log:
        if f.get("kind") == DOWN_AGENT and f.get("ok", True):
            steps.setdefault(f["fault_id"], {"node": f["node"]})[f["op"]] = int(f["t_ms"])
    rows = []
    for fault_id, s in sorted(steps.items()):
        node, paused, resumed = s["node"], s.get("pause"), s.get("resume")
        row: dict[str, Any] = {
            "fault_id": fault_id,
            "node": node,
            "declared_down": None,
            "self_healed": None,
            "heal_s": None,
        }
        if paused is None or resumed is None:
            rows.append(row)
            continue
        mine = [e for e in whole if e.node_id == node]
        before = [e.incarnation for e in mine if e.ts_ms <= paused]
        incarnation = max(before, default=0)
        down = [e for e in mine if e.state == NodeState.DOWN and e.ts_ms >= paused]
        row["declared_down"] = bool(down)
        if not down:
            rows.append(row)
            continue
        restarted = min(
            (
                int(r["t_ms"])
                for r in fault_log
                if r.get("kind") == "supervisor" and r.get("node") == node and r["t_ms"] >= resumed
            ),
            default=None,
        )
        up = next(
            (
                e
                for e in mine
                if e.state == NodeState.UP
                and e.incarnation > incarnation
                and e.ts_ms >= down[0].ts_ms
                and (restarted is None or e.ts_ms < restarted)
            ),
            None,
        )
        row["self_healed"] = up is not None
        if up is not None:
            row["heal_s"] = round(max(0, up.ts_ms - resumed) / 1000, 3)
        rows.append(row)
    return rows
