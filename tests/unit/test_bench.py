"""``framespool bench core`` runs at tiny sizes and reports what the issue asks for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from framespool.bench.core import bench_placement
from framespool.cli import main


@pytest.mark.slow
def test_bench_core_writes_the_json_keys(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    status = main(
        [
            "bench",
            "core",
            "--nodes",
            "20",
            "--queued",
            "400",
            "--events",
            "3000",
            "--rounds",
            "2",
            "--json",
            str(out),
        ]
    )
    assert status == 0
    result = json.loads(out.read_text())
    assert result["events_per_s"] > 0 and result["placements_per_s"] > 0
    assert set(result["decision_latency_ms"]) >= {"p50", "p99"}
    assert result["decision_latency_ms"]["n"] > 0
    assert result["mixed"]["replay_matches"] is True  # the core replays deterministically
    assert {"JobAdmitted", "NodeHeartbeat", "RunCompleted", "Tick"} <= set(
        result["mixed"]["event_mix"]
    )
    assert "events/s" in capsys.readouterr().out


def test_placement_bench_fills_the_empty_fleet_from_the_queue() -> None:
    result = bench_placement(
        nodes=10, gpus_per_node=8, queued=300, rounds=2, complete_share=0.2, seed=3
    )
    assert result["queued"] == 300
    fill = result["fill"]
    assert fill["placements"] > 0 and fill["passes"] >= 1
    assert result["after_completions"]["placements"] > 0


def test_hop_split_measures_each_hop_between_its_two_stamps():
    from framespool.bench.pipeline import HOPS, hop_split

    sent = {"a": 1000.0, "b": 2000.0}
    stamps = {
        "submit": {"a": 1004.0, "b": 2002.0},
        "admitted": {"a": 1010.0, "b": 2003.0},
        "assigned": {"a": 1030.0},  # b was never assigned
        "started": {"a": 1031.0},
    }
    hops = hop_split(sent, stamps, {"a": 1029.0})
    assert tuple(hops) == HOPS
    assert hops["api"]["max"] == 4.0 and hops["api"]["p50"] == 3.0
    assert hops["admission"]["max"] == 6.0
    assert hops["decision"] == {"p50": 20.0, "p99": 20.0, "max": 20.0}
    assert hops["delivery"]["max"] == 1.0
    assert hops["observe"]["max"] == 0.0  # ms-truncated clocks: never negative


def test_cpu_meter_sums_each_kind_of_process_and_skips_the_gone():
    import os
    import subprocess
    import sys

    from framespool.bench.pipeline import CpuMeter, process_cpu_s, process_kind

    assert [process_kind(n) for n in ("agent-node-3", "agent-1", "scheduler-0", "api")] == [
        "agents",
        "agents",
        "scheduler",
        "api",
    ]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert process_cpu_s(gone.pid) is None
    me = os.getpid()
    meter = CpuMeter({"agent-0": me, "agent-1": me, "bench": me, "broker": gone.pid})
    meter.start()
    spent = process_cpu_s(me)
    assert spent is not None
    while process_cpu_s(me) - spent < 0.05:  # burn some CPU of our own
        sum(range(10_000))
    cpu = meter.stop()
    assert meter.elapsed_s > 0  # what bench_pipeline turns % into ms per job with
    assert set(cpu) == {"agents", "bench", "total"}  # the gone broker has no figure
    assert cpu["agents"] == pytest.approx(2 * cpu["bench"], abs=0.2)
    assert cpu["bench"] > 0
    assert cpu["total"] == pytest.approx(cpu["agents"] + cpu["bench"], abs=0.2)


@pytest.mark.slow
def test_bench_core_runs_light_and_backlog_side_by_side(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    status = main(
        ["bench", "core", "--nodes", "10", "--queued", "200", "--events", "1500", "--rounds", "1"]
        + ["--backlog-events", "800", "--backlog-queued", "60", "--backlog-tenants", "120"]
        + ["--json", str(out)]
    )
    assert status == 0
    result = json.loads(out.read_text())
    scenarios = result["scenarios"]
    assert list(scenarios) == ["light", "backlog"]
    for name, scenario in scenarios.items():
        assert scenario["events_per_s"] > 0 and scenario["placements_per_s"] > 0, name
        assert {"p50", "p99"} <= set(scenario["decision_latency_ms"]), name
        assert scenario["mixed"]["replay_matches"] is True, name
    backlog = scenarios["backlog"]
    assert backlog["setup"]["tenants"] == 120 and backlog["setup"]["warmup"] > 0
    assert backlog["placement"]["queued"] >= 60
    # the light scenario's keys stay at the top level
    assert result["events_per_s"] == scenarios["light"]["events_per_s"]
    assert result["decision_latency_ms"] == scenarios["light"]["decision_latency_ms"]
    assert result["backlog_vs_light"] > 0
    printed = capsys.readouterr().out
    assert "light" in printed and "backlog" in printed


def test_bench_core_scenarios_flag_is_checked(capsys) -> None:
    assert main(["bench", "core", "--scenarios", "light,heavy"]) == 2
    assert "--scenarios" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_core_repeat_times_every_run_from_the_same_warm_cell(tmp_path: Path, capsys) -> None:
    """``--repeat 3``: three timed runs of each part, the best reported. Each
    run of the mixed stream replays the recording on its own copy of the warm
    cell, so every run matches it (a run on the cell an earlier run already
    advanced would not)."""
    out = tmp_path / "bench.json"
    status = main(
        ["bench", "core", "--nodes", "20", "--queued", "400", "--events", "3000"]
        + ["--rounds", "2", "--scenarios", "light", "--repeat", "3", "--json", str(out)]
    )
    assert status == 0
    result = json.loads(out.read_text())
    runs = result["mixed"]["runs_events_per_s"]
    assert len(runs) == 3 and result["events_per_s"] == max(runs)
    assert result["mixed"]["replay_matches"] is True
    passes = result["placement"]["runs_placements_per_s"]
    assert len(passes) == 3 and result["placements_per_s"] == max(passes)
    assert result["setup"]["repeat"] == 3
    assert "best of 3 runs" in capsys.readouterr().out


def test_bench_core_repeat_must_be_positive(capsys) -> None:
    assert main(["bench", "core", "--repeat", "0"]) == 2
    assert "--repeat" in capsys.readouterr().err


def test_output_hashes_are_a_function_of_the_tape():
    """``bench core --hash``: the same scenario hashes the same; the names are checked."""
    from framespool.bench.core import output_hash

    first = output_hash("light", 0.01)
    assert first == output_hash("light", 0.01) and len(first) == 16
    assert output_hash("backlog", 0.01) != first
    with pytest.raises(ValueError, match="unknown hash scenario"):
        output_hash("heavy")


def test_the_snapshot_bench_times_both_states_it_built():
    from framespool.bench.snapshot import bench_snapshot

    r = bench_snapshot(decisions=300, nodes=10, events=500, repeat=1)
    assert r["admission"]["decisions"] == 300 and r["admission"]["bytes"] > 0
    assert r["cell"]["jobs"] > 0 and r["cell"]["bytes"] > 0
    assert r["admission"]["round_trip_ms"] >= 0 and r["cell"]["pickle_ms"] >= 0
