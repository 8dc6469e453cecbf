"""The simulator names how each run ended from the core's cause codes, never from
the wording of a reason (``processors/sim/jobevents.py``, ``schemas/causes.py``)."""

from __future__ import annotations

import pytest

from framespool.processors.sim.jobevents import requeue_outcome
from framespool.schemas import events as ev
from framespool.schemas.causes import MOVES, RETRY_CLASS, RunCause

MISLEADING = "retry after timeout: checkpoint-and-move: preempted by j9"  # prose is ignored


def requeued(cause: str = RunCause.UNRECORDED, failure_class: str = "") -> ev.JobRequeued:
    return ev.JobRequeued(
        event_id="cell-0@1/0",
        ts_ms=1,
        job_id="j1",
        run=1,
        reason=MISLEADING,
        cause=cause,
        failure_class=failure_class,
    )


@pytest.mark.parametrize(
    ("cause", "failure_class", "outcome"),
    [
        (RunCause.GPU_ECC, "", "moved:gpu_ecc"),
        (RunCause.GPU_THROTTLED, "", "moved:gpu_throttled"),
        (RunCause.STRAGGLER, "", "moved:straggler"),
        (RunCause.NODE_DRAINING, "", "moved:node_draining"),
        (RunCause.PREEMPTED, "", "preempted"),
        (RunCause.NODE_DOWN, "node_lost", "requeued:node_lost"),
        (RunCause.AGENT_STOPPED, "node_lost", "requeued:node_lost"),
        (RunCause.HUNG, "hung", "requeued:hung"),
        (RunCause.RUN_FAILED, "oom", "requeued:oom"),
        (RunCause.LEASE_EXPIRED, "lease_expired", "requeued:lease_expired"),
        (RunCause.UNRECORDED, "", "requeued"),
    ],
)
def test_a_requeued_runs_outcome_comes_from_its_cause(cause, failure_class, outcome):
    assert requeue_outcome(requeued(cause, failure_class)) == outcome


def test_a_cause_after_a_round_trip_through_the_codec_still_classifies():
    from framespool.schemas import codec

    back = codec.decode(codec.encode(requeued(RunCause.GPU_ECC)))
    assert type(back.cause) is str and requeue_outcome(back) == "moved:gpu_ecc"


def test_every_cause_is_a_move_a_retry_class_or_named_by_its_own_event():
    own_event = {
        RunCause.PREEMPTED,
        RunCause.RUN_FAILED,
        RunCause.COMPLETED,
        RunCause.CANCELLED,
        RunCause.UNRECORDED,
    }
    assert set(RunCause) == set(MOVES) | set(RETRY_CLASS) | own_event
    assert not set(MOVES) & set(RETRY_CLASS)
