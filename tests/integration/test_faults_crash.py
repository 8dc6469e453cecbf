"""A generator that crashes every time: the job ends FAILED after its retry budget.

``params.fail_at_step`` makes the demo generator exit 3 at that step on every
run. ``generator_error`` has a budget of 2 retries, so runs 1-3 fail, the
first two are requeued, and the third ends the job with a JobFailed that
names the class, the count, the budget and the generator's own last words.
"""

from __future__ import annotations

import pytest

from framespool.chaos.drill import LogTail, chaos_stack
from framespool.producers.client import Client
from framespool.schemas import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_generator_that_crashes_every_time_ends_failed_with_class_and_budget(tmp_path):
    with chaos_stack(tmp_path, nodes=2) as stack, LogTail(stack.bootstrap_servers) as tail:
        c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
        job = c.submit(
            prompt="a glass about to fall",
            model="demo",
            model_version="crashy",
            estimate_s=5,
            params={
                "steps": 20,
                "seconds_per_step": 1,
                "duration_s": 1,
                "fps": 4,
                "resolution": "64x64",
                "fail_at_step": 2,
            },
        )["job_id"]
        failed = tail.wait_for(lambda t: t.first(ev.JobFailed, job_id=job), 40, "the job's end")
        assert failed.failure_class == "generator_error" and failed.run == 3
        assert "failed 3 times with generator_error; retry budget 2" in failed.reason
        assert "injected failure at step 2" in failed.reason
        assert [r.failure_class for r in tail.of(ev.RunFailed, job_id=job)] == [
            "generator_error"
        ] * 3
        assert all(r.exit_code == 3 for r in tail.of(ev.RunFailed, job_id=job))
        assert [(r.run, r.retries_left) for r in tail.of(ev.JobRequeued, job_id=job)] == [
            (1, 1),
            (2, 0),
        ]
        assert not tail.of(ev.JobCompleted, job_id=job)
