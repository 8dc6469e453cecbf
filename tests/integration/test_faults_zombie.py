"""A stalled agent comes back as a zombie: its reports are ignored, its run stopped.

The agent holding a run is SIGSTOPped past the heartbeat timeout: the node is
declared DOWN and the job moves to the other node. When the agent resumes it
still believes it runs the old attempt; the scheduler ignores (and records) its
heartbeats and its reports about that attempt, and the old generator is gone
within seconds, while run 2 completes elsewhere. Having read its DOWN, the
agent then registers again by itself under a new incarnation.
"""

from __future__ import annotations

import time

import pytest

from framespool.agents import faults
from framespool.chaos.drill import LogTail, chaos_stack
from framespool.chaos.plan import Timing
from framespool.producers.client import Client
from framespool.schemas import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TIMING = Timing(heartbeat_timeout_s=3.0)


def test_resumed_zombie_agent_reports_are_ignored_and_its_run_stopped(tmp_path):
    with (
        chaos_stack(tmp_path, nodes=2, timing=TIMING) as stack,
        LogTail(stack.bootstrap_servers) as tail,
    ):
        c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
        job = c.submit(
            prompt="a zombie parade",
            model="demo",
            estimate_s=14,
            checkpoint_interval_s=5,
            params={
                "steps": 60,
                "seconds_per_step": 2,
                "duration_s": 1,
                "fps": 4,
                "resolution": "64x64",
                "seed": 4,
            },
        )["job_id"]
        first = tail.wait_for(lambda t: t.first(ev.RunStarted, job_id=job, run=1), 20, "run 1")
        node, incarnation = first.node_id, first.incarnation
        tail.wait_for(lambda t: t.first(ev.RunCheckpointed, job_id=job, run=1), 20, "a checkpoint")
        agent = next(p for p in stack.processes if p.name == f"agent-{node}")
        faults.pause(agent.popen.pid)
        try:
            requeued = tail.wait_for(
                lambda t: t.first(ev.JobRequeued, job_id=job, run=1), 20, "the requeue of run 1"
            )
            assert f"node {node} down" in requeued.reason and requeued.resume_from
            # the generator of the old attempt is still alive while its agent is stopped
            assert [(g.job_id, g.run) for g in faults.generators(agent.popen.pid)] == [(job, 1)]
            second = tail.wait_for(
                lambda t: t.first(ev.JobAssigned, job_id=job, run=2), 10, "run 2"
            )
            assert [s.node_id for s in second.placement] != [node]
        finally:
            faults.resume(agent.popen.pid)

        def zombie_ignored(t: LogTail) -> bool:
            ignored = t.of(ev.ReportIgnored)
            heartbeat = any(i.subject == node and "node is DOWN" in i.reason for i in ignored)
            stale_run = any(
                i.subject == f"{job}#1" and i.source_event_id.startswith(f"{node}:{job}:1:")
                for i in ignored
            )
            return heartbeat and stale_run

        tail.wait_for(zombie_ignored, 15, "the zombie's heartbeat and run-1 report ignored")
        deadline = time.monotonic() + 10
        while faults.generators(agent.popen.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert faults.generators(agent.popen.pid) == [], "the zombie's run was not stopped"
        done = tail.wait_for(lambda t: t.first(ev.JobCompleted, job_id=job), 40, "completion")
        assert done.run == 2
        # nothing the zombie said about run 1 reached job-events as a decision
        assert not tail.of(ev.JobFailed, job_id=job)
        assert [e.run for e in tail.of(ev.JobRequeued, job_id=job)] == [1]
        # the old incarnation ended DOWN; the resumed agent then healed itself: the
        # node is UP again under a higher incarnation (its old run stayed fenced)
        states = [e for e in tail.of(ev.NodeStateChanged, node_id=node) if e.gpu < 0]
        old = [e for e in states if e.incarnation == incarnation]
        assert old[-1].state == "DOWN"
        assert states[-1].state == "UP" and states[-1].incarnation > incarnation
