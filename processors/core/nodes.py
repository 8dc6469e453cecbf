"""Node handlers: registration (incarnations), heartbeats, health, leases.

Theory of operation
-------------------
1. A node registers with an incarnation number; a higher incarnation replaces
   the old one, whose runs are lost and requeued from their last checkpoint.
   Reports of an older incarnation are ignored, and the runs they list are
   told to stop (zombies).
2. Every heartbeat is a ledger reconciliation: a listed run the cell did not
   place there is stopped; a run placed there but not listed is requeued once
   its lease has passed; a stopping run no longer listed is released.
3. Heartbeat health samples drive GPU states (``health.py``); a GPU that is
   no longer ok gets no new work, and its runs are checkpointed and moved.
   Step rates are evidence against a node only across tenants
   (``stragglers.py``).
4. Ticks expire leases: a silent node goes DOWN, an assigned run that never
   started is requeued, an unanswered checkpoint request becomes a stop, an
   unconfirmed stop takes the node DOWN, a run past its hard time limit is
   stopped with failure class ``timeout``, and a gang one of whose members
   went silent is ended whole (``gangs.py``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.causes import NODE_LOST, RunCause
from framespool.schemas.refusals import IgnoreCode
from framespool.schemas.states import GpuState, NodeState, RunPhase

from . import lifecycle as lc
from .health import classify, next_gpu_state
from .model import HealthSeen, Node, Run

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

STOP_RESEND_MS = 5_000
_LEGACY_EXIT = {"preempt": RunCause.PREEMPTED, "move": RunCause.NODE_DRAINING}


class NodeHandlers:
    # -- registration -------------------------------------------------------
    def on_node_registered(self: Cell, event: ev.NodeRegistered) -> None:
        old = self.node(event.node_id)
        if old is not None and event.incarnation <= old.incarnation:
            self.ignore(
                event.node_id,
                IgnoreCode.STALE_INCARNATION,
                f"stale registration: incarnation {event.incarnation} <= {old.incarnation}",
                event,
            )
            return
        if old is not None:
            old.state = NodeState.DOWN  # NODE_TRANSITIONS lets every state go DOWN
            for run in self.runs_on(old):
                self.release_slice(run, old.node_id)
                self.on_node_lost_run(
                    run,
                    f"node {old.node_id} re-registered (incarnation {event.incarnation}); run lost",
                    RunCause.NODE_REREGISTERED,
                )
        node = Node(
            event.node_id,
            event.incarnation,
            event.gpus,
            event.gpu_type,
            event.rail,
            event.cpus,
            event.mem_gb,
            self.now_ms,
        )
        self.index.forget_bucket(event.node_id)
        self.forget_stragglers(event.node_id)
        self.index.add(node)
        self.touch(node)
        self.emit(
            ev.NodeStateChanged,
            node_id=node.node_id,
            incarnation=node.incarnation,
            state=NodeState.UP,
            reason=f"registered: {node.total} x {node.gpu_type} in {node.rail}",
        )
        if self.queued_count:
            self.schedule(full=False)

    def touch(self: Cell, node: Node) -> None:
        node.last_seen_ms = self.now_ms
        self.node_seen.pop(node.node_id, None)
        self.node_seen[node.node_id] = None

    def runs_on(self: Cell, node: Node) -> list[Run]:
        keys: dict = {}
        for owner in node.owner:
            if owner is not None:
                keys[owner] = None
        return [self.runs[k] for k in keys if k in self.runs]

    # -- heartbeats ---------------------------------------------------------
    def on_heartbeat(self: Cell, event: ev.NodeHeartbeat) -> None:
        node = self.node(event.node_id)
        if node is None:
            self.ignore(
                event.node_id,
                IgnoreCode.UNREGISTERED_NODE,
                "heartbeat from an unregistered node: register first",
                event,
            )
            return
        if event.incarnation != node.incarnation or node.state == NodeState.DOWN:
            why = (
                f"stale incarnation {event.incarnation} (node is at {node.incarnation})"
                if event.incarnation != node.incarnation
                else "node is DOWN: re-register"
            )
            for report in event.runs:
                self.emit(
                    ev.StopRun,
                    node_id=node.node_id,
                    incarnation=event.incarnation,
                    job_id=report.job_id,
                    run=report.run,
                    reason=f"zombie: {why}",
                )
            self.ignore(
                event.node_id, IgnoreCode.STALE_INCARNATION, f"heartbeat ignored: {why}", event
            )
            return
        if event.ts_ms <= node.last_heartbeat_ts:
            # A re-delivered or reordered heartbeat is no sign of life now.
            self.ignore(
                event.node_id,
                IgnoreCode.STALE_HEARTBEAT,
                "heartbeat ignored: not newer than the last one "
                f"({event.ts_ms} <= {node.last_heartbeat_ts})",
                event,
            )
            return
        node.last_heartbeat_ts = event.ts_ms
        self.touch(node)
        self.apply_health(node, event.gpus)
        self.reconcile(node, event)

    def apply_health(self: Cell, node: Node, samples: tuple[ev.GpuHealth, ...]) -> None:
        """Fold one heartbeat's GPU health samples into the node's GPU states.

        Cost: O(1) when the samples are the ones this node sent last (the same
        tuple, or an equal one) and that fold left every GPU settled (its state
        is what its sample says, or FAILED) and the warm models untouched since:
        folding them again would change nothing but the healthy streaks of the
        GPUs that sampled OK, so those are owed (``health_seen``'s debt) and
        paid on the next full fold, before anything reads them (``HealthSeen``). Otherwise
        O(samples): each sample classified, its streak and state advanced."""
        seen = self.health_seen.get(node.node_id)
        if seen is not None and seen.node is node:
            if (
                seen.settled
                and (seen.samples is samples or seen.samples == samples)
                and seen.warm == node.warm
            ):
                seen.owed += 1
                return
            if seen.owed:
                streak = node.healthy_streak
                for i in seen.ok:
                    streak[i] += seen.owed
        changed = False
        settled = True
        indices: set = set()
        ok: list[int] = []
        to_move: dict = {}
        for sample in samples:
            i = sample.index
            if not 0 <= i < node.total:
                continue
            if i in indices:
                settled = False  # a repeated GPU: its samples fight each other
            indices.add(i)
            if sample.warm_models:
                node.warm[i] = sample.warm_models[0]
            state, why, cause = classify(sample, self.config)
            if state == GpuState.OK:
                node.healthy_streak[i] += 1
                ok.append(i)
            else:
                node.healthy_streak[i] = 0
            new = next_gpu_state(node.gpu_state[i], state, node.healthy_streak[i], self.config)
            if new != state and new != GpuState.FAILED:
                settled = False  # recovering: the streak decides a later fold
            if new == node.gpu_state[i]:
                continue
            node.gpu_state[i] = new
            changed = True
            self.emit(
                ev.NodeStateChanged,
                node_id=node.node_id,
                incarnation=node.incarnation,
                state=new,
                gpu=i,
                reason=why,
            )
            if new != GpuState.OK and node.owner[i] is not None:
                to_move[node.owner[i]] = (why, cause)
            if new == GpuState.FAILED and node.state == NodeState.UP:
                self.set_node_state(node, NodeState.DRAINING, f"GPU {i} failed: {why}", cause)
        self.health_seen[node.node_id] = HealthSeen(samples, node, list(node.warm), settled, ok)
        if changed:
            self.index.refresh(node)
        for key, (why, cause) in to_move.items():
            run = self.runs.get(key)
            if run is not None:
                self.move_run(
                    run, f"checkpoint-and-move: GPU unhealthy on {node.node_id} ({why})", cause
                )

    def reconcile(self: Cell, node: Node, event: ev.NodeHeartbeat) -> None:
        """O(runs listed + runs held here); per listed run that is simply
        running, a few dict reads (the common case, every heartbeat)."""
        listed: dict = {}
        runs, node_id, now = self.runs, node.node_id, self.now_ms
        for report in event.runs:
            key = (report.job_id, report.run)
            listed[key] = None
            run = runs.get(key)
            if run is None or node_id not in run.held:
                self.instruct(
                    ev.StopRun,
                    node,
                    report.job_id,
                    report.run,
                    "reconcile: running but not assigned here",
                )
                continue
            run.last_report_ms = now
            if run.gang is not None:
                self.member_seen(run, node_id)
            if run.phase == RunPhase.ASSIGNED:
                job = self.jobs.get(run.job_id)
                if job is not None and job.run != run.run:
                    job = None
                if run.gang is not None:  # listed: this member holds its GPUs (gangs.py)
                    if job is None or not self.refused(job, "start", event):
                        self.member_ready(run, node.node_id, job)
                elif job is None or not self.refused(job, "start", event):
                    if job is not None:
                        job.state = lc.next_state(job.job_id, job.state, "start")
                    self.run_started(run)
            elif run.phase == RunPhase.STOPPING and now - run.stop_sent_ms >= STOP_RESEND_MS:
                run.stop_sent_ms = now
                self.instruct(
                    ev.StopRun, node, run.job_id, run.run, "reconcile: stop not yet obeyed"
                )
            if report.step_rate > 0:
                self.note_step_rate(node, run, report.step_rate)
        # the runs holding GPUs here that the heartbeat did not list, taken
        # before any is released; mostly none, which a C-level set difference
        # says without a Python loop
        holders = set(node.owner)
        holders.discard(None)
        if holders.issubset(listed):
            return
        for run in [run for run in self.runs_on(node) if run.key not in listed]:
            if run.phase == RunPhase.STOPPING:
                self.release_slice(run, node.node_id)
            elif run.phase == RunPhase.ASSIGNED:
                continue  # the start lease (on Tick) covers assignments in flight
            elif run.gang is not None:
                if self.now_ms - run.gang.seen[node.node_id] > self.config.report_lease_s * 1000:
                    self.on_node_lost_run(
                        run,
                        f"gang member {node.node_id} has not listed the run for "
                        f"{self.config.report_lease_s:.0f}s: the whole gang is requeued",
                        RunCause.MEMBER_LOST,
                    )
            elif self.now_ms - run.last_report_ms > self.config.report_lease_s * 1000:
                self.on_lease_lost(
                    run, f"run not reported by {node.node_id} for {self.config.report_lease_s:.0f}s"
                )

    def set_node_state(
        self: Cell,
        node: Node,
        state: NodeState,
        reason: str,
        cause: RunCause = RunCause.NODE_DRAINING,
    ) -> None:
        """``cause`` is what a run moved off a DRAINING node carries. A change the
        node table does not list (``lifecycle.NODE_TRANSITIONS``) is refused with
        a recorded reason and changes nothing."""
        if node.state == state:
            return
        if not lc.node_allowed(node.state, state):
            self._count("illegal_transition")
            self.ignore(
                node.node_id,
                IgnoreCode.ILLEGAL_TRANSITION,
                f"illegal node transition: {node.state} -> {state} ({reason})",
                self._input,
            )
            return
        node.state = state
        node.state_reason = reason
        self.index.refresh(node)
        self.emit(
            ev.NodeStateChanged,
            node_id=node.node_id,
            incarnation=node.incarnation,
            state=state,
            reason=reason,
        )
        if state == NodeState.DRAINING:
            for run in self.runs_on(node):
                self.move_run(
                    run, f"checkpoint-and-move: node {node.node_id} draining ({reason})", cause
                )
        elif state == NodeState.DOWN:
            self.node_seen.pop(node.node_id, None)
            for run in self.runs_on(node):
                self.release_slice(run, node.node_id)
                self.on_node_lost_run(
                    run, f"node {node.node_id} down: {reason}", RunCause.NODE_DOWN
                )

    # -- lease expiry (on Tick) --------------------------------------------
    def expire_nodes(self: Cell) -> None:
        deadline = self.now_ms - int(self.config.heartbeat_timeout_s * 1000)
        expired = []
        for node_id in self.node_seen:
            if self.index.nodes[node_id].last_seen_ms >= deadline:
                break
            expired.append(node_id)
        for node_id in expired:
            node = self.index.nodes[node_id]
            self.set_node_state(
                node,
                NodeState.DOWN,
                f"no heartbeat for {(self.now_ms - node.last_seen_ms) / 1000:.1f}s",
            )

    def expire_runs(self: Cell) -> None:
        now = self.now_ms
        start_deadline = now - int(self.config.start_lease_s * 1000)
        late = []
        for key in self.assigned_unstarted:
            run = self.runs.get(key)
            if run is not None and run.assigned_ms >= start_deadline:
                break
            late.append(key)
        for key in late:
            self.assigned_unstarted.pop(key, None)
            run = self.runs.get(key)
            if run is not None and run.phase == RunPhase.ASSIGNED:
                self.on_lease_lost(
                    run, f"run never started within {self.config.start_lease_s:.0f}s"
                )
        for key in [k for k in self.exiting if self.runs[k].exit_deadline_ms <= now]:
            self.finish_exit(self.runs[key])
        stop_deadline = now - int(self.config.stop_lease_s * 1000)
        for key in [k for k in self.stopping if self.runs[k].stop_sent_ms <= stop_deadline]:
            run = self.runs.get(key)
            if run is None:  # released meanwhile (its node went DOWN for another run)
                continue
            for node_id in tuple(run.held):
                node = self.index.nodes[node_id]
                if node.state != NodeState.DOWN:
                    self.set_node_state(
                        node,
                        NodeState.DOWN,
                        # no job id: this reason reaches the other jobs on the node,
                        # of other tenants (the StopRun event names the run)
                        f"a run's stop unconfirmed for {self.config.stop_lease_s:.0f}s",
                    )
                else:
                    self.release_slice(run, node_id)
        while self.limits and self.limits[0][0] <= now:
            _, job_id, number = heapq.heappop(self.limits)
            run = self.runs.get((job_id, number))
            job = self.jobs.get(job_id)
            if (
                run is None
                or job is None
                or job.run != number
                or run.phase not in (RunPhase.ASSIGNED, RunPhase.RUNNING)
            ):
                continue
            if self.refused(job, self.end_action(job, "timeout")):
                continue
            self.end_run(run, confirmed=(), reason="time limit")
            self.retry_or_fail(
                job,
                RunCause.TIMEOUT,
                f"ran past its limit of "
                f"{(run.limit_ms - run.started_ms) / 1000:.0f}s "
                f"(estimate {run.estimate_s:.0f}s)",
            )
        self.expire_gang_members()

    def on_lease_lost(self: Cell, run: Run, reason: str) -> None:
        self.on_node_lost_run(run, reason, RunCause.LEASE_EXPIRED)

    # -- moving work off bad hardware --------------------------------------
    def move_run(self: Cell, run: Run, reason: str, cause: RunCause) -> None:
        """Checkpoint-and-move when the run can checkpoint; otherwise a run on a
        failed GPU restarts elsewhere and one on a merely degraded GPU finishes."""
        if run.phase not in (RunPhase.ASSIGNED, RunPhase.RUNNING):
            return
        job = self.jobs.get(run.job_id)
        if job is None or job.run != run.run:
            return
        if run.checkpointable and run.phase == RunPhase.RUNNING:
            self.request_exit(run, cause, "", reason)
            return
        if any(
            self.index.nodes[n].gpu_state[i] == GpuState.FAILED
            or self.index.nodes[n].state in (NodeState.DRAINING, NodeState.DOWN)
            for n, gpus in run.held.items()
            for i in gpus
        ):
            if self.refused(job, "requeue"):
                return
            self.end_run(run, confirmed=(), reason=reason)
            self.requeue(
                job,
                reason + " (not checkpointable: restarts from scratch)",
                self.config.retry_budget(NODE_LOST) - job.failures.get(NODE_LOST, 0),
                cause,
            )

    def request_exit(self: Cell, run: Run, cause: RunCause, by_job: str, reason: str) -> bool:
        """Ask the run to checkpoint and leave (``cause``: ``PREEMPTED`` or why it
        moves); False, with nothing changed, if the table refuses it."""
        job = self.jobs[run.job_id]
        if self.refused(job, "checkpoint"):
            return False
        run.phase = lc.next_phase(run.key, run.phase, "exit")
        run.exit_intent = cause
        run.exit_by = by_job
        run.exit_deadline_ms = self.now_ms + int(self.config.checkpoint_grace_s * 1000)
        self.exiting[run.key] = None
        job.state = lc.next_state(job.job_id, job.state, "checkpoint")
        job.reason = reason
        for node_id in run.held:
            self.instruct(ev.CheckpointRun, self.index.nodes[node_id], run.job_id, run.run, reason)
        return True

    def finish_exit(self: Cell, run: Run) -> None:
        """The exiting run checkpointed (or its grace ran out): stop it and requeue
        its job to resume from the latest checkpoint."""
        job = self.jobs.get(run.job_id)
        reason = job.reason if job else "exit"
        if job is not None and job.run != run.run:
            job = None
        if job is not None and self.refused(job, "requeue"):
            return
        self.exiting.pop(run.key, None)
        self.end_run(run, confirmed=(), reason=reason)
        if job is None:
            return
        # a snapshot taken before causes says "preempt" or "move"
        cause = _LEGACY_EXIT.get(run.exit_intent, run.exit_intent)
        if cause == RunCause.PREEMPTED:
            job.preemptions += 1
            self.emit(
                ev.JobPreempted,
                job_id=job.job_id,
                run=run.run,
                reason=reason,
                by_job_id=run.exit_by,
            )
        self.requeue(
            job,
            reason,
            self.config.retry_budget(NODE_LOST) - job.failures.get(NODE_LOST, 0),
            cause,
        )
