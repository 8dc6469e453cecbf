"""``framespool chaos`` through the CLI: a small seeded drill ends with zeros.

30 jobs on 6 agents x 8 simulated GPUs in two cells shared by two scheduler
instances (the defaults) while every kind of fault is injected once or twice
(agents killed and paused, an agent left DOWN to heal itself, every agent of
one cell killed past the drain grace so that its queued jobs are rerouted to
the other cell, a scheduler
instance killed and another paused past its session timeout, reports
duplicated and reordered, malformed records on every topic, ECC errors,
throttling, a wedged generator, jobs that crash or hang every time). The
command exits 0 only if no job is lost, no job has two terminal events, and
no GPU is leaked or double-booked; the JSON report says what happened.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from framespool.chaos import plan as chaos

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(320)]


def test_chaos_drill_of_30_jobs_ends_with_zeros(tmp_path):
    report_path = tmp_path / "chaos.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "framespool.cli",
            "chaos",
            "--jobs",
            "30",
            "--seed",
            "1",
            "--data-dir",
            str(tmp_path / "stack"),
            "--json",
            str(report_path),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=280,  # about 100 s alone on 2 cores; the emptied cell adds ~40 s
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "result: OK" in proc.stdout
    report = json.loads(report_path.read_text())
    for key in ("lost", "duplicate_terminal_events", "leaked_gpus", "double_booked_gpus"):
        assert report[key] == 0, (
            key,
            report[key],
            report.get("lost_jobs"),
            report.get("leaks"),
            report.get("double_booking"),
        )
    assert report["submitted"] == 30 and not report["submit_errors"]
    assert report["completed"] + report["failed"] == 30
    assert report["finished_before_timeout"]
    # every kind of fault was injected, and none of the steps failed
    assert set(report["faults_injected"]) == {
        chaos.KILL_AGENT,
        chaos.PAUSE_AGENT,
        chaos.DOWN_AGENT,
        chaos.EMPTY_CELL,
        chaos.KILL_SCHEDULER,
        chaos.PAUSE_SCHEDULER,
        chaos.DUPLICATE_REPORTS,
        chaos.MALFORMED_RECORDS,
        chaos.ECC_GPU,
        chaos.THROTTLE_GPU,
        chaos.WEDGE_GENERATOR,
        chaos.CRASH_GENERATOR,
        chaos.HANG_GENERATOR,
        chaos.KILL_BROKER,  # the durable broker is among the faults
    }
    assert report["faults_skipped"] == []
    # the planted failures ended FAILED with their class and budget; nothing else failed
    assert report["failed_by_class"] == {"generator_error": 1, "hung": 1}
    assert report["failed_unexpected"] == {}
    assert all("retry budget" in r for r in report["failed_reasons"].values())
    # malformed records all reached dead-letter; the zombie's and duplicates were ignored
    assert report["dead_letter"]["missing"] == [] and report["dead_letter"]["injected"] > 0
    assert {"stale_run", "not_holder", "stale_incarnation"} & set(report["reports_ignored"])
    assert "unrecorded" not in report["reports_ignored"]  # every refusal carries its code
    assert report["resumed_runs"] > 0
    assert report["cluster_view"].get("busy") == 0
    # the shape: two cells, two instances; each scheduler fault moved its instance's
    # cells to a new owner that went on deciding
    assert (report["config"]["cells"], report["config"]["schedulers"]) == (2, 2)
    assert report["takeovers"] >= 1 and report["takeovers_unfinished"] == []
    assert report["takeover_s_max"] is not None
    # one cell was emptied past the drain grace: the jobs queued there (its lost runs
    # among them) were rerouted to the other cell and completed (lost 0 above)
    (drain,) = report["drains"]
    assert drain["expected"] and drain["rerouted"] >= 1, drain
    assert report["reroutes"] >= drain["rerouted"]
    # the DOWN agent's healing is reported either way (agents/ may not heal yet)
    assert [row["declared_down"] for row in report["self_healing"]] == [True]
    assert "summary: {" in proc.stdout
