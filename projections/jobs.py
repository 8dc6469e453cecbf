"""The job read model: a pure fold of ``job-events`` and ``progress`` into one view per job.

Theory of operation
-------------------
``apply(view, event) -> view`` is the whole projection; it does no IO, reads no
clock and is deterministic, so truncate-and-replay rebuilds the same views.

1. **Dedupe.** The log is at-least-once and a crashed writer re-emits outputs
   with the same ``event_id``. A view remembers the ids of its last
   ``SEEN_MAX`` events (applied, recorded or ignored); a repeated id is a no-op.
   Progress records are also checked for monotonicity within a run, so a late
   duplicate older than the window cannot move progress backwards.
2. **Lifecycle as data.** ``TRANSITIONS`` lists, per event type, the states it
   may arrive in and the state it leads to. An event that arrives in another
   state is recorded in the timeline as ignored and changes nothing else.
3. **Fencing.** ``JobAssigned`` starts run ``n`` (the job's fencing epoch). A
   report that names an older run is stale and ignored (progress is only
   counted, it would flood the timeline). The first progress of the current
   run means RUNNING. Progress and job events come from two topics, read by
   two consumers, each at its own pace, so progress of run ``n`` can be read
   before ``JobAssigned`` of run ``n``: the view holds the newest such report
   (one, ``held_progress``, with the time of the job's first, ``held_since_ms``) and applies it right
   after that ``JobAssigned``, drops it when an even newer run is assigned or
   the job ends. Held progress is not shown (the run is not assigned yet in
   the view) and one report per job at most is held, so a report for a run
   that never comes costs one event.
4. **Terminal jobs** (COMPLETED, FAILED, CANCELLED, REJECTED) never change state
   again; later events are recorded as ignored.
5. **Timeline.** Every applied or recorded event appends a ``TimelineEntry``
   with a per-job ``seq`` (1, 2, ...), the SSE event id. Consecutive progress
   (or wait-estimate) entries of the same run replace each other under a new
   seq, so the bounded timeline keeps the lifecycle and the latest progress.

PREEMPTED and REQUEUED are shown as state QUEUED with ``phase`` naming them and
``reason`` saying why; the view's ``state`` is what a user acts on. While a job
waits, ``reason`` and ``reason_code`` are the cell's latest why (its
``JobQueued``/``JobWaitEstimated``: ``framespool.schemas.waits``) and
``position`` its place in the cell's order; a refresh without a band (the
reason alone, or a reservation's) keeps the band told before. A run whose
agent reports it is writing a checkpoint (``RunProgress.phase``) is
CHECKPOINTING until its next progress. A job a cell
gave up (``JobRerouted``: it could not run it) is SUBMITTED again, phase
REROUTED, with the reason, until admission's next ``JobAdmitted`` names its new
cell, which numbers its runs on from the last one and resumes its checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from framespool.schemas.events import (
    JobAdmitted,
    JobAssigned,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobQueued,
    JobRejected,
    JobRequeued,
    JobRerouted,
    JobSpec,
    JobWaitEstimated,
    ReportIgnored,
    RunProgress,
    Shape,
)
from framespool.schemas.states import JobState

SUBMITTED = "SUBMITTED"  # the view's own state: accepted by the API, not yet queued by a cell
QUEUED, ASSIGNED, RUNNING = JobState.QUEUED, JobState.ASSIGNED, JobState.RUNNING
CHECKPOINTING = JobState.CHECKPOINTING
COMPLETED, FAILED, CANCELLED = JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED
REJECTED = JobState.REJECTED
STATES = (
    SUBMITTED,
    QUEUED,
    ASSIGNED,
    RUNNING,
    CHECKPOINTING,
    COMPLETED,
    FAILED,
    CANCELLED,
    REJECTED,
)
TERMINAL_STATES = frozenset({COMPLETED, FAILED, CANCELLED, REJECTED})
ACTIVE_STATES = frozenset(STATES) - TERMINAL_STATES

SEEN_MAX = 256  # event ids remembered per job for dedupe
TIMELINE_MAX = 100  # timeline entries kept per job
COALESCED_TYPES = frozenset({"RunProgress", "JobWaitEstimated"})

# event type -> (states it may arrive in, state it leads to; None = unchanged)
TRANSITIONS: dict[str, tuple[frozenset[str], str | None]] = {
    "JobAdmitted": (frozenset({SUBMITTED}), SUBMITTED),
    "JobQueued": (frozenset({SUBMITTED, QUEUED}), QUEUED),
    "JobWaitEstimated": (frozenset({SUBMITTED, QUEUED}), None),
    "JobAssigned": (frozenset({SUBMITTED, QUEUED}), ASSIGNED),
    "RunProgress": (frozenset({ASSIGNED, RUNNING, CHECKPOINTING}), RUNNING),
    "JobPreempted": (frozenset({ASSIGNED, RUNNING, CHECKPOINTING}), QUEUED),
    "JobRequeued": (frozenset({ASSIGNED, RUNNING, CHECKPOINTING, QUEUED}), QUEUED),
    "JobCancelled": (ACTIVE_STATES, CANCELLED),
    "JobCompleted": (ACTIVE_STATES, COMPLETED),
    "JobFailed": (ACTIVE_STATES, FAILED),
    "JobRejected": (ACTIVE_STATES, REJECTED),
    "JobRerouted": (frozenset({SUBMITTED, QUEUED}), SUBMITTED),
    "ReportIgnored": (frozenset(STATES), None),
}
JOB_EVENT_TYPES = frozenset(TRANSITIONS)


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One line of a job's history: the SSE event and the dashboard row."""

    seq: int
    event_id: str
    ts_ms: int
    type: str
    state: str
    summary: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobView:
    """What the API answers about a job."""

    job_id: str
    tenant: str = ""
    user: str = ""
    tier: str = ""
    model: str = ""
    model_version: str = ""
    prompt: str = ""
    params: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    gpus_per_node: int = 0
    shapes: tuple[Shape, ...] = ()
    preemptible: bool = False
    callback_url: str | None = None
    cell: str = ""
    state: str = SUBMITTED
    phase: str = ""  # PREEMPTED / REQUEUED while shown as QUEUED
    run: int = 0
    nodes: tuple[str, ...] = ()
    assigned_gpus: int = 0
    progress: float = 0.0
    step: int = 0
    total_steps: int = 0
    progress_message: str = ""
    wait_estimate_s: float = -1.0
    wait_p50_s: float = -1.0  # calibrated wait band while queued; -1 = unknown
    wait_p90_s: float = -1.0
    position: int = 0
    reason: str = ""
    reason_code: str = ""  # why it waits, while it does (framespool.schemas.waits)
    artifact_uri: str = ""
    created_ms: int = 0
    updated_ms: int = 0
    started_ms: int = 0
    finished_ms: int = 0
    request_hash: str = ""  # fingerprint of the submission (idempotency)
    ignored: int = 0  # stale or illegal events seen for this job
    seq: int = 0
    timeline: tuple[TimelineEntry, ...] = ()
    seen: tuple[str, ...] = ()
    # the newest RunProgress of a run newer than ``run``, and the time of the
    # job's first report held (theory of operation 3)
    held_progress: RunProgress | None = None
    held_since_ms: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


