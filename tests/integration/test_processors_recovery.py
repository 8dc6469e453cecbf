"""Crash the scheduler processor at input position k, restart it, compare with an
uninterrupted run (bytewax style): after dedupe by event id the outputs are
exactly those of folding the same input log through a fresh Cell, and nothing
is lost."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from framespool.log import read_all
from framespool.processors.core import CellConfig
from framespool.processors.snapshots import SnapshotStore
from tests.support.processors import (
    REPO,
    InProcess,
    actual_outputs,
    cell_workload,
    configured_at_start,
    expected_outputs,
    in_process,
    produce,
    subprocess_processor,
)

pytestmark = pytest.mark.integration

CONFIG = CellConfig()
MAX_BATCH = 4


class CrashingStore(SnapshotStore):
    """Dies between steps 2 and 3: outputs delivered, snapshot not written, nothing committed."""

    def __init__(self, path: Path, namespace: str, crash_at: int) -> None:
        super().__init__(path, namespace)
        self.crash_at = crash_at

    def save_pickled(self, snapshots) -> None:
        if any(offset >= self.crash_at for _, offset in snapshots.values()):
            raise OSError(f"simulated crash at input offset {self.crash_at}")
        super().save_pickled(snapshots)


def wait_complete(bootstrap: str, topics, expected: dict, timeout: float = 20.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        actual = actual_outputs(bootstrap, topics)
        missing = set(expected) - {(topic, event_id) for topic, event_id, _, _ in actual}
        if not missing:
            return actual
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{len(missing)} expected outputs never arrived, e.g. {sorted(missing)[:5]}"
            )
        time.sleep(0.1)


def check_against_uninterrupted(bootstrap: str, topics, max_duplicated_inputs: int) -> Counter:
    """Outputs == an uninterrupted fold's, byte for byte; returns duplicates per input position."""
    inputs = read_all(bootstrap, topics.SCHEDULER.name, [0])
    expected = expected_outputs(inputs, CONFIG, topics)
    actual = wait_complete(bootstrap, topics, expected)
    seen: Counter = Counter()
    for topic, event_id, partition, value in actual:
        assert (topic, event_id) in expected, f"unexpected output {event_id} on {topic}"
        assert (partition, value) == expected[(topic, event_id)], f"{event_id} differs"
        seen[(topic, event_id)] += 1
    assert set(seen) == set(expected)  # nothing lost, nothing extra
    duplicated_inputs = Counter(
        event_id.split("/")[0] for (_, event_id), n in seen.items() if n > 1
    )
    assert len(duplicated_inputs) <= max_duplicated_inputs, duplicated_inputs
    return duplicated_inputs


@pytest.mark.parametrize("same_data_dir", [True, False], ids=["restart", "fresh-instance"])
def test_crash_between_delivery_and_snapshot_then_restart(
    kafka_bootstrap, fresh_topics, tmp_path, same_data_dir
):
    t = fresh_topics
    inputs = cell_workload(CONFIG)
    k = len(inputs) // 2
    produce(kafka_bootstrap, t.SCHEDULER.name, 0, "cell-0", inputs)
    store = CrashingStore(tmp_path / "first", t.SCHEDULER.name, crash_at=k)
    crashed = InProcess(
        "scheduler", kafka_bootstrap, t, tmp_path, max_batch=MAX_BATCH, store=store
    ).start()
    crashed.wait_dead(20)
    store.close()
    assert "simulated crash" in repr(crashed.error)
    before = actual_outputs(kafka_bootstrap, t)
    assert before, "the crashed run should have delivered the outputs before k"
    # restart: the same store (snapshot just before k), or an empty one (another
    # instance: replays from 0, quietly up to the committed offset)
    data_dir = tmp_path / ("first" if same_data_dir else "second")
    store = SnapshotStore(data_dir, t.SCHEDULER.name)
    with in_process("scheduler", kafka_bootstrap, t, tmp_path, max_batch=MAX_BATCH, store=store):
        duplicated = check_against_uninterrupted(kafka_bootstrap, t, MAX_BATCH)
    # the batch that crashed was re-sent with the same ids, and only it
    assert duplicated, "the crashed batch's outputs should have been re-sent"
    offsets = sorted(int(pos.split("@")[1]) for pos in duplicated)
    assert offsets[-1] >= k - MAX_BATCH and offsets[0] <= k


def test_sigkill_mid_stream_then_restart(kafka_bootstrap, fresh_topics, tmp_path):
    t = fresh_topics
    inputs = cell_workload(CONFIG)
    half = len(inputs) // 2
    produce(kafka_bootstrap, t.SCHEDULER.name, 0, "cell-0", inputs[:half])
    args = ("scheduler", kafka_bootstrap, t.suffix, tmp_path / "data", "--max-batch", "2")
    with subprocess_processor(*args, log_dir=tmp_path) as first:
        deadline = time.monotonic() + 20
        while len(actual_outputs(kafka_bootstrap, t)) < 12:  # somewhere mid-stream
            assert first.proc.poll() is None, first.log_text()[-3000:]
            assert time.monotonic() < deadline, first.log_text()[-3000:]
            time.sleep(0.05)
        first.kill()
    produce(kafka_bootstrap, t.SCHEDULER.name, 0, "cell-0", inputs[half:])
    with subprocess_processor(*args, log_dir=tmp_path) as second:
        check_against_uninterrupted(kafka_bootstrap, t, max_duplicated_inputs=2)
        # each start recorded the configuration it folds with, outside the fold
        configured = configured_at_start(kafka_bootstrap, t)
        assert [c.processor for c in configured] == ["scheduler", "scheduler"]
        assert len({c.sha256 for c in configured}) == 1
        assert second.terminate() == 0, second.log_text()[-3000:]
        lines = [
            json.loads(line) for line in second.log_text().splitlines() if line.startswith("{")
        ]
    assert any("stopped (clean)" in line["msg"] for line in lines)
    assigned = [line for line in lines if line.get("event_type") == "JobAssigned"]
    assert all(line["job_id"] and line["node_id"] for line in assigned)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "framespool.processors", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bad_config_exits_2_with_the_field_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[scheduler]\nheartbeat_timeout_s = "soon"\n')
    result = run_cli("scheduler", "--data-dir", str(tmp_path / "d"), "--config", str(bad))
    assert result.returncode == 2
    assert "scheduler.heartbeat_timeout_s: expected a number, got 'soon'" in result.stderr
    result = run_cli("admission", "--data-dir", str(tmp_path / "d"), "--config", str(bad))
    assert result.returncode == 2  # admission reads the scheduler's tiers from the same file


def test_missing_topics_exit_2(kafka_bootstrap, tmp_path):
    result = run_cli(
        "admission",
        "--bootstrap",
        kafka_bootstrap,
        "--data-dir",
        str(tmp_path),
        "--topic-suffix",
        "does-not-exist",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "framespool.commands.does-not-exist" in result.stderr
