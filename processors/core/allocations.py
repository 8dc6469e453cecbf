"""A run's GPUs taken and given back: the bookkeeping of a start and a release.

Theory of operation
-------------------
``commit`` turns a placement (``starts.py``) into a run, all in one apply: the
job leaves its queue (``dequeue``) as a new attempt (``job.run``) in the
chosen shape, its GPUs get the run as owner on every node of the gang (with
the node's CPU and memory), and what the cell counts of running work moves
with it: the organisation's, user's and tier's GPUs and runs, the unused
guarantees (``shift_use``), the fair-share charge at the estimate
(``charge_start``), the release plan the reservations walk
(``plan_release``), the lease limit and the start mix. It emits one
``JobAssigned`` with the whole gang, then one ``StartRun`` per node. The table
may refuse (``assign``): then nothing has changed.

A run ends in two steps, because a node's GPUs are free only once its
process is known gone:

1. ``end_run``: the run is over for the scheduler: its charge is settled to
   the GPU-time really used (``settle``, once per run), it is STOPPING, and
   each of its nodes is released at once where its process is confirmed gone
   (or the node is DOWN), else told to stop (``StopRun``);
2. ``release_slice``: one node's GPUs given back, and every count ``commit``
   moved for them moved back by that node's share; a run released without
   ``end_run`` is settled first, and with its last node it is forgotten.

Cost model
----------
``commit`` is O(GPUs placed) for owners and the node index, plus its callees'
costs as they state them: the dequeue (O(log n + log q)), one insertion per
node into the sorted release list (``plan_release``: O(log R) search, O(R)
memmove) and the fair charge (O(log n) per level of the fair tree).
``release_slice`` is O(GPUs of the slice) plus the removal of its release end
(``unplan_release``) and, at the run's last node, its step rate
(``forget_rate``); ``settle`` is the fair charge's correction, O(log n) per
level, plus O(probes) while a breaker has probes out (``settle_probe``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.states import NodeState, RunPhase

from . import lifecycle as lc
from .model import Job, Run
from .placement import Placement

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell


class Allocations:
    # -- starting a run ---------------------------------------------------------
    def commit(
        self: Cell, job: Job, placement: Placement, shape: tuple[int, int, float], why: str
    ) -> bool:
        """Place ``job`` (False, with nothing changed, if the table refuses ``assign``)."""
        if self.refused(job, "assign"):
            return False
        gpus, per_node, estimate = shape
        self.dequeue(job)
        job.run += 1
        job.shape = shape
        job.state = lc.next_state(job.job_id, job.state, "assign")
        if job.first_start_ms < 0:
            job.first_start_ms = self.now_ms
            self.wait_bands.started(job.job_id, self.now_ms)
        charged = self.cost_of(job, gpus, estimate)
        limit_ms = self.now_ms + int(
            (estimate * self.config.overrun_factor + self.config.overrun_grace_s) * 1000
        )
        run = Run(job, job.run, placement.slices, estimate, self.now_ms, limit_ms, charged)
        self.plan_release(run)
        self.runs[run.key] = run
        self.shift_depth(run.tier, run.tenant, runs=1, held=sum(map(len, run.held.values())))
        if self.breakers:  # past a half-open breaker, this run is its probe
            self.note_placement(run)
        self.note_load(placement.slices, job.spec.model, gpus, estimate)  # before mark_warm
        nodes_needed = len(placement.slices)
        for piece in placement.slices:
            node = self.index.nodes[piece.node_id]
            for i in piece.gpus:
                node.owner[i] = run.key
            node.cpus_used += job.spec.cpus / nodes_needed
            node.mem_used += job.spec.mem_gb / nodes_needed
            self.index.mark_warm(node, piece.gpus, job.spec.model)
            self.index.refresh(node)
        org, user = self.use_of(job)
        self.shift_use(job.tenant, job.tier, gpus)
        org.gpus += gpus
        user.gpus += gpus
        org.running += 1
        user.running += 1
        self.tier_use[job.tier] = self.tier_use.get(job.tier, 0) + gpus
        self.fair.charge_start(self.leaf_of(job), charged)
        self.running_end_gpu_s += gpus * (self.now_ms / 1000 + estimate)
        self.running_gpus += gpus
        self.note_run_start(gpus, estimate)
        self.push_limit(run)
        self.assigned_unstarted[run.key] = None
        if job.job_id == self.reservation_job:
            self.clear_reservation()
        self.more_reservations().pop(job.job_id, None)
        self.claims.pop(job.job_id, None)
        reason = f"{why}; {placement.reason}"
        if job.spec.shapes:  # more shapes than the spec's own
            reason += f"; elastic shape {gpus} GPUs x {estimate:.0f}s finishes earliest"
        self.emit(
            ev.JobAssigned,
            job_id=job.job_id,
            run=run.run,
            placement=placement.slices,
            gpus=gpus,
            estimate_s=estimate,
            resume_from=job.checkpoint,
            reason=reason,
        )
        for piece in placement.slices:
            node = self.index.nodes[piece.node_id]
            self.emit(
                ev.StartRun,
                node_id=piece.node_id,
                incarnation=node.incarnation,
                run=run.run,
                spec=job.spec,
                gpus=piece.gpus,
                placement=placement.slices,
                estimate_s=estimate,
                resume_from=job.checkpoint,
            )
        return True

    # -- ending runs ------------------------------------------------------------
    def end_run(self: Cell, run: Run, confirmed: tuple[str, ...], reason: str) -> None:
        """The run is over for the scheduler: release the GPUs of nodes whose
        processes are known gone, and tell the others to stop (their GPUs stay
        held until they confirm)."""
        if run.phase != RunPhase.STOPPING:
            self.settle(run)
            run.phase = lc.next_phase(run.key, run.phase, "stop")
            run.stop_sent_ms = self.now_ms
            self.exiting.pop(run.key, None)
            self.assigned_unstarted.pop(run.key, None)
            self.stopping[run.key] = None
        for node_id in tuple(run.held):
            node = self.index.nodes[node_id]
            if node_id in confirmed or node.state == NodeState.DOWN:
                self.release_slice(run, node_id)
            else:
                self.instruct(ev.StopRun, node, run.job_id, run.run, reason)

    def settle(self: Cell, run: Run) -> None:
        """Correct the fair-share charge to the GPU-time really used, once."""
        if self.breaker_probes:
            self.settle_probe(run)
        used = run.gpus * max(0, self.now_ms - run.started_ms) / 1000
        self.fair.charge_end(self.leaf_of(run), run.charged, used)
        org, user = self.use_of(run)
        org.running -= 1
        user.running -= 1
        self.running_end_gpu_s -= run.gpus * (run.assigned_ms / 1000 + run.estimate_s)
        self.running_gpus -= run.gpus

    def release_slice(self: Cell, run: Run, node_id: str) -> None:
        gpus = run.held.pop(node_id, None)
        if gpus is None:
            return
        self.index.freed += 1  # use given back (even on a node that cannot take work)
        self.unplan_release(run, node_id, len(gpus))
        node = self.index.nodes[node_id]
        for i in gpus:
            if node.owner[i] == run.key:
                node.owner[i] = None
        share = max(1, len(run.placement))
        node.cpus_used = max(0.0, node.cpus_used - run.cpus / share)
        node.mem_used = max(0.0, node.mem_used - run.mem_gb / share)
        self.index.refresh(node)
        org, user = self.use_of(run)
        self.shift_use(run.tenant, run.tier, -len(gpus))
        self.shift_depth(run.tier, run.tenant, held=-len(gpus))
        org.gpus -= len(gpus)
        user.gpus -= len(gpus)
        self.tier_use[run.tier] -= len(gpus)
        if run.phase != RunPhase.STOPPING:
            self.settle(run)
            run.phase = lc.next_phase(run.key, run.phase, "stop")
            self.stopping[run.key] = None
        if not run.held:
            self.stopping.pop(run.key, None)
            self.exiting.pop(run.key, None)
            self.assigned_unstarted.pop(run.key, None)
            self.forget_rate(run)
            del self.runs[run.key]
            self.shift_depth(run.tier, run.tenant, runs=-1)