# --------------------------------------------------------------------------
# Helpers used by the API and the shells
# --------------------------------------------------------------------------
def spec_fingerprint(spec: JobSpec) -> str:
    """Hash of what the user asked for, to tell a resubmission from a new request."""
    doc = {
        "tenant": spec.tenant,
        "user": spec.user,
        "tier": spec.tier,
        "model": spec.model,
        "model_version": spec.model_version,
        "prompt": spec.prompt,
        "params": dict(sorted(spec.params.items())),
        "gpus": spec.gpus,
        "gpus_per_node": spec.gpus_per_node,
        "preemptible": spec.preemptible,
        "callback_url": spec.callback_url,
        "shapes": [[s.gpus, s.gpus_per_node, s.estimate_s] for s in spec.shapes],
    }
    # resources count too; each is hashed only when it differs from JobSpec's default,
    # so the fingerprints of requests that never named them stay what they were
    for name in ("estimate_s", "gpu_type", "cpus", "mem_gb", "checkpoint_interval_s"):
        value = getattr(spec, name)
        if value != _SPEC_DEFAULTS[name]:
            doc[name] = value
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


_SPEC_DEFAULTS = {f.name: f.default for f in fields(JobSpec)}


def submitted_view(spec: JobSpec, ts_ms: int) -> JobView:
    """The provisional view the API stores right after writing ``SubmitJob``.

    It has no timeline entries, so a view rebuilt from the log alone (which
    starts at ``JobAdmitted``) carries the same sequence numbers. It is the
    view ``_with_spec`` would make of an empty one, built in one constructor
    call (the API builds one per submission; ``dataclasses.replace`` of a
    whole view costs about as much again). Cost: that call plus
    ``spec_fingerprint`` (one JSON encode and one SHA-256 of the request).
    """
    return JobView(
        job_id=spec.job_id,
        **_spec_fields(spec),
        created_ms=spec.submitted_ms or ts_ms,
        updated_ms=ts_ms,
        request_hash=spec_fingerprint(spec),
    )


