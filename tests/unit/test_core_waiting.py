"""Why a job waits, told to its tenant (issue #32): the cell's reason in words and as
a code, and the job's position in the cell's order, on its JobQueued and on the
refreshes (``processors/core/waiting.py``). Before this, every queued job was
told "admitted: fair-share queue", position 0 on refreshes, and nothing at all
when a quota held it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from framespool.processors.core import CellConfig
from framespool.processors.core.config import TenantConfig
from framespool.schemas import events as ev
from framespool.schemas.waits import WaitCode
from tests.support.core_harness import Harness


def cfg(**kw: Any) -> CellConfig:
    base = dict(
        status_interval_s=0, estimate_interval_s=0, heartbeat_timeout_s=1e9, report_lease_s=1e9
    )
    return CellConfig(**(base | kw))


def queued(out: Iterable[Any], job_id: str) -> ev.JobQueued:
    return next(o for o in out if isinstance(o, ev.JobQueued) and o.job_id == job_id)


def test_a_job_behind_busy_gpus_is_told_its_position_and_that_it_waits_for_gpus():
    h = Harness(nodes=1, config=cfg())
    h.submit("running", tenant="other", gpus=8, estimate_s=600)
    h.start_all()
    first = queued(h.submit("next", tenant="acme", gpus=8, estimate_s=60), "next")
    assert first.position == 1 and first.reason_code == WaitCode.GPUS
    assert first.reason == "next in line: waiting for 8 GPU(s) to free (0 free now)"
    assert first.wait_p50_s > 0
    behind = queued(h.submit("behind", tenant="acme", gpus=4, estimate_s=60), "behind")
    assert behind.position == 2 and behind.reason_code == WaitCode.FAIR_SHARE
    assert behind.reason.startswith("behind 1 job(s) of higher fair order; then it needs 4 GPU")


def test_other_tenants_jobs_ahead_count_in_the_position_by_their_gpu_time():
    h = Harness(nodes=1, config=cfg(tenants=(TenantConfig("heavy", weight=100.0),)))
    h.submit("running", tenant="light", gpus=8, estimate_s=600)
    h.start_all()
    for i in range(3):
        h.submit(f"heavy{i}", tenant="heavy", gpus=8, estimate_s=60)
    # the heavy tenant's three jobs come first in fair order: light's is fourth
    told = queued(h.submit("light0", tenant="light", gpus=8, estimate_s=60), "light0")
    assert told.position == 4 and told.reason_code == WaitCode.FAIR_SHARE
    assert told.reason.startswith("behind 3 job(s) of higher fair order")
    assert "heavy" not in told.reason


def test_a_job_held_by_its_quota_says_so_though_gpus_are_free():
    h = Harness(nodes=2, config=cfg(tenants=(TenantConfig("capped", max_gpus=8),)))
    h.submit("mine", tenant="capped", gpus=8, estimate_s=600)
    h.start_all()
    told = queued(h.submit("more", tenant="capped", gpus=4, estimate_s=60), "more")
    assert told.reason_code == WaitCode.QUOTA
    assert told.reason == (
        "held by quota: organisation capped holds 8 of its 8 GPUs (max_gpus) and this job needs 4"
    )
    free = queued(h.submit("free", tenant="uncapped", gpus=4, estimate_s=60), "free")
    assert free.reason_code != WaitCode.QUOTA  # and it started: the GPUs were free
    assert "free" not in h.cell.jobs or h.cell.jobs["free"].state != "QUEUED"


def test_caps_on_runs_and_on_users_say_which():
    h = Harness(nodes=2, config=cfg(tenants=(TenantConfig("org", max_running=1),)))
    h.submit("one", tenant="org", gpus=1)
    told = queued(h.submit("two", tenant="org", gpus=1), "two")
    assert told.reason_code == WaitCode.CONCURRENCY_CAP
    assert "runs 1 job(s), its cap (max_running 1)" in told.reason
    h = Harness(nodes=2, config=cfg(tenants=(TenantConfig("org", user_max_gpus=2),)))
    h.submit("one", tenant="org", gpus=2, user="ann")
    told = queued(h.submit("two", tenant="org", gpus=1, user="ann"), "two")
    assert told.reason_code == WaitCode.QUOTA and "user ann holds 2 of its 2 GPUs" in told.reason
    other_user = h.submit("three", tenant="org", gpus=1, user="bob")
    assert not any(isinstance(o, ev.JobQueued) and o.reason_code for o in other_user)


def test_a_job_that_fits_the_free_gpus_but_may_not_delay_a_gang_is_told_so():
    h = Harness(nodes=2, config=cfg())
    h.submit("wide", tenant="a", gpus=8, estimate_s=600)
    h.submit("half", tenant="a", gpus=4, estimate_s=600)
    h.start_all()
    h.submit("gang", tenant="b", gpus=16, per_node=8, estimate_s=60)
    h.tick(1)  # a full pass: the gang reserves both nodes
    assert h.cell.reservation_job == "gang"
    told = queued(h.submit("long", tenant="c", gpus=4, estimate_s=3600), "long")
    assert told.reason_code == WaitCode.RESERVATION
    assert "reserved for a larger job ahead of it" in told.reason
    holder = [o for o in h.log if isinstance(o, ev.JobWaitEstimated) and o.job_id == "gang"]
    assert holder and holder[-1].reason_code == WaitCode.RESERVATION_HOLDER
    assert holder[-1].reason.startswith("reservation: holds 2 node(s)")


def test_a_breaker_open_for_its_model_is_the_reason():
    h = Harness(nodes=1, config=cfg())
    h.cell.breakers[("demo@1", "gpu_type", "H100")] = h.now_ms + 60_000
    told = queued(h.submit("j", tenant="a", gpus=1), "j")
    job = h.cell.jobs["j"]
    assert job.state == "QUEUED" and told.reason_code == WaitCode.BREAKER
    assert "breaker open for about 60s more for model demo@1 on H100 GPUs" in told.reason


def test_a_refresh_tells_a_job_that_is_no_longer_held_by_its_quota_why_it_waits_now():
    tenants = (TenantConfig("capped", max_gpus=8), TenantConfig("vip", weight=100.0))
    h = Harness(nodes=2, config=cfg(estimate_interval_s=1, tenants=tenants))
    h.submit("vip-run", tenant="vip", gpus=8, estimate_s=6000)
    h.submit("mine", tenant="capped", gpus=8, estimate_s=6000)
    h.start_all()
    told = queued(h.submit("later", tenant="capped", gpus=8, estimate_s=60), "later")
    assert told.reason_code == WaitCode.QUOTA
    h.submit("vip-next", tenant="vip", gpus=8, estimate_s=6000)
    h.tick(100)  # both run: capped is charged 100 times what vip is, by their weights
    h.complete(("mine", 1))  # the quota frees, and vip's job takes the GPUs first
    h.confirm_stops()
    out = h.tick(2)
    assert any(isinstance(o, ev.JobAssigned) and o.job_id == "vip-next" for o in h.log)
    refreshed = [o for o in out if isinstance(o, ev.JobWaitEstimated) and o.job_id == "later"]
    assert refreshed and refreshed[-1].reason_code == WaitCode.GPUS
    assert "held by quota" not in refreshed[-1].reason


def test_the_reason_and_position_name_no_other_tenant_or_job():
    h = Harness(nodes=2, config=cfg(estimate_interval_s=1))
    h.submit("job_mallory_1", tenant="mallory", gpus=8, estimate_s=600)
    h.submit("job_mallory_2", tenant="mallory", gpus=16, per_node=8, estimate_s=600)
    h.start_all()
    for i in range(4):
        h.submit(f"job_victim_{i}", tenant="victim", gpus=4, estimate_s=60 + i)
    h.tick(2)
    told = [
        o
        for o in h.log
        if isinstance(o, (ev.JobQueued, ev.JobWaitEstimated)) and "victim" in o.job_id
    ]
    assert told and all(o.reason_code for o in told if o.wait_estimate_s > 0)
    assert all("mallory" not in o.reason for o in told)


def test_reasons_do_not_change_decisions():
    """The same workload with and without reading reasons places the same jobs at
    the same times: ``wait_reason`` only reads."""

    def run(read: bool) -> list[tuple[str, int]]:
        h = Harness(nodes=2, config=cfg(tenants=(TenantConfig("capped", max_gpus=8),)))
        for i in range(6):
            h.submit(f"j{i}", tenant="capped" if i % 2 else "free", gpus=4, estimate_s=30)
            if read:
                for job in list(h.cell.jobs.values()):
                    if job.state == "QUEUED":
                        h.cell.wait_reason(job, 1)
            h.start_all()
            h.tick(20)
            for key in h.live_runs():
                if h.cell.runs[key].phase == "running":
                    h.complete(key)
        return [(o.job_id, o.ts_ms) for o in h.log if isinstance(o, ev.JobAssigned)]

    assert run(True) == run(False)


def test_a_job_larger_than_its_quota_is_rejected_naming_the_quota_not_held_forever():
    h = Harness(nodes=2, config=cfg(tenants=(TenantConfig("capped", max_gpus=8),)))
    out = h.submit("huge", tenant="capped", gpus=16, per_node=8)
    (rejected,) = [o for o in out if isinstance(o, ev.JobRejected)]
    assert rejected.reason == "over_quota" and "max_gpus of tenant capped is 8" in rejected.detail
