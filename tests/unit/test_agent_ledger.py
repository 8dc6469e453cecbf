"""The agent's pure decisions: fencing by node, incarnation and run; dedupe."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from framespool.agents.ledger import Action, ProgressThrottle, RunLedger, RunState, StepRate
from framespool.schemas.events import BeginRun, CheckpointRun
from tests.support.agents import INC, NODE, start, stop


def ckpt(job="job-1", run=1, *, node=NODE, inc=INC, eid=None):
    return CheckpointRun(
        event_id=eid or f"ckpt-{job}-{run}-{inc}",
        ts_ms=0,
        node_id=node,
        incarnation=inc,
        job_id=job,
        run=run,
    )


def test_a_new_run_launches():
    ledger = RunLedger(NODE, INC)
    d = ledger.decide(start())
    assert (d.action, d.job_id, d.run, d.supersedes) == (Action.LAUNCH, "job-1", 1, ())
    assert [e.state for e in ledger.active()] == [RunState.LAUNCHING]
    assert ledger.started("job-1", 1)
    assert ledger.entry("job-1", 1).state is RunState.RUNNING


def test_instructions_for_other_nodes_are_skipped_without_state():
    ledger = RunLedger(NODE, INC)
    assert ledger.decide(start(node="node-b")).action is Action.SKIP
    assert ledger.decide(stop(node="node-b")).action is Action.SKIP
    assert ledger.active() == [] and ledger.ignored == []
    assert ledger.decide(start()).action is Action.LAUNCH  # same ids, for us: not a duplicate


def test_stale_and_unknown_incarnations_are_ignored():
    ledger = RunLedger(NODE, INC)
    for cmd in (start(inc=INC - 1), stop(inc=INC - 1), ckpt(inc=INC - 1)):
        d = ledger.decide(cmd)
        assert d.action is Action.IGNORE and "stale incarnation" in d.reason
    assert ledger.decide(start(inc=INC + 1)).action is Action.IGNORE
    assert ledger.active() == []
    # A stale StopRun for a run we do not have is not answered either.
    assert all(r for _, r in ledger.ignored)


def test_duplicate_event_id_is_ignored():
    ledger = RunLedger(NODE, INC)
    cmd = start()
    assert ledger.decide(cmd).action is Action.LAUNCH
    d = ledger.decide(cmd)
    assert d.action is Action.IGNORE and d.reason == "duplicate event_id"


def test_same_run_under_another_event_id_is_a_duplicate():
    ledger = RunLedger(NODE, INC)
    ledger.decide(start(eid="a"))
    d = ledger.decide(start(eid="b"))
    assert d.action is Action.IGNORE and "duplicate run" in d.reason
    ledger.finished("job-1", 1)
    assert ledger.decide(start(eid="c")).action is Action.IGNORE  # even after it finished


def test_lower_run_than_seen_is_stale():
    ledger = RunLedger(NODE, INC)
    ledger.decide(start(run=3))
    d = ledger.decide(start(run=2))
    assert d.action is Action.IGNORE and "stale run 2" in d.reason


def test_higher_run_supersedes_the_running_one():
    ledger = RunLedger(NODE, INC)
    ledger.decide(start(run=1))
    ledger.started("job-1", 1)
    d = ledger.decide(start(run=2))
    assert d.action is Action.LAUNCH and d.supersedes == (("job-1", 1),)
    assert ledger.entry("job-1", 1).state is RunState.STOPPING
    assert "superseded by run 2" in ledger.entry("job-1", 1).stop_reason


def test_stop_of_a_running_run_stops_it_once():
    ledger = RunLedger(NODE, INC)
    ledger.decide(start())
    ledger.started("job-1", 1)
    d = ledger.decide(stop(reason="preempted"))
    assert (d.action, d.reason) == (Action.STOP, "preempted")
    again = ledger.decide(stop(eid="another-stop"))
    assert again.action is Action.IGNORE and again.reason == "already stopping"


def test_stop_while_launching_makes_started_report_false():
    ledger = RunLedger(NODE, INC)
    ledger.decide(start())
    assert ledger.decide(stop()).action is Action.STOP
    assert not ledger.started("job-1", 1)  # the shell must stop the process it just started


def test_stop_or_checkpoint_for_unknown_run_reports_stopped():
    ledger = RunLedger(NODE, INC)
    assert ledger.decide(stop(job="ghost")).action is Action.REPORT_STOPPED
    assert ledger.decide(ckpt(job="ghost2")).action is Action.REPORT_STOPPED


def test_stop_after_finish_reports_stopped():
    ledger = RunLedger(NODE, INC)
    ledger.decide(start())
    ledger.started("job-1", 1)
    ledger.finished("job-1", 1)
    ledger.forget_finished()
    assert ledger.decide(stop()).action is Action.REPORT_STOPPED


def test_start_arriving_after_its_stop_is_not_launched():
    ledger = RunLedger(NODE, INC)
    assert ledger.decide(stop(run=4)).action is Action.REPORT_STOPPED
    assert ledger.decide(start(run=4)).action is Action.IGNORE
    assert ledger.decide(start(run=3)).action is Action.IGNORE


def begin(job="job-1", run=1, *, node=NODE, inc=INC, eid=None):
    return BeginRun(
        event_id=eid or f"begin-{job}-{run}-{inc}",
        ts_ms=0,
        node_id=node,
        incarnation=inc,
        job_id=job,
        run=run,
    )


def test_begin_releases_a_launching_run_once_and_nothing_else():
    ledger = RunLedger(NODE, INC)
    assert ledger.decide(begin(job="ghost")).action is Action.IGNORE  # nothing to release
    ledger.decide(start())
    d = ledger.decide(begin())
    assert (d.action, d.job_id, d.run) == (Action.BEGIN, "job-1", 1)
    assert ledger.decide(begin()).action is Action.IGNORE  # redelivered
    assert ledger.decide(begin(inc=INC - 1, eid="old")).action is Action.IGNORE  # fenced
    ledger.started("job-1", 1)
    d = ledger.decide(begin(eid="late"))
    assert d.action is Action.IGNORE and "running" in d.reason
    ledger.decide(stop())
    assert ledger.decide(begin(eid="after-stop")).action is Action.IGNORE


def test_checkpoint_only_for_running_runs():
    ledger = RunLedger(NODE, INC)
    ledger.decide(start())
    d = ledger.decide(ckpt(eid="c1"))
    assert d.action is Action.IGNORE and "launching" in d.reason
    ledger.started("job-1", 1)
    assert ledger.decide(ckpt(eid="c2")).action is Action.CHECKPOINT


def test_active_lists_runs_in_stable_order():
    ledger = RunLedger(NODE, INC)
    for job in ("b", "a", "c"):
        ledger.decide(start(job=job))
    ledger.finished("c", 1)
    assert [(e.job_id, e.run) for e in ledger.active()] == [("a", 1), ("b", 1)]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["j1", "j2"]),
            st.integers(1, 5),
            st.sampled_from([INC - 1, INC]),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_at_most_one_launch_per_run_and_runs_only_move_forward(script):
    ledger = RunLedger(NODE, INC)
    launched: list[tuple[str, int]] = []
    for i, (job, run, inc, is_stop) in enumerate(script):
        cmd = (
            stop(job, run, inc=inc, eid=f"e{i}")
            if is_stop
            else start(job, run, inc=inc, eid=f"e{i}")
        )
        d = ledger.decide(cmd)
        if inc != INC:
            assert d.action is Action.IGNORE
        if d.action is Action.LAUNCH:
            assert all(r < run for j, r in launched if j == job)
            launched.append((job, run))
    assert len(launched) == len(set(launched))


def test_progress_throttle_keeps_first_and_last():
    t = ProgressThrottle(min_interval_s=0.2)
    key = ("j", 1)
    sent = [
        p
        for now, p in [(0.0, 0.0), (0.05, 0.1), (0.1, 0.2), (0.25, 0.3), (0.3, 0.4), (0.31, 1.0)]
        if t.should_send(key, p, now)
    ]
    assert sent == [0.0, 0.3, 1.0]
    t.forget(key)
    assert t.should_send(key, 0.5, 5.0)


def test_progress_throttle_caps_the_rate():
    t = ProgressThrottle(min_interval_s=0.2)
    sent = sum(t.should_send(("j", 1), i / 1000, i / 100) for i in range(1, 1000))  # 10 s at 100/s
    assert sent <= 10 / 0.2 + 1


def test_step_rate_over_a_window_and_reset_on_resume():
    r = StepRate(window=4)
    assert r.rate == 0.0
    for i in range(10):
        r.add(i * 0.5, i)
    assert r.rate == 2.0
    r.add(6.0, 3)  # resumed from an earlier step
    assert r.rate == 0.0
    r.add(7.0, 5)
    assert r.rate == 2.0