def job_id_of(event: Any) -> str | None:
    """The job an event belongs to, or None for events this fold does not take."""
    name = type(event).__name__
    if name not in JOB_EVENT_TYPES:
        return None
    if isinstance(event, JobAdmitted):
        return event.spec.job_id
    if isinstance(event, ReportIgnored):
        return event.subject
    return event.job_id


def entries_after(view: JobView, seq: int) -> tuple[TimelineEntry, ...]:
    """Timeline entries newer than ``seq`` (the SSE backlog after Last-Event-ID)."""
    return tuple(e for e in view.timeline if e.seq > seq)


# --------------------------------------------------------------------------
# The fold
# --------------------------------------------------------------------------
def apply(view: JobView | None, event: Any) -> JobView | None:
    """Fold one event into a job's view; returns the view unchanged for no-ops."""
    name = type(event).__name__
    if name not in TRANSITIONS:
        return view
    if view is None:
        view = _new_view(event)
        if view is None:
            return None
    if event.event_id in view.seen:
        return view
    allowed_from, _ = TRANSITIONS[name]
    if isinstance(event, RunProgress):
        if event.run > view.run and not view.terminal:
            return _hold_progress(view, event)
        if view.state not in allowed_from or event.run != view.run or _older_progress(view, event):
            return _ignore_silently(view, event)
        return _finish(_progress(view, event), event, _progress_summary(event))
    if view.terminal and name != "ReportIgnored":
        return _record_ignored(view, event, f"job already {view.state}")
    if view.state not in allowed_from:
        return _record_ignored(view, event, f"{name} is not legal in state {view.state}")
    stale = _stale_run(view, event)
    if stale:
        return _record_ignored(view, event, stale)
    new_view, summary = _HANDLERS[name](view, event)
    new_view = _finish(new_view, event, summary)
    if new_view.held_progress is not None:
        new_view = _release_held(new_view, new_view.held_progress)
    return new_view


def fold(events, view: JobView | None = None) -> JobView | None:
    """Apply events in order (replay, tests)."""
    for event in events:
        view = apply(view, event)
    return view


def _new_view(event: Any) -> JobView | None:
    if isinstance(event, JobAdmitted):
        return JobView(job_id=event.spec.job_id, created_ms=event.spec.submitted_ms or event.ts_ms)
    if isinstance(event, (JobRejected, JobQueued)):
        return JobView(job_id=event.job_id, tenant=event.tenant, created_ms=event.ts_ms)
    return None  # progress or decisions for a job this projection never saw


def _stale_run(view: JobView, event: Any) -> str:
    if isinstance(event, JobAssigned):
        return "" if event.run > view.run else f"run {event.run} is not newer than run {view.run}"
    if isinstance(event, (JobPreempted, JobRequeued, JobCompleted, JobFailed)):
        if event.run not in (0, view.run):
            return f"stale run {event.run}; current run is {view.run}"
    return ""


