"""What a cell offers to admission, and the drain of jobs it cannot run.

Theory of operation
-------------------
**Offers.** Every ``status_interval_s`` of cell time (on a Tick) the cell emits a
``CellOffer``: per GPU type its healthy and free GPUs, its UP nodes grouped by
healthy GPUs (so admission can tell whether a gang of ``gpus`` at
``gpus_per_node`` fits: enough UP nodes with at least ``min(per_node, gpus)``
healthy GPUs of the type) and the largest job they could ever host; the cell's
capacity, free GPUs and the GPU-seconds its running work still needs; and per
tier the GPU-seconds queued in that tier and every more important one (lower
rank), with the tier's ``max_predicted_wait_s``, and how the fair order
serves the tier's own backlog (``fair_gpu_s``: below). That is what
``WaitEstimates.predicted_wait_s`` divides by the capacity, so admission predicts
a job's wait in each cell by the same arithmetic, and the edge refuses a job
past its tier's limit by it (``framespool.processors.core.offers``). The shell
sends the offer to every commands partition, where admission folds it, and to
job-events, where the API's cluster projection keeps each cell's latest.

A tier's queued total is the wait of a job behind all of it, but fair share
serves a tenant with little queued before a tenant with much (``fairshare``):
one tenant's flood would make every tenant of the tier look refused. So each
``TierBacklog`` also carries ``fair_gpu_s``: for each step ``d`` of
``FAIR_STEPS_GPU_S``, the GPU-seconds of the tier's backlog its organisations
get while the fair order brings virtual time from the tier's least settled
virtual time (where a returning organisation starts, at best) to that plus
``d`` (``LevelIndex.served``), then the tier's whole own backlog. The edge reads
off it the work ahead of a tenant whose waiting and running work is ``d``
GPU-seconds (``offers.fair_ahead_gpu_s``), and only the edge does, for a tier with a
predicted-wait limit: a tier without one gets it empty. Cost: O(n log n) per
limited tier with n organisations backlogged in it, once per offer (every
``status_interval_s``), never per job; nothing without a limit (the default).

**Drain** (``CellConfig.drain_grace_s`` > 0; off by default: a lone cell has
nowhere to send its jobs). A queued job that none of its shapes can run on
this cell's UP nodes' healthy GPUs (the cell emptied, its agents died, its
nodes of that type are DOWN) for ``drain_grace_s`` of cell time leaves the
cell: it is dequeued and forgotten exactly as a cancelled queued job is
(fair-share backlog, tenant counts, wait bands, reservations), but not
recorded as finished, and a ``JobRerouted`` carrying its spec, its last run
number and its last checkpoint goes to job-events and to the commands topic,
keyed by its tenant, where admission routes it again, to another cell (whose
``JobAdmitted`` carries both on: runs are numbered on from there, and the next
run resumes from the checkpoint). A run of the job still stopping here is
released as any old run is.

1. ``unplaceable`` maps each queued job that cannot run here to the cell time
   it was first seen so. It is rebuilt by a scan of the queue only when the
   set of UP nodes' healthy GPUs (``host_groups``) changes, checked at most
   every ``DRAIN_CHECK_FRACTION`` of the grace; a job admitted between scans
   is checked against the groups of the last scan (a change since then
   rescans it anyway).
2. At a check, each entry whose job is still queued here and past the grace
   is rerouted; entries of jobs that left or were placed are dropped.
3. ``rerouted`` remembers, for ``finished_horizon_s``, when each job left. A
   ``JobAdmitted`` of such a job stamped no later than that is a re-delivery
   of the admission that brought it here (the job waited a whole grace since)
   and is ignored; a later one (the job drained from the next cell and was
   routed back) is admitted afresh. A ``CancelJob`` for it is refused with
   the reason; admission forwards cancels to the cell that now holds it.

Cost model: an offer costs O(N * G) for N nodes of G GPUs (as ``CellStatus``)
plus O(T) tiers; a drain check costs O(N * G) for the groups, plus O(q * s)
(q queued jobs, s shapes each) only when the groups changed, plus O(u) for
the u entries of ``unplaceable``. A Tick between checks costs O(1) here.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.refusals import IgnoreCode
from framespool.schemas.states import GpuState, JobState, NodeState

from .fairshare import Flow, LevelIndex
from .jobs import MAX_GPUS_PER_JOB
from .model import Job

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

# GPU-seconds per unit of weight at which an offer samples how the fair order
# serves a tier's backlog (``TierBacklog.fair_gpu_s``; theory of operation)
FAIR_STEPS_GPU_S = (0.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0)
DRAIN_CHECK_FRACTION = 8  # drain checks per grace (at most one per second of cell time)


def fair_served(tier: Flow | None) -> tuple[float, ...]:
    """``TierBacklog.fair_gpu_s`` of one tier's flow (theory of operation);
    () when nothing is queued in it. O(n log n) for n backlogged organisations."""
    if tier is None or tier.backlog <= 0 or not tier.active:
        return ()
    start = min(org.settled_vt() for org in tier.active.values())
    index = LevelIndex(tier)
    served = [
        round(min(max(index.served(start + step), 0.0), tier.backlog), 3)
        for step in FAIR_STEPS_GPU_S
    ]
    return (*served, round(tier.backlog, 3))


Groups = tuple[tuple[str, int, int], ...]  # (gpu type, healthy GPUs per node, UP nodes)


def can_host(groups: Groups, gpus: int, per_node: int, gpu_type: str) -> bool:
    """Whether UP nodes grouped as ``groups`` could ever run a gang of ``gpus``
    GPUs at ``per_node`` per node of ``gpu_type`` ("" = any type)."""
    per_node = max(1, per_node)
    size = min(per_node, gpus)
    need = -(-gpus // per_node)
    found = 0
    for kind, healthy, nodes in groups:
        if healthy >= size and (not gpu_type or kind == gpu_type):
            found += nodes
            if found >= need:
                return True
    return False


def largest_job(groups: Groups, gpu_type: str = "") -> int:
    """GPUs of the largest gang ``groups`` could host (``per_node`` = some node
    size s, on every node with at least s healthy GPUs), at most
    ``MAX_GPUS_PER_JOB``."""
    sizes = sorted({h for kind, h, _ in groups if h > 0 and (not gpu_type or kind == gpu_type)})
    best = 0
    for s in sizes:
        nodes = sum(n for kind, h, n in groups if h >= s and (not gpu_type or kind == gpu_type))
        best = max(best, s * nodes)
    return min(best, MAX_GPUS_PER_JOB)


def job_fits(groups: Groups, spec: ev.JobSpec, every_shape: bool) -> bool:
    """Whether the job's shapes fit ``groups``: all of them (``every_shape``, what
    a cell's admission demands) or at least one (what placement needs)."""
    shapes = [(spec.gpus, spec.gpus_per_node)] + [(s.gpus, s.gpus_per_node) for s in spec.shapes]
    fits = (can_host(groups, g, p, spec.gpu_type) for g, p in shapes)
    return all(fits) if every_shape else any(fits)


