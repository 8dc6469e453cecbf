"""``framespool bench fetch`` on the embedded broker: idle readers cost it CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from framespool.cli import main


def test_bench_fetch_reports_the_broker_cpu_per_case(tmp_path: Path, capsys) -> None:
    out = tmp_path / "fetch.json"
    argv = ["bench", "fetch", "--waits", "3", "--partitions", "1,2"]
    assert main([*argv, "--seconds", "1.5", "--settle", "0.5", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    cases = result["cases"]
    assert [(c["wait_ms"], c["partitions"], c["consumers"]) for c in cases] == [
        (3, 1, 1),
        (3, 2, 1),
    ]
    # a reader Fetching every 3 ms keeps the broker busier than no reader at all
    assert all(c["broker_cpu_pct"] > result["broker_idle_cpu_pct"] for c in cases)
    assert "partition(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--waits", "three"], "--waits"),
        (["--partitions", "9"], "--partitions"),
        (["--consumers", "0"], "--consumers"),
    ],
)
def test_bench_fetch_refuses_bad_flags_before_starting_a_broker(flags, named, capsys) -> None:
    assert main(["bench", "fetch", *flags]) != 0
    assert named in capsys.readouterr().err
