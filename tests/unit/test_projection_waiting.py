"""The job view tells a tenant why its job waits and where it stands (issue #32):
the cell's reason in words and as a code, its position and band, kept from
refresh to refresh; and CHECKPOINTING while its run writes a checkpoint."""

from __future__ import annotations

from dataclasses import replace

from framespool.projections.jobs import CHECKPOINTING, QUEUED, RUNNING, fold
from framespool.projections.serde import job_status, public_job
from framespool.projections.webhooks import delivery_for
from framespool.schemas import events as ev
from tests.support.projections import spec

QUOTA_WORDS = (
    "held by quota: organisation acme holds 8 of its 8 GPUs (max_gpus) and this job needs 4"
)


def admitted(job_id: str = "j", **kw) -> list:
    return [
        ev.JobAdmitted(
            event_id="a", ts_ms=1, cell="cell-0", spec=spec(job_id, callback_url="https://x", **kw)
        ),
        ev.JobQueued(
            event_id="q",
            ts_ms=2,
            job_id=job_id,
            tenant="acme",
            tier="free",
            wait_estimate_s=90.0,
            wait_p50_s=80.0,
            wait_p90_s=200.0,
            position=3,
            reason="behind 2 job(s) of higher fair order; then it needs 4 GPU(s) (0 free now)",
            reason_code="fair_share",
        ),
    ]


def test_the_view_carries_the_cells_reason_code_position_and_band():
    view = fold(admitted())
    doc = public_job(view)
    assert (doc["reason_code"], doc["position"]) == ("fair_share", 3)
    assert doc["reason"].startswith("behind 2 job(s)")
    assert (doc["wait_p50_s"], doc["wait_p90_s"]) == (80.0, 200.0)
    assert "behind 2 job(s)" in view.timeline[-1].summary


def test_a_refresh_replaces_the_reason_and_a_reason_alone_keeps_the_band():
    held = ev.JobWaitEstimated(
        event_id="w1",
        ts_ms=3,
        job_id="j",
        wait_estimate_s=90.0,
        position=1,
        reason=QUOTA_WORDS,
        reason_code="quota",
    )
    view = fold([*admitted(), held])
    doc = public_job(view)
    assert (doc["reason_code"], doc["reason"], doc["position"]) == ("quota", QUOTA_WORDS, 1)
    assert (doc["wait_p50_s"], doc["wait_p90_s"]) == (80.0, 200.0)  # no band in it: kept
    status = job_status(view)
    assert status["reason_code"] == "quota" and status["state"] == QUEUED


def test_an_old_refresh_without_a_code_keeps_the_reason_told_before():
    old = ev.JobWaitEstimated(event_id="w1", ts_ms=3, job_id="j", wait_estimate_s=20.0, position=0)
    view = fold([*admitted(), old])
    assert view.reason_code == "fair_share" and view.position == 3


def test_assignment_clears_the_wait():
    assigned = ev.JobAssigned(
        event_id="s",
        ts_ms=4,
        job_id="j",
        run=1,
        placement=(ev.NodeSlice(node_id="n", gpus=(0,)),),
        gpus=1,
        estimate_s=60.0,
        reason="fair-share order",
    )
    doc = public_job(fold([*admitted(), assigned]))
    assert doc["reason_code"] is None and doc["position"] is None


def progress(n: int, step: int, phase: str = "") -> ev.RunProgress:
    return ev.RunProgress(
        event_id=f"p{n}",
        ts_ms=10 + n,
        job_id="j",
        run=1,
        node_id="n",
        progress=step / 10,
        step=step,
        total_steps=10,
        phase=phase,
    )


def test_checkpointing_is_a_state_of_its_own_and_webhooks_do_not_repeat_running():
    assigned = ev.JobAssigned(
        event_id="s",
        ts_ms=4,
        job_id="j",
        run=1,
        placement=(ev.NodeSlice(node_id="n", gpus=(0,)),),
        gpus=1,
        estimate_s=60.0,
    )
    running = fold([*admitted(), assigned, progress(1, 3)])
    assert running.state == RUNNING
    writing = fold([progress(2, 3, phase="CHECKPOINTING")], running)
    assert writing.state == CHECKPOINTING and public_job(writing)["state"] == CHECKPOINTING
    assert "checkpointing at 30%" in writing.timeline[-1].summary
    back = fold([progress(3, 4)], writing)
    assert back.state == RUNNING
    assert delivery_for(running, writing, progress(2, 3)) is None
    assert delivery_for(writing, back, progress(3, 4)) is None
    # the flicker replaces itself in the bounded timeline
    assert [e.type for e in back.timeline].count("RunProgress") == 1
    preempted = ev.JobPreempted(event_id="x", ts_ms=30, job_id="j", run=1, reason="for interactive")
    assert fold([preempted], writing).state == QUEUED


def test_a_view_stored_before_reason_codes_reads_with_none():
    from framespool.projections.serde import view_from_dict, view_to_dict

    doc = view_to_dict(fold(admitted()))
    del doc["reason_code"]
    assert view_from_dict(doc).reason_code == ""
    assert replace(view_from_dict(doc), reason_code="x").reason_code == "x"


def test_framespool_status_says_why_where_and_how_long():
    from framespool.commands.jobs import status_line

    line = status_line(public_job(fold(admitted())))
    assert line.startswith("j  QUEUED  position 3  wait P50 ~80s, P90 ~200s  [fair_share]  behind")
