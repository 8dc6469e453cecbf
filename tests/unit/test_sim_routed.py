"""``simulate --cells N`` routes each job with the real admission fold (issue 36, item 9).

The cells advance together in virtual time and admission folds their offers at
their cadence; these tests check that the cell a job ran in is the one the
admission core decides from the same inputs, that load moves work (which hash
routing cannot do), that the run is deterministic and routes every job once,
and that ``--routing hash`` is the fleet it was.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.cli import main
from framespool.processors import sim
from framespool.processors.core import CellConfig, TenantConfig
from framespool.processors.core.admission import AdmissionState, rendezvous
from framespool.processors.sim.cells import cell_names, simulate_cells
from framespool.processors.sim.engine import Simulation, cell_config
from framespool.processors.sim.multitenant import multitenant, partition, route
from framespool.processors.sim.policies import POLICIES
from framespool.processors.sim.routed import admission_config, simulate_admitted
from framespool.processors.sim.workload import TraceJob, Workload
from framespool.schemas import events as ev

FRAMESPOOL = POLICIES["framespool"]


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def trace_workload(jobs: list[tuple[int, str, int, float]]) -> Workload:
    """Jobs (submit_ms, tenant, gpus, duration_s), in submit order, tier paid."""

    def stream() -> Iterator[TraceJob]:
        for idx, (at, tenant, gpus, seconds) in enumerate(jobs):
            yield TraceJob(idx, at, tenant, "paid", gpus, min(gpus, 8), seconds, seconds)

    tenants = {tenant: 1.0 for _, tenant, _, _ in jobs}
    return Workload("trace", len(jobs), tenants, stream)


def run_admitted(
    workload: Workload, opts: sim.SimOptions, cells: int, out: Path, base: CellConfig | None = None
) -> tuple[dict[str, list[str]], list, dict]:
    """Fold a fleet routed by admission; (cell -> its job ids, admission's tape, decisions)."""
    base = base or CellConfig()
    names = cell_names(cells)
    cell_opts = replace(opts, nodes=opts.nodes // cells)
    config = cell_config(FRAMESPOOL.configure(base, workload.tenants), cell_opts)
    tape: list = []
    sims, fleet, wall = simulate_admitted(
        workload, FRAMESPOOL, cell_opts, base, out, names, config, tape
    )
    for s in sims:
        s.finish(wall)
    held = {n: [r["job_id"] for r in rows(out / n / "jobs.csv")] for n in names}
    return held, tape, fleet.decisions()


def replayed(tape: list, names: tuple[str, ...], config: AdmissionState) -> dict[str, str]:
    """The admission core fed the fleet's inputs directly: job id -> its cell
    ("" when it rejected the job)."""
    decided: dict[str, str] = {}
    for i, command in enumerate(tape):
        for out in config.apply(command, f"replay:{i}"):
            if isinstance(out, ev.JobAdmitted):
                decided[out.spec.job_id] = out.cell
            elif isinstance(out, ev.JobRejected):
                decided[out.job_id] = ""
    return decided


def test_each_job_runs_in_the_cell_the_admission_core_picks(tmp_path: Path) -> None:
    opts = sim.SimOptions(nodes=8, gpus_per_node=8, seed=3)
    workload = multitenant(300, 3, opts.capacity_gpus)
    held, tape, decisions = run_admitted(workload, opts, 4, tmp_path)
    names = cell_names(4)
    config = cell_config(FRAMESPOOL.configure(CellConfig(), workload.tenants), opts)
    core = replayed(tape, names, AdmissionState(admission_config(names, config)))
    ran = {job: cell for cell, jobs in held.items() for job in jobs}
    assert len(ran) == 300 and set(core) == set(ran)
    admitted = {job: cell for job, cell in core.items() if cell}
    assert admitted == {job: ran[job] for job in admitted}
    # 64-GPU jobs fit no 2-node cell: rejected, booked where the job id hashes
    rejected = sorted(set(core) - set(admitted))
    assert len(rejected) == decisions["rejected_no_cell_can_run"] > 0
    assert all(ran[job] == rendezvous(job, names) for job in rejected)
    states = {r["job_id"]: r["state"] for n in names for r in rows(tmp_path / n / "jobs.csv")}
    assert {states[job] for job in rejected} == {"REJECTED"}
    assert decisions["admitted_per_cell"] == {
        n: sum(1 for c in admitted.values() if c == n) for n in names
    }
    # the offers did the routing: admission folded them, and they moved jobs
    # away from where the job id's hash (its rule with no offer) would send them
    assert decisions["offers"] > 0 and any(isinstance(c, ev.CellOffer) for c in tape)
    assert sum(rendezvous(job, names) != cell for job, cell in ran.items()) > 30
    # every offer folded before a submission is no older than one interval
    last = 0
    for command in tape:
        if isinstance(command, ev.CellOffer):
            last = command.ts_ms
        else:
            assert 0 <= command.ts_ms - last < 5000


def full_and_idle(routing: str, out: Path) -> tuple[str, list[dict[str, str]]]:
    """Two one-node cells; an 8-GPU hour-long job fills one, then ten one-GPU
    jobs of other tenants come every 20 s. The full cell's name, and the small jobs' rows."""
    jobs = [(0, "big", 8, 3600.0)] + [(30_000 + 20_000 * k, f"t{k}", 1, 20.0) for k in range(10)]
    opts = sim.SimOptions(nodes=2, gpus_per_node=8, max_sim_s=600)
    simulate_cells(trace_workload(jobs), FRAMESPOOL, opts, CellConfig(), out, 2, 1, routing)
    full = next(
        n for n in cell_names(2) if "j0" in {r["job_id"] for r in rows(out / n / "jobs.csv")}
    )
    small = [
        {**r, "cell": n}
        for n in cell_names(2)
        for r in rows(out / n / "jobs.csv")
        if r["job_id"] != "j0"
    ]
    return full, small


def test_a_full_cell_sends_new_work_to_the_idle_one(tmp_path: Path) -> None:
    full, small = full_and_idle("admission", tmp_path / "admission")
    assert len(small) == 10 and all(r["cell"] != full for r in small)
    assert all(float(r["first_start_s"]) - float(r["submit_s"]) < 5 for r in small)
    # hash routing is blind to the load: some of the same jobs wait behind the hour
    full, small = full_and_idle("hash", tmp_path / "hash")
    behind = [r for r in small if r["cell"] == full]
    assert behind and all(r["state"] == "UNFINISHED" for r in behind)


def test_the_edge_refuses_on_every_cells_offer_before_admission(tmp_path: Path) -> None:
    """Both one-node cells full for an hour: a paid job whose tier allows 60 s
    of predicted wait is refused at the edge (the API's 429) and never reaches
    admission; with one cell idle the same job is admitted there."""
    tiers = tuple(
        replace(t, max_predicted_wait_s=60.0) if t.name == "paid" else t for t in CellConfig().tiers
    )
    base = CellConfig(tiers=tiers)
    opts = sim.SimOptions(nodes=2, gpus_per_node=8, max_sim_s=300)
    both = [(0, "big1", 8, 3600.0), (1000, "big2", 8, 3600.0), (30_000, "small", 1, 20.0)]
    held, tape, decisions = run_admitted(trace_workload(both), opts, 2, tmp_path / "both", base)
    assert decisions["refused_predicted_wait"] == 1 and decisions["admitted"] == 2
    assert [c.spec.job_id for c in tape if isinstance(c, ev.SubmitJob)] == ["j0", "j1"]
    states = {
        r["job_id"]: r["state"] for n in held for r in rows(tmp_path / "both" / n / "jobs.csv")
    }
    assert states["j2"] == "REJECTED" and sorted(held["cell-00"] + held["cell-01"]) == [
        "j0",
        "j1",
        "j2",
    ]
    one = [both[0], both[2]]
    held, _, decisions = run_admitted(trace_workload(one), opts, 2, tmp_path / "one", base)
    assert decisions["refused_predicted_wait"] == 0 and decisions["admitted"] == 2
    assert not set(held["cell-00"]) & set(held["cell-01"])


def test_quota_tenants_stay_in_their_home_cell(tmp_path: Path) -> None:
    opts = sim.SimOptions(nodes=8, gpus_per_node=8)
    workload = multitenant(200, 5, opts.capacity_gpus)
    bound = sorted(workload.tenants)[:40]
    base = CellConfig(tenants=tuple(TenantConfig(t, max_queued=1000) for t in bound))
    held, _, decisions = run_admitted(workload, opts, 4, tmp_path, base)
    names = cell_names(4)
    table = {r["job_id"]: r for n in names for r in rows(tmp_path / n / "jobs.csv")}
    mine = [
        (job, cell) for cell, jobs in held.items() for job in jobs if table[job]["tenant"] in bound
    ]
    # a home of 2 nodes cannot run a 32- or 64-GPU job: those spill (and are rejected)
    fits = [(job, cell) for job, cell in mine if int(table[job]["gpus"]) <= 16]
    assert fits and decisions["quota_spills"] == len(mine) - len(fits)
    assert all(cell == rendezvous(table[job]["tenant"], names) for job, cell in fits)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 20_000),  # gap after the previous job, ms
            st.sampled_from(["a", "b", "c", "d"]),
            st.sampled_from([1, 2, 4, 8, 16]),
            st.floats(1.0, 400.0),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([2, 3]),
)
def test_every_job_is_routed_exactly_once(tmp_path_factory, jobs, cells: int) -> None:
    at, timed = 0, []
    for gap, tenant, gpus, seconds in jobs:
        at += gap
        timed.append((at, tenant, gpus, seconds))
    workload = trace_workload(timed)
    out = tmp_path_factory.mktemp("fleet")
    held, tape, decisions = run_admitted(workload, sim.SimOptions(nodes=2 * cells), cells, out)
    ids = [job for jobs_ in held.values() for job in jobs_]
    assert sorted(ids) == sorted(f"j{i}" for i in range(len(timed)))  # once each, none lost
    submits = [c.spec.job_id for c in tape if isinstance(c, ev.SubmitJob)]
    assert submits == [f"j{i}" for i in range(len(timed))]  # admission saw each once
    rejected = decisions["rejected_no_cell_can_run"]
    assert decisions["admitted"] + rejected == len(timed)
    names = cell_names(cells)
    config = cell_config(FRAMESPOOL.configure(CellConfig(), workload.tenants), sim.SimOptions())
    core = replayed(tape, names, AdmissionState(admission_config(names, config)))
    assert all(job in held[cell] for job, cell in core.items() if cell)


