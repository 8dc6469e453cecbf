"""Job handlers: admission into the cell, cancellation, and run reports.

Every agent report is fenced before it may change anything: the run must be
the job's current attempt, held on the reporting node, under the node's
current incarnation; otherwise it is recorded as ignored and changes nothing.
A fenced report then asks the lifecycle table (``Cell.refused``) before it
changes anything; a transition the table refuses is recorded the same way.
Every run that ends other than by completion or cancellation carries a
``RunCause`` code in its ``JobRequeued``/``JobFailed``.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any, cast

from framespool.schemas import events as ev
from framespool.schemas.causes import NODE_LOST, RETRY_CLASS, RunCause, of_failure_class
from framespool.schemas.refusals import IgnoreCode
from framespool.schemas.states import JobState, RunPhase

from . import lifecycle as lc
from .fairshare import Flow
from .model import Job, Run

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

MAX_GPUS_PER_JOB = 64


# jobs whose GPU-seconds ``own_place`` sums one by one on the side it counts
# from; beyond them it counts the flow's mean cost per job
OWN_PLACE_EXACT = 256


class JobHandlers:
    # -- admission ----------------------------------------------------------
    def on_job_admitted(self: Cell, event: ev.JobAdmitted) -> None:
        spec = event.spec
        if spec.job_id in self.jobs or spec.job_id in self.finished:
            self.ignore(
                spec.job_id, IgnoreCode.DUPLICATE, "duplicate submission: job already known", event
            )
            return
        problem = self.admission_problem(spec)
        if problem:
            self.reject(spec, *problem)
            return
        job = Job(spec, spec.tier, self.now_ms)
        # a job another cell gave up (drain.py) goes on from its runs and checkpoint there
        job.run, job.checkpoint = event.run, event.resume_from
        job.cost = self.cost_of(job, spec.gpus, spec.estimate_s)
        # No rejection by predicted wait here: the tier's limit is the edge's, at
        # submit, from the cells' offers (``offers.wait_refusal``), so a job the API
        # accepted is never rejected later for its wait.
        self.jobs[spec.job_id] = job
        self.shift_depth(job.tier, job.tenant, jobs=1)
        self.enqueue(job, requeued=False)
        # The JobQueued goes out first but is told its wait after the admission's
        # pass: a job that started in it waited 0; one the pass passed over
        # waits, whatever the free GPUs look like (a reservation, a guarantee or
        # a cap holds them: 46 % of batch jobs told "fits the free GPUs now"
        # waited, a quarter of them over 6,000 s, multitenant 10,000 jobs).
        place = self.hold_output()
        fits = self.fits_free_now(job)
        if fits:
            self.schedule(full=False)
        position, code, why = 0, "", ""
        if job.state is JobState.QUEUED:
            terms = self.wait_terms()
            # its place in its flow's order (by size: not always the last)
            own_jobs, own_gpu_s = self.own_place(job)
            served: list[float] = []
            ahead = self.predicted_wait_s(
                job, own_gpu_s, passed_over=True, terms=terms, ahead_out=served
            )
            # held while it fit: most such jobs start at the next full pass
            # (waitbands.py, 7.), so they learn their own bands
            key = self.band_key(job)  # its tier and shape class
            self.wait_bands.admitted(spec.job_id, key, self.now_ms, ahead, held=fits)
            depth = self.wait_depth(ahead, job.shape[0], terms)
            p50, p90 = self.wait_bands.band(key, ahead, depth, held=fits)
            self.wait_bands.told(spec.job_id, p50)  # its P50's correction (waitbands 11.)
            others = served[0] - own_gpu_s if served else 0.0
            position = self.position_of(own_jobs - 1, others, self.mean_queued_cost())
            types = self.free_by_type() if spec.gpu_type else None
            code, why = self.wait_reason(job, position, types)
            job.wait_code = code
        else:
            ahead = p50 = p90 = 0.0
            why = "started in its admission's pass"
        job.wait_estimate_s = ahead
        self.emit_held(
            place,
            ev.JobQueued,
            job_id=spec.job_id,
            tenant=spec.tenant,
            tier=spec.tier,
            wait_estimate_s=round(ahead, 3),
            wait_p50_s=round(p50, 3),
            wait_p90_s=round(p90, 3),
            position=position,
            reason=why,
            reason_code=code,
        )

    def admission_problem(self: Cell, spec: ev.JobSpec) -> tuple[str, str] | None:
        tier = self.config.tier(spec.tier)
        if tier is None:
            names = ", ".join(t.name for t in self.config.tiers)
            return "invalid_tier", f"tier {spec.tier!r} is unknown; use one of: {names}"
        for gpus, per_node, estimate in [
            (s.gpus, s.gpus_per_node, s.estimate_s) for s in spec.shapes
        ] + [(spec.gpus, spec.gpus_per_node, spec.estimate_s)]:
            if not 1 <= gpus <= MAX_GPUS_PER_JOB:
                return "invalid_shape", f"gpus={gpus} must be between 1 and {MAX_GPUS_PER_JOB}"
            if per_node < 1 or (gpus > per_node and gpus % per_node):
                return "invalid_shape", (
                    f"gpus_per_node={per_node} must divide gpus={gpus}; use a divisor such as 8"
                )
            if estimate <= 0:
                return "invalid_shape", f"estimate_s={estimate} must be positive"
            if self.index.nodes and not self.shape_exists(
                min(per_node, gpus), -(-gpus // per_node), spec.gpu_type
            ):
                return "infeasible", (
                    f"no set of {-(-gpus // per_node)} node(s) with "
                    f"{min(per_node, gpus)} {spec.gpu_type or 'any'} GPUs "
                    f"exists in {self.cell_id}; ask for fewer GPUs per node"
                )
        tenant = self.config.tenant(spec.tenant)
        smallest = min([s.gpus for s in spec.shapes] + [spec.gpus])
        for name, limit in (("max_gpus", tenant.max_gpus), ("user_max_gpus", tenant.user_max_gpus)):
            if limit and smallest > limit:  # it could never start: say so now
                return "over_quota", (
                    f"the job needs {smallest} GPUs at once; {name} of tenant {spec.tenant} is "
                    f"{limit}: ask for at most {limit}"
                )
        org, _ = self.use_of(Job(spec, spec.tier, self.now_ms))
        if tenant.max_queued and org.queued >= tenant.max_queued:
            return "queue_cap", (
                f"tenant {spec.tenant} already has {org.queued} queued jobs "
                f"(limit {tenant.max_queued}); wait for some to start"
            )
        return None

    def shape_exists(self: Cell, per_node: int, nodes_needed: int, gpu_type: str) -> bool:
        count = 0
        for node in self.index.nodes.values():
            if node.total >= per_node and (not gpu_type or node.gpu_type == gpu_type):
                count += 1
                if count >= nodes_needed:
                    return True
        return False

    def reject(self: Cell, spec: ev.JobSpec, reason: str, detail: str) -> None:
        self.finished[spec.job_id] = JobState.REJECTED
        self.emit(
            ev.JobRejected, job_id=spec.job_id, tenant=spec.tenant, reason=reason, detail=detail
        )

    # -- cancellation -------------------------------------------------------
    def on_cancel(self: Cell, event: ev.CancelJob) -> None:
        job = self.jobs.get(event.job_id)
        if job is None:
            why = (
                ("job already " + self.finished[event.job_id])
                if event.job_id in self.finished
                else "unknown job"
            )
            self.ignore(event.job_id, IgnoreCode.UNKNOWN_JOB, f"cancel refused: {why}", event)
            return
        if job.tenant != event.tenant:
            self.ignore(
                event.job_id,
                IgnoreCode.WRONG_TENANT,
                "cancel refused: job belongs to another tenant",
                event,
            )
            return
        if self.refused(job, "cancel", event):
            return
        run = self.runs.get((job.job_id, job.run)) if job.state != JobState.QUEUED else None
        if job.state == JobState.QUEUED:
            self.dequeue(job)
        self.finish(job, JobState.CANCELLED, "cancel")
        self.emit(ev.JobCancelled, job_id=job.job_id, run=job.run, reason=event.reason)
        if run is not None:
            self.end_run(run, confirmed=(), reason="job cancelled")

    # -- run reports --------------------------------------------------------
    def fenced_run(self: Cell, event: Any, allow_terminal: bool = False) -> Run | None:
        """The run this report is about, if the report is current; else None
        (the report is recorded as ignored)."""
        subject = f"{event.job_id}#{event.run}"
        run = self.runs.get((event.job_id, event.run))
        if run is None:
            self.ignore(
                subject,
                IgnoreCode.STALE_RUN,
                "stale report: run unknown or already released",
                event,
            )
            return None
        node = self.node(event.node_id)
        if node is None or event.node_id not in run.held:
            self.ignore(
                subject,
                IgnoreCode.NOT_HOLDER,
                f"stale report: node {event.node_id} does not hold this run",
                event,
            )
            return None
        if event.incarnation != node.incarnation:
            self.ignore(
                subject,
                IgnoreCode.STALE_INCARNATION,
                f"stale report: incarnation {event.incarnation}, node is at {node.incarnation}",
                event,
            )
            return None
        if run.phase == RunPhase.STOPPING:
            # The run is over for the scheduler (even if the job has not been
            # placed again yet): an exit report only confirms this node's
            # processes are gone; anything else is stale.
            if isinstance(event, (ev.RunStopped, ev.RunCompleted, ev.RunFailed)):
                self.release_slice(run, event.node_id)
            else:
                self.ignore(subject, IgnoreCode.STALE_RUN, "stale report: run already ended", event)
            return None
        job = self.jobs.get(event.job_id)
        if job is None or job.run != event.run:
            if not allow_terminal:
                current = job.run if job else self.finished.get(event.job_id, "?")
                self.ignore(
                    subject,
                    IgnoreCode.STALE_RUN,
                    f"stale report: run {event.run} is not current ({current})",
                    event,
                )
                return None
        return run

    def on_run_started(self: Cell, event: ev.RunStarted) -> None:
        run = self.fenced_run(event)
        if run is None:
            return
        job = self.jobs[run.job_id]
        if self.refused(job, "start", event):
            return
        if run.gang is not None:  # one member holds its GPUs: the start barrier (gangs.py)
            self.member_ready(run, event.node_id, job)
            return
        job.state = lc.next_state(job.job_id, job.state, "start")
        if run.phase == RunPhase.ASSIGNED:
            run.last_report_ms = self.now_ms
            self.run_started(run)

    def run_started(self: Cell, run: Run) -> None:
        """An ASSIGNED run's processes hold their GPUs (its ``RunStarted``, a
        heartbeat listing it, or a gang's last member at the barrier): it runs
        from now, so its static end moves with its start and its release slices
        are filed again (``refile_release``), and it is no longer awaited."""
        run.phase = lc.next_phase(run.key, run.phase, "start")
        run.started_ms = run.saved_ms = self.now_ms
        self.refile_release(run)
        self.assigned_unstarted.pop(run.key, None)

    def on_run_checkpointed(self: Cell, event: ev.RunCheckpointed) -> None:
        run = self.fenced_run(event)
        if run is None:
            return
        job = self.jobs[run.job_id]
        if self.refused(job, "checkpointed", event):
            return
        if run.gang is not None and event.step >= 0:  # one rank's; see gangs.py
            run.last_report_ms = self.now_ms
            if self.rank_checkpointed(run, job, event):
                run.saved_ms = self.now_ms  # every rank has this step
                if run.phase == RunPhase.EXITING:
                    self.finish_exit(run)
            return
        if event.progress >= job.checkpoint_progress:  # a re-delivered older one never wins
            job.checkpoint = event.checkpoint_uri
            job.checkpoint_progress = event.progress
        run.last_report_ms = run.saved_ms = self.now_ms
        if run.phase == RunPhase.EXITING:
            self.finish_exit(run)

    def on_run_completed(self: Cell, event: ev.RunCompleted) -> None:
        run = self.fenced_run(event)
        if run is None:
            return
        job = self.jobs[run.job_id]
        if self.refused(job, "complete", event):
            return
        self.finish(job, JobState.COMPLETED, "complete")
        self.emit(
            ev.JobCompleted,
            job_id=job.job_id,
            run=run.run,
            artifact_uri=event.artifact_uri,
            gpu_seconds=round(run.gpus * max(0, self.now_ms - run.started_ms) / 1000, 3),
        )
        # Only this node's processes are known gone; the gang's other nodes
        # confirm with their own exit reports (or are stopped).
        self.end_run(run, confirmed=(event.node_id,), reason="completed")

    def on_run_failed(self: Cell, event: ev.RunFailed) -> None:
        run = self.fenced_run(event)
        if run is None:
            return
        job = self.jobs[run.job_id]
        if self.refused(job, self.end_action(job, event.failure_class), event):
            return
        self.note_failure(run, event.node_id, event.failure_class)
        self.end_run(run, confirmed=(event.node_id,), reason=f"failed: {event.failure_class}")
        self.retry_or_fail(
            job,
            of_failure_class(event.failure_class),
            event.reason or event.failure_class,
            event.failure_class,
        )

    def on_run_stopped(self: Cell, event: ev.RunStopped) -> None:
        run = self.fenced_run(event, allow_terminal=True)
        if run is None:
            return
        job = self.jobs.get(run.job_id)
        if job is not None and job.run != run.run:
            job = None  # an old run's exit: it only confirms this node's processes are gone
        if job is not None and self.refused(job, self.end_action(job, NODE_LOST), event):
            return
        self.release_slice(run, event.node_id)
        if job is not None:
            # The agent stopped a run nobody asked it to stop (it shut down):
            # the run is lost; resume it elsewhere from its last checkpoint.
            self.end_run(run, confirmed=(), reason="stopped by agent")
            self.retry_or_fail(
                job,
                RunCause.AGENT_STOPPED,
                f"run stopped by node {event.node_id}: {event.reason or 'no reason given'}",
            )

    # -- shared job transitions --------------------------------------------
    def end_action(self: Cell, job: Job, failure_class: str) -> str:
        """``fail`` if one more failure of ``failure_class`` spends the job's
        retry budget, else ``requeue``: the transition to check before a run ends."""
        used = job.failures.get(failure_class, 0) + 1
        return "fail" if used > self.config.retry_budget(failure_class) else "requeue"

    def retry_or_fail(
        self: Cell, job: Job, cause: RunCause, reason: str, failure_class: str | None = None
    ) -> None:
        """Charge a failure to its retry class (``RETRY_CLASS[cause]`` unless the
        agent named one) and requeue the job, or fail it once the budget is spent.
        The caller has checked ``end_action`` against the lifecycle table."""
        if failure_class is None:
            failure_class = RETRY_CLASS[cause]
        used = job.failures.get(failure_class, 0) + 1
        job.failures[failure_class] = used
        budget = self.config.retry_budget(failure_class)
        if used > budget:
            self.finish(job, JobState.FAILED, "fail")
            self.emit(
                ev.JobFailed,
                job_id=job.job_id,
                run=job.run,
                failure_class=failure_class,
                reason=f"{reason} (failed {used} times with {failure_class}; "
                f"retry budget {budget})",
                cause=cause,
            )
            return
        self.requeue(
            job, f"retry after {failure_class}: {reason}", budget - used, cause, failure_class
        )

    def requeue(
        self: Cell,
        job: Job,
        reason: str,
        retries_left: int = -1,
        cause: str = RunCause.UNRECORDED,
        failure_class: str = "",
    ) -> None:
        """Back to the queue; the caller has checked ``requeue`` against the table."""
        job.state = lc.next_state(job.job_id, job.state, "requeue")
        job.queued_ms = self.now_ms
        job.reason = reason
        self.enqueue(job, requeued=True)
        if retries_left < 0:
            retries_left = self.config.default_retries
        self.emit(
            ev.JobRequeued,
            job_id=job.job_id,
            run=job.run,
            reason=reason,
            resume_from=job.checkpoint,
            retries_left=retries_left,
            cause=cause,
            failure_class=failure_class,
        )

    def finish(self: Cell, job: Job, state: JobState, action: str) -> None:
        """Terminal; the caller has checked ``action`` against the table."""
        job.state = lc.next_state(job.job_id, job.state, action)
        del self.jobs[job.job_id]
        self.shift_depth(job.tier, job.tenant, jobs=-1)
        self.wait_bands.forget(job.job_id)  # ended before it ever started
        self.finished[job.job_id] = state
        if self.reservation_job == job.job_id:
            self.clear_reservation()
        self.claims.pop(job.job_id, None)

    def size_key(self: Cell, job: Job) -> float | None:
        """Where a job stands in its own flow's queue when flows serve by size
        (``CellConfig.size_order_gpu_s_per_s`` r > 0): its admission time plus
        its cost over r, in seconds, so a lighter job goes before a heavier one
        admitted up to (their cost difference) / r earlier: a job of cost C is
        passed over only by jobs admitted less than C / r after it (the
        bound). Static, so the flow keeps its jobs sorted once. Only within
        one user's own queue: fair share between flows is untouched. None:
        arrival order."""
        rate = getattr(self.config, "size_order_gpu_s_per_s", 0.0)
        if rate <= 0:
            return None
        return job.queued_ms / 1000 + job.cost / rate

    def order_leaf(self: Cell, leaf: Flow) -> None:
        """Key every job of ``leaf``'s queue by ``size_key`` now (or serve it
        in arrival order when the knob is 0): jobs queued before the leaf was
        served by size (a snapshot from before keys, a changed knob) must not
        wait behind every later keyed job. O(q log q), once per such leaf."""
        if getattr(self.config, "size_order_gpu_s_per_s", 0.0) <= 0:
            self.fair.order_by(leaf, None)
            return
        jobs = self.jobs
        self.fair.order_by(leaf, {j: cast(float, self.size_key(jobs[j])) for j in leaf.queue})

    def own_place(self: Cell, job: Job) -> tuple[int, float]:
        """``job``'s place in its own flow's order (``leaf_jobs``), 1 at the
        head, and the GPU-seconds queued there up to and including it.

        Cost: O(log q + OWN_PLACE_EXACT + r) with q the flow's queue and r its
        requeued jobs, whatever the flow holds. The place is exact (a
        bisection of the size order, or the arrival order's tail for the job
        just admitted). The GPU-seconds are exact for the ``OWN_PLACE_EXACT``
        jobs nearest the job on the side counted from (the nearer end); jobs
        beyond them count at the flow's mean cost. Summing them all cost
        O(queue) per admission: a tenant flooding one flow with 100k jobs of
        one admission time made every admission walk half its queue
        (test_core_fairness's flood ran for hours)."""
        leaf = self.leaf_of(job)
        job_id = job.job_id
        keys = leaf.keys
        jobs = self.jobs
        mean = leaf.backlog / leaf.queued if leaf.queued else job.cost
        if job_id in leaf.requeued:
            ahead: list[str] = []
            for other in leaf.requeued:
                ahead.append(other)
                if other == job_id:
                    break
            return len(ahead), sum(jobs[j].cost for j in ahead)
        if keys is not None and job_id in keys:
            ordered = leaf.ordered
            at = bisect_right(ordered, (keys[job_id], job_id))  # keyed jobs up to it
            place = len(leaf.requeued) + at
            if at <= len(ordered) // 2:  # count from the head
                near = ordered[max(0, at - OWN_PLACE_EXACT) : at]
                far = at - len(near)
                own = sum(jobs[j].cost for j in leaf.requeued)
                return place, own + sum(jobs[e[1]].cost for e in near) + far * mean
            near = ordered[at : at + OWN_PLACE_EXACT]  # count from the tail
            far = len(leaf.queue) - at - len(near)  # the unkeyed follow the keyed
            behind = sum(jobs[e[1]].cost for e in near) + far * mean
            return place, leaf.backlog - behind
        # arrival order (or queued before keys, behind every keyed job): the
        # job just admitted is the last, so counting from the tail is O(1)
        behind_jobs: list[str] = []
        for other in reversed(leaf.queue):
            if other == job_id or len(behind_jobs) >= OWN_PLACE_EXACT:
                break
            behind_jobs.append(other)
        if len(behind_jobs) < OWN_PLACE_EXACT:
            cost = sum(jobs[j].cost for j in behind_jobs)
            return leaf.queued - len(behind_jobs), leaf.backlog - cost
        queue = list(leaf.queue)  # deep in an arrival-ordered queue: O(q), rare
        at = len(leaf.requeued) + queue.index(job_id) + 1
        return at, leaf.backlog - (leaf.queued - at) * mean

    def enqueue(self: Cell, job: Job, requeued: bool) -> None:
        bounds = self.queue_bounds()  # before the job joins: a rebuild must not count it
        classes = self.__dict__.get("_queue_classes")  # kept once a walk first asks
        job.state = JobState.QUEUED
        leaf = self.leaf_of(job)
        size = self.size_key(job)
        if (size is None) != (leaf.keys is None) or (
            leaf.keys is not None and len(leaf.keys) < len(leaf.queue)
        ):
            self.order_leaf(leaf)  # queued under the other mode: one order for all
        self.fair.push(leaf, job.job_id, job.cost, requeued=requeued, key=size)
        key = self.bound_key(job)
        self.note_queued(job, 1, key)
        bounds.add(*key)
        if classes is not None:
            classes.add(*self.class_key(job))
        self.queued_count += 1
        self.shift_depth(job.tier, job.tenant, queued_gpus=job.shape[0])
        org, user = self.use_of(job)
        org.queued += 1
        user.queued += 1

    def depth_rows(self: Cell) -> dict[tuple[str, str], list[int]]:
        """Per ``(tier, tenant)`` with a live job or run: ``[jobs, runs, queued
        GPUs, GPUs runs hold]``, kept where each changes (``shift_depth``) so a
        status publish reads its rows, not every job and run (the queued jobs
        it counts are the fair tree's flow's, ``Flow.queued``). Built from the
        jobs and runs on first use (a new cell, or one restored from a snapshot
        taken before the rows were kept)."""
        rows: dict[tuple[str, str], list[int]] | None = self.__dict__.get("_status_rows")
        if rows is None:
            rows = {}
            self._status_rows = rows
            self.__dict__.pop("_depth_rows", None)  # five-slot rows (60b4690), queued kept too
            for job in self.jobs.values():
                row = rows.setdefault((job.tier, job.tenant), [0, 0, 0, 0])
                row[0] += 1
                if job.state == JobState.QUEUED:
                    row[2] += job.shape[0]
            for run in self.runs.values():
                row = rows.setdefault((run.tier, run.tenant), [0, 0, 0, 0])
                row[1] += 1
                row[3] += sum(len(g) for g in run.held.values())
        return rows

    def shift_depth(
        self: Cell,
        tier: str,
        tenant: str,
        jobs: int = 0,
        runs: int = 0,
        queued_gpus: int = 0,
        held: int = 0,
    ) -> None:
        """A job joined or left the cell, the queue or a shape, or a run its
        GPUs: move its row (dropped once it has no job and no run). O(1); a
        no-op until the rows are first read."""
        rows: dict[tuple[str, str], list[int]] | None = self.__dict__.get("_status_rows")
        if rows is None:
            return
        row = rows.get((tier, tenant))
        if row is None:
            row = rows[(tier, tenant)] = [0, 0, 0, 0]
        row[0] += jobs
        row[1] += runs
        row[2] += queued_gpus
        row[3] += held
        if not row[0] and not row[1]:
            del rows[(tier, tenant)]

    def dequeue(self: Cell, job: Job) -> None:
        bounds = self.queue_bounds()
        classes = self.__dict__.get("_queue_classes")
        if self.fair.remove(self.leaf_of(job), job.job_id, job.cost):
            key = self.bound_key(job)
            self.note_queued(job, -1, key)
            bounds.remove(*key)
            if classes is not None:
                classes.remove(*self.class_key(job))
            self.queued_count -= 1
            self.shift_depth(job.tier, job.tenant, queued_gpus=-job.shape[0])
            org, user = self.use_of(job)
            org.queued -= 1
            user.queued -= 1

    def on_node_lost_run(self: Cell, run: Run, reason: str, cause: RunCause) -> None:
        """A run's node went away: requeue its job from the last checkpoint. The
        run ends whatever the table says (its node is gone); a job transition the
        table refuses is recorded instead of applied."""
        job = self.jobs.get(run.job_id)
        # A run already over (its job requeued, not yet placed again) costs nothing more.
        if job is not None and (job.run != run.run or job.state not in lc.ACTIVE):
            job = None
        if job is not None and self.refused(job, self.end_action(job, RETRY_CLASS[cause])):
            job = None
        self.end_run(run, confirmed=(), reason=reason)
        if job is not None:
            self.retry_or_fail(job, cause, reason)
