"""No process of an embedded stack outlives its launcher, even one killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from framespool.broker import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone
        return f.read().split()[2] != "Z"


def test_sigkilled_launcher_takes_its_stack_down(tmp_path):
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "framespool.cli",
            "up",
            "--data-dir",
            str(tmp_path),
            "--port",
            str(free_port()),
            "--nodes",
            "1",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "stack.json").exists():
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        pids = list(json.loads((tmp_path / "stack.json").read_text())["pids"].values())
        assert pids and all(alive(p) for p in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if alive(p)]
    finally:
        if launcher.poll() is None:
            launcher.kill()