def _older_progress(view: JobView, event: RunProgress) -> bool:
    return view.state in (RUNNING, CHECKPOINTING) and (event.step, event.progress) < (
        view.step,
        view.progress,
    )


def _hold_progress(view: JobView, event: RunProgress) -> JobView:
    """Keep ``event`` (of a run newer than the view's) unless a newer report is held."""
    held = view.held_progress
    seen = _remember(view, event.event_id)
    if held is None:
        return replace(view, held_progress=event, held_since_ms=event.ts_ms, seen=seen)
    newest = max(event, held, key=lambda p: (p.run, p.step, p.progress))  # a tie: the later
    since = min(event.ts_ms, view.held_since_ms)
    return replace(view, held_progress=newest, held_since_ms=since, seen=seen)


def _release_held(view: JobView, held: RunProgress) -> JobView:
    """After a job event: apply held progress of the run now assigned, drop it if
    the job ended or moved past its run, keep it while its run is still ahead."""
    if held.run > view.run and not view.terminal:
        return view
    since = view.held_since_ms
    view = replace(view, held_progress=None, held_since_ms=0)
    if view.terminal:
        return view
    started = replace(view, started_ms=view.started_ms or since)
    if held.run != view.run or view.state != ASSIGNED:  # a newer run was assigned: it did run
        return started
    return _finish(_progress(started, held), held, _progress_summary(held))


def _remember(view: JobView, event_id: str) -> tuple[str, ...]:
    return (view.seen + (event_id,))[-SEEN_MAX:]


def _ignore_silently(view: JobView, event: Any) -> JobView:
    return replace(view, seen=_remember(view, event.event_id), ignored=view.ignored + 1)


def _record_ignored(view: JobView, event: Any, why: str) -> JobView:
    counted = replace(view, ignored=view.ignored + 1)
    return _finish(counted, event, f"ignored: {why}", coalesce=False)


def _finish(view: JobView, event: Any, summary: str, *, coalesce: bool = True) -> JobView:
    seq = view.seq + 1
    name = type(event).__name__
    entry = TimelineEntry(seq, event.event_id, event.ts_ms, name, view.state, summary)
    timeline = view.timeline
    if (
        coalesce
        and name in COALESCED_TYPES
        and timeline
        and timeline[-1].type == name
        and _same_phase(timeline[-1].state, view.state)
    ):
        timeline = timeline[:-1]
    timeline = (timeline + (entry,))[-TIMELINE_MAX:]
    return replace(
        view,
        seq=seq,
        timeline=timeline,
        seen=_remember(view, event.event_id),
        updated_ms=max(view.updated_ms, event.ts_ms),
    )


def _same_phase(a: str, b: str) -> bool:
    """Whether two timeline entries of one type replace each other: the same state,
    or a run's progress while running and checkpointing (a checkpoint every few
    seconds would push the lifecycle out of the bounded timeline)."""
    return a == b or {a, b} <= {RUNNING, CHECKPOINTING}


def _spec_fields(spec: JobSpec) -> dict[str, Any]:
    """The view's fields that come from the job's spec (one place for the
    provisional view and the view a ``JobAdmitted`` fills in)."""
    return {
        "tenant": spec.tenant,
        "user": spec.user,
        "tier": spec.tier,
        "model": spec.model,
        "model_version": spec.model_version,
        "prompt": spec.prompt,
        "params": dict(spec.params),
        "gpus": spec.gpus,
        "gpus_per_node": spec.gpus_per_node,
        "shapes": tuple(spec.shapes),
        "preemptible": spec.preemptible,
        "callback_url": spec.callback_url,
    }


def _with_spec(view: JobView, spec: JobSpec) -> JobView:
    return replace(
        view, **_spec_fields(spec), request_hash=view.request_hash or spec_fingerprint(spec)
    )


# --------------------------------------------------------------------------
# Handlers: (view, event) -> (view, summary); legality was checked by apply()
# --------------------------------------------------------------------------
def _admitted(v: JobView, e: JobAdmitted):
    v = replace(_with_spec(v, e.spec), cell=e.cell, state=SUBMITTED)
    return v, f"admitted to {e.cell or 'a cell'}: {e.spec.gpus} GPU(s), tier {e.spec.tier}"