@pytest.mark.parametrize("routing", ["admission", "hash"])
def test_the_same_seed_gives_the_same_fleet(tmp_path: Path, routing: str) -> None:
    opts = sim.SimOptions(nodes=6, gpus_per_node=8, seed=7)
    outputs = []
    for run in ("one", "two"):
        out = tmp_path / run
        workload = multitenant(200, 7, opts.capacity_gpus)
        summary = simulate_cells(workload, FRAMESPOOL, opts, CellConfig(), out, 3, 1, routing)
        assert summary["routing"] == routing and summary["jobs_submitted"] == 200
        outputs.append(digest(out / "jobs.csv", out / "runs.csv"))
    assert outputs[0] == outputs[1]


def test_hash_routing_folds_each_cell_as_a_cell_of_its_partition(tmp_path: Path) -> None:
    opts = sim.SimOptions(nodes=6, gpus_per_node=8, seed=2)
    workload = multitenant(240, 2, opts.capacity_gpus)
    summary = simulate_cells(workload, FRAMESPOOL, opts, CellConfig(), tmp_path / "f", 3, 2, "hash")
    assert summary["routing"] == "hash" and "admission" not in summary
    names = cell_names(3)
    routing = route(workload, names)
    cell_opts = replace(opts, nodes=2)
    for name in names:
        alone = tmp_path / "alone" / name
        alone.mkdir(parents=True)
        Simulation(
            partition(workload, names, name, routing), FRAMESPOOL, cell_opts, CellConfig(), alone
        ).run()
        for csv_name in ("jobs.csv", "runs.csv"):
            assert (tmp_path / "f" / name / csv_name).read_bytes() == (
                alone / csv_name
            ).read_bytes()


