"""A fleet of cells in one command: ``simulate --cells N``.

The fleet's nodes are split evenly into N cells. Each cell writes its own
``cell-XX/`` (summary.json, jobs.csv, runs.csv); the fleet's ``summary.json``,
``jobs.csv`` and ``runs.csv`` merge them, and the summary says which routing
ran (``routing``). Two routings:

- ``admission`` (the default): the real admission fold routes each job at its
  submit time by the cells' offers, as production does (``routed``): lowest
  predicted wait, tenant stickiness, quota homes. The cells advance together
  in virtual time in one process, so the command costs the sum of the cells'
  folds; the summary's ``admission`` counts the decisions (admitted per cell,
  rerouted, rejected ``no_cell_can_run``, refused at the edge).
- ``hash``: every job goes to the rendezvous hash of its job id, admission's
  rule when no cell has offered (start-up, cells that do not publish). The
  cells then share nothing and are folded in parallel worker processes (fork:
  the workload's generator and its routing are inherited, not pickled): the
  mode for top-scale runs, at the price of routing blind to the cells' load.

Cost model of ``hash``: the parent reads the workload's stream once, up to the horizon
(``--max-sim-s``), and routes each job (``multitenant.route``: one byte per
job); each cell regenerates the stream up to the horizon and keeps its own
jobs (``multitenant.partition``). So a 5 M-job day bounded at half an hour
generates the half hour's jobs 1 + N times and hashes them once, never the
day's other jobs; memory per cell is its own jobs in flight. The cell's
configuration, O(tenants) to make (778 k tenants for 5 M jobs), is made once
in the parent too.

Cost model of ``admission``: see ``routed``; the stream is generated once, up
to the horizon, and nothing is forked.

Fleet figures: ``wall_s`` is the whole command; ``events_per_s`` is all
cells' events over it; ``headroom`` is the min / median / max over the cells
of ``virtual_s / core_s`` (how much faster than real time a cell's core folds
its day; ``headroom_min`` is the slowest cell's); ``jobs_inside_horizon`` the
jobs submitted at or before the horizon, ``jobs_past_horizon`` the rest of the
workload, never generated.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
from array import array
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from time import perf_counter
from typing import Any

from framespool.processors.core import CellConfig

from .engine import SimOptions, Simulation, cell_config
from .metrics import quantiles
from .multitenant import partition, route
from .policies import Policy
from .report import write_summary
from .routed import simulate_admitted
from .workload import Workload

ROUTINGS = ("admission", "hash")

# What each worker needs; set in the parent before the pool forks.
_FLEET: dict[str, Any] = {}

CELL_KEYS = (
    "jobs_submitted",
    "jobs_inside_horizon",
    "jobs_completed",
    "jobs_failed",
    "jobs_rejected",
    "jobs_unfinished",
    "gpu_utilization",
    "utilization_under_backlog",
    "wait_s",
    "wait_s_by_tier",
    "invariant_violations",
    "events",
    "virtual_s",
    "core_s",
    "wall_s",
    "events_per_s",
    "headroom",
    "stop_reason",
)


def cell_names(cells: int) -> tuple[str, ...]:
    return tuple(f"cell-{i:02d}" for i in range(cells))


def _run_cell(index: int) -> dict[str, Any]:
    fleet = _FLEET
    names: tuple[str, ...] = fleet["names"]
    name = names[index]
    target: Path = fleet["out"] / name
    target.mkdir(parents=True, exist_ok=True)
    workload = partition(fleet["workload"], names, name, fleet["routing"])
    sim = Simulation(
        workload, fleet["policy"], fleet["opts"], fleet["base"], target, config=fleet["config"]
    )
    return cell_result(sim, sim.run(), name, fleet["opts"], target)


def cell_result(
    sim: Simulation, summary: dict[str, Any], name: str, opts: SimOptions, target: Path
) -> dict[str, Any]:
    """Write a finished cell's summary; return what the fleet summary merges."""
    summary["cell"] = name
    summary["options"] = {f.name: getattr(opts, f.name) for f in fields(opts)}
    write_summary(summary, target)
    rec = sim.recorder
    return {
        "summary": summary,
        "waits": rec.waits.tobytes(),
        "tier_waits": {tier: stats.waits.tobytes() for tier, stats in rec.tiers.items()},
        "capacity_ms": rec.capacity * max(0, rec.end_ms - max(0, rec.first_submit_ms)),
        "busy_ms": rec.busy_ms,
    }


