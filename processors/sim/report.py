"""Writing a simulation's results: summary.json, report.png and the policy comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .metrics import Recorder

COMPARISON_COLUMNS = (
    ("policy", "policy", "{}"),
    ("completed", "jobs_completed", "{:,}"),
    ("failed", "jobs_failed", "{:,}"),
    ("rejected", "jobs_rejected", "{:,}"),
    ("makespan_h", "makespan_s", "{:.2f}"),
    ("util", "gpu_utilization", "{:.3f}"),
    ("util_backlog", "utilization_under_backlog", "{:.3f}"),
    ("wait_p50_s", ("wait_s", "p50"), "{:.0f}"),
    ("wait_p99_s", ("wait_s", "p99"), "{:.0f}"),
    ("wait_max_s", ("wait_s", "max"), "{:.0f}"),
    ("jain", "jain_fairness", "{:.3f}"),
    ("warm_ratio", "warm_start_ratio", "{:.3f}"),
    ("preempt", "preemptions", "{:,}"),
    ("preempt_gpu_s", ("preemption_cost", "all", "gpu_s"), "{:,.0f}"),
    ("preempt_share", ("preemption_cost", "all", "share_of_delivered"), "{:.3%}"),
    ("violations", "invariant_violations", "{:,}"),
    ("wall_s", "wall_s", "{:.1f}"),
)


def write_summary(summary: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return path


def _value(summary: dict[str, Any], key: Any) -> Any:
    if isinstance(key, tuple):
        value: Any = summary
        for part in key:
            value = value.get(part) if isinstance(value, dict) else None
        return value
    value = summary.get(key)
    if key == "makespan_s" and value is not None:
        return value / 3600
    return value


def comparison_rows(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{name: _value(s, key) for name, key, _ in COMPARISON_COLUMNS} for s in summaries]


def comparison_table(summaries: list[dict[str, Any]]) -> str:
    """A fixed-width table, one row per policy."""
    header = [name for name, _, _ in COMPARISON_COLUMNS]
    rows = []
    for summary in summaries:
        row = []
        for _, key, fmt in COMPARISON_COLUMNS:
            value = _value(summary, key)
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [
        "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths)))
    ]
    for row in rows:
        lines.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        )
    return "\n".join(lines)


def write_comparison(summaries: list[dict[str, Any]], out_dir: Path) -> str:
    table = comparison_table(summaries)
    (out_dir / "comparison.txt").write_text(table + "\n")
    (out_dir / "comparison.json").write_text(
        json.dumps(comparison_rows(summaries), indent=2) + "\n"
    )
    return table


def plot(recorder: Recorder, summary: dict[str, Any], path: Path) -> Path | None:
    """Four panels: utilization, queue depth per tier, per-tenant share, wait CDF per tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [t / 3600 for t in recorder.samples_t]
    capacity = max(1, recorder.capacity)
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    title = (
        f"{summary['workload']} / {summary['policy']}: {summary['jobs_submitted']:,} jobs on "
        f"{summary['cluster']['gpus']:,} GPUs; util {summary['gpu_utilization']:.2f}, "
        f"jain {summary['jain_fairness'] if summary['jain_fairness'] is not None else '-'}"
    )
    fig.suptitle(title)

    ax = axes[0][0]
    ax.plot(hours, [b / capacity for b in recorder.samples_busy], lw=1)
    ax.set_ylim(0, 1.05)
    ax.set_title("GPU utilization")
    ax.set_xlabel("virtual time (h)")
    ax.set_ylabel("busy / all GPUs")

    ax = axes[0][1]
    for tier, series in sorted(recorder.samples_queued.items()):
        ax.plot(hours[: len(series)], series, lw=1, label=tier)
    ax.set_title("queued jobs per tier")
    ax.set_xlabel("virtual time (h)")
    if recorder.samples_queued:
        ax.legend(fontsize=8)

    ax = axes[1][0]
    tenants = sorted(recorder.samples_tenant, key=lambda n: -sum(recorder.samples_tenant[n]))
    shown, rest = tenants[:10], tenants[10:]
    stacks = []
    labels = []
    for name in shown:
        series = recorder.samples_tenant[name]
        stacks.append([g / capacity for g in series] + [0] * (len(hours) - len(series)))
        labels.append(name)
    if rest:
        other = [0.0] * len(hours)
        for name in rest:
            for i, g in enumerate(recorder.samples_tenant[name]):
                other[i] += g / capacity
        stacks.append(other)
        labels.append(f"{len(rest)} others")
    if stacks and hours:
        ax.stackplot(
            hours, *stacks, labels=labels, colors=[plt.cm.tab20(i % 20) for i in range(len(stacks))]
        )
        ax.legend(fontsize=7, loc="upper right", ncol=2)
    ax.set_ylim(0, 1.05)
    ax.set_title("GPU share per tenant (of all GPUs)")
    ax.set_xlabel("virtual time (h)")

    ax = axes[1][1]
    for name, stats in sorted(recorder.tiers.items()):
        if not stats.waits:
            continue
        waits = sorted(stats.waits)
        n = len(waits)
        step = max(1, n // 2000)
        xs = [max(w, 0.1) for w in waits[::step]]
        ys = [(i * step + 1) / n for i in range(len(xs))]
        ax.plot(xs, ys, lw=1, label=f"{name} (n={n:,})")
    ax.set_xscale("log")
    ax.set_title("wait to first start, CDF per tier")
    ax.set_xlabel("wait (s, log)")
    ax.set_ylim(0, 1.01)
    if recorder.tiers:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
