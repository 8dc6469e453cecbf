"""The lifecycle table is asked before anything changes
(docs/design.md#job-lifecycle-and-fencing), and every
run the core ends carries a machine-readable cause (``framespool.schemas.causes``).

Fencing keeps illegal transitions out of reach of well-formed inputs, so these
tests put a job in a state its run contradicts (as a bug elsewhere in the fold
would) and check that the next report is refused and recorded as a
``ReportIgnored``, with the cell exactly as it was: never half-changed, never a
processing error.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from framespool.processors.core import lifecycle as lc
from framespool.processors.core.cell import Cell
from framespool.processors.core.config import CellConfig
from framespool.schemas import events as ev
from framespool.schemas.causes import RunCause
from framespool.schemas.states import JobState, NodeState, RunPhase
from tests.support.core_harness import Harness

BOOKKEEPING = ("counters", "_out", "_pos", "_input")


def state_bytes(cell: Cell) -> bytes:
    """Everything the fold keeps, pickled, except per-apply buffers and counters."""
    return pickle.dumps({k: v for k, v in vars(cell).items() if k not in BOOKKEEPING})


def placed(h: Harness, job_id: str = "j1", **extra: Any) -> tuple[str, int, str]:
    h.submit(job_id, gpus=8, **extra)
    h.tick(1)
    (key,) = [k for k in h.cell.runs if k[0] == job_id]
    return key[0], key[1], next(iter(h.cell.runs[key].held))


def started(h: Harness, job_id: str = "j1", **extra: Any) -> tuple[str, int, str]:
    job_id, run, node = placed(h, job_id, **extra)
    h.report(ev.RunStarted, job_id, run, node)
    return job_id, run, node


@pytest.mark.parametrize(
    ("report", "fields", "action"),
    [
        (ev.RunStarted, {}, "start"),
        (ev.RunCompleted, {"artifact_uri": "mem://x"}, "complete"),
        (ev.RunFailed, {"failure_class": "generator_error"}, "requeue"),
        (ev.RunStopped, {}, "requeue"),
    ],
)
def test_an_illegal_transition_is_recorded_and_changes_nothing(report, fields, action):
    h = Harness()
    job_id, run, node = started(h)
    h.cell.jobs[job_id].state = JobState.QUEUED  # contradicts its live run
    before = state_bytes(h.cell)
    event = report(
        event_id=h.next_id(),
        ts_ms=h.now_ms,
        job_id=job_id,
        run=run,
        node_id=node,
        incarnation=h.incarnation[node],
        **fields,
    )
    out = h.cell.apply(event)  # raises nothing: no processing_error
    assert out == [
        ev.ReportIgnored(
            event_id=out[0].event_id,
            ts_ms=h.now_ms,
            subject=job_id,
            reason=f"illegal transition: {action} while QUEUED",
            source_event_id=event.event_id,
            code="illegal_transition",
        )
    ]
    assert state_bytes(h.cell) == before
    assert h.cell.counters["illegal_transition"] == 1


def test_a_refused_checkpoint_request_leaves_the_run_running():
    """``request_exit`` used to set the run EXITING before asking the table."""
    h = Harness()
    job_id, run, _ = started(h, checkpoint_interval_s=30.0)
    h.cell.jobs[job_id].state = JobState.ASSIGNED  # "checkpoint" is illegal from here
    before = state_bytes(h.cell)
    h.cell._out = []
    assert h.cell.request_exit(h.cell.runs[(job_id, run)], RunCause.STRAGGLER, "", "move") is False
    assert state_bytes(h.cell) == before
    assert h.cell.runs[(job_id, run)].phase == RunPhase.RUNNING
    (ignored,) = h.cell._out
    assert isinstance(ignored, ev.ReportIgnored)
    assert ignored.reason == "illegal transition: checkpoint while ASSIGNED"


def test_a_refused_assignment_leaves_the_job_queued():
    """``commit`` used to dequeue and bump the run number before asking the table."""
    h = Harness(nodes=1)
    started(h, "j1")
    h.submit("j2", gpus=8)  # the only node is busy: j2 waits
    job = h.cell.jobs["j2"]
    job.state = JobState.CANCELLED  # as if terminal but still queued
    h.cell.release_slice(h.cell.runs[("j1", 1)], "n0")  # GPUs free for j2
    before = state_bytes(h.cell)
    h.cell._out = []
    assert h.cell.try_start(job, "fair-share order") is False
    assert state_bytes(h.cell) == before
    assert job.run == 0
    assert [o.reason for o in h.cell._out] == ["illegal transition: assign while CANCELLED"]


def test_every_action_missing_from_the_table_is_refused():
    actions = {a for _, a in lc.TRANSITIONS}
    for state in JobState:
        for action in actions:
            assert lc.allowed(state, action) == ((state, action) in lc.TRANSITIONS)
    for state in lc.TERMINAL:
        assert not any(lc.allowed(state, a) for a in actions), state


# -- causes -------------------------------------------------------------------
def requeued(out: list[Any]) -> ev.JobRequeued:
    (event,) = [o for o in out if isinstance(o, ev.JobRequeued)]
    return event


def test_an_agent_failure_carries_its_cause_and_retry_class():
    h = Harness()
    job_id, run, node = started(h)
    out = h.report(ev.RunFailed, job_id, run, node, failure_class="hung")
    assert (requeued(out).cause, requeued(out).failure_class) == (RunCause.HUNG, "hung")
    run += 1
    h.tick(1)
    node = next(iter(h.cell.runs[(job_id, run)].held))
    out = h.report(ev.RunFailed, job_id, run, node, failure_class="oom")
    assert (requeued(out).cause, requeued(out).failure_class) == (RunCause.RUN_FAILED, "oom")


def test_a_lost_node_and_an_agent_stop_are_told_apart():
    h = Harness()
    job_id, run, node = started(h)
    out = h.report(ev.RunStopped, job_id, run, node, reason="agent shutting down")
    assert (requeued(out).cause, requeued(out).failure_class) == (
        RunCause.AGENT_STOPPED,
        "node_lost",
    )
    h.tick(1)
    run += 1
    node = next(iter(h.cell.runs[(job_id, run)].held))
    out = h.register(node, 8, h.cell.index.nodes[node].rail)
    assert (requeued(out).cause, requeued(out).failure_class) == (
        RunCause.NODE_REREGISTERED,
        "node_lost",
    )


def test_a_silent_node_ends_its_runs_with_node_down():
    h = Harness(nodes=2)
    job_id, run, node = started(h)
    other = next(n for n in h.cell.index.nodes if n != node)
    out = []
    for _ in range(30):
        h.heartbeat(other)
        out += h.tick(1)
        if any(isinstance(o, ev.JobRequeued) for o in out):
            break
    assert requeued(out).cause == RunCause.NODE_DOWN


def test_a_run_past_its_limit_fails_with_timeout_when_retries_are_spent():
    config = CellConfig(
        status_interval_s=0, estimate_interval_s=0, overrun_grace_s=5.0, retries=(("timeout", 0),)
    )
    h = Harness(config)
    job_id, run, node = started(h, estimate_s=5.0)
    out = []
    for _ in range(60):
        h.heartbeat(node)
        out += h.tick(1)
        if any(isinstance(o, ev.JobFailed) for o in out):
            break
    (failed,) = [o for o in out if isinstance(o, ev.JobFailed)]
    assert (failed.cause, failed.failure_class) == (RunCause.TIMEOUT, "timeout")


@pytest.mark.parametrize(
    ("health", "cause"),
    [
        (ev.GpuHealth(index=0, ecc_uncorrected=1), RunCause.GPU_ECC),
        (ev.GpuHealth(index=0, temperature_c=99.0), RunCause.GPU_THROTTLED),
        (ev.GpuHealth(index=0, sm_clock_mhz=500, max_sm_clock_mhz=1980), RunCause.GPU_THROTTLED),
    ],
)
def test_a_move_off_bad_hardware_says_what_was_bad(health, cause):
    h = Harness()
    job_id, run, node = started(h, checkpoint_interval_s=30.0)
    h.heartbeat(node, gpus=(health,))
    assert h.cell.runs[(job_id, run)].phase == RunPhase.EXITING
    out = h.report(ev.RunCheckpointed, job_id, run, node, checkpoint_uri="mem://ck")
    assert requeued(out).cause == cause and requeued(out).failure_class == ""
    assert requeued(out).reason.startswith("checkpoint-and-move")  # the prose stays, for audit


def preempting_cell() -> Harness:
    """A batch run on the only node, asked to checkpoint for an interactive job."""
    config = CellConfig(status_interval_s=0, estimate_interval_s=0, heartbeat_timeout_s=1000)
    h = Harness(nodes=1, config=config)
    h.submit(
        "batch", gpus=8, tier="batch", preemptible=True, checkpoint_interval_s=30, estimate_s=3600
    )
    h.start_all()
    h.tick(100)
    h.heartbeat("n0")
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    h.tick(31)
    assert h.cell.runs[("batch", 1)].exit_intent == RunCause.PREEMPTED
    return h


def test_a_preempted_run_is_requeued_with_cause_preempted():
    h = preempting_cell()
    out = h.report(ev.RunCheckpointed, "batch", 1, "n0", checkpoint_uri="mem://batch/ck1")
    assert [type(o) for o in out if isinstance(o, (ev.JobPreempted, ev.JobRequeued))] == [
        ev.JobPreempted,
        ev.JobRequeued,
    ]
    assert (requeued(out).cause, requeued(out).failure_class) == (RunCause.PREEMPTED, "")


def test_an_exit_asked_for_before_causes_existed_still_ends_right():
    """A snapshot from before causes holds ``exit_intent`` "preempt" or "move"."""
    for legacy, cause, preempted in [
        ("preempt", RunCause.PREEMPTED, True),
        ("move", RunCause.NODE_DRAINING, False),
    ]:
        h = preempting_cell()
        h.cell.runs[("batch", 1)].exit_intent = legacy
        out = h.report(ev.RunCheckpointed, "batch", 1, "n0", checkpoint_uri="mem://batch/ck1")
        assert requeued(out).cause == cause
        assert any(isinstance(o, ev.JobPreempted) for o in out) == preempted


# -- runs and nodes: their own tables -----------------------------------------


def test_every_run_phase_change_is_a_row_of_the_run_table():
    """A run the fold tries to start twice, or to stop and then take back, is a
    bug: ``next_phase`` raises instead of assigning a phase the table lacks."""
    h = Harness()
    job_id, run, node = started(h)
    key = (job_id, run)
    assert h.cell.runs[key].phase == RunPhase.RUNNING
    with pytest.raises(lc.IllegalTransition, match="cannot start while running"):
        lc.next_phase(key, RunPhase.RUNNING, "start")
    for phase in RunPhase:
        for action in ("start", "exit", "stop"):
            row = (phase, action) in lc.RUN_TRANSITIONS
            if row:
                assert lc.next_phase(key, phase, action) == lc.RUN_TRANSITIONS[(phase, action)]
            else:
                with pytest.raises(lc.IllegalTransition):
                    lc.next_phase(key, phase, action)
    # STOPPING is the end: nothing leaves it
    assert not [k for k in lc.RUN_TRANSITIONS if k[0] == RunPhase.STOPPING]


def test_a_node_change_the_table_lacks_is_refused_and_recorded():
    """A DOWN node is replaced by its next registration, never revived; a DRAINING
    node is not put on straggler probation. Each is refused with a recorded
    reason, the node as it was and no NodeStateChanged emitted."""
    h = Harness()
    node = h.cell.index.nodes["n0"]
    h.cell.set_node_state(node, NodeState.DRAINING, "GPU 0 failed")
    assert node.state == NodeState.DRAINING
    for new in (NodeState.DEGRADED, NodeState.UP):
        before = state_bytes(h.cell)
        h.cell._out = []
        h.cell.set_node_state(node, new, "probation")
        (refusal,) = h.cell._out
        assert isinstance(refusal, ev.ReportIgnored)
        assert refusal.code == "illegal_transition" and refusal.subject == "n0"
        assert f"{NodeState.DRAINING} -> {new}" in refusal.reason
        assert state_bytes(h.cell) == before
    h.cell.set_node_state(node, NodeState.DOWN, "no heartbeat")
    h.cell._out = []
    h.cell.set_node_state(node, NodeState.UP, "back")
    assert node.state == NodeState.DOWN
    assert [type(o) for o in h.cell._out] == [ev.ReportIgnored]


def test_the_node_changes_the_fold_makes_are_rows_of_the_node_table():
    """Over the property tests' random histories (failures, hot GPUs, missed
    heartbeats, re-registrations) every NodeStateChanged the fold emits is a
    row of the table, and no node change was refused: the table matches the
    fold."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.support.core import action, play

    seen: list[int] = []

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(action, min_size=20, max_size=120))
    def check(actions):
        h = Harness()
        play(h, actions)
        h.drain()
        last: dict[tuple[str, int], NodeState] = {}
        changes = 0
        for o in h.log:
            if isinstance(o, ev.NodeStateChanged) and o.gpu == -1:
                key = (o.node_id, o.incarnation)
                if key not in last:  # its registration: an incarnation starts UP
                    assert o.state == NodeState.UP, o
                else:
                    assert lc.node_allowed(last[key], NodeState(o.state)), o
                    changes += 1
                last[key] = NodeState(o.state)
        assert not [
            o for o in h.log if isinstance(o, ev.ReportIgnored) and "illegal node" in o.reason
        ]
        seen.append(changes)

    check()
    assert sum(seen) > 0  # the histories did change nodes' states