def simulate_cells(
    workload: Workload,
    policy: Policy,
    opts: SimOptions,
    base: CellConfig,
    out_dir: Path,
    cells: int,
    processes: int = 0,
    routing: str = "admission",
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """Fold ``cells`` cells of ``opts.nodes / cells`` nodes each, their jobs
    routed by ``routing`` (``ROUTINGS``, module docstring); write and return
    the fleet summary. ``progress``: called as jobs are routed (admission only:
    the hash fleet's cells fold in worker processes)."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing {routing!r} is unknown; use one of: {', '.join(ROUTINGS)}")
    if routing == "admission":
        return _simulate_admitted(workload, policy, opts, base, out_dir, cells, progress)
    wall0 = perf_counter()
    names = cell_names(cells)
    cell_opts = replace(opts, nodes=opts.nodes // cells)
    horizon_ms = int(opts.max_sim_s * 1000) if opts.max_sim_s > 0 else None
    owners = route(workload, names, horizon_ms)
    # the same for every cell and O(tenants) to make: once, before the fork
    config = cell_config(policy.configure(base, workload.tenants), cell_opts)
    _FLEET.update(
        names=names,
        out=out_dir,
        workload=workload,
        routing=owners,
        policy=policy,
        opts=cell_opts,
        base=base,
        config=config,
    )
    workers = max(1, min(cells, processes or os.cpu_count() or 1))
    try:
        if workers == 1:
            results = [_run_cell(i) for i in range(cells)]
        else:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                results = pool.map(_run_cell, range(cells), chunksize=1)
    finally:
        _FLEET.clear()
    for name in ("jobs.csv", "runs.csv"):
        _concatenate([out_dir / n / name for n in names], out_dir / name)
    summary = fleet_summary(results, opts, cell_opts, workers, perf_counter() - wall0)
    summary["routing"] = "hash"
    return _written(summary, workload, policy, len(owners.owners), out_dir)


def _written(
    summary: dict[str, Any], workload: Workload, policy: Policy, inside: int, out_dir: Path
) -> dict[str, Any]:
    """The fleet's ``summary`` with what both routings report of the workload
    (``inside``: its jobs submitted within the horizon), written to ``out_dir``."""
    summary["jobs_in_workload"] = workload.total
    summary["jobs_inside_horizon"] = inside
    summary["jobs_past_horizon"] = max(0, workload.total - inside)
    summary["workload"] = workload.name
    summary["workload_description"] = workload.description
    summary["policy"] = policy.name
    write_summary(summary, out_dir)
    return summary


def _simulate_admitted(
    workload: Workload,
    policy: Policy,
    opts: SimOptions,
    base: CellConfig,
    out_dir: Path,
    cells: int,
    progress: Callable[[float, str], None] | None,
) -> dict[str, Any]:
    names = cell_names(cells)
    cell_opts = replace(opts, nodes=opts.nodes // cells)
    config = cell_config(policy.configure(base, workload.tenants), cell_opts)
    sims, fleet, wall_s = simulate_admitted(
        workload, policy, cell_opts, base, out_dir, names, config, progress=progress
    )
    results = []
    for name, sim in zip(names, sims):
        summary = sim.finish(wall_s)  # each cell's wall is the fleet's: they fold together
        results.append(cell_result(sim, summary, name, cell_opts, out_dir / name))
    for name in ("jobs.csv", "runs.csv"):
        _concatenate([out_dir / n / name for n in names], out_dir / name)
    summary = fleet_summary(results, opts, cell_opts, 1, wall_s)
    summary["routing"] = "admission"
    summary["admission"] = fleet.decisions()
    return _written(summary, workload, policy, sum(s.read for s in sims), out_dir)


def fleet_summary(
    results: list[dict[str, Any]],
    opts: SimOptions,
    cell_opts: SimOptions,
    workers: int,
    wall_s: float,
) -> dict[str, Any]:
    cells = [r["summary"] for r in results]
    events = sum(c["events"] for c in cells)
    headrooms = [c["headroom"] for c in cells if c.get("headroom") is not None]
    waits = array("d")
    tier_waits: dict[str, array] = {}
    for r in results:
        waits.frombytes(r["waits"])
        for tier, raw in r["tier_waits"].items():
            tier_waits.setdefault(tier, array("d")).frombytes(raw)
    capacity_ms = sum(r["capacity_ms"] for r in results)
    return {
        "cells": len(cells),
        "processes": workers,
        "cluster": {
            "nodes": opts.nodes,
            "gpus": opts.capacity_gpus,
            "nodes_per_cell": cell_opts.nodes,
            "gpus_per_node": opts.gpus_per_node,
        },
        "wall_s": round(wall_s, 3),
        "events": events,
        "events_per_s": round(events / wall_s) if wall_s > 0 else None,
        "headroom_min": min(headrooms) if headrooms else None,
        "headroom": {
            "min": min(headrooms),
            "median": round(statistics.median(headrooms), 1),
            "max": max(headrooms),
        }
        if headrooms
        else None,
        "jobs_submitted": sum(c["jobs_submitted"] for c in cells),
        "jobs_completed": sum(c["jobs_completed"] for c in cells),
        "jobs_failed": sum(c["jobs_failed"] for c in cells),
        "jobs_rejected": sum(c["jobs_rejected"] for c in cells),
        "jobs_unfinished": sum(c["jobs_unfinished"] for c in cells),
        "invariant_violations": sum(c["invariant_violations"] for c in cells),
        "violation_examples": [e for c in cells for e in c["violation_examples"]][:20],
        "gpu_utilization": round(sum(r["busy_ms"] for r in results) / capacity_ms, 4)
        if capacity_ms
        else 0.0,
        "virtual_s": max(c["virtual_s"] for c in cells),
        "core_s": round(sum(c["core_s"] for c in cells), 3),
        "wait_s": quantiles(waits),
        "wait_s_by_tier": {t: quantiles(w) for t, w in sorted(tier_waits.items())},
        "per_cell": {c["cell"]: {k: c.get(k) for k in CELL_KEYS} for c in cells},
        "options": {f.name: getattr(cell_opts, f.name) for f in fields(cell_opts)},
    }


def _concatenate(parts: list[Path], target: Path) -> None:
    """One CSV from the cells' CSVs (one header)."""
    with target.open("w", newline="") as out:
        for i, part in enumerate(parts):
            with part.open() as src:
                header = src.readline()
                if i == 0:
                    out.write(header)
                shutil.copyfileobj(src, out)
