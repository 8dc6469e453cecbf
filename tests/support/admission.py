"""Commands for the admission core's unit tests (test_admission_core.py and
test_admission_routing.py had one ``submit`` each; this is the first's, whose optional
idempotency key the second never passed)."""

from __future__ import annotations

from framespool.schemas import events as ev

T0 = 1_700_000_000_000


def submit(
    job_id: str, tenant: str = "acme", ts: int = T0, key: str | None = None, **spec: object
) -> ev.SubmitJob:
    return ev.SubmitJob(
        event_id=f"cmd-{job_id}",
        ts_ms=ts,
        idempotency_key=key,
        spec=ev.JobSpec(job_id=job_id, tenant=tenant, **spec),
    )


def cancel(job_id: str, tenant: str = "acme", ts: int = T0) -> ev.CancelJob:
    return ev.CancelJob(event_id=f"cancel-{job_id}", ts_ms=ts, job_id=job_id, tenant=tenant)
