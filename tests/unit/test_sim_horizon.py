"""``--max-sim-s`` bounds what a run generates, not only what it folds (issue 35).

A 5 M-job day bounded at half an hour must cost the half hour's jobs: the
stream is read no further than the horizon (one job past it, a few more to
route the cells), and a fleet's cells get exactly the partition of the jobs
inside it. Small sizes only.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from framespool.processors import sim
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import rendezvous
from framespool.processors.sim.cells import cell_names, simulate_cells
from framespool.processors.sim.engine import Simulation
from framespool.processors.sim.multitenant import partition, route
from framespool.processors.sim.policies import POLICIES
from framespool.processors.sim.workload import TraceJob, Workload
from framespool.schemas import events as ev

TIERS = ("interactive", "enterprise", "paid", "free", "batch")


def counted(jobs: int, every_ms: int, read: list[int]) -> Workload:
    """``jobs`` one-GPU jobs, one every ``every_ms``; ``read`` gets each job's
    index as the stream yields it (every regeneration appends again)."""

    def stream() -> Iterator[TraceJob]:
        for idx in range(jobs):
            read.append(idx)
            tier = TIERS[idx % len(TIERS)]
            yield TraceJob(idx, idx * every_ms, f"t{idx % 7}", tier, 1, 1, 30.0, 30.0)

    tenants = {f"t{i}": 1.0 for i in range(7)}
    return Workload("counted", jobs, tenants, stream)


def job_ids(path: Path) -> list[str]:
    """The job ids of a jobs.csv, in the order the jobs ended."""
    with path.open(newline="") as handle:
        return [row["job_id"] for row in csv.DictReader(handle)]


def test_jobs_after_the_horizon_are_never_read(tmp_path: Path) -> None:
    read: list[int] = []
    workload = counted(1_000_000, 1000, read)  # a job a second for 11.6 days
    opts = sim.SimOptions(nodes=2, gpus_per_node=8, tick_s=1.0, max_sim_s=120)
    summary = Simulation(workload, POLICIES["framespool"], opts, CellConfig(), tmp_path).run()
    assert summary["stop_reason"].startswith("hard stop")
    assert summary["virtual_s"] == 120.0  # the run still goes on to the horizon
    assert max(read) == 121  # jobs 0..120 are inside; 121 is the one read ahead
    assert summary["jobs_submitted"] == summary["jobs_inside_horizon"] == 121
    assert summary["jobs_past_horizon"] == 1_000_000 - 121
    assert sorted(job_ids(tmp_path / "jobs.csv")) == sorted(f"j{i}" for i in range(121))
    assert summary["invariant_violations"] == summary["jobs_unfinished"]  # no NOT_SUBMITTED


def test_a_crash_before_the_horizon_still_writes_every_job_inside_it(tmp_path: Path) -> None:
    read: list[int] = []
    opts = sim.SimOptions(nodes=2, gpus_per_node=8, tick_s=1.0, max_sim_s=120)
    s = Simulation(
        counted(10_000, 1000, read), POLICIES["framespool"], opts, CellConfig(), tmp_path
    )
    apply = s.cell.apply

    def failing(event, position=None):
        if isinstance(event, ev.JobAdmitted) and event.spec.job_id == "j10":
            raise KeyError("boom")
        return apply(event, position)

    s.cell.apply = failing  # type: ignore[method-assign]
    summary = s.run()
    assert "core raised KeyError" in summary["stop_reason"]
    assert sorted(job_ids(tmp_path / "jobs.csv")) == sorted(f"j{i}" for i in range(121))
    assert summary["jobs_inside_horizon"] == 121 and max(read) == 121


def test_routing_stops_at_the_horizon_and_partitions_exactly() -> None:
    read: list[int] = []
    workload = counted(1_000_000, 1000, read)
    names = cell_names(4)
    routing = route(workload, names, horizon_ms=300_000)
    assert len(routing.owners) == 301
    # a few jobs past the horizon tell which cells have more: nowhere near the day
    assert routing.cut == frozenset(range(4)) and 302 <= max(read) < 400
    inside = [f"j{i}" for i in range(301)]
    for name in names:
        read.clear()
        part = partition(workload, names, name, routing)
        ids = [j.job_id for j in part.jobs()]
        assert ids == [j for j in inside if rendezvous(j, names) == name]
        assert part.total == len(ids) and part.cut
        assert max(read) == 300  # the cell's stream regenerates the horizon only


def test_a_fleet_runs_the_partition_of_the_jobs_inside_the_horizon(tmp_path: Path) -> None:
    read: list[int] = []
    workload = counted(200_000, 2000, read)  # a job every 2 s
    opts = sim.SimOptions(nodes=6, gpus_per_node=8, tick_s=1.0, max_sim_s=200)
    summary = simulate_cells(
        workload, POLICIES["framespool"], opts, CellConfig(), tmp_path, 3, 1, routing="hash"
    )
    # the parent routes once, each of 3 cells regenerates the horizon: 4 reads of ~101 jobs
    assert len(read) < 4 * 150 and max(read) < 200
    names = cell_names(3)
    inside = [f"j{i}" for i in range(101)]
    for name in names:
        assert sorted(job_ids(tmp_path / name / "jobs.csv")) == sorted(
            j for j in inside if rendezvous(j, names) == name
        )
        assert summary["per_cell"][name]["stop_reason"].startswith("hard stop")
    assert summary["jobs_inside_horizon"] == summary["jobs_submitted"] == 101
    assert summary["jobs_past_horizon"] == 200_000 - 101
    headroom = summary["headroom"]
    assert headroom["min"] == summary["headroom_min"] <= headroom["median"] <= headroom["max"]
