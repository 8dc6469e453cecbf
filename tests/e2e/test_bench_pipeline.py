"""framespool bench pipeline on a real embedded stack (tiny sizes)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_bench_pipeline_runs_end_to_end_and_writes_its_keys(tmp_path):
    """A tiny pipeline bench on a real embedded stack: the keys exist and every job ended."""
    import json as _json

    from framespool.cli import main as cli_main

    out = tmp_path / "pipe.json"
    assert (
        cli_main(
            [
                "bench",
                "pipeline",
                "--jobs",
                "20",
                "--rate",
                "20",
                "--seconds",
                "1",
                "--nodes",
                "2",
                "--concurrency",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = _json.loads(out.read_text())
    assert result["completed"] == 20 and result["failed"] == 0
    assert set(result["submit_to_assigned_ms"]) >= {"p50", "p99"}
    # the latency budget: every hop measured for the latency-phase jobs
    hops = result["hops_ms"]
    assert list(hops) == ["api", "admission", "decision", "delivery", "observe"]
    for hop, q in hops.items():
        assert q["p50"] == q["p50"] and q["p50"] >= 0, (hop, q)  # not NaN: the hop was seen
    assert result["jobs_per_s"] > 0
    # the CPU each kind of process used, idle and under load
    for phase in ("cpu_idle_pct", "cpu_latency_pct", "cpu_ms_per_job"):
        assert {"broker", "api", "admission", "scheduler", "agents", "total"} <= set(
            result[phase]
        ), phase


def test_bench_pipeline_hosts_several_nodes_per_agent_process(tmp_path, capsys):
    """``--nodes-per-agent``: four nodes in two agent processes run every job."""
    import json as _json

    from framespool.cli import main as cli_main

    out = tmp_path / "pipe.json"
    argv = ["bench", "pipeline", "--jobs", "20", "--rate", "20", "--seconds", "1"]
    argv += ["--nodes", "4", "--nodes-per-agent", "2", "--concurrency", "4", "--json", str(out)]
    assert cli_main(argv) == 0
    result = _json.loads(out.read_text())
    assert (result["nodes"], result["agent_processes"]) == (4, 2)
    assert result["completed"] == 20 and result["failed"] == 0
    assert "4 nodes x 8 GPUs in 2 agent process(es)" in capsys.readouterr().out
