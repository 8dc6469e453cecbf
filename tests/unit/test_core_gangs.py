"""Gangs live and die together (processors/core/gangs.py): the start barrier,
liveness per member node, and resume from the step every rank checkpointed.

Each scenario is a two-node gang (n0 is rank 0, n1 rank 1) driven through the
core harness, which checks the cell's invariants after every input, the gang
one included (no member computes before every member holds its GPUs)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core import CellConfig
from framespool.schemas import events as ev
from framespool.schemas.causes import RunCause
from framespool.schemas.states import JobState, RunPhase
from tests.support.core import gang, of, started_gang
from tests.support.core_harness import Harness


def ckpt_uri(job_id: str, run: int, rank: int, step: int) -> str:
    return f"mem://jobs/{job_id}/runs/{run}/ranks/{rank}/checkpoints/{step}"


# -- the start barrier -----------------------------------------------------------
def test_no_member_computes_until_every_member_holds_its_gpus():
    h = Harness(nodes=2)
    gang(h)
    out = h.report(ev.RunStarted, "g", 1, "n0")
    run = h.cell.runs[("g", 1)]
    assert not of(out, ev.BeginRun)
    assert run.phase == RunPhase.ASSIGNED and h.cell.jobs["g"].state == JobState.ASSIGNED
    assert not of(h.report(ev.RunStarted, "g", 1, "n0"), ev.BeginRun)  # a repeat opens nothing

    h.tick(2)
    out = h.report(ev.RunStarted, "g", 1, "n1")
    begins = of(out, ev.BeginRun)
    assert [(b.node_id, b.job_id, b.run) for b in begins] == [("n0", "g", 1), ("n1", "g", 1)]
    assert all(b.incarnation == 1 for b in begins)
    assert run.phase == RunPhase.RUNNING and h.cell.jobs["g"].state == JobState.RUNNING
    assert run.started_ms == h.now_ms  # GPU time is charged from the go, not the first ready
    assert not of(h.report(ev.RunStarted, "g", 1, "n1"), ev.BeginRun)  # only one go


def test_a_heartbeat_listing_the_run_counts_as_that_member_ready():
    h = Harness(nodes=2)
    gang(h)
    assert not of(h.heartbeat("n1"), ev.BeginRun)
    assert h.cell.runs[("g", 1)].phase == RunPhase.ASSIGNED
    out = h.report(ev.RunStarted, "g", 1, "n0")
    assert sorted(b.node_id for b in of(out, ev.BeginRun)) == ["n0", "n1"]


def test_a_member_never_ready_within_the_start_lease_fails_the_attempt_of_the_whole_gang():
    h = Harness(CellConfig(status_interval_s=0, estimate_interval_s=0, start_lease_s=30), nodes=2)
    gang(h)
    h.report(ev.RunStarted, "g", 1, "n0")
    out = []
    for _ in range(8):
        h.heartbeat("n0")  # n0 is ready and alive; n1 is up but never takes the run
        h.heartbeat("n1", runs=())
        out += h.tick(5)
    (requeued,) = of(out, ev.JobRequeued)
    assert requeued.cause == RunCause.LEASE_EXPIRED and requeued.run == 1
    assert sorted(s.node_id for s in of(out, ev.StopRun)) == ["n0", "n1"]
    assert not of(h.log, ev.BeginRun)


# -- liveness per member ---------------------------------------------------------
def test_a_member_that_stops_listing_the_run_requeues_the_gang_within_its_lease():
    """n0 keeps reporting the run; n1's agent (alive) no longer lists it. The run-wide
    report time that n0 keeps fresh must not hide n1: the gang ends within the lease,
    long before the hard limit (2 x 600 s + 300 s)."""
    config = CellConfig(status_interval_s=0, estimate_interval_s=0, report_lease_s=15)
    h = Harness(config, nodes=2)
    started_gang(h)
    silent_since = h.now_ms
    requeued = []
    while not requeued:
        assert h.now_ms - silent_since < 60_000, "the silent member went unnoticed"
        out = h.tick(2) + h.heartbeat("n0") + h.heartbeat("n1", runs=())
        requeued = of(out, ev.JobRequeued)
    (req,) = requeued
    assert req.cause == RunCause.MEMBER_LOST and "n1" in req.reason
    assert req.ts_ms - silent_since <= 15_000 + 2_000  # the lease, plus one heartbeat period
    assert h.cell.jobs["g"].state == JobState.QUEUED
    assert h.cell.runs[("g", 1)].phase == RunPhase.STOPPING


def test_a_silent_member_ends_the_gang_on_tick_within_the_lease_not_at_the_hard_limit():
    """n1 goes wholly silent (its node is not declared DOWN for 300 s); n0 keeps
    reporting. The Tick after the report lease ends the whole gang."""
    config = CellConfig(
        status_interval_s=0, estimate_interval_s=0, report_lease_s=15, heartbeat_timeout_s=300
    )
    h = Harness(config, nodes=2)
    started_gang(h)
    silent_since = h.now_ms
    out = []
    while not of(out, ev.JobRequeued):
        assert h.now_ms - silent_since < 60_000, "the silent member went unnoticed"
        out = h.tick(1) + h.heartbeat("n0")
    (req,) = of(out, ev.JobRequeued)
    assert req.cause == RunCause.MEMBER_LOST
    assert "n1 (rank 1 of 2)" in req.reason and "whole gang" in req.reason
    assert 15_000 < req.ts_ms - silent_since <= 16_000
    # every member is told to stop, the silent one too; the run ends once
    assert sorted(s.node_id for s in of(out, ev.StopRun)) == ["n0", "n1"]
    assert not of(h.tick(1), ev.JobRequeued)
    # and it is placed again, as one gang, once the GPUs come back
    h.report(ev.RunStopped, "g", 1, "n0")
    out = h.register("n1") + h.tick(1)
    assert [a.run for a in of(out, ev.JobAssigned)] == [2]


def test_single_node_runs_keep_the_run_wide_lease():
    config = CellConfig(
        status_interval_s=0, estimate_interval_s=0, report_lease_s=15, heartbeat_timeout_s=300
    )
    h = Harness(config, nodes=2)
    h.submit("solo", gpus=8, per_node=8, estimate_s=600)
    h.report(ev.RunStarted, "solo", 1, "n0")
    out = []
    for _ in range(40):
        out += h.tick(1)
    assert not of(out, ev.JobRequeued)  # no heartbeat from n0 at all: only its node lease
    assert h.cell.runs[("solo", 1)].gang is None


# -- per-rank checkpoints ----------------------------------------------------------
def test_the_gang_resumes_from_the_latest_step_every_rank_checkpointed():
    h = Harness(nodes=2)
    started_gang(h, checkpoint_interval_s=30.0)
    for rank, node, step in ((0, "n0", 10), (0, "n0", 20), (1, "n1", 10)):
        h.report(
            ev.RunCheckpointed,
            "g",
            1,
            node,
            checkpoint_uri=ckpt_uri("g", 1, rank, step),
            step=step,
            progress=step / 100,
        )
    job = h.cell.jobs["g"]
    assert job.checkpoint == ckpt_uri("g", 1, 0, 10)
    assert h.cell.runs[("g", 1)].gang.common_step == 10

    out = h.report(ev.RunFailed, "g", 1, "n1", failure_class="generator_error")
    (req,) = of(out, ev.JobRequeued)
    assert req.resume_from == ckpt_uri("g", 1, 0, 10)  # not 20: rank 1 never wrote it
    h.report(ev.RunStopped, "g", 1, "n0")
    out = h.tick(1)
    starts = of(out, ev.StartRun)
    assert len(starts) == 2 and {s.resume_from for s in starts} == {ckpt_uri("g", 1, 0, 10)}


def test_a_step_every_rank_wrote_later_moves_the_checkpoint_forward_and_older_ones_never_back():
    h = Harness(nodes=2)
    started_gang(h, checkpoint_interval_s=30.0)

    def ck(node, rank, step):
        return h.report(
            ev.RunCheckpointed, "g", 1, node, checkpoint_uri=ckpt_uri("g", 1, rank, step), step=step
        )

    ck("n0", 0, 10)
    ck("n0", 0, 20)
    ck("n1", 1, 20)  # rank 1 skipped 10: 20 is the first step both ranks have
    assert h.cell.jobs["g"].checkpoint == ckpt_uri("g", 1, 0, 20)
    ck("n1", 1, 10)  # late and older: changes nothing
    assert h.cell.jobs["g"].checkpoint == ckpt_uri("g", 1, 0, 20)
    assert h.cell.runs[("g", 1)].gang.steps == {
        "n0": {20: (ckpt_uri("g", 1, 0, 20), 0.0)},
        "n1": {20: (ckpt_uri("g", 1, 1, 20), 0.0)},
    }


def test_a_gang_asked_to_checkpoint_and_move_leaves_once_every_rank_checkpointed():
    h = Harness(nodes=2)
    started_gang(h, checkpoint_interval_s=30.0)
    out = h.heartbeat("n0", gpus=(ev.GpuHealth(index=0, temperature_c=95.0),))
    assert sorted(c.node_id for c in of(out, ev.CheckpointRun)) == ["n0", "n1"]
    run = h.cell.runs[("g", 1)]
    assert run.phase == RunPhase.EXITING
    out = h.report(
        ev.RunCheckpointed, "g", 1, "n0", checkpoint_uri=ckpt_uri("g", 1, 0, 30), step=30
    )
    assert run.phase == RunPhase.EXITING and not of(out, ev.JobRequeued)  # rank 1 still writing
    out = h.report(
        ev.RunCheckpointed, "g", 1, "n1", checkpoint_uri=ckpt_uri("g", 1, 1, 30), step=30
    )
    (req,) = of(out, ev.JobRequeued)
    assert req.resume_from == ckpt_uri("g", 1, 0, 30)


def test_checkpoints_without_a_step_keep_the_run_wide_rule():
    """An older agent (or the simulator) reports one checkpoint per gang, without a
    step: the newest reported is the job's, as before."""
    h = Harness(nodes=2)
    started_gang(h, checkpoint_interval_s=30.0)
    h.report(ev.RunCheckpointed, "g", 1, "n0", checkpoint_uri="mem://g/ck1", progress=0.3)
    assert h.cell.jobs["g"].checkpoint == "mem://g/ck1"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 12)), max_size=30))
def test_the_job_resumes_from_the_latest_step_that_every_rank_reported(reports):
    """Whatever order the ranks' checkpoints arrive in (repeats, gaps, late ones),
    the job's checkpoint is the latest step both ranks reported, if any."""
    h = Harness(nodes=2)
    started_gang(h, checkpoint_interval_s=30.0)
    wrote: dict[int, set[int]] = {0: set(), 1: set()}
    for rank, step in reports:
        h.report(
            ev.RunCheckpointed,
            "g",
            1,
            f"n{rank}",
            checkpoint_uri=ckpt_uri("g", 1, rank, step),
            step=step,
        )
        wrote[rank].add(step)
        common = wrote[0] & wrote[1]
        expected = ckpt_uri("g", 1, 0, max(common)) if common else None
        assert h.cell.jobs["g"].checkpoint == expected
