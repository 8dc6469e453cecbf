"""The job fold: lifecycle, fencing, dedupe, terminal handling, replay properties."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.projections import jobs
from framespool.projections.jobs import (
    ASSIGNED,
    CANCELLED,
    COMPLETED,
    FAILED,
    QUEUED,
    REJECTED,
    RUNNING,
    SUBMITTED,
    TIMELINE_MAX,
    apply,
    entries_after,
    fold,
    submitted_view,
)
from framespool.projections.serde import public_job, view_from_dict, view_to_dict
from framespool.schemas.events import (
    JobAssigned,
    JobCancelled,
    JobCompleted,
    JobQueued,
    JobWaitEstimated,
    NodeSlice,
    ReportIgnored,
    RunProgress,
    Shape,
    SubmitJob,
    Tick,
)
from tests.support.projections import lifecycle, spec

ROOT = Path(__file__).resolve().parents[2]


def test_happy_path_reaches_completed_with_artifact_and_timeline():
    view = fold(lifecycle("j1"))
    assert view.state == COMPLETED
    assert view.artifact_uri.endswith("video.mp4")
    assert view.progress == 1.0 and view.run == 1 and view.nodes == ("node-1",)
    assert [e.type for e in view.timeline] == [
        "JobAdmitted",
        "JobQueued",
        "JobWaitEstimated",
        "JobAssigned",
        "RunProgress",
        "JobCompleted",
    ]
    seqs = [e.seq for e in view.timeline]
    assert seqs == sorted(seqs) and seqs[-1] == view.seq


def test_each_state_is_reached_in_order():
    states = []
    view = None
    for event in lifecycle("j1", progress_steps=2):
        view = apply(view, event)
        if not states or states[-1] != view.state:
            states.append(view.state)
    assert states == [SUBMITTED, QUEUED, ASSIGNED, RUNNING, COMPLETED]


def test_wait_estimate_and_position_are_shown_while_queued():
    events = lifecycle("j1")
    view = fold(events[:3])
    assert view.state == QUEUED and view.wait_estimate_s == 12.0 and view.position == 1
    assert fold(events[:4]).wait_estimate_s == -1.0  # assigned: no more waiting


def test_preempted_and_requeued_show_as_queued_with_reason():
    events = lifecycle("j1", runs=2)
    cut = next(i for i, e in enumerate(events) if type(e).__name__ == "JobPreempted")
    view = fold(events[: cut + 1])
    assert view.state == QUEUED and view.phase == "PREEMPTED" and "preempted" in view.reason
    view = fold(events[: cut + 2])
    assert view.state == QUEUED and view.phase == "REQUEUED"


def test_progress_of_a_stale_run_is_fenced_off():
    events = lifecycle("j1", runs=2, stale_progress=True)
    view = fold(events)
    assert view.state == COMPLETED and view.run == 2
    assert view.ignored == 1
    stale = [e for e in events if isinstance(e, RunProgress) and e.run == 1 and e.progress == 0.9]
    assert stale and all(e.event_id not in [t.event_id for t in view.timeline] for e in stale)


def test_first_progress_of_current_run_means_running():
    events = lifecycle("j1")
    assigned = fold(events[:4])
    assert assigned.state == ASSIGNED
    running = apply(assigned, events[4])
    assert running.state == RUNNING and running.started_ms == events[4].ts_ms


def test_progress_for_a_job_never_seen_is_ignored():
    p = RunProgress(event_id="p", ts_ms=1, job_id="nope", run=1, node_id="n", progress=0.5)
    assert apply(None, p) is None


def _early(run: int, n: int, progress: float, ts: int = 1) -> RunProgress:
    return RunProgress(
        event_id=f"early-{run}-{n}",
        ts_ms=ts,
        job_id="j1",
        run=run,
        node_id="node-1",
        progress=progress,
        step=n,
        total_steps=4,
    )


def test_progress_read_before_its_assignment_is_held_then_shown_when_the_run_is_assigned():
    # progress and job-events are two topics read at their own pace: a run's
    # first reports can be folded before its JobAssigned
    events = lifecycle("j1", progress_steps=0)
    queued = fold(events[:3])
    held = apply(apply(queued, _early(1, 1, 0.25, ts=50)), _early(1, 2, 0.5, ts=60))
    assert held.state == QUEUED and held.ignored == 0 and held.timeline == queued.timeline
    assert public_job(held) == public_job(queued)  # not shown before the run is assigned
    running = apply(held, events[3])  # JobAssigned run 1
    assert running.state == RUNNING and running.run == 1
    assert (running.progress, running.step, running.total_steps) == (0.5, 2, 4)
    assert running.started_ms == 50  # the first report's time, not the held one's
    assert [t.type for t in running.timeline[-2:]] == ["JobAssigned", "RunProgress"]
    assert running.held_progress is None
    # an older report read after the newer one does not replace it
    again = apply(apply(held, _early(1, 0, 0.1, ts=70)), events[3])
    assert again.progress == 0.5


def test_held_progress_of_a_run_that_never_comes_is_dropped():
    events = lifecycle("j1", progress_steps=0)
    queued = fold(events[:3])
    ahead = apply(queued, _early(2, 1, 0.5))
    assigned = apply(ahead, events[3])  # run 1: the held report is for run 2, still ahead
    assert assigned.state == ASSIGNED and assigned.progress == 0.0
    assert assigned.held_progress is not None and assigned.held_progress.run == 2
    done = apply(assigned, events[-1])  # the job ends: nothing is held any more
    assert done.state == COMPLETED and done.held_progress is None
    # a newer run assigned drops a report of an older one
    assert fold([*events[:3], _early(1, 1, 0.5)], None).held_progress is not None
    stale = jobs.apply(apply(queued, _early(1, 1, 0.5)), replace(events[3], run=2, event_id="a2"))
    assert stale.run == 2 and stale.state == ASSIGNED and stale.held_progress is None
    assert stale.started_ms == 1  # run 1 reported progress: the job did start then


def test_progress_after_the_job_ended_is_not_held():
    events = lifecycle("j1")
    done = fold(events)
    later = apply(done, _early(done.run + 1, 1, 0.5))
    assert later.held_progress is None and later.state == COMPLETED


def test_progress_never_moves_backwards_within_a_run():
    events = lifecycle("j1", progress_steps=3)
    running = fold(events[:7])
    late = RunProgress(
        event_id="late",
        ts_ms=9_999,
        job_id="j1",
        run=1,
        node_id="node-1",
        progress=0.1,
        step=1,
        total_steps=4,
    )
    assert apply(running, late).progress == running.progress


def test_events_after_terminal_are_recorded_not_applied():
    done = fold(lifecycle("j1"))
    late = JobAssigned(
        event_id="late",
        ts_ms=99_999,
        job_id="j1",
        run=5,
        gpus=1,
        estimate_s=1,
        placement=(NodeSlice(node_id="n9", gpus=(0,)),),
    )
    after = apply(done, late)
    assert after.state == COMPLETED and after.run == 1 and after.nodes == ("node-1",)
    assert after.timeline[-1].event_id == "late" and "ignored" in after.timeline[-1].summary
    assert after.ignored == done.ignored + 1
    progress = RunProgress(event_id="p2", ts_ms=1, job_id="j1", run=1, node_id="n", progress=0.2)
    assert apply(after, progress).timeline == after.timeline


def test_exactly_one_terminal_event_counts():
    done = fold(lifecycle("j1", outcome="FAILED"))
    assert done.state == FAILED and "crash" in done.reason
    again = apply(done, JobCancelled(event_id="c", ts_ms=5, job_id="j1"))
    assert again.state == FAILED


def test_illegal_transition_is_recorded_with_its_reason():
    queued = fold(lifecycle("j1")[:2])
    completed_stale = JobCompleted(event_id="x", ts_ms=5, job_id="j1", run=7)
    after = apply(queued, completed_stale)
    assert after.state == QUEUED and "stale run 7" in after.timeline[-1].summary


def test_rejected_without_admission_and_cancel_while_queued():
    rejected = fold(lifecycle("j1", outcome="REJECTED"))
    assert rejected.state == REJECTED and rejected.tenant == "acme" and "quota" in rejected.reason
    events = lifecycle("j2", outcome="COMPLETED")[:2]
    cancelled = fold(
        events + [JobCancelled(event_id="c", ts_ms=5_000, job_id="j2", reason="cancelled by alice")]
    )
    assert cancelled.state == CANCELLED and cancelled.finished_ms == 5_000


def test_report_ignored_is_recorded_on_the_job():
    view = fold(lifecycle("j1")[:4])
    after = apply(
        view, ReportIgnored(event_id="ri", ts_ms=5, subject="j1", reason="stale incarnation")
    )
    assert after.state == ASSIGNED and "stale incarnation" in after.timeline[-1].summary


def test_events_of_other_kinds_are_no_ops():
    view = fold(lifecycle("j1")[:2])
    assert apply(view, Tick(event_id="t", ts_ms=1, cell="cell-0", now_ms=1)) is view
    assert jobs.job_id_of(Tick(event_id="t", ts_ms=1, cell="c", now_ms=1)) is None


def test_duplicate_event_id_is_a_no_op():
    events = lifecycle("j1")
    view = fold(events)
    for e in events:
        assert apply(view, e) is view


def test_provisional_view_then_log_equals_log_alone():
    events = lifecycle("j1")
    cmd = SubmitJob(event_id="s", ts_ms=1_000, spec=events[0].spec)
    provisional = submitted_view(cmd.spec, cmd.ts_ms)
    assert provisional.state == SUBMITTED and provisional.timeline == ()
    assert fold(events, provisional) == fold(events)


def test_provisional_view_is_the_spec_applied_to_an_empty_view():
    s = replace(
        lifecycle("j1")[0].spec,
        params={"b": "2", "a": "1"},
        shapes=(Shape(gpus=2, gpus_per_node=2, estimate_s=5.0),),
        callback_url="https://hook",
        preemptible=True,
    )
    for submitted_ms in (0, 700):
        s = replace(s, submitted_ms=submitted_ms)
        empty = jobs.JobView(job_id=s.job_id, created_ms=s.submitted_ms or 1_000, updated_ms=1_000)
        assert submitted_view(s, 1_000) == jobs._with_spec(empty, s)


def test_progress_and_wait_entries_coalesce_but_lifecycle_stays():
    events = lifecycle("j1", progress_steps=500)[:-1]
    view = fold(events)
    assert sum(1 for e in view.timeline if e.type == "RunProgress") == 1
    assert view.timeline[0].type == "JobAdmitted"
    waits = [
        JobWaitEstimated(event_id=f"w{i}", ts_ms=i, job_id="j9", wait_estimate_s=i, position=1)
        for i in range(300)
    ]
    queued = fold([JobQueued(event_id="q", ts_ms=0, job_id="j9", tenant="t", tier="free")] + waits)
    assert len(queued.timeline) == 2 and queued.wait_estimate_s == 299


def test_timeline_is_bounded():
    events = [JobQueued(event_id="q", ts_ms=0, job_id="j", tenant="t", tier="free")]
    events += [
        ReportIgnored(event_id=f"r{i}", ts_ms=i, subject="j", reason="x")
        for i in range(TIMELINE_MAX * 2)
    ]
    view = fold(events)
    assert len(view.timeline) == TIMELINE_MAX and view.timeline[-1].seq == view.seq


def test_entries_after_gives_the_sse_backlog():
    view = fold(lifecycle("j1"))
    assert [e.seq for e in entries_after(view, 3)] == [e.seq for e in view.timeline if e.seq > 3]
    assert entries_after(view, view.seq) == ()


def test_serde_round_trips_and_public_form_is_json():
    view = fold(lifecycle("j1", runs=2, callback_url="https://example.com/hook"))
    doc = json.loads(json.dumps(view_to_dict(view)))
    assert view_from_dict(doc) == view
    pub = public_job(view)
    assert "seen" not in pub and pub["state"] == COMPLETED
    json.dumps(pub)


def test_spec_fingerprint_ignores_ids_and_time():
    a = spec("j1", submitted_ms=1)
    b = spec("j2", submitted_ms=2)
    assert jobs.spec_fingerprint(a) == jobs.spec_fingerprint(b)
    assert jobs.spec_fingerprint(a) != jobs.spec_fingerprint(spec("j1", prompt="other"))


# --------------------------------------------------------------------------
# Purity
# --------------------------------------------------------------------------
# --------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------
OUTCOMES = st.sampled_from(["COMPLETED", "FAILED", "CANCELLED", "REJECTED", "RUNNING"])


@st.composite
def job_streams(draw):
    streams = {}
    for i in range(draw(st.integers(1, 4))):
        outcome = draw(OUTCOMES)
        events = lifecycle(
            f"job-{i}",
            ts0=1_000 * (i + 1),
            runs=draw(st.integers(1, 3)),
            progress_steps=draw(st.integers(0, 4)),
            outcome="COMPLETED" if outcome == "RUNNING" else outcome,
            callback_url=draw(st.sampled_from([None, "https://example.com/h"])),
        )
        if outcome == "RUNNING":
            events = events[:-1]
        streams[f"job-{i}"] = events
    return streams


@st.composite
def interleaved_with_duplicates(draw, streams):
    """Per-job order kept, jobs interleaved, earlier events re-delivered later."""
    cursors = {job: 0 for job in streams}
    out = []
    while any(cursors[j] < len(streams[j]) for j in streams):
        job = draw(st.sampled_from(sorted(j for j in streams if cursors[j] < len(streams[j]))))
        out.append(streams[job][cursors[job]])
        cursors[job] += 1
        if draw(st.integers(0, 3)) == 0:
            out.append(streams[job][draw(st.integers(0, cursors[job] - 1))])
    return out


def fold_all(events):
    views = {}
    for e in events:
        job = jobs.job_id_of(e)
        views[job] = apply(views.get(job), e)
    return views


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_shuffled_duplicated_stream_folds_like_the_clean_one(data):
    streams = data.draw(job_streams())
    clean = {job: fold(events) for job, events in streams.items()}
    noisy = data.draw(interleaved_with_duplicates(streams))
    assert fold_all(noisy) == clean


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_truncate_and_replay_is_idempotent(data):
    streams = data.draw(job_streams())
    events = data.draw(interleaved_with_duplicates(streams))
    k = data.draw(st.integers(0, len(events)))
    partial = fold_all(events[:k])
    replayed = dict(partial)
    for e in events:  # the consumer restarted from the beginning of the log
        job = jobs.job_id_of(e)
        replayed[job] = apply(replayed.get(job), e)
    assert replayed == fold_all(events)
    # and a view that went through the store's JSON form folds on identically
    through_json = {
        j: view_from_dict(json.loads(json.dumps(view_to_dict(v)))) for j, v in partial.items()
    }
    for e in events[k:]:
        job = jobs.job_id_of(e)
        through_json[job] = apply(through_json.get(job), e)
    assert through_json == fold_all(events)


@st.composite
def progress_read_ahead(draw, events):
    """One job's events as the projection's two consumers can fold them when the
    progress reader is ahead: job events in log order, each report read at the
    latest where the log has it and as early as right after any job event before
    it (job events and progress are two topics, read at their own pace)."""
    ahead = [(pos, e) for pos, e in enumerate(events) if isinstance(e, RunProgress)]
    out = []
    for pos, event in enumerate(events):
        if isinstance(event, RunProgress):
            continue
        while ahead and ahead[0][0] < pos:
            out.append(ahead.pop(0)[1])
        out.append(event)
        for _ in range(draw(st.integers(0, len(ahead)))):
            out.append(ahead.pop(0)[1])
    return out + [e for _, e in ahead]


@st.composite
def merged(draw, sequences):
    """Several jobs' sequences interleaved, each kept in its order."""
    queues = [list(q) for q in sequences]
    out = []
    while any(queues):
        i = draw(st.sampled_from([i for i, q in enumerate(queues) if q]))
        out.append(queues[i].pop(0))
    return out


# what reading progress ahead may show differently: the timeline's numbering
# (held reports are shown as one entry) and the time of the last update
_ORDER_DEPENDENT = ("timeline", "updated_ms")


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_progress_read_ahead_of_its_assignment_ends_as_in_log_order(data):
    streams = {}
    for i in range(data.draw(st.integers(1, 3))):
        outcome = data.draw(OUTCOMES)
        events = lifecycle(
            f"job-{i}",
            ts0=1_000 * (i + 1),
            runs=data.draw(st.integers(1, 3)),
            progress_steps=data.draw(st.integers(1, 4)),
            outcome="COMPLETED" if outcome == "RUNNING" else outcome,
            stale_progress=False,
        )
        streams[f"job-{i}"] = events[:-1] if outcome == "RUNNING" else events
    clean = {job: fold(events) for job, events in streams.items()}
    ahead = [data.draw(progress_read_ahead(events)) for events in streams.values()]
    folded = fold_all(data.draw(merged(ahead)))
    for job, view in clean.items():
        want = {k: v for k, v in public_job(view).items() if k not in _ORDER_DEPENDENT}
        got = {k: v for k, v in public_job(folded[job]).items() if k not in _ORDER_DEPENDENT}
        assert got == want
        assert folded[job].held_progress is None
