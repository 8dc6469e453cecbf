"""Following the cell's job events: queue membership, runs, terminal states.

The simulator keeps its own view of every job from the events the cell
publishes (as a projection would) and checks them against what really
happened on the simulated GPUs:

- a job is assigned only while queued, with its whole gang in one event, on
  distinct nodes, never more GPUs per node than it asked for;
- ``JobCompleted`` only for a run whose processes really completed;
- exactly one terminal event per job, and only for a submitted job.

Each broken rule is a counted invariant violation with an example.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.causes import MOVES, RunCause
from framespool.schemas.states import JobState

from .fleet import SimJob, SimRun
from .workload import idx_of

if TYPE_CHECKING:  # pragma: no cover
    from .metrics import Recorder


def placement_text(placement: tuple[ev.NodeSlice, ...]) -> str:
    """``node:gpu+gpu;node:gpu+gpu`` as runs.csv writes it."""
    return ";".join(f"{s.node_id}:{'+'.join(str(g) for g in s.gpus)}" for s in placement)


def requeue_outcome(event: ev.JobRequeued) -> str:
    """How runs.csv names a run that ended in ``event``, from its cause code:
    ``moved:<cause>`` off bad hardware, ``preempted``, ``requeued:<retry class>``
    after a failure, or plain ``requeued`` when the cause was not recorded."""
    if event.cause in MOVES:
        return f"moved:{event.cause}"
    if event.cause == RunCause.PREEMPTED:
        return RunCause.PREEMPTED
    if event.failure_class:
        return "requeued:" + event.failure_class
    return "requeued"


class JobEvents:
    """The cell-output half of ``engine.Simulation`` (a mixin): what it uses of
    the simulation is declared below, and mypy checks that Simulation provides it."""

    if TYPE_CHECKING:  # pragma: no cover
        now: int
        recorder: Recorder
        jobs: dict[str, SimJob]
        runs: dict[tuple[str, int], SimRun]
        core_queued: int
        last_progress_ms: int

    def _job(self, job_id: str, event: object) -> SimJob | None:
        job = self.jobs.get(job_id)
        if job is None:
            self.recorder.violation(
                "event_for_ended_job",
                f"{type(event).__name__} for {job_id}, which already ended or was never submitted",
            )
        return job

    def _enqueue(self, job: SimJob) -> None:
        if job.queued:
            self.recorder.violation("queued_twice", f"{job.job_id} queued while already queued")
            return
        job.queued = True
        self.core_queued += 1
        self._wait(job)

    def _wait(self, job: SimJob) -> None:
        """The job waits for GPUs (in the cell's queue or the FIFO gate): backlog."""
        if not job.waiting:
            job.waiting = True
            self.recorder.queue_change(job, +1, self.now)

    def _dequeue(self, job: SimJob) -> None:
        if job.queued:
            job.queued = False
            self.core_queued -= 1
        if job.waiting:
            job.waiting = False
            self.recorder.queue_change(job, -1, self.now)

    def _close_run(self, job: SimJob, run: int, outcome: str) -> None:
        current = job.open_run
        if current is None or current[0] != run:
            return
        job.open_run = None
        self.recorder.run_closed(job.job_id, run, current[1], current[2], self.now, outcome)

    # -- handlers, one per output type ----------------------------------------------
    def _queued(self, o: ev.JobQueued) -> None:
        job = self._job(o.job_id, o)
        if job is not None:
            if job.est_p50 < 0 and job.first_start_ms < 0:
                job.est_p50, job.est_p90 = o.wait_p50_s, o.wait_p90_s
            self._enqueue(job)

    def _estimated(self, o: ev.JobWaitEstimated) -> None:
        """A refreshed band of a queued job: each one is a forecast of the wait
        left, scored when the job first starts (``Recorder.started``)."""
        job = self.jobs.get(o.job_id)
        if job is None or job.first_start_ms >= 0 or o.wait_p50_s < 0:
            return
        if job.refreshed is None:
            job.refreshed = []
        job.refreshed.append((self.now, o.wait_p50_s, o.wait_p90_s))

    def _rejected(self, o: ev.JobRejected) -> None:
        self.recorder.count("rejected:" + o.reason)
        self._terminal(o.job_id, JobState.REJECTED)

    def _assigned(self, o: ev.JobAssigned) -> None:
        job = self._job(o.job_id, o)
        if job is None:
            return
        if not job.queued:
            self.recorder.violation(
                "assigned_while_not_queued", f"{o.job_id}#{o.run} assigned while not queued"
            )
        self._dequeue(job)
        self._check_gang(job, o)
        now = self.now
        job.runs = o.run
        if job.first_start_ms < 0:
            job.first_start_ms = now
            self.recorder.started(job, now)
        job.open_run = (o.run, now, placement_text(o.placement))
        self.runs[(o.job_id, o.run)] = SimRun(job, o.run, o.placement)
        self.last_progress_ms = now

    def _check_gang(self, job: SimJob, o: ev.JobAssigned) -> None:
        trace = job.trace
        total = sum(len(s.gpus) for s in o.placement)
        nodes = [s.node_id for s in o.placement]
        problem = ""
        if total != o.gpus or total != trace.gpus:
            problem = f"holds {total} GPUs, asked for {trace.gpus} (event says {o.gpus})"
        elif len(set(nodes)) != len(nodes):
            problem = f"names a node twice: {nodes}"
        elif any(
            len(s.gpus) > trace.gpus_per_node or len(set(s.gpus)) != len(s.gpus)
            for s in o.placement
        ):
            problem = f"over {trace.gpus_per_node} GPUs per node or a GPU twice"
        if problem:
            self.recorder.violation("bad_gang", f"{o.job_id}#{o.run} {problem}")

    def _preempted(self, o: ev.JobPreempted) -> None:
        job = self._job(o.job_id, o)
        if job is not None:
            self.recorder.count("preemptions")
            by = self.jobs.get(o.by_job_id)
            self.recorder.preempted(o.job_id, o.run, by.trace.tier if by else "?")
            self._close_run(job, o.run, RunCause.PREEMPTED)

    def _requeued(self, o: ev.JobRequeued) -> None:
        job = self._job(o.job_id, o)
        if job is not None:
            self.recorder.count("requeues")
            self._close_run(job, o.run, requeue_outcome(o))
            self._enqueue(job)

    def _completed(self, o: ev.JobCompleted) -> None:
        job = self.jobs.get(o.job_id)
        if job is not None:
            if job.completed_run != o.run:
                self.recorder.violation(
                    "completed_without_work",
                    f"{o.job_id}#{o.run} completed, but its processes never finished that run",
                )
            self._close_run(job, o.run, RunCause.COMPLETED)
        self._terminal(o.job_id, JobState.COMPLETED)

    def _failed(self, o: ev.JobFailed) -> None:
        job = self.jobs.get(o.job_id)
        if job is not None:
            self._close_run(job, o.run, f"failed:{o.failure_class}")
            self.recorder.count("failed:" + o.failure_class)
        self._terminal(o.job_id, JobState.FAILED)

    def _cancelled(self, o: ev.JobCancelled) -> None:
        job = self.jobs.get(o.job_id)
        if job is not None:
            self._close_run(job, o.run, RunCause.CANCELLED)
        self._terminal(o.job_id, JobState.CANCELLED)

    def _ignored(self, o: ev.ReportIgnored) -> None:
        self.recorder.count("ignored_reports")

    def _node_state(self, o: ev.NodeStateChanged) -> None:
        if o.gpu < 0:
            self.recorder.count(f"node_state:{o.state}")

    def _breaker(self, o: ev.BreakerTripped) -> None:
        if o.until_ms > o.ts_ms:  # a close (probe succeeded) is until_ms == ts_ms
            self.recorder.count("breakers_tripped")

    def _terminal(self, job_id: str, state: str) -> None:
        try:
            idx = idx_of(job_id)
        except ValueError:
            self.recorder.violation("terminal_for_unknown_job", f"{job_id} is not a simulated job")
            return
        first = self.recorder.terminal_event(idx, job_id)
        job = self.jobs.pop(job_id, None)
        if job is None:
            if first:
                self.recorder.violation(
                    "terminal_for_unknown_job", f"{job_id} ended ({state}) before it was submitted"
                )
            return
        self._dequeue(job)
        self.recorder.finished(job, state, self.now)
        self.last_progress_ms = self.now
