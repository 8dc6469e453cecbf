"""Scheduling-quality tables of a simulation, as pure functions over per-job rows.

- Calibration: of the jobs that started, the share whose actual wait was at
  most the P50 (and the P90) the cell published at admission, per tier. An
  honest estimator puts about half the jobs under its P50 and nine in ten
  under its P90. The cell tells a job its wait after the admission's own
  pass, so a job told 0 ("starts now") is one that started in it: its wait
  was known, not forecast, and it is under its P50 whatever the estimator
  does (with most jobs starting at once, the all-jobs share under the P50
  is at least their share). The table therefore splits jobs told 0 (and how
  often that was right) from jobs told a positive P50: the forecasts, where
  the P50 can be calibrated to a half.
- Refreshed bands: every band the cell published for a queued job
  (``JobWaitEstimated``) is a forecast of the wait left, scored the same way
  against the time from that refresh to the job's first start.
- Noisy neighbours: per tier, the p50/p90 wait of jobs of light tenants (at
  most ``LIGHT_JOBS`` jobs submitted) against heavy tenants (the top
  ``HEAVY_SHARE`` of tenants by GPU-seconds submitted, at least one).
- Fair share (workloads of a few tenants, such as ``shapes``): each tenant's
  share of the GPU-time while backlogged and its ``fair_ratio`` (that time
  over its entitlement; metrics.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

LIGHT_JOBS = 3
HEAVY_SHARE = 0.05
FAIR_SHARE_TENANTS = 8  # the per-tenant fair-share table is printed up to this many tenants


class WaitRow(NamedTuple):
    """One started job: its tier and tenant, actual wait, admission P50/P90 (-1 =
    none), and its size in GPU-seconds (GPUs x true run time; 0 = not given)."""

    tier: str
    tenant: str
    wait_s: float
    p50_s: float
    p90_s: float
    gpu_s: float = 0.0


def _q(ordered: list[float], p: float) -> float | None:
    if not ordered:
        return None
    n = len(ordered)
    return round(ordered[min(n - 1, max(0, math.ceil(p * n) - 1))], 3)


def _calibration(rows: list[WaitRow]) -> dict[str, Any]:
    """Shares under the P50 and the P90, and the same split by what the job
    was told: a job told P50 = 0 ("starts now") is under its P50 exactly when
    it starts at once, whatever the estimator does, so those jobs set a floor
    under ``le_p50`` (their share right, ``told_0_right``); the jobs told a
    positive P50 (``told_pos_*``) are where the P50 is a forecast that can be
    calibrated to a half."""
    rated = [r for r in rows if r.p50_s >= 0 and r.p90_s >= 0]
    n = len(rated)
    if not n:
        return {"n": 0, "le_p50": None, "le_p90": None, "waited": 0}
    le50 = sum(1 for r in rated if r.wait_s <= r.p50_s + 1e-6)
    le90 = sum(1 for r in rated if r.wait_s <= r.p90_s + 1e-6)
    told_0 = [r for r in rated if r.p50_s <= 0]
    told_pos = [r for r in rated if r.p50_s > 0]

    def share(part: list[WaitRow], hit: Any) -> float | None:
        return round(sum(1 for r in part if hit(r)) / len(part), 4) if part else None

    return {
        "n": n,
        "le_p50": round(le50 / n, 4),
        "le_p90": round(le90 / n, 4),
        "waited": sum(1 for r in rated if r.wait_s > 0),  # ties at 0 flatter the P50 share
        "told_0": len(told_0),
        "told_0_right": share(told_0, lambda r: r.wait_s <= 1e-6),
        "told_pos": len(told_pos),
        "told_pos_le_p50": share(told_pos, lambda r: r.wait_s <= r.p50_s + 1e-6),
        "told_pos_le_p90": share(told_pos, lambda r: r.wait_s <= r.p90_s + 1e-6),
    }


def calibration_table(rows: Iterable[WaitRow]) -> dict[str, dict[str, Any]]:
    """Per tier (and ``all``): n, share of jobs with wait <= P50 and <= P90."""
    by_tier: dict[str, list[WaitRow]] = {}
    everyone: list[WaitRow] = []
    for row in rows:
        by_tier.setdefault(row.tier, []).append(row)
        everyone.append(row)
    table = {tier: _calibration(by_tier[tier]) for tier in sorted(by_tier)}
    table["all"] = _calibration(everyone)
    return table


def tenant_classes(
    jobs: Mapping[str, int], volume_gpu_s: Mapping[str, float]
) -> tuple[set[str], set[str]]:
    """(light, heavy) tenants from jobs submitted and GPU-seconds submitted per tenant."""
    light = {t for t, n in jobs.items() if n <= LIGHT_JOBS}
    ranked = sorted(volume_gpu_s, key=lambda t: (-volume_gpu_s[t], t))
    heavy = set(ranked[: max(1, math.ceil(HEAVY_SHARE * len(ranked)))]) if ranked else set()
    return light, heavy


def noisy_neighbour_table(
    rows: Iterable[WaitRow], jobs: Mapping[str, int], volume_gpu_s: Mapping[str, float]
) -> dict[str, Any]:
    """Per tier: p50/p90 wait (and job and tenant counts) of light vs heavy tenants."""
    light, heavy = tenant_classes(jobs, volume_gpu_s)
    waits: dict[str, dict[str, list[float]]] = {}
    tenants: dict[str, dict[str, set[str]]] = {}
    for row in rows:
        for name, members in (("light", light), ("heavy", heavy)):
            if row.tenant in members:
                waits.setdefault(row.tier, {}).setdefault(name, []).append(row.wait_s)
                tenants.setdefault(row.tier, {}).setdefault(name, set()).add(row.tenant)
    table: dict[str, Any] = {}
    for tier in sorted(waits):
        entry = {}
        for name in ("light", "heavy"):
            ordered = sorted(waits[tier].get(name, []))
            entry[name] = {
                "tenants": len(tenants[tier].get(name, ())),
                "jobs": len(ordered),
                "p50_s": _q(ordered, 0.5),
                "p90_s": _q(ordered, 0.9),
            }
        table[tier] = entry
    return {
        "light_jobs_max": LIGHT_JOBS,
        "heavy_share": HEAVY_SHARE,
        "light_tenants": len(light),
        "heavy_tenants": len(heavy),
        "tiers": table,
    }


def format_tables(summary: Mapping[str, Any]) -> str:
    """The two tables of one summary as text lines."""
    lines = [f"{summary.get('policy', '?')}: wait calibration (share of started jobs)"]
    lines.append(
        f"  {'tier':<12}{'n':>8}{'<=P50':>8}{'<=P90':>8}{'waited':>8}"
        f"{'told 0':>9}{'right':>7}{'told>0':>9}{'<=P50':>7}{'<=P90':>7}"
    )

    def fmt3(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for tier, row in summary.get("wait_calibration", {}).items():
        lines.append(
            f"  {tier:<12}{row['n']:>8}{fmt3(row['le_p50']):>8}{fmt3(row['le_p90']):>8}"
            f"{row['waited']:>8}{row.get('told_0', 0):>9}{fmt3(row.get('told_0_right')):>7}"
            f"{row.get('told_pos', 0):>9}{fmt3(row.get('told_pos_le_p50')):>7}"
            f"{fmt3(row.get('told_pos_le_p90')):>7}"
        )
    refreshed = summary.get("wait_calibration_refreshed", {})
    if refreshed.get("all", {}).get("n"):
        lines.append(
            f"{summary.get('policy', '?')}: refreshed bands while queued "
            "(share of published refreshes, against the wait left)"
        )
        lines.append(f"  {'tier':<12}{'n':>8}{'<=P50':>8}{'<=P90':>8}")
        for tier, row in refreshed.items():
            lines.append(
                f"  {tier:<12}{row['n']:>8}{fmt3(row['le_p50']):>8}{fmt3(row['le_p90']):>8}"
            )
    nn = summary.get("noisy_neighbour")
    if nn:
        lines.append(
            f"{summary.get('policy', '?')}: noisy neighbours, wait s "
            f"(light <= {nn['light_jobs_max']} jobs: {nn['light_tenants']} tenants; "
            f"heavy top {nn['heavy_share']:.0%}: {nn['heavy_tenants']})"
        )
        lines.append(
            f"  {'tier':<12}{'light n':>8}{'p50':>9}{'p90':>9}{'heavy n':>9}{'p50':>9}{'p90':>9}"
        )

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f}"

        for tier, row in nn["tiers"].items():
            lt, hv = row["light"], row["heavy"]
            lines.append(
                f"  {tier:<12}{lt['jobs']:>8}{fmt(lt['p50_s']):>9}{fmt(lt['p90_s']):>9}"
                f"{hv['jobs']:>9}{fmt(hv['p50_s']):>9}{fmt(hv['p90_s']):>9}"
            )
    lines.extend(fair_share_lines(summary))
    lines.extend(preemption_cost_lines(summary))
    from .scorecard import scorecard_lines  # it reads this module's helpers

    lines.extend(scorecard_lines(summary))
    return "\n".join(lines)


def preemption_cost_lines(summary: Mapping[str, Any]) -> list[str]:
    """GPU-s thrown away by preemption, per preempting tier (metrics.py):
    work lost since the victims' last checkpoint, the checkpoint/stop grace, and
    the resumed runs' cold starts; and their sum as a share of delivered GPU-s."""
    cost = summary.get("preemption_cost") or {}
    if not cost:
        return []
    lines = [
        f"{summary.get('policy', '?')}: GPU-time cost of preemption, by preempting tier "
        "(share of delivered GPU-s)"
    ]
    lines.append(
        f"  {'tier':<12}{'victims':>8}{'lost':>12}{'grace':>12}{'restart':>12}"
        f"{'gpu_s':>12}{'share':>10}"
    )
    for tier, row in cost.items():
        share = row.get("share_of_delivered")
        lines.append(
            f"  {tier:<12}{row['victims']:>8,}{row['lost_gpu_s']:>12,.0f}{row['grace_gpu_s']:>12,.0f}"
            f"{row['restart_gpu_s']:>12,.0f}{row['gpu_s']:>12,.0f}"
            f"{'-' if share is None else f'{share:.4%}':>10}"
        )
    return lines


def fair_share_lines(
    summary: Mapping[str, Any], max_tenants: int = FAIR_SHARE_TENANTS
) -> list[str]:
    """Each tenant's GPU-time share while backlogged against its fair share
    (``fair_ratio``: 1.0 = exactly its share), for workloads of a few tenants
    (``shapes``, ``flood``); nothing for more than ``max_tenants``."""
    tenants = summary.get("tenants") or {}
    if not tenants or len(tenants) > max_tenants:
        return []
    lines = [
        f"{summary.get('policy', '?')}: fair share while backlogged "
        "(fair_ratio 1.0 = exactly its share)"
    ]
    lines.append(f"  {'tenant':<12}{'weight':>8}{'gpu_s':>12}{'share':>8}{'fair_ratio':>12}")
    for name, row in tenants.items():
        share = row.get("share_while_backlogged")
        ratio = row.get("fair_ratio")
        lines.append(
            f"  {name:<12}{row.get('weight', 1.0):>8.2f}{row.get('gpu_s', 0.0):>12,.0f}"
            f"{'-' if share is None else f'{share:.3f}':>8}"
            f"{'-' if ratio is None else f'{ratio:.3f}':>12}"
        )
    return lines