def _queued(v: JobView, e: JobQueued):
    v = replace(
        v,
        state=QUEUED,
        tier=e.tier or v.tier,
        tenant=v.tenant or e.tenant,
        wait_estimate_s=e.wait_estimate_s,
        wait_p50_s=e.wait_p50_s,
        wait_p90_s=e.wait_p90_s,
        position=e.position,
        reason=e.reason or v.reason,
        reason_code=e.reason_code,
    )
    text = _wait_text(e.position, e.wait_estimate_s, e.wait_p50_s, e.wait_p90_s)
    return v, f"queued{text}" + (f": {e.reason}" if e.reason_code else "")


def _wait(v: JobView, e: JobWaitEstimated):
    banded = e.wait_p50_s >= 0 and e.wait_p90_s >= 0  # else the band told before stands
    v = replace(
        v,
        wait_estimate_s=e.wait_estimate_s,
        wait_p50_s=e.wait_p50_s if banded else v.wait_p50_s,
        wait_p90_s=e.wait_p90_s if banded else v.wait_p90_s,
        position=e.position or v.position,
        reason=e.reason if e.reason_code else v.reason,
        reason_code=e.reason_code or v.reason_code,
    )
    text = _wait_text(v.position, e.wait_estimate_s, v.wait_p50_s, v.wait_p90_s)
    return v, f"wait estimate{text}" + (f": {e.reason}" if e.reason_code else "")


def _assigned(v: JobView, e: JobAssigned):
    nodes = tuple(s.node_id for s in e.placement)
    v = replace(
        v,
        state=ASSIGNED,
        phase="",
        run=e.run,
        nodes=nodes,
        assigned_gpus=e.gpus,
        reason=e.reason,
        reason_code="",
        position=0,
        wait_estimate_s=-1.0,
        wait_p50_s=-1.0,
        wait_p90_s=-1.0,
        step=0,
        total_steps=0,
        progress=v.progress if e.resume_from else 0.0,
    )
    resumed = f", resuming from {e.resume_from}" if e.resume_from else ""
    return v, f"run {e.run} assigned {e.gpus} GPU(s) on {', '.join(nodes) or '?'}{resumed}"


def _progress(v: JobView, e: RunProgress) -> JobView:
    return replace(
        v,
        state=CHECKPOINTING if e.phase == CHECKPOINTING else RUNNING,
        progress=min(1.0, max(0.0, e.progress)),
        step=e.step,
        total_steps=e.total_steps,
        progress_message=e.message,
        started_ms=v.started_ms or e.ts_ms,
    )


def _progress_summary(e: RunProgress) -> str:
    steps = f" (step {e.step}/{e.total_steps})" if e.total_steps else ""
    verb = " checkpointing at" if e.phase == CHECKPOINTING else ""
    return f"run {e.run}{verb} {min(1.0, max(0.0, e.progress)):.0%}{steps}" + (
        f": {e.message}" if e.message else ""
    )


def _replace_named(text: str, prefix: str, end: str, keep: str, replacement: str) -> str:
    """Each ``prefix<name><end>`` in ``text`` whose name is not ``keep`` becomes ``replacement``
    (``end`` is kept; a missing ``end`` means the name runs to the next space)."""
    out, i = [], 0
    while (start := text.find(prefix, i)) >= 0:
        name_at = start + len(prefix)
        stop = text.find(end, name_at)
        space = text.find(" ", name_at)
        if stop < 0 or (0 <= space < stop):
            stop = space if space >= 0 else len(text)
            tail = ""
        else:
            tail = end
        name = text[name_at:stop]
        out.append(text[i:start])
        out.append(text[start : stop + len(tail)] if name == keep else replacement + tail)
        i = stop + len(tail)
    return "".join(out) + text[i:]


