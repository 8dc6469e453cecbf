"""Scheduling policies the simulator compares, each expressed as a core configuration.

Every policy runs the same core; a policy only chooses the ``CellConfig`` and
how a job's tenant and tier are presented to the cell. Metrics are always kept
under the job's original tenant and tier, so policies compare like for like.

- ``framespool``: the core as configured (hierarchical weighted fair share,
  EASY backfill, preemption).
- ``backfill``: Slurm-like. All tenants of a tier share one queue (no fair
  share between tenants: first come, first served within a tier) and tiers
  weigh ``PRIORITY_BASE ** (ranks below)``, so the fair-share walk serves the
  more important tier first (a tier returning from idle can lose at most one
  job to a less important tier). EASY backfill as in the core.
- ``fifo``: strict first-in first-out without backfill. Every job goes to one
  tier and one tenant. The core has no switch for "stop the pass at the first
  job that does not fit" (``backfill_depth=0`` also caps the candidates a pass
  looks at, and admission-time quick passes backfill regardless), so the shell
  emulates it with an admission gate: the next job is admitted only when the
  cell holds no queued job. See ``Policy.gate``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from framespool.processors.core import CellConfig, TenantConfig, TierConfig

PRIORITY_BASE = 1000.0
FIFO = "fifo"


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    configure: Callable[[CellConfig, dict[str, float]], CellConfig]
    route: Callable[[str, str], tuple[str, str]]  # (tenant, tier) -> as the cell sees it
    gate: bool = False  # admit one job at a time, only when the cell holds none queued


def _framespool(base: CellConfig, tenants: dict[str, float]) -> CellConfig:
    known = {t.name for t in base.tenants}
    extra = tuple(
        TenantConfig(name, weight=weight) for name, weight in tenants.items() if name not in known
    )
    return replace(base, tenants=base.tenants + extra)


def _backfill(base: CellConfig, tenants: dict[str, float]) -> CellConfig:
    worst = max(t.rank for t in base.tiers)
    tiers = tuple(replace(t, weight=PRIORITY_BASE ** (worst - t.rank)) for t in base.tiers)
    return replace(base, tiers=tiers, tenants=())


def _fifo(base: CellConfig, tenants: dict[str, float]) -> CellConfig:
    tier = TierConfig(FIFO, weight=1.0, rank=0, sla_wait_s=float("inf"))
    return replace(base, tiers=(tier,), tenants=(), backfill_depth=0)


POLICIES: dict[str, Policy] = {
    "framespool": Policy(
        "framespool",
        "the core as configured: hierarchical fair share in GPU-time, EASY backfill, preemption",
        _framespool,
        lambda tenant, tier: (tenant, tier),
    ),
    "backfill": Policy(
        "backfill",
        "Slurm-like: tier priority, FCFS within a tier, EASY backfill, no fair share",
        _backfill,
        lambda tenant, tier: (f"{tier}:all", tier),
    ),
    "fifo": Policy(
        "fifo",
        "strict FIFO in submit order, no backfill (admission gate in the shell)",
        _fifo,
        lambda tenant, tier: (FIFO, FIFO),
        gate=True,
    ),
}


def parse_policies(text: str) -> list[Policy]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("--policy is empty; give one or more of " + ", ".join(POLICIES))
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--policy {text!r} names a policy twice")
    return [POLICIES[n] for n in names]
