"""Shape fairness in the simulator (issue #10): on ``--synthetic shapes`` a
tenant of 8- and 16-GPU gangs gets at least 0.9 of its fair share against an
equal-weight tenant of 1-GPU jobs under framespool (conservative backfill),
while first-come-first-served policies give it its share of the submissions."""

from __future__ import annotations

from pathlib import Path

import pytest

from framespool.cli import main
from framespool.processors import sim
from framespool.processors.sim.quality import fair_share_lines


@pytest.mark.slow
def test_gang_tenant_gets_its_fair_share_under_framespool_not_under_fifo_or_backfill():
    opts = sim.SimOptions(nodes=4, gpus_per_node=8, nodes_per_rail=4, tick_s=5.0, seed=3)
    workload = sim.synthetic("shapes", 800, 3, opts.capacity_gpus)
    fair, fifo, backfill = sim.simulate(
        workload, sim.parse_policies("framespool,fifo,backfill"), opts, make_plot=False
    )
    for summary in (fair, fifo, backfill):
        assert summary["invariant_violations"] == 0, summary["violation_examples"]
        assert summary["jobs_unfinished"] == 0
        assert set(summary["tenants"]) == {"big", "small"}
    assert fair["tenants"]["big"]["fair_ratio"] >= 0.9, fair["tenants"]
    # controls: first come, first served within the tier gives the gang tenant
    # about its quarter of the submissions, well short of its half
    assert fifo["tenants"]["big"]["fair_ratio"] < 0.75, fifo["tenants"]
    assert backfill["tenants"]["big"]["fair_ratio"] < 0.75, backfill["tenants"]
    lines = fair_share_lines(fair)
    assert lines[0].startswith("framespool: fair share while backlogged")
    assert any(line.split()[0] == "big" for line in lines[2:])


def test_simulate_shapes_prints_each_tenants_fair_share(tmp_path: Path, capsys) -> None:
    status = main(
        [
            "simulate", "--synthetic", "shapes", "--jobs", "60", "--nodes", "2",
            "--nodes-per-rail", "2", "--tick-s", "5", "--policy", "framespool,fifo",
            "--out", str(tmp_path), "--no-plot", "--quiet",
        ]
    )  # fmt: skip
    assert status == 0
    out = capsys.readouterr().out
    assert "framespool: fair share while backlogged" in out
    assert "fifo: fair share while backlogged" in out
    assert (tmp_path / "framespool" / "summary.json").exists()
