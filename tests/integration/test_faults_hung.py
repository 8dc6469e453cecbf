"""A hung generator is detected by its agent and its run retried.

At time scale 10 the demo profile's hang timeout (30 s) is 3 s of silence.
A generator that hangs at the same step every time (``params.hang_at_step``)
fails its run as ``hung``, is retried once (the class's budget), and the job
ends FAILED naming the class and the budget. A generator that hangs once
(SIGSTOPped from outside) is retried from its last checkpoint and completes.
"""

from __future__ import annotations

import pytest

from framespool.agents import faults
from framespool.chaos.drill import LogTail, chaos_stack
from framespool.producers.client import Client
from framespool.schemas import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PARAMS = {"seconds_per_step": 2, "duration_s": 1, "fps": 4, "resolution": "64x64"}


@pytest.fixture(scope="module")
def stack_config(tmp_path_factory):
    """The drill's stack (no admission rate limit, the drill's leases); tests/conftest.py
    starts it as ``stack``."""
    return chaos_stack(tmp_path_factory.mktemp("hung"), nodes=2).config


def test_generator_that_hangs_every_time_is_retried_then_fails_as_hung(stack):
    c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
    job = c.submit(
        prompt="a frozen river",
        model="demo",
        estimate_s=5,
        params={**PARAMS, "steps": 20, "hang_at_step": 2},
    )["job_id"]
    with LogTail(stack.bootstrap_servers) as tail:
        failed = tail.wait_for(lambda t: t.first(ev.JobFailed, job_id=job), 40, "the job's end")
        runs = tail.of(ev.RunFailed, job_id=job)
        assert [(r.run, r.failure_class) for r in runs] == [(1, "hung"), (2, "hung")]
        assert "no progress for 3s (last step 2)" in runs[0].reason
        requeued = tail.of(ev.JobRequeued, job_id=job)
        assert [(r.run, r.retries_left) for r in requeued] == [(1, 0)]
        assert requeued[0].reason.startswith("retry after hung: no progress")
        assert [a.run for a in tail.of(ev.JobAssigned, job_id=job)] == [1, 2]
        assert failed.run == 2 and failed.failure_class == "hung"
        assert "failed 2 times with hung; retry budget 1" in failed.reason


def test_generator_wedged_once_is_retried_from_its_checkpoint_and_completes(stack):
    c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
    job = c.submit(
        prompt="a stuck elevator",
        model="demo",
        estimate_s=10,
        checkpoint_interval_s=5,
        params={**PARAMS, "steps": 40},
    )["job_id"]
    with LogTail(stack.bootstrap_servers) as tail:
        started = tail.wait_for(lambda t: t.first(ev.RunStarted, job_id=job, run=1), 20, "run 1")
        tail.wait_for(lambda t: t.first(ev.RunCheckpointed, job_id=job, run=1), 20, "a checkpoint")
        agent = next(p for p in stack.processes if p.name == f"agent-{started.node_id}")
        (generator,) = faults.generators(agent.popen.pid)
        assert faults.wedge(generator)
        hung = tail.wait_for(lambda t: t.first(ev.RunFailed, job_id=job, run=1), 15, "hung run")
        assert hung.failure_class == "hung"
        requeued = tail.wait_for(lambda t: t.first(ev.JobRequeued, job_id=job, run=1), 5, "requeue")
        assert requeued.resume_from and requeued.reason.startswith("retry after hung")
        done = tail.wait_for(lambda t: t.first(ev.JobCompleted, job_id=job), 40, "completion")
        assert done.run == 2
        assert tail.first(ev.JobAssigned, job_id=job, run=2).resume_from == requeued.resume_from
