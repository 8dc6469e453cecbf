"""One agent process hosting four simulated nodes over two cells (``nodes_per_agent``):
each node registers on its own, in its own cell, and jobs run on every one of them."""

from __future__ import annotations

import json

import pytest

from framespool.broker import free_port
from framespool.chaos.drill import LogTail
from framespool.producers.client import Client
from framespool.schemas import events as ev
from framespool.stack import Stack, StackConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODES = [f"node-{i}" for i in range(4)]


def test_one_process_hosts_four_nodes_and_jobs_run_on_all(tmp_path):
    config = tmp_path / "processors.json"
    config.write_text(json.dumps({"admission": {"rate": {"rate_per_s": 0}}}))
    stack = Stack(
        StackConfig(
            data_dir=tmp_path / "stack",
            port=free_port(),
            nodes=4,
            cells=2,
            schedulers=1,
            nodes_per_agent=4,
            time_scale=10.0,
            processor_config=config,
        )
    )
    with stack, LogTail(stack.bootstrap_servers) as tail:
        agents = [p for p in stack.processes if p.name.startswith("agent-")]
        assert [p.name for p in agents] == ["agent-0"]
        info = json.loads((stack.data_dir / "stack.json").read_text())
        assert "agent-0" in info["pids"] and info["cells"] == {
            "cell-0": ["node-0", "node-2"],
            "cell-1": ["node-1", "node-3"],
        }
        regs = tail.wait_for(
            lambda t: (
                len({r.node_id for r in t.of(ev.NodeRegistered)}) == 4 and t.of(ev.NodeRegistered)
            ),
            20,
            "four registrations",
        )
        assert {r.node_id: r.cell for r in regs} == {
            "node-0": "cell-0",
            "node-1": "cell-1",
            "node-2": "cell-0",
            "node-3": "cell-1",
        }
        c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
        # whole-node jobs, submitted together: each node gets some
        params = {"steps": 10, "seconds_per_step": 1, "duration_s": 1, "resolution": "64x64"}
        jobs = [
            c.submit(prompt=f"job {i}", model="demo", gpus=8, estimate_s=2, params=params)["job_id"]
            for i in range(12)
        ]
        done = tail.wait_for(
            lambda t: len(t.of(ev.JobCompleted)) >= len(jobs) and t.of(ev.JobCompleted),
            120,
            "every job completed",
        )
        assert {d.job_id for d in done} == set(jobs)
        ran_on = {
            s.node_id: s.incarnation
            for d in done
            for s in tail.of(ev.RunStarted, job_id=d.job_id, run=d.run)
        }
        assert sorted(ran_on) == NODES
        # each node's runs report the incarnation that node registered
        assert ran_on == {r.node_id: r.incarnation for r in regs}
        assert not tail.of(ev.JobFailed)