class Drain:
    # -- state ----------------------------------------------------------------
    def init_drain(self: Cell) -> None:
        self.unplaceable: dict[str, int] = {}  # queued job -> cell time it could not run since
        self.rerouted: dict[str, int] = {}  # job that left -> cell time it left, oldest first
        self.host_sig: Groups | None = None  # the groups of the last drain check
        self.last_offer_ms: int = -1
        self.last_drain_ms: int = -1

    def __setstate__(self: Cell, state: dict) -> None:
        """A snapshot from before offers and drains gets their state empty."""
        super().__setstate__(state)
        if "unplaceable" not in self.__dict__:
            self.init_drain()

    def host_groups(self: Cell) -> Groups:
        """UP nodes grouped by (GPU type, healthy GPUs), sorted: O(N) Python
        steps (each node's healthy GPUs counted by ``list.count``)."""
        count: Counter[tuple[str, int]] = Counter()
        up, ok = NodeState.UP, GpuState.OK
        for node in self.index.nodes.values():
            if node.state == up:
                count[(node.gpu_type, node.gpu_state.count(ok))] += 1
        return tuple((kind, h, n) for (kind, h), n in sorted(count.items()))

    def free_by_type(self: Cell) -> Counter[str]:
        """Free GPUs of UP nodes per GPU type, read off the placement index (a
        schedulable node with free GPUs is filed under its free count, kept by
        every change of its owners, health or state): O(N) dict reads, where
        ``Node.free_count`` per node was O(N * G)."""
        free: Counter[str] = Counter()
        bucket_of = self.index.bucket_of
        up = NodeState.UP
        for node in self.index.nodes.values():
            if node.state == up:
                free[node.gpu_type] += bucket_of.get(node.node_id, 0)
        return free

    # -- the Tick hook --------------------------------------------------------
    def offer_and_drain(self: Cell) -> None:
        """On every Tick, after the periodic read-model outputs."""
        every = int(self.config.status_interval_s * 1000)
        if every and self.now_ms - self.last_offer_ms >= every:
            self.last_offer_ms = self.now_ms
            self.publish_offer()
        grace_ms = int(self.config.drain_grace_s * 1000)
        if grace_ms > 0 and self.now_ms > 0:
            check_every = max(1000, grace_ms // DRAIN_CHECK_FRACTION)
            if self.last_drain_ms < 0 or self.now_ms - self.last_drain_ms >= check_every:
                self.last_drain_ms = self.now_ms
                self.drain(grace_ms)

    # -- offers ---------------------------------------------------------------
    def publish_offer(self: Cell) -> None:
        self.emit(ev.CellOffer, **self.offer_fields())

    def offer_fields(self: Cell) -> dict[str, object]:
        """The fields of the cell's ``CellOffer`` now (it reads, never changes,
        the state: the simulator's edge builds offers from it between inputs)."""
        groups = self.host_groups()
        free = self.free_by_type()
        types = []
        for kind in dict.fromkeys(k for k, _, _ in groups):
            mine = tuple((k, h, n) for k, h, n in groups if k == kind)
            types.append(
                ev.GpuOffer(
                    gpu_type=kind,
                    healthy_gpus=sum(h * n for _, h, n in mine),
                    free_gpus=free[kind],
                    largest_job=largest_job(mine),
                    groups=tuple(ev.NodeGroup(gpus=h, nodes=n) for _, h, n in mine),
                )
            )
        tiers = []
        ahead = 0.0
        for tier in sorted(self.config.tiers, key=lambda t: t.rank):
            flow = self.fair.root.children.get(tier.name)
            ahead += flow.backlog if flow is not None else 0.0
            tiers.append(
                ev.TierBacklog(
                    tier=tier.name,
                    queued_gpu_s=round(ahead, 3),
                    max_wait_s=tier.max_predicted_wait_s,
                    fair_gpu_s=fair_served(flow) if tier.max_predicted_wait_s > 0 else (),
                )
            )
        running = self.running_left_gpu_s()
        return dict(
            cell=self.cell_id,
            capacity_gpus=self.index.free_total + self.running_gpus,
            free_gpus=sum(free.values()),
            running_gpu_s=round(running, 3),
            gpu_types=tuple(types),
            tiers=tuple(tiers),
        )

    # -- drain ----------------------------------------------------------------
    def drain(self: Cell, grace_ms: int) -> None:
        horizon_ms = int(self.config.finished_horizon_s * 1000)
        while self.rerouted:
            job_id, left_ms = next(iter(self.rerouted.items()))
            if left_ms >= self.now_ms - horizon_ms:
                break
            del self.rerouted[job_id]
        groups = self.host_groups()
        if groups != self.host_sig:
            self.host_sig = groups
            kept = self.unplaceable
            self.unplaceable = {
                job_id: kept.get(job_id, self.now_ms)
                for job_id, job in self.jobs.items()
                if job.state == JobState.QUEUED and not job_fits(groups, job.spec, False)
            }
        for job_id, since in list(self.unplaceable.items()):
            job = self.jobs.get(job_id)
            if job is None or job.state != JobState.QUEUED:
                del self.unplaceable[job_id]
            elif self.now_ms - since >= grace_ms:
                self.reroute(job, since)

    def reroute(self: Cell, job: Job, since_ms: int) -> None:
        """``job`` leaves this cell's queue for admission to route elsewhere."""
        if self.refused(job, "reroute"):
            return
        job_id = job.job_id
        del self.unplaceable[job_id]
        self.dequeue(job)
        del self.jobs[job_id]
        self.shift_depth(job.tier, job.tenant, jobs=-1)
        self.wait_bands.forget(job_id)
        if self.reservation_job == job_id:
            self.clear_reservation()
        self.claims.pop(job_id, None)
        self.rerouted[job_id] = self.now_ms
        self._count("rerouted")
        spec = job.spec
        kind = f"{spec.gpu_type} " if spec.gpu_type else ""
        self.emit(
            ev.JobRerouted,
            job_id=job_id,
            tenant=job.tenant,
            from_cell=self.cell_id,
            reason=(
                f"{self.cell_id} has no UP nodes that can run {spec.gpus} {kind}GPU(s) at "
                f"{spec.gpus_per_node} per node (largest now: "
                f"{largest_job(self.host_sig or (), spec.gpu_type)}); queued "
                f"{(self.now_ms - since_ms) / 1000:.0f}s past the "
                f"{self.config.drain_grace_s:g}s drain grace"
            ),
            spec=spec,
            run=job.run,
            resume_from=job.checkpoint,
        )

    # -- inputs that meet a rerouted job ---------------------------------------
    def on_admitted_here(self: Cell, event: ev.JobAdmitted) -> None:
        """``JobAdmitted``, minding jobs that drained away (see item 3)."""
        job_id = event.spec.job_id
        left_ms = self.rerouted.get(job_id)
        if left_ms is not None:
            if event.ts_ms <= left_ms:
                self.ignore(
                    job_id,
                    IgnoreCode.DUPLICATE,
                    f"duplicate admission: job was rerouted away from {self.cell_id}",
                    event,
                )
                return
            del self.rerouted[job_id]
        self.on_job_admitted(event)
        if self.host_sig is not None and self.config.drain_grace_s > 0 and self.now_ms > 0:
            job = self.jobs.get(job_id)
            if job is not None and job.state == JobState.QUEUED:
                if not job_fits(self.host_sig, job.spec, False):
                    self.unplaceable.setdefault(job_id, self.now_ms)

    def on_cancel_here(self: Cell, event: ev.CancelJob) -> None:
        if event.job_id in self.rerouted and event.job_id not in self.jobs:
            self.ignore(
                event.job_id,
                IgnoreCode.NOT_HERE,
                f"cancel refused: job was rerouted away from {self.cell_id}; "
                "admission forwards cancels to the cell that holds it",
                event,
            )
            return
        self.on_cancel(event)