def _about_others(text: str, v: JobView, by_job_id: str = "") -> str:
    """``text`` without the preempting job's id or another tenant's name: the view is
    shown to the preempted job's tenant, who may learn that, not by whom."""
    text = _replace_named(text, "preempted by ", ":", v.job_id, "preempted by another job")
    if by_job_id and by_job_id != v.job_id:
        text = text.replace(by_job_id, "another job")
    own_capacity = f"capacity of {v.tenant}/"
    if own_capacity in text:
        return text
    return _replace_named(text, "capacity of ", " ", "", "capacity of another tenant")


def _preempted(v: JobView, e: JobPreempted):
    by = " by another job" if e.by_job_id else ""
    why = _about_others(e.reason, v, e.by_job_id)
    v = replace(v, state=QUEUED, phase="PREEMPTED", reason=f"preempted{by}: {why}", reason_code="")
    return v, f"run {e.run} preempted{by}: {why}"


def _requeued(v: JobView, e: JobRequeued):
    why = _about_others(e.reason, v)
    v = replace(v, state=QUEUED, phase="REQUEUED", reason=f"requeued: {why}", reason_code="")
    ckpt = f" from {e.resume_from}" if e.resume_from else ""
    return v, f"run {e.run} requeued{ckpt}: {why} ({e.retries_left} retries left)"


def _rerouted(v: JobView, e: JobRerouted):
    v = replace(
        v,
        state=SUBMITTED,
        phase="REROUTED",
        reason=f"rerouted from {e.from_cell}: {e.reason}",
        reason_code="",
        position=0,
        wait_estimate_s=-1.0,
        wait_p50_s=-1.0,
        wait_p90_s=-1.0,
    )
    return v, f"rerouted from {e.from_cell}: {e.reason}"


def _terminal(state: str, summary: Callable[[Any], str], reason: Callable[[Any], str]):
    def handler(v: JobView, e: Any):
        v = replace(
            v,
            state=state,
            phase="",
            reason=reason(e),
            reason_code="",
            finished_ms=e.ts_ms,
            artifact_uri=getattr(e, "artifact_uri", "") or v.artifact_uri,
            progress=1.0 if state == COMPLETED else v.progress,
            position=0,
            wait_estimate_s=-1.0,
            wait_p50_s=-1.0,
            wait_p90_s=-1.0,
        )
        return v, summary(e)

    return handler


def _report_ignored(v: JobView, e: ReportIgnored):
    return replace(
        v, ignored=v.ignored + 1
    ), f"scheduler ignored a report ({e.code or 'unrecorded'}): {e.reason}"


def _wait_text(position: int, wait_s: float, p50_s: float = -1.0, p90_s: float = -1.0) -> str:
    parts = []
    if position > 0:
        parts.append(f"position {position}")
    if wait_s >= 0:
        parts.append(f"~{wait_s:.0f}s wait")
    if p50_s >= 0 and p90_s >= 0:
        parts.append(f"P50 {p50_s:.0f}s, P90 {p90_s:.0f}s")
    return f" ({', '.join(parts)})" if parts else ""


_HANDLERS: dict[str, Callable[[JobView, Any], tuple[JobView, str]]] = {
    "JobAdmitted": _admitted,
    "JobQueued": _queued,
    "JobWaitEstimated": _wait,
    "JobAssigned": _assigned,
    "JobPreempted": _preempted,
    "JobRequeued": _requeued,
    "JobRerouted": _rerouted,
    "JobCancelled": _terminal(CANCELLED, lambda e: f"cancelled: {e.reason}", lambda e: e.reason),
    "JobCompleted": _terminal(
        COMPLETED, lambda e: f"run {e.run} completed: {e.artifact_uri}", lambda e: ""
    ),
    "JobFailed": _terminal(
        FAILED,
        lambda e: f"run {e.run} failed ({e.failure_class}): {e.reason}",
        lambda e: f"{e.failure_class}: {e.reason}" if e.failure_class else e.reason,
    ),
    "JobRejected": _terminal(
        REJECTED,
        lambda e: f"rejected: {e.reason}" + (f" ({e.detail})" if e.detail else ""),
        lambda e: f"{e.reason}: {e.detail}" if e.detail else e.reason,
    ),
    "ReportIgnored": _report_ignored,
}
