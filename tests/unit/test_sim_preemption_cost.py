"""The GPU-time cost of preemption in a simulation's summary (metrics.py):
work lost since the victim's last checkpoint, the checkpoint/stop grace and the
resumed run's cold start, charged to the preempting job's tier."""

from __future__ import annotations

import json
from pathlib import Path

from framespool.cli import main
from framespool.processors.sim.metrics import Recorder
from framespool.processors.sim.quality import format_tables

S = 1000  # ms


def recorder() -> Recorder:
    rec = Recorder(None, capacity_gpus=8, tenant_weights={})
    rec.busy_ms = 10_000.0 * S  # delivered GPU-time, for the share
    return rec


def test_the_three_parts_are_charged_to_the_preempting_tier() -> None:
    rec = recorder()
    rec.run_launched("j0", 1, 4, 0, cold_s=20.0)  # the victim's own cold start is not charged
    rec.run_saved("j0", 1, 100 * S)
    rec.exit_requested("j0", 1, 150 * S)  # 50 s of work since the checkpoint is lost
    rec.exit_requested("j0", 1, 155 * S)  # a repeated ask (another node of the gang) is ignored
    rec.run_halted("j0", 1, 4, 160 * S)  # 10 s of grace
    rec.preempted("j0", 1, "interactive")
    rec.run_launched("j0", 2, 4, 200 * S, cold_s=20.0)  # the resumed run loads the model again
    cost = rec.preemption_cost()
    assert cost["interactive"] == {
        "victims": 1,
        "lost_gpu_s": 200.0,
        "grace_gpu_s": 40.0,
        "restart_gpu_s": 80.0,
        "gpu_s": 320.0,
        "share_of_delivered": 0.032,
    }
    assert cost["all"]["gpu_s"] == 320.0


def test_order_of_stop_and_preempted_does_not_matter_and_a_warm_resume_is_free() -> None:
    rec = recorder()
    rec.run_launched("j0", 1, 2, 0, cold_s=0.0)
    rec.exit_requested("j0", 1, 30 * S)  # never checkpointed: all 30 s are lost
    rec.preempted("j0", 1, "paid")  # the cell's verdict arrives before the stop
    rec.run_halted("j0", 1, 2, 90 * S)  # the grace ran out (60 s)
    rec.run_launched("j0", 2, 2, 100 * S, cold_s=0.0)  # warm GPUs: no restart cost
    assert rec.preemption_cost()["paid"] == {
        "victims": 1,
        "lost_gpu_s": 60.0,
        "grace_gpu_s": 120.0,
        "restart_gpu_s": 0.0,
        "gpu_s": 180.0,
        "share_of_delivered": 0.018,
    }


def test_a_stop_that_is_not_a_preemption_costs_nothing() -> None:
    rec = recorder()
    rec.run_launched("j0", 1, 8, 0, cold_s=20.0)
    rec.exit_requested("j0", 1, 30 * S)  # asked to move off a bad node
    rec.run_halted("j0", 1, 8, 31 * S)
    rec.run_launched("j0", 2, 8, 40 * S, cold_s=20.0)
    rec.run_launched("j1", 1, 8, 40 * S, cold_s=20.0)
    rec.run_halted("j1", 1, 8, 50 * S)  # cancelled or its node lost: no exit was asked
    rec.preempted("j1", 1, "interactive")
    rec.run_launched("j1", 2, 8, 60 * S, cold_s=20.0)
    assert rec.preemption_cost() == {
        "all": {
            "victims": 0,
            "lost_gpu_s": 0.0,
            "grace_gpu_s": 0.0,
            "restart_gpu_s": 0.0,
            "gpu_s": 0.0,
            "share_of_delivered": 0.0,
        }
    }
    assert not (rec.halted or rec.exit_ms or rec.preempt_pending or rec.resume_tier)


TRACE = """submit_s,tenant,tier,gpus,duration_s,gpus_per_node,estimate_s,preemptible,checkpoint_s,model
0,acme,batch,8,600,8,600,1,60,m1
100,gamma,interactive,8,30,8,30,0,0,m2
"""


def test_simulate_reports_the_cost_of_an_interactive_preemption(tmp_path: Path, capsys) -> None:
    """One node: the interactive job preempts the batch job, which checkpoints at
    once (nothing lost, no grace) and resumes on GPUs now warm with the other
    model: 8 GPUs x 20 s of cold start."""
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(trace), "--nodes", "1", "--out", str(out), "--no-plot"]
    assert main([*argv, "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["preemptions"] == 1
    cost = summary["preemption_cost"]
    assert set(cost) == {"interactive", "all"}
    row = cost["all"]
    assert (row["victims"], row["lost_gpu_s"], row["grace_gpu_s"]) == (1, 0.0, 0.0)
    assert row["restart_gpu_s"] == row["gpu_s"] == 8 * 20.0
    delivered = summary["gpu_utilization"] * summary["makespan_s"] * 8
    assert abs(row["share_of_delivered"] - 160.0 / delivered) < 1e-3
    text = format_tables(summary)
    assert "GPU-time cost of preemption" in text
    assert "interactive" in text.split("GPU-time cost of preemption")[1]
