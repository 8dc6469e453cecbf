"""The mission-shaped workload, production cadences, headroom and the fleet command.

Small sizes only: every test runs in seconds.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from framespool.cli import main
from framespool.processors import sim
from framespool.processors.sim.cells import cell_names
from framespool.processors.sim.multitenant import DEFAULT_LOAD, mean_gpu_s, partition


def test_multitenant_has_thousands_of_zipf_tenants_per_tier_and_mixed_gangs() -> None:
    workload = sim.synthetic("multitenant", 40_000, 1, 1024 * 8)
    jobs = list(workload.jobs())
    tiers = Counter(t[:3] for t in workload.tenants)
    assert len(tiers) == 5 and min(tiers.values()) >= 1000  # ~6.4 jobs per tenant
    volumes = Counter(j.tenant for j in jobs)
    ordered = sorted(volumes.values(), reverse=True)
    assert ordered[0] >= 1000  # a few tenants submit thousands
    assert sorted(volumes.values())[len(volumes) // 2] <= 5  # most submit one to five
    assert {j.gpus for j in jobs} == {1, 2, 4, 8, 16, 32, 64}
    assert all(j.gpus_per_node == min(j.gpus, 8) for j in jobs)


def test_multitenant_offers_its_load_with_a_diurnal_swing() -> None:
    capacity = 2000
    workload = sim.synthetic("multitenant", 20_000, 2, capacity)
    jobs = list(workload.jobs())
    span_s = jobs[-1].submit_ms / 1000
    offered = sum(j.gpus * j.duration_s for j in jobs) / (capacity * span_s)
    # clipped log-normal durations land a little under the mean the rate is sized by
    assert DEFAULT_LOAD * 0.8 < offered < DEFAULT_LOAD * 1.15
    assert mean_gpu_s() > 0
    # arrivals per tenth of the run swing well beyond Poisson noise
    tenths = Counter(min(9, int(10 * j.submit_ms / 1000 / span_s)) for j in jobs)
    assert max(tenths.values()) > 1.4 * min(tenths.values())
    assert math.isclose(sim.synthetic("multitenant", 10, 2, capacity, 2.0).total, 10)


def test_partition_routes_every_job_to_exactly_one_cell() -> None:
    workload = sim.synthetic("multitenant", 3000, 4, 256)
    names = cell_names(3)
    parts = [partition(workload, names, n) for n in names]
    ids = [j.job_id for p in parts for j in p.jobs()]
    assert sorted(ids) == sorted(j.job_id for j in workload.jobs())
    assert all(p.total > 600 for p in parts) and sum(p.total for p in parts) == 3000
    assert [j.job_id for j in parts[1].jobs()] == [j.job_id for j in parts[1].jobs()]


def test_production_cadences_and_headroom_in_the_summary(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mt"
    status = main(
        [
            "simulate",
            "--synthetic",
            "multitenant",
            "--jobs",
            "150",
            "--nodes",
            "16",
            "--production-cadences",
            "--out",
            str(out),
            "--no-plot",
            "--quiet",
        ]
    )
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    options = summary["options"]
    assert (options["tick_s"], options["heartbeat_s"], options["estimates"]) == (1.0, 10.0, True)
    assert summary["headroom"] == pytest.approx(summary["virtual_s"] / summary["core_s"], rel=0.01)
    assert summary["events_per_s"] > 0 and summary["jobs_completed"] == 150
    printed = capsys.readouterr().out
    assert "events/s" in printed and "headroom" in printed


@pytest.mark.slow
@pytest.mark.parametrize("routing", ["admission", "hash"])
def test_fleet_of_cells_in_one_command(tmp_path: Path, capsys, routing: str) -> None:
    out = tmp_path / "fleet"
    status = main(
        [
            "simulate",
            "--routing",
            routing,
            "--synthetic",
            "multitenant",
            "--jobs",
            "240",
            "--nodes",
            "24",
            "--cells",
            "3",
            "--production-cadences",
            "--out",
            str(out),
            "--no-plot",
            "--quiet",
        ]
    )
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("wall_s", "events_per_s", "headroom_min", "jobs_completed"):
        assert summary[key] > 0, key
    assert summary["invariant_violations"] == 0 and summary["jobs_completed"] == 240
    cells = summary["per_cell"]
    assert list(cells) == ["cell-00", "cell-01", "cell-02"]
    assert summary["headroom_min"] == min(c["headroom"] for c in cells.values())
    assert sum(c["jobs_submitted"] for c in cells.values()) == 240
    with (out / "jobs.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 240 and len({r["job_id"] for r in rows}) == 240
    assert (out / "runs.csv").read_text().startswith("job_id,run,")
    assert all((out / n / "summary.json").exists() for n in cells)
    assert set(summary["wait_s_by_tier"]) == {"batch", "enterprise", "free", "interactive", "paid"}
    printed = capsys.readouterr().out
    assert "headroom min" in printed and f"routing {routing}" in printed
    assert summary["routing"] == routing
    if routing == "admission":
        decided = summary["admission"]
        assert decided["admitted"] == 240 and decided["offers"] > 0
        assert decided["admitted_per_cell"] == {n: c["jobs_submitted"] for n, c in cells.items()}
        assert "admission: 240 admitted" in printed


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--nodes", "10", "--cells", "3"], "divide evenly"),
        (["--nodes", "8", "--cells", "2", "--policy", "framespool,fifo"], "single --policy"),
        (["--cells", "0"], "must be positive"),
    ],
)
def test_fleet_flags_are_checked(extra, message, tmp_path: Path, capsys) -> None:
    args = ["simulate", "--synthetic", "multitenant", "--jobs", "20", "--out", str(tmp_path)]
    assert main(args + extra + ["--no-plot", "--quiet"]) != 0
    assert message in capsys.readouterr().err


def test_jobs_per_day_fixes_the_arrivals_and_scales_run_times_to_the_load() -> None:
    # 40,000 jobs a day on 2,000 GPUs at load 0.8: the mean job is
    # 0.8 x 2,000 x 86,400 / 40,000 = 3,456 GPU-s (the mix's own is ~4,500)
    capacity, per_day, load = 2000, 40_000, 0.8
    workload = sim.synthetic("multitenant", 50_000, 3, capacity, load, jobs_per_day=per_day)
    jobs = list(workload.jobs())
    in_day = [j for j in jobs if j.submit_ms <= 86_400_000]
    # Poisson over a whole diurnal period: the day's count is N within noise (sd ~200)
    assert abs(len(in_day) - per_day) < 0.03 * per_day
    offered = sum(j.gpus * j.duration_s for j in in_day) / (capacity * 86_400)
    assert abs(offered - load) < 0.1 * load
    # the swing has a day's period: the busiest quarter of the day beats the quietest
    quarters = Counter(min(3, j.submit_ms // 21_600_000) for j in in_day)
    assert max(quarters.values()) > 1.3 * min(quarters.values())
    # many jobs a day means short jobs: the same tiers, shorter run times
    short = sim.synthetic("multitenant", 20_000, 3, capacity, load, jobs_per_day=2_000_000)
    short_jobs = list(short.jobs())
    mean = sum(j.gpus * j.duration_s for j in short_jobs) / len(short_jobs)
    target = load * capacity * 86_400 / 2_000_000  # 69.1 GPU-s
    assert abs(mean - target) < 0.15 * target
    assert min(j.duration_s for j in short_jobs) >= 1.0
    assert {j.tier for j in short_jobs} == {j.tier for j in jobs}
    assert {j.gpus for j in short_jobs} == {1, 2, 4, 8, 16, 32, 64}


def test_jobs_per_day_leaves_the_default_stream_alone() -> None:
    a = [vars_of(j) for j in sim.synthetic("multitenant", 500, 5, 512).jobs()]
    b = [vars_of(j) for j in sim.synthetic("multitenant", 500, 5, 512, None, 0).jobs()]
    assert a == b
    with pytest.raises(ValueError, match="multitenant"):
        sim.synthetic("steady", 10, 1, 64, jobs_per_day=1000)


def vars_of(job) -> tuple:
    return tuple(getattr(job, name) for name in type(job).__slots__)
