"""A node crash mid-run: the run resumes from its last checkpoint on another node.

Two agents; a checkpointing job runs on one of them; that agent and its
generator are SIGKILLed (``framespool.agents.faults.crash_node``). The scheduler declares
the node DOWN after its heartbeat timeout, requeues the job with the last
checkpoint, and places run 2 on the other node resuming from it.
"""

from __future__ import annotations

import pytest

from framespool.agents import faults
from framespool.chaos.drill import LogTail, chaos_stack
from framespool.chaos.plan import Timing
from framespool.producers.client import Client
from framespool.schemas import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TIMING = Timing(heartbeat_timeout_s=3.0)


def test_killed_agent_run_resumes_from_its_checkpoint_on_another_node(tmp_path):
    with (
        chaos_stack(tmp_path, nodes=2, timing=TIMING) as stack,
        LogTail(stack.bootstrap_servers) as tail,
    ):
        c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
        # 60 steps of 0.2 s (time scale 10): 12 s; a checkpoint every 0.5 s
        job = c.submit(
            prompt="a lighthouse in a storm",
            model="demo",
            estimate_s=14,
            checkpoint_interval_s=5,
            params={
                "steps": 60,
                "seconds_per_step": 2,
                "duration_s": 1,
                "fps": 4,
                "resolution": "64x64",
                "seed": 3,
            },
        )["job_id"]
        first = tail.wait_for(lambda t: t.first(ev.JobAssigned, job_id=job, run=1), 20, "run 1")
        node = first.placement[0].node_id
        tail.wait_for(
            lambda t: len(t.of(ev.RunCheckpointed, job_id=job, run=1)) >= 2,
            20,
            "two checkpoints of run 1",
        )
        agent = next(p for p in stack.processes if p.name == f"agent-{node}")
        killed = faults.crash_node(agent.popen.pid)
        assert [(g.job_id, g.run) for g in killed] == [(job, 1)]

        requeued = tail.wait_for(
            lambda t: t.first(ev.JobRequeued, job_id=job, run=1), 20, "the requeue of run 1"
        )
        assert "node_lost" in requeued.reason and node in requeued.reason, requeued
        last_checkpoint = [
            e.checkpoint_uri
            for e in tail.of(ev.RunCheckpointed, job_id=job, run=1)
            if e.node_id == node
        ][-1]
        assert requeued.resume_from == last_checkpoint
        second = tail.wait_for(lambda t: t.first(ev.JobAssigned, job_id=job, run=2), 10, "run 2")
        assert [s.node_id for s in second.placement] != [node]
        assert second.resume_from == requeued.resume_from
        done = tail.wait_for(lambda t: t.first(ev.JobCompleted, job_id=job), 40, "completion")
        assert done.run == 2
        # run 2 started where the checkpoint left off, not at step 0
        steps = [p.step for p in tail.of(ev.RunProgress, job_id=job, run=2)]
        assert steps and min(steps) > 0, steps
        assert not tail.of(ev.JobFailed, job_id=job)
