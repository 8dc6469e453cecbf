"""``framespool up`` heals itself: a SIGKILLed process is restarted while the rest keep
serving, and the default shape is several cells and scheduler instances."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from framespool.broker import free_port
from framespool.producers.client import ApiError, Client
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def cell_of(client: Client, job_id: str) -> str | None:
    try:
        return client.status(job_id).get("cell")
    except ApiError:  # not projected yet
        return None


def test_killed_scheduler_is_restarted_while_the_api_keeps_serving(tmp_path):
    port = free_port()
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "framespool.cli",
            "up",
            "--data-dir",
            str(tmp_path),
            "--port",
            str(port),
            "--nodes",
            "2",
            "--time-scale",
            "20",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "up.err", "w"),
    )
    stack_json = tmp_path / "stack.json"
    try:
        wait_until(stack_json.exists, 120, "stack.json written")
        info = json.loads(stack_json.read_text())
        # the default shape: two cells with a node each, two scheduler instances
        assert info["cells"] == {"cell-0": ["node-0"], "cell-1": ["node-1"]}
        assert {"admission", "scheduler-0", "scheduler-1", "clock", "api"} <= set(info["pids"])
        old = info["pids"]["scheduler-0"]
        os.kill(old, signal.SIGKILL)
        # the API answers while the scheduler is down and after
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200
        new = wait_until(
            lambda: (p := json.loads(stack_json.read_text())["pids"]["scheduler-0"]) != old and p,
            60,
            "scheduler-0 restarted with a new pid in stack.json",
        )
        os.kill(new, 0)  # alive
        assert launcher.poll() is None, "framespool up must not stop when one process dies"
        assert "scheduler-0 exited" in (tmp_path / "up.err").read_text()
        # work still flows through both cells
        client = Client(info["api_url"], info["tenants"][0]["api_key"], timeout_s=30)
        params = {"duration_s": 1, "fps": 4, "resolution": "128x72"}
        ids: list[str] = []
        cells: set[str] = set()
        while len(cells) < 2 and len(ids) < 50:  # rendezvous routing: submit until both got one
            job_id = client.submit(prompt=f"fox {len(ids)}", model="demo", gpus=1, params=params)[
                "job_id"
            ]
            ids.append(job_id)
            cells.add(wait_until(lambda j=job_id: cell_of(client, j), 30, "routed"))
        assert cells == {"cell-0", "cell-1"}
        wait_until(
            lambda: all(client.status(j)["state"] == "COMPLETED" for j in ids),
            120,
            "every job completed after the restart",
        )
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(60)
        except subprocess.TimeoutExpired:
            launcher.kill()
