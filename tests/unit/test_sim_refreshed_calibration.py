"""The simulator scores every band the cell refreshed for a queued job
(``JobWaitEstimated``) against the wait left from that refresh (issue #10:
"refreshed while queued")."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from framespool.processors import sim
from framespool.processors.sim import jobevents
from framespool.processors.sim.quality import format_tables


@pytest.mark.slow
def test_refreshed_bands_are_scored_against_the_wait_left(tmp_path: Path, monkeypatch) -> None:
    seen: list[tuple[str, int, float, float]] = []
    original = jobevents.JobEvents._estimated

    def spy(self, o):
        seen.append((o.job_id, self.now, o.wait_p50_s, o.wait_p90_s))
        original(self, o)

    monkeypatch.setattr(jobevents.JobEvents, "_estimated", spy)
    opts = sim.SimOptions(nodes=4, gpus_per_node=8, nodes_per_rail=4, estimates=True, seed=5)
    workload = sim.synthetic("flood", 600, 5, opts.capacity_gpus)
    opts = sim.with_workload_defaults(opts, workload, None)
    (summary,) = sim.simulate(
        workload, sim.parse_policies("framespool"), opts, out_dir=tmp_path, make_plot=False
    )
    with (tmp_path / "jobs.csv").open(newline="") as handle:
        start = {r["job_id"]: float(r["first_start_s"]) for r in csv.DictReader(handle)}
    scored = [
        (start[job] - at / 1000, p50, p90)
        for job, at, p50, p90 in seen
        if p50 >= 0 and at / 1000 <= start[job] + 1e-9
    ]
    assert len(scored) > 100  # a flood on 32 GPUs keeps jobs queued through many refreshes
    table = summary["wait_calibration_refreshed"]["all"]
    assert table["n"] == len(scored)
    le50 = sum(1 for left, p50, _ in scored if left <= p50 + 1e-6) / len(scored)
    le90 = sum(1 for left, _, p90 in scored if left <= p90 + 1e-6) / len(scored)
    assert table["le_p50"] == pytest.approx(le50, abs=1e-4)
    assert table["le_p90"] == pytest.approx(le90, abs=1e-4)
    assert "refreshed bands while queued" in format_tables(summary)
