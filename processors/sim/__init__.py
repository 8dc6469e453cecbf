"""The simulator: a shell that drives the real scheduling core with a virtual clock.

``simulate(workload, policies, options)`` runs each policy on the same
workload and writes, per policy, ``summary.json``, ``jobs.csv``, ``runs.csv``
and ``report.png`` (and a comparison table when there are several). The core
never imports this package.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from framespool.processors.core import CellConfig, TierConfig

from .engine import SimOptions, Simulation
from .policies import POLICIES, Policy, parse_policies
from .report import comparison_table, plot, write_comparison, write_summary
from .trace import TraceError, read_trace
from .workload import SYNTHETIC, Workload, synthetic

__all__ = [
    "POLICIES",
    "SYNTHETIC",
    "SimOptions",
    "Simulation",
    "TraceError",
    "Workload",
    "comparison_table",
    "load_tiers",
    "parse_policies",
    "read_trace",
    "simulate",
    "synthetic",
]


def load_tiers(path: str | Path) -> tuple[TierConfig, ...]:
    """Tier configs from a JSON list of objects with TierConfig's fields."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read tiers file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON list of tier objects")
    allowed = {f.name for f in fields(TierConfig)}
    tiers = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"{path}: tier #{i} is not an object")
        unknown = sorted(set(item) - allowed)
        if unknown:
            raise ValueError(
                f"{path}: tier #{i} has unknown field(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        missing = [k for k in ("name", "weight", "rank", "sla_wait_s") if k not in item]
        if missing:
            raise ValueError(f"{path}: tier #{i} lacks {', '.join(missing)}")
        tiers.append(TierConfig(**item))
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: tier names repeat: {names}")
    return tuple(tiers)


def simulate(
    workload: Workload,
    policies: list[Policy],
    opts: SimOptions,
    base_config: CellConfig | None = None,
    out_dir: Path | None = None,
    make_plot: bool = True,
    progress: Callable[[float, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every policy on the same workload; return their summaries in order."""
    base = base_config or CellConfig()
    summaries = []
    for policy in policies:
        target = None
        if out_dir is not None:
            target = out_dir if len(policies) == 1 else out_dir / policy.name
            target.mkdir(parents=True, exist_ok=True)
        sim = Simulation(workload, policy, opts, base, target, progress)
        summary = sim.run()
        summary["options"] = {f.name: getattr(opts, f.name) for f in fields(opts)}
        if target is not None:
            write_summary(summary, target)
            if make_plot:
                plot(sim.recorder, summary, target / "report.png")
        summaries.append(summary)
    if out_dir is not None and len(policies) > 1:
        write_comparison(summaries, out_dir)
    return summaries


def with_workload_defaults(
    opts: SimOptions, workload: Workload, node_failures: float | None
) -> SimOptions:
    """The workload's default node-failure rate applies unless the user gave one."""
    rate = node_failures if node_failures is not None else (workload.node_failures_per_hour or 0.0)
    return replace(opts, node_failures_per_hour=rate)
