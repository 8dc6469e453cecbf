"""Issue 34's scorecard: each scheduling-quality target against its figure.

- Interactive p99 wait (target <= ``INTERACTIVE_P99_S``), with the GPU-time
  preemption threw away as a share of the capacity over the makespan
  (target <= ``PREEMPTION_LOSS_SHARE``; ``metrics.py`` says what is counted).
- Light and heavy jobs per tier: a job is *light* when its GPU-seconds (GPUs
  x true run time) are below the median of its own tenant's jobs, *heavy*
  when above (a tenant's median job, and every job of a one-job tenant, is
  neither). Target: the light jobs' p90 wait within ``LIGHT_P90_S`` of their
  tier.
- Calibration per tier: of the jobs told a positive P50 at admission (the
  forecasts; ``quality.py`` says why jobs told 0 are apart), the share whose
  wait was at most their P50 (target 40-60 %) and their P90 (85-95 %).
- Utilization under backlog (busy GPUs while any job is queued over the
  capacity; target >= ``UTIL_UNDER_BACKLOG``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .quality import WaitRow, _q

INTERACTIVE_P99_S = 10.0
PREEMPTION_LOSS_SHARE = 0.01
LIGHT_P90_S = {"enterprise": 60.0, "paid": 60.0, "free": 600.0}
P50_BAND = (0.40, 0.60)
P90_BAND = (0.85, 0.95)
UTIL_UNDER_BACKLOG = 0.98


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def light_heavy_table(rows: Iterable[WaitRow]) -> dict[str, Any]:
    """Per tier: jobs, p50 and p90 wait of the light and of the heavy jobs
    (each job against its own tenant's median GPU-seconds; module doc)."""
    rows = list(rows)
    sizes: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        sizes.setdefault((row.tier, row.tenant), []).append(row.gpu_s)
    medians = {key: _median(v) for key, v in sizes.items() if len(v) > 1}
    waits: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        median = medians.get((row.tier, row.tenant))
        if median is None or row.gpu_s == median:
            continue
        side = "light" if row.gpu_s < median else "heavy"
        waits.setdefault(row.tier, {"light": [], "heavy": []})[side].append(row.wait_s)
    table: dict[str, dict[str, dict[str, int | float | None]]] = {}
    for tier in sorted(waits):
        table[tier] = {}
        for side in ("light", "heavy"):
            ordered = sorted(waits[tier][side])
            table[tier][side] = {
                "jobs": len(ordered),
                "p50_s": _q(ordered, 0.5),
                "p90_s": _q(ordered, 0.9),
            }
    return table


def scorecard(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Each target with its figure and whether it is met (None: no figure)."""
    checks: dict[str, Any] = {}

    def check(name: str, value: float | None, ok: bool | None, target: str) -> None:
        checks[name] = {"value": value, "target": target, "met": ok if value is not None else None}

    p99 = (summary.get("wait_s_by_tier") or {}).get("interactive", {}).get("p99")
    check("interactive_p99_s", p99, p99 is not None and p99 <= INTERACTIVE_P99_S, "<= 10 s")
    lost = (summary.get("preemption_cost") or {}).get("all", {}).get("gpu_s", 0.0)
    capacity_s = summary.get("cluster", {}).get("gpus", 0) * summary.get("makespan_s", 0.0)
    share = round(lost / capacity_s, 6) if capacity_s else None
    check(
        "preemption_loss_share_of_capacity",
        share,
        share is not None and share <= PREEMPTION_LOSS_SHARE,
        "<= 1 %",
    )
    light = summary.get("light_heavy") or {}
    for tier, limit in LIGHT_P90_S.items():
        p90 = light.get(tier, {}).get("light", {}).get("p90_s")
        check(f"light_p90_s:{tier}", p90, p90 is not None and p90 <= limit, f"<= {limit:.0f} s")
    for tier, row in (summary.get("wait_calibration") or {}).items():
        if tier == "all":
            continue
        for key, band in (("told_pos_le_p50", P50_BAND), ("told_pos_le_p90", P90_BAND)):
            value = row.get(key)
            ok = value is not None and band[0] <= value <= band[1]
            check(f"{key}:{tier}", value, ok, f"{band[0]:.0%}-{band[1]:.0%}")
    util = summary.get("utilization_under_backlog")
    check(
        "utilization_under_backlog",
        util,
        util is not None and util >= UTIL_UNDER_BACKLOG,
        ">= 0.98",
    )
    violations = summary.get("invariant_violations")
    check("invariant_violations", violations, violations == 0, "0")
    return checks


def scorecard_lines(summary: Mapping[str, Any]) -> list[str]:
    """The light/heavy table and the scorecard, as text lines."""
    policy = summary.get("policy", "?")
    lines: list[str] = []
    light = summary.get("light_heavy") or {}
    if light:
        lines.append(
            f"{policy}: light vs heavy jobs, wait s (light: below its tenant's median GPU-s)"
        )
        lines.append(
            f"  {'tier':<12}{'light n':>8}{'p50':>9}{'p90':>9}{'heavy n':>9}{'p50':>9}{'p90':>9}"
        )

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:,.0f}"

        for tier, row in light.items():
            lt, hv = row["light"], row["heavy"]
            lines.append(
                f"  {tier:<12}{lt['jobs']:>8}{fmt(lt['p50_s']):>9}{fmt(lt['p90_s']):>9}"
                f"{hv['jobs']:>9}{fmt(hv['p50_s']):>9}{fmt(hv['p90_s']):>9}"
            )
    card = summary.get("scorecard") or {}
    if card:
        lines.append(f"{policy}: issue 34 targets")
        for name, row in card.items():
            value = row["value"]
            text = (
                "-"
                if value is None
                else f"{value:,.4g}"
                if isinstance(value, float)
                else str(value)
            )
            mark = {True: "met", False: "MISSED", None: "-"}[row["met"]]
            lines.append(f"  {name:<38}{text:>12}  {row['target']:<10}{mark}")
    return lines
