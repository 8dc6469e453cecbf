"""The stack keeps its promise across restarts: durability proved by doing it.

One data dir, one stack at a time, three lives on Apache Kafka:

1. the first stack runs jobs (some complete, some are mid-run with checkpoints),
   a tenant rotates its webhook secret; then it is stopped (SIGTERM, in order);
2. a second stack on the same data dir: every key still valid, every job known
   with its state, completed results downloadable, the operator key and the
   rotated secret still in force, the interrupted jobs completed; new long jobs
   are started, then every process of the stack, the broker included, is
   SIGKILLed at once;
3. a third stack: again everything known and finished; then the broker alone is
   SIGKILLed while jobs are submitted, the supervisor restarts it, and every
   acknowledged job completes. ``framespool verify`` and ``replay`` then check
   the whole log: one terminal event per job, no GPU double-booked, every
   allocation released, every emitted decision reproduced by the core.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path

import pytest

from framespool import cli, stack_secrets
from framespool.broker import free_port
from framespool.producers.client import ApiError, Client
from framespool.stack import Stack, StackConfig
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# the API or the broker may be restarting while a test waits
wait_for = partial(wait_until, every_s=0.5, tolerate=(ApiError, OSError))

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}
# 240 steps of 1.5 s at time scale 20: 18 s per run, a checkpoint every 20 steps (1.5 s)
LONG = {"steps": 240, "seconds_per_step": 1.5, "checkpoint_every": 20}
SHORT = {"duration_s": 1, "fps": 4, "resolution": "128x72", "seed": 7}


def config(data_dir: Path, port: int) -> StackConfig:
    return StackConfig(
        data_dir=data_dir, port=port, nodes=2, cells=1, schedulers=1, time_scale=20.0
    )


def client(stack: Stack, tenant: int) -> Client:
    return Client(stack.api_url, stack.tenant_keys[tenant]["api_key"], timeout_s=60)


def submit(c: Client, params: dict) -> str:
    return c.submit(prompt="a fox that survives restarts", model="demo", gpus=8, params=params)[
        "job_id"
    ]


def states(c: Client, job_ids: list[str]) -> dict[str, str]:
    return {job_id: c.status(job_id)["state"] for job_id in job_ids}


def all_terminal(c: Client, job_ids: list[str]):
    now = states(c, job_ids)
    return now if all(s in TERMINAL for s in now.values()) else None


def download(c: Client, job_id: str) -> bytes:
    with urllib.request.urlopen(c.result(job_id)["url"], timeout=10) as resp:
        return resp.read()


def has_checkpoint(c: Client, job_id: str) -> bool:
    """Running past its second checkpoint (one every 20 of 240 steps)."""
    job = c.status(job_id)
    return job["state"] == "RUNNING" and job.get("progress", 0) >= 0.2


def metrics_status(stack: Stack, key: str) -> int:
    req = urllib.request.Request(
        f"{stack.api_url}/metrics", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def kill_everything(stack: Stack) -> None:
    """SIGKILL every process of the stack at once (the launcher's own state is dropped
    as a crash would drop it: no stop, no cleanup, stack.json left behind)."""
    for process in stack.processes:
        try:
            os.killpg(process.popen.pid, signal.SIGKILL)  # the process and its generators
        except ProcessLookupError:
            pass
    for process in stack.processes:
        process.popen.wait(10)
        process.log.close()
    stack.processes.clear()
    assert stack.lock_file is not None
    stack.lock_file.close()  # the kernel drops a dead launcher's lock the same way
    stack.lock_file = None


def test_nothing_acknowledged_is_lost_across_stop_sigkill_and_broker_death(tmp_path):
    data_dir = tmp_path / "data"
    port = free_port()

    # 1. First life: two jobs complete, four are interrupted mid-run.
    first = Stack(config(data_dir, port))
    first.start()
    try:
        keys = [t["api_key"] for t in first.tenant_keys]
        c0, c1 = client(first, 0), client(first, 1)
        done = [submit(c0, SHORT), submit(c1, SHORT)]
        wait_for(lambda: all_terminal(c0, done[:1]) and all_terminal(c1, done[1:]), 120, "shorts")
        interrupted = [submit(c0, LONG), submit(c1, LONG), submit(c0, LONG), submit(c1, LONG)]
        wait_for(lambda: has_checkpoint(c0, interrupted[0]), 120, "a checkpoint of a running job")
        rotated = c1.rotate_webhook_secret()["webhook_secret"]
        operator_key = json.loads((data_dir / stack_secrets.SECRETS_FILE).read_text())[
            "operator_key"
        ]
    finally:
        first.stop()

    # 2. Second life on the same data dir: everything is still there.
    second = Stack(config(data_dir, port))
    second.start()
    try:
        assert [t["api_key"] for t in second.tenant_keys] == keys
        c0, c1 = client(second, 0), client(second, 1)
        assert states(c0, done[:1]) == {done[0]: "COMPLETED"}
        assert states(c1, done[1:]) == {done[1]: "COMPLETED"}
        assert download(c0, done[0])[:3] == b"GIF"
        assert metrics_status(second, operator_key) == 200
        secrets = json.loads((data_dir / stack_secrets.SECRETS_FILE).read_text())
        assert secrets["auth"]["tenants"]["studio"]["webhook_secret"] == rotated
        mine = {0: [j for j in interrupted[::2]], 1: [j for j in interrupted[1::2]]}
        known = {**states(c0, mine[0]), **states(c1, mine[1])}
        assert set(known) == set(interrupted), known  # every job known after the stop
        wait_for(lambda: all_terminal(c0, mine[0]) and all_terminal(c1, mine[1]), 300, "resumed")
        assert set(states(c0, mine[0]).values()) | set(states(c1, mine[1]).values()) == {
            "COMPLETED"
        }
        resumed = c0.status(mine[0][0])
        assert download(c0, mine[0][0])[:3] == b"GIF", resumed
        crashed = [submit(c0, LONG), submit(c1, LONG)]
        wait_for(lambda: has_checkpoint(c0, crashed[0]), 120, "a checkpoint before the crash")
        kill_everything(second)
    finally:
        second.stop()

    # 3. Third life after SIGKILL of everything; then the broker alone dies.
    third = Stack(config(data_dir, port))
    stop = threading.Event()
    third.start()
    try:
        c0, c1 = client(third, 0), client(third, 1)
        assert states(c0, done[:1]) == {done[0]: "COMPLETED"}
        assert set(states(c0, crashed[:1])) == {crashed[0]}
        assert set(states(c1, crashed[1:])) == {crashed[1]}
        broker = next(p for p in third.processes if p.name == "broker")
        supervised: list[str] = []

        def supervise() -> None:  # what `framespool up` does twice a second
            while not stop.wait(0.5):
                supervised.extend(third.supervise())

        supervisor = threading.Thread(target=supervise, daemon=True)
        supervisor.start()
        os.kill(broker.popen.pid, signal.SIGKILL)
        during = []
        for c in (c0, c1):  # acknowledged while the broker is dead or restarting
            during.append(wait_for(lambda c=c: submit(c, SHORT), 180, "a submit during the outage"))
        wait_for(lambda: any("broker restarted" in line for line in supervised), 60, "restart")
        wait_for(lambda: all_terminal(c0, [crashed[0], during[0]]), 300, "jobs after the crash")
        wait_for(lambda: all_terminal(c1, [crashed[1], during[1]]), 300, "jobs after the crash")
        assert set(states(c0, [crashed[0], during[0]]).values()) == {"COMPLETED"}
        assert set(states(c1, [crashed[1], during[1]]).values()) == {"COMPLETED"}
        for verb in ("verify", "replay"):
            status = cli.main([verb, "--data-dir", str(data_dir), "--json"])
            assert status == 0, f"framespool {verb} failed on the log of three lives"
    finally:
        stop.set()
        third.stop()
