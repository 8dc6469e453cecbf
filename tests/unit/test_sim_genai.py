"""Issue 34's workload (``genai``), its checkpoint physics and its scorecard.

Small sizes only: every test runs in seconds.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from framespool.cli import main
from framespool.processors import sim
from framespool.processors.sim.genai import DEFAULT_LOAD, MAX_S, MIN_S
from framespool.processors.sim.quality import WaitRow
from framespool.processors.sim.scorecard import light_heavy_table, scorecard


def test_genai_has_the_missions_shape() -> None:
    workload = sim.synthetic("genai", 27_000, 1, 128 * 8)
    jobs = list(workload.jobs())
    assert len(jobs) == workload.total == 27_000
    assert [j.idx for j in jobs] == list(range(len(jobs)))
    assert all(a.submit_ms <= b.submit_ms for a, b in zip(jobs, jobs[1:]))
    # ~4,200 tenants, every one of them submits; heavy-tailed volumes
    volumes = Counter(j.tenant for j in jobs)
    assert len(volumes) == len(workload.tenants) == 4200
    ordered = sorted(volumes.values(), reverse=True)
    assert ordered[0] >= 500 and ordered[len(ordered) // 2] <= 3
    assert len({j.tier for j in jobs}) == 5
    # run times from seconds to 45 minutes; mostly 1-8 GPUs, rare gangs
    assert min(j.duration_s for j in jobs) == MIN_S and max(j.duration_s for j in jobs) == MAX_S
    gangs = sum(1 for j in jobs if j.gpus > 8)
    assert 0 < gangs < 0.02 * len(jobs)
    assert all(j.gpus_per_node == min(j.gpus, 8) for j in jobs)
    # the offered load is the asked one, give or take the random draw
    span_s = jobs[-1].submit_ms / 1000
    offered = sum(j.gpus * j.duration_s for j in jobs) / (128 * 8 * span_s)
    assert DEFAULT_LOAD * 0.9 < offered < DEFAULT_LOAD * 1.1
    # checkpointing work answers a checkpoint request only at its next boundary
    ckpt = [j for j in jobs if j.checkpoint_s > 0]
    assert ckpt and all(j.preemptible and not j.checkpoint_on_request for j in ckpt)
    assert not any(j.checkpoint_s for j in jobs if j.tier == "interactive")


def test_genai_arrives_in_bursts() -> None:
    """A tenant's next request follows its last within a minute far more often
    than independent arrivals at its rate would make it."""
    jobs = list(sim.synthetic("genai", 5000, 3, 256).jobs())
    last: dict[str, int] = {}
    close = total = 0
    for j in jobs:
        if j.tenant in last:
            total += 1
            close += j.submit_ms - last[j.tenant] <= 60_000
        last[j.tenant] = j.submit_ms
    assert close / total > 0.5


TRACE = """submit_s,tenant,tier,gpus,duration_s,gpus_per_node,estimate_s,preemptible,checkpoint_s,model
0,acme,batch,8,600,8,600,1,60,m1
100,gamma,interactive,8,30,8,30,0,0,m1
"""


def test_a_generator_that_checkpoints_at_boundaries_answers_at_the_next_one(
    tmp_path: Path, monkeypatch
) -> None:
    """The same trace with ``checkpoint_on_request`` off: the preemption waits
    for the victim's next 60 s boundary, and the work up to it is saved."""
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    waits = {}
    for on_request in (True, False):
        workload = sim.read_trace(trace)
        base = workload.jobs

        def jobs(base=base, on_request=on_request):
            for job in base():
                job.checkpoint_on_request = on_request
                yield job

        workload.jobs = jobs
        opts = sim.SimOptions(nodes=1, cold_start_s=0.0)
        (summary,) = sim.simulate(workload, sim.parse_policies("framespool"), opts)
        waits[on_request] = summary["wait_s_by_tier"]["interactive"]["max"]
        assert summary["preemptions"] == 1
        assert summary["preemption_cost"]["all"]["gpu_s"] == 0.0
    assert waits[True] < 10 < waits[False] <= 60 + 10


def test_light_and_heavy_are_split_at_each_tenants_own_median() -> None:
    rows = [
        WaitRow("free", "a", 5.0, -1, -1, 10.0),  # light (a's median is 20)
        WaitRow("free", "a", 50.0, -1, -1, 20.0),  # a's median job: neither
        WaitRow("free", "a", 500.0, -1, -1, 300.0),  # heavy
        WaitRow("free", "b", 7.0, -1, -1, 1.0),  # a one-job tenant: neither
        WaitRow("paid", "c", 1.0, -1, -1, 5.0),
        WaitRow("paid", "c", 9.0, -1, -1, 50.0),
    ]
    table = light_heavy_table(rows)
    assert table["free"]["light"] == {"jobs": 1, "p50_s": 5.0, "p90_s": 5.0}
    assert table["free"]["heavy"] == {"jobs": 1, "p50_s": 500.0, "p90_s": 500.0}
    assert table["paid"]["light"]["p90_s"] == 1.0 and table["paid"]["heavy"]["p90_s"] == 9.0


def test_scorecard_marks_each_target() -> None:
    summary = {
        "cluster": {"gpus": 100},
        "makespan_s": 1000.0,
        "wait_s_by_tier": {"interactive": {"p99": 12.0}},
        "preemption_cost": {"all": {"gpu_s": 500.0}},  # 0.5 % of 100,000 GPU-s
        "light_heavy": {"free": {"light": {"p90_s": 599.0}}, "paid": {"light": {"p90_s": 61.0}}},
        "wait_calibration": {"free": {"told_pos_le_p50": 0.5, "told_pos_le_p90": 0.8}},
        "utilization_under_backlog": 0.981,
        "invariant_violations": 0,
    }
    card = scorecard(summary)
    met = {name: row["met"] for name, row in card.items()}
    assert met == {
        "interactive_p99_s": False,
        "preemption_loss_share_of_capacity": True,
        "light_p90_s:enterprise": None,
        "light_p90_s:paid": False,
        "light_p90_s:free": True,
        "told_pos_le_p50:free": True,
        "told_pos_le_p90:free": False,
        "utilization_under_backlog": True,
        "invariant_violations": True,
    }
    assert card["preemption_loss_share_of_capacity"]["value"] == 0.005


def test_simulate_prints_the_scorecard_for_genai(tmp_path: Path, capsys) -> None:
    out = tmp_path / "g"
    argv = ["simulate", "--synthetic", "genai", "--jobs", "300", "--nodes", "4"]
    assert main([*argv, "--estimates", "--out", str(out), "--no-plot", "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "genai" and summary["jobs_completed"] == 300
    assert "interactive_p99_s" in summary["scorecard"] and summary["light_heavy"]
    printed = capsys.readouterr().out
    assert "issue 34 targets" in printed and "light vs heavy jobs" in printed