def test_admission_routing_reads_the_stream_to_the_horizon_only(tmp_path: Path) -> None:
    read: list[int] = []

    def stream() -> Iterator[TraceJob]:
        for idx in range(1_000_000):
            read.append(idx)
            yield TraceJob(idx, idx * 2000, f"t{idx % 7}", "paid", 1, 1, 30.0, 30.0)

    workload = Workload("counted", 1_000_000, {f"t{i}": 1.0 for i in range(7)}, stream)
    opts = sim.SimOptions(nodes=6, gpus_per_node=8, max_sim_s=200)
    summary = simulate_cells(workload, FRAMESPOOL, opts, CellConfig(), tmp_path, 3)
    assert max(read) == 101 and len(read) == 102  # once, one job past the horizon
    assert summary["jobs_inside_horizon"] == summary["jobs_submitted"] == 101
    assert summary["jobs_past_horizon"] == 1_000_000 - 101
    assert summary["admission"]["admitted"] == 101
    assert all(c["stop_reason"].startswith("hard stop") for c in summary["per_cell"].values())


def test_routing_flag_is_checked(tmp_path: Path, capsys) -> None:
    args = ["simulate", "--synthetic", "multitenant", "--jobs", "20", "--out", str(tmp_path)]
    with pytest.raises(SystemExit):
        main(args + ["--cells", "2", "--nodes", "4", "--routing", "random"])
    assert "invalid choice" in capsys.readouterr().err


def test_progress_is_reported_as_jobs_are_routed(tmp_path: Path) -> None:
    jobs = [(k * 2000, f"t{k % 5}", 1, 10.0) for k in range(2100)]
    seen: list[tuple[float, str]] = []
    opts = sim.SimOptions(nodes=4, gpus_per_node=8)
    summary = simulate_cells(
        trace_workload(jobs),
        FRAMESPOOL,
        opts,
        CellConfig(),
        tmp_path,
        2,
        progress=lambda f, text: seen.append((f, text)),
    )
    assert summary["jobs_completed"] == 2100
    assert [f for f, _ in seen] == [1024 / 2100, 2048 / 2100]
    assert seen[0][1].startswith("admission: 1,024 jobs routed")
