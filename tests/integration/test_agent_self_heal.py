"""A node declared DOWN heals itself: no operator, no supervisor restart.

One agent process; a checkpointing job runs on it; the agent is SIGSTOPped past
its heartbeat lease, so the scheduler declares the node DOWN and requeues the
run; on SIGCONT the agent reads that declaration, stops the old incarnation's
run, registers as incarnation + 1 and takes work again: the requeued job's
next run and a new job both run and complete on it. The old run stays fenced:
nothing it reports after the DOWN changes the job.
"""

from __future__ import annotations

import pytest

from framespool.agents import faults
from framespool.chaos.drill import LogTail, chaos_stack
from framespool.chaos.plan import Timing
from framespool.producers.client import Client
from framespool.schemas import events as ev
from framespool.schemas.states import NodeState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TIMING = Timing(heartbeat_timeout_s=3.0)
NODE = "node-0"
PARAMS = {"steps": 40, "seconds_per_step": 2, "duration_s": 1, "resolution": "64x64", "seed": 1}


def test_a_node_declared_down_reregisters_by_itself_and_runs_new_work(tmp_path):
    with (
        chaos_stack(tmp_path, nodes=1, timing=TIMING) as stack,
        LogTail(stack.bootstrap_servers) as tail,
    ):
        c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
        up = tail.wait_for(
            lambda t: t.first(ev.NodeStateChanged, node_id=NODE, state=NodeState.UP, gpu=-1),
            20,
            "the node UP",
        )
        agent = next(p for p in stack.processes if p.name == f"agent-{NODE}")
        pid = agent.popen.pid
        job = c.submit(
            prompt="a long one", model="demo", estimate_s=10, checkpoint_interval_s=3, params=PARAMS
        )["job_id"]
        tail.wait_for(lambda t: t.first(ev.RunStarted, job_id=job, run=1), 30, "run 1 started")

        faults.pause(pid)
        try:
            down = tail.wait_for(
                lambda t: t.first(ev.NodeStateChanged, node_id=NODE, state=NodeState.DOWN, gpu=-1),
                30,
                "the node declared DOWN",
            )
            assert down.incarnation == up.incarnation
            tail.wait_for(lambda t: t.first(ev.JobRequeued, job_id=job, run=1), 10, "requeue")
        finally:
            faults.resume(pid)

        healed = tail.wait_for(
            lambda t: next(
                (
                    e
                    for e in t.of(ev.NodeStateChanged, node_id=NODE, state=NodeState.UP, gpu=-1)
                    if e.incarnation > up.incarnation
                ),
                None,
            ),
            30,
            "the node UP again with a new incarnation",
        )
        assert healed.incarnation == up.incarnation + 1
        # the requeued job and a new one run on the healed node, under its new incarnation
        fresh = c.submit(prompt="after healing", model="demo", params={"steps": 2})["job_id"]
        for j in (job, fresh):
            done = tail.wait_for(lambda t, j=j: t.first(ev.JobCompleted, job_id=j), 60, j)
            started = tail.first(ev.RunStarted, job_id=j, run=done.run)
            assert started.node_id == NODE and started.incarnation == healed.incarnation
        assert tail.first(ev.JobCompleted, job_id=job).run == 2
        # run 1 ended under its own (old) incarnation: its end report is fenced, not applied
        assert all(
            e.incarnation == up.incarnation
            for cls in (ev.RunStopped, ev.RunCompleted, ev.RunFailed)
            for e in tail.of(cls, job_id=job, run=1)
        )
        assert len(tail.of(ev.JobCompleted, job_id=job)) == 1
        # healed by itself: the same process, never restarted
        assert agent.popen.pid == pid and agent.alive() and agent.restarts == 0
        registered = tail.of(ev.NodeRegistered, node_id=NODE)
        assert sorted({r.incarnation for r in registered}) == [
            up.incarnation,
            healed.incarnation,
        ]
