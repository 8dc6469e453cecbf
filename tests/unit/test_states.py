"""The state vocabulary (``framespool.schemas.states``) is the strings the log has
always carried: members encode, compare and hash exactly like them, so the wire,
snapshots read back and replays do not change."""

from __future__ import annotations

import json

import pytest

from framespool.processors.core.config import CellConfig
from framespool.processors.core.health import classify
from framespool.projections import jobs as job_fold
from framespool.projections.cluster import gpu_bucket
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas.causes import RunCause
from framespool.schemas.states import GpuSlot, GpuState, JobState, NodeState, RunPhase

WIRE = {
    JobState: [
        "QUEUED",
        "ASSIGNED",
        "RUNNING",
        "CHECKPOINTING",
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "REJECTED",
    ],
    RunPhase: ["assigned", "running", "exiting", "stopping"],
    NodeState: ["UP", "DEGRADED", "DRAINING", "DOWN"],
    GpuState: ["ok", "degraded", "failed"],
    GpuSlot: ["busy", "free", "degraded", "failed", "down"],
}


@pytest.mark.parametrize("enum", list(WIRE), ids=lambda e: e.__name__)
def test_values_are_the_strings_on_the_wire(enum):
    assert [m.value for m in enum] == WIRE[enum]
    for member in enum:
        assert member == member.value and hash(member) == hash(member.value)
        assert f"{member}" == member.value and json.dumps(member) == json.dumps(member.value)


def test_job_states_and_run_phases_are_told_apart():
    assert JobState.RUNNING != RunPhase.RUNNING
    assert JobState.ASSIGNED != RunPhase.ASSIGNED


def test_an_event_with_a_member_encodes_byte_for_byte_like_the_string():
    def changed(state):
        return ev.NodeStateChanged(
            event_id="e", ts_ms=1, node_id="n0", incarnation=1, state=state, reason="x"
        )

    assert codec.encode(changed(NodeState.DOWN)) == codec.encode(changed("DOWN"))
    requeued = dict(event_id="q", ts_ms=1, job_id="j", run=1, reason="r")
    assert codec.encode(ev.JobRequeued(**requeued, cause=RunCause.HUNG)) == codec.encode(
        ev.JobRequeued(**requeued, cause="hung")
    )


def test_the_job_views_states_are_the_cores_plus_submitted():
    # CHECKPOINTING is shown (issue #32); SUBMITTED is the view's own (no cell yet)
    assert set(job_fold.STATES) == {*JobState, "SUBMITTED"}


@pytest.mark.parametrize(
    ("node", "gpu", "bucket"),
    [
        (NodeState.UP, GpuSlot.FREE, GpuSlot.FREE),
        (NodeState.UP, GpuSlot.BUSY, GpuSlot.BUSY),
        (NodeState.DRAINING, GpuSlot.FREE, GpuSlot.DEGRADED),
        (NodeState.DEGRADED, GpuSlot.FREE, GpuSlot.DEGRADED),
        (NodeState.UP, GpuSlot.DEGRADED, GpuSlot.DEGRADED),
        (NodeState.UP, GpuSlot.FAILED, GpuSlot.DOWN),
        (NodeState.DOWN, GpuSlot.BUSY, GpuSlot.DOWN),
    ],
)
def test_cluster_buckets_come_from_node_and_gpu_states(node, gpu, bucket):
    status = ev.NodeStatus(node_id="n0", state=node, gpus=(ev.GpuStatus(index=0, state=gpu),))
    assert gpu_bucket(status, status.gpus[0]) == bucket


@pytest.mark.parametrize(
    ("sample", "state", "cause"),
    [
        (ev.GpuHealth(index=0), GpuState.OK, RunCause.UNRECORDED),
        (ev.GpuHealth(index=0, ecc_uncorrected=1), GpuState.FAILED, RunCause.GPU_ECC),
        (ev.GpuHealth(index=0, ecc_corrected=10_000), GpuState.DEGRADED, RunCause.GPU_ECC),
        (ev.GpuHealth(index=0, temperature_c=99.0), GpuState.DEGRADED, RunCause.GPU_THROTTLED),
    ],
)
def test_a_health_sample_gives_a_gpu_state_and_the_cause_a_move_carries(sample, state, cause):
    got_state, why, got_cause = classify(sample, CellConfig())
    assert (got_state, got_cause) == (state, cause) and why
