"""The simulator drives the real core to completion and measures it honestly.

Small fleets and workloads only: the whole file runs in seconds.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from framespool.cli import main
from framespool.processors import sim
from framespool.processors.core import CellConfig
from framespool.processors.sim.engine import Simulation
from framespool.processors.sim.fleet import checkpoint_uri, unit, work_done_in
from framespool.processors.sim.kinds import NODE_FAIL
from framespool.processors.sim.metrics import JOB_COLUMNS, RUN_COLUMNS
from framespool.processors.sim.policies import POLICIES
from framespool.schemas import events as ev

TERMINAL = {"COMPLETED", "FAILED", "REJECTED", "CANCELLED"}
PLACEMENT = re.compile(r"^n\d+:\d+(\+\d+)*(;n\d+:\d+(\+\d+)*)*$")

TRACE = """submit_s,tenant,tier,gpus,duration_s,gpus_per_node,estimate_s,preemptible,checkpoint_s,weight
0,acme,paid,1,120,,100,0,0,2
0,acme,paid,8,300,8,300,0,0,2
5,beta,free,2,200,,,1,60,
10,beta,free,16,100,8,120,0,0,
12,gamma,interactive,1,30,,,0,0,
20,gamma,batch,4,400,4,350,1,100,
20,acme,enterprise,64,60,8,60,0,0,2
30,beta,paid,3,90,3,90,0,0,
"""


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def small(**overrides) -> sim.SimOptions:
    base = dict(nodes=8, gpus_per_node=8, nodes_per_rail=4, tick_s=2.0)
    base.update(overrides)
    return sim.SimOptions(**base)


@pytest.mark.slow
def test_trace_simulates_to_completion_with_every_output(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    out = tmp_path / "out"
    status = main(
        [
            "simulate",
            "--trace",
            str(trace),
            "--nodes",
            "8",
            "--nodes-per-rail",
            "4",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["invariant_violations"] == 0, summary["violation_examples"]
    assert summary["jobs_submitted"] == 8 and summary["jobs_unfinished"] == 0
    assert summary["stop_reason"] == "drained"
    for key in (
        "jobs_completed",
        "jobs_failed",
        "jobs_rejected",
        "makespan_s",
        "gpu_utilization",
        "utilization_under_backlog",
        "jain_fairness",
        "events",
        "wall_s",
        "cold_starts_avoided",
        "tenants",
    ):
        assert key in summary
    assert set(summary["wait_s"]) >= {"p50", "p90", "p99", "max"}
    assert set(summary["wait_s_by_tier"]) == {"paid", "free", "interactive", "batch", "enterprise"}
    assert summary["tenants"]["acme"]["weight"] == 2.0

    header, jobs = read_csv(out / "jobs.csv")
    assert header == list(JOB_COLUMNS)
    assert sorted(j["job_id"] for j in jobs) == [f"j{i}" for i in range(8)]
    assert all(j["state"] in TERMINAL for j in jobs)
    header, runs = read_csv(out / "runs.csv")
    assert header == list(RUN_COLUMNS)
    assert all(PLACEMENT.match(r["placement"]) for r in runs), runs
    gang = [r for r in runs if r["job_id"] == "j6"]  # 64 GPUs = 8 nodes x 8
    assert gang and len(gang[0]["placement"].split(";")) == 8
    assert (out / "report.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(sim.SYNTHETIC))
def test_each_synthetic_workload_runs_clean_at_small_scale(name: str, tmp_path: Path) -> None:
    opts = small(seed=3)
    workload = sim.synthetic(name, 300, 3, opts.capacity_gpus)
    opts = sim.with_workload_defaults(opts, workload, 0.05 if name == "failures" else None)
    (summary,) = sim.simulate(
        workload, sim.parse_policies("framespool"), opts, out_dir=tmp_path, make_plot=False
    )
    assert summary["invariant_violations"] == 0, summary["violation_examples"]
    assert summary["jobs_unfinished"] == 0 and summary["stop_reason"] == "drained"
    _, jobs = read_csv(tmp_path / "jobs.csv")
    assert len(jobs) == 300 and all(j["state"] in TERMINAL for j in jobs)
    assert summary["jobs_completed"] + summary["jobs_failed"] + summary["jobs_rejected"] == 300
    if name == "failures":
        assert summary["node_failures"] > 0
        assert summary["run_outcomes"].get("requeued:generator_error", 0) > 0
    if name == "gangs":
        assert any(len(r["placement"].split(";")) > 1 for r in read_csv(tmp_path / "runs.csv")[1])


@pytest.mark.slow
def test_flooding_tenant_does_not_shrink_the_others_share() -> None:
    """Equal weights, one tier: while backlogged, each small tenant holds about 1/4 of
    what the backlogged tenants hold, however many jobs 'flood' queues. FCFS within
    the tier (the backfill policy) gives them about their 1% of the submissions."""
    opts = sim.SimOptions(nodes=2, gpus_per_node=8, nodes_per_rail=2, tick_s=5.0, seed=2)
    workload = sim.synthetic("flood", 2000, 2, opts.capacity_gpus)
    fair, fcfs = sim.simulate(workload, sim.parse_policies("framespool,backfill"), opts)
    for summary in (fair, fcfs):
        assert summary["invariant_violations"] == 0, summary["violation_examples"]
    n = len(fair["tenants"])
    for tenant in ("a", "b", "c"):
        assert abs(fair["tenants"][tenant]["share_while_backlogged"] - 1 / n) <= 0.1, fair[
            "tenants"
        ]
        assert fcfs["tenants"][tenant]["share_while_backlogged"] < 0.1, fcfs["tenants"]
    assert fair["jain_fairness"] >= 0.9 > fcfs["jain_fairness"]


def test_policies_compare_in_one_run(tmp_path: Path) -> None:
    status = main(
        [
            "simulate",
            "--synthetic",
            "steady",
            "--jobs",
            "200",
            "--nodes",
            "4",
            "--nodes-per-rail",
            "2",
            "--policy",
            "framespool,fifo",
            "--out",
            str(tmp_path),
            "--no-plot",
            "--quiet",
        ]
    )
    assert status == 0
    for policy in ("framespool", "fifo"):
        summary = json.loads((tmp_path / policy / "summary.json").read_text())
        assert summary["policy"] == policy and summary["jobs_unfinished"] == 0
        assert summary["invariant_violations"] == 0
    table = (tmp_path / "comparison.txt").read_text().splitlines()
    assert table[0].startswith("policy") and [r.split()[0] for r in table[1:]] == [
        "framespool",
        "fifo",
    ]


def test_fifo_starts_jobs_in_submit_order_without_backfill(tmp_path: Path) -> None:
    opts = small(nodes=4)
    workload = sim.synthetic("gangs", 150, 5, opts.capacity_gpus)
    (summary,) = sim.simulate(workload, [POLICIES["fifo"]], opts, out_dir=tmp_path, make_plot=False)
    assert summary["invariant_violations"] == 0
    _, jobs = read_csv(tmp_path / "jobs.csv")
    started = sorted((j for j in jobs if j["first_start_s"]), key=lambda j: int(j["job_id"][1:]))
    starts = [float(j["first_start_s"]) for j in started]
    assert starts == sorted(starts)  # no job overtakes an earlier one
    assert summary["wait_s"]["max"] > 0  # and the gangs did have to wait


def test_same_seed_same_results(tmp_path: Path) -> None:
    rows = []
    for run in ("a", "b"):
        opts = small(node_failures_per_hour=0.05)
        workload = sim.synthetic("failures", 200, 7, opts.capacity_gpus)
        sim.simulate(
            workload,
            sim.parse_policies("framespool"),
            opts,
            out_dir=tmp_path / run,
            make_plot=False,
        )
        rows.append(
            ((tmp_path / run / "jobs.csv").read_text(), (tmp_path / run / "runs.csv").read_text())
        )
    assert rows[0] == rows[1]


def test_checkpoint_uri_carries_the_work_done() -> None:
    assert work_done_in(checkpoint_uri("j1", 3, 123.4567)) == pytest.approx(123.457)
    assert work_done_in(None) == 0.0 and work_done_in("s3://elsewhere/x") == 0.0
    assert unit(1, 2, 3) == unit(1, 2, 3) != unit(1, 2, 4)


def test_resumed_run_does_only_the_remaining_work(tmp_path: Path) -> None:
    """A checkpointing job on a node that fails resumes elsewhere from its checkpoint."""
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,tenant,tier,gpus,duration_s,checkpoint_s\n0,t,paid,8,1000,100\n")
    opts = sim.SimOptions(
        nodes=2,
        gpus_per_node=8,
        nodes_per_rail=2,
        cold_start_s=0,
        node_failures_per_hour=0.0,
        heartbeat_s=10.0,
    )
    s = Simulation(sim.read_trace(trace), POLICIES["framespool"], opts, CellConfig(), tmp_path)
    original = s._launch

    def launch_then_fail_first(run, resume_from):  # the first node dies at t=550 s
        original(run, resume_from)
        if run.run == 1:
            s.push(550_000, NODE_FAIL, s.node_by_id[run.leader])

    s._launch = launch_then_fail_first
    summary = s.run()
    assert summary["invariant_violations"] == 0, summary["violation_examples"]
    _, runs = read_csv(tmp_path / "runs.csv")
    assert [r["outcome"] for r in runs] == ["requeued:node_lost", "completed"]
    second = runs[1]
    # the last checkpoint was at 500 s of work: about 500 s remain
    assert float(second["end_s"]) - float(second["start_s"]) == pytest.approx(500, abs=5)


def test_invariant_checks_catch_a_double_terminal_event(tmp_path: Path) -> None:
    opts = small(nodes=2)
    workload = sim.synthetic("steady", 20, 1, opts.capacity_gpus)
    s = Simulation(workload, POLICIES["framespool"], opts, CellConfig())
    apply = s.cell.apply

    def duplicating(event, position=None):
        out = apply(event, position)
        return out + [o for o in out if isinstance(o, ev.JobCompleted)]

    s.cell.apply = duplicating
    summary = s.run()
    assert summary["violations_by_kind"].get("second_terminal_event") == 20


def test_core_exception_stops_the_run_and_is_reported(tmp_path: Path) -> None:
    opts = small(nodes=2)
    workload = sim.synthetic("steady", 50, 1, opts.capacity_gpus)
    s = Simulation(workload, POLICIES["framespool"], opts, CellConfig(), tmp_path)
    apply = s.cell.apply

    def failing(event, position=None):
        if isinstance(event, ev.RunCompleted) and event.job_id == "j10":
            raise KeyError("boom")
        return apply(event, position)

    s.cell.apply = failing
    summary = s.run()
    assert "core raised KeyError" in summary["stop_reason"]
    assert summary["violations_by_kind"]["core_exception"] == 1
    assert summary["jobs_unfinished"] > 0
    _, jobs = read_csv(tmp_path / "jobs.csv")
    assert len(jobs) == 50  # every job has a row, unfinished ones say so
    assert {"UNFINISHED", "NOT_SUBMITTED"} & {j["state"] for j in jobs}


def test_hard_stop_reports_what_the_core_still_holds(tmp_path: Path) -> None:
    status = main(
        [
            "simulate",
            "--synthetic",
            "steady",
            "--jobs",
            "200",
            "--nodes",
            "2",
            "--max-sim-s",
            "300",
            "--out",
            str(tmp_path),
            "--no-plot",
            "--quiet",
        ]
    )
    assert status == 1  # unfinished jobs are invariant violations
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"].startswith("hard stop")
    assert summary["jobs_unfinished"] == summary["violations_by_kind"]["not_terminal"] > 0
    _, jobs = read_csv(tmp_path / "jobs.csv")
    # every job is accounted for: a row for each job submitted at or before the
    # horizon, a count of those after it (never generated: issue 35)
    assert len(jobs) == summary["jobs_inside_horizon"] > 0
    assert len(jobs) + summary["jobs_past_horizon"] == 200


@pytest.mark.parametrize(
    "text, message",
    [
        ("submit_s,tenant,gpus,duration_s\n0,a,1,10\n", "header lacks tier"),
        ("submit_s,tenant,tier,gpus,duration_s,colour\n0,a,paid,1,10,red\n", "unknown column"),
        ("submit_s,tenant,tier,gpus,duration_s\n0,a,paid,two,10\n", ":2: gpus='two'"),
        ("submit_s,tenant,tier,gpus,duration_s\n0,a,paid,1,0\n", "duration_s='0' must be > 0"),
        (
            "submit_s,tenant,tier,gpus,duration_s,weight\n0,a,paid,1,5,1\n0,a,paid,1,5,2\n",
            "give each tenant one weight",
        ),
    ],
)
def test_bad_traces_are_refused_with_the_line_and_field(
    tmp_path: Path, capsys, text: str, message: str
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(text)
    assert main(["simulate", "--trace", str(trace), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_unsorted_trace_is_sorted_by_submit_time(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,tenant,tier,gpus,duration_s\n50,a,paid,1,10\n0,a,paid,1,10\n")
    workload = sim.read_trace(trace)
    assert [j.job_id for j in workload.jobs()] == ["j1", "j0"]
    assert workload.notes


def test_tiers_file_configures_the_cell(tmp_path: Path, capsys) -> None:
    tiers = tmp_path / "tiers.json"
    tiers.write_text(
        json.dumps(
            [
                {"name": "gold", "weight": 4, "rank": 0, "sla_wait_s": 10, "may_preempt": True},
                {"name": "bronze", "weight": 1, "rank": 1, "sla_wait_s": 600},
            ]
        )
    )
    trace = tmp_path / "t.csv"
    trace.write_text(
        "submit_s,tenant,tier,gpus,duration_s\n0,a,gold,8,100\n0,b,bronze,8,100\n1,c,free,1,10\n"
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(trace),
                "--tiers",
                str(tiers),
                "--nodes",
                "1",
                "--out",
                str(out),
                "--no-plot",
                "--quiet",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejections"] == {"invalid_tier": 1}  # 'free' is not a tier here
    assert set(summary["wait_s_by_tier"]) == {"gold", "bronze", "free"}
    assert summary["wait_s_by_tier"]["bronze"]["max"] >= 100  # one node: it waits for gold

    tiers.write_text(json.dumps([{"name": "gold", "weight": 4, "rank": 0, "sla_wait": 10}]))
    assert (
        main(
            ["simulate", "--trace", str(trace), "--tiers", str(tiers), "--out", str(out), "--quiet"]
        )
        == 2
    )
    assert "unknown field(s) sla_wait" in capsys.readouterr().err
