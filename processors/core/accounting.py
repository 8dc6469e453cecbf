"""Costs, capacity and the cell's periodic read-model output.

- Cost of a run in GPU-seconds, scaled by Dominant Resource Fairness when the
  job also asks for CPU or memory out of proportion to its GPUs.
- Bounded state: finished jobs and the failure log are expired, so a cell's
  snapshot stays the size of its live work.
- Periodic output: CellStatus (nodes, status rows, medians) and the wait
  estimates of the jobs nearest the front of each flow. The estimates
  themselves are ``estimates.py``; the breakers ``breakers.py``.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.states import GpuSlot, GpuState, NodeState, RunPhase

from .fairshare import Flow, LevelIndex, leaf_jobs
from .model import Job, Run
from .waitbands import WaitBands
from .waiting import HOLDING

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell


_DOWN = NodeState.DOWN  # bound once: these sums run on every admission


class Accounting:
    def shapes_of(self: Cell, job: Job) -> list[tuple[int, int, float]]:
        spec = job.spec
        shapes = [(spec.gpus, spec.gpus_per_node, spec.estimate_s)]
        shapes.extend((s.gpus, s.gpus_per_node, s.estimate_s) for s in spec.shapes)
        return shapes

    def fits_free_now(self: Cell, job: Job) -> bool:
        """Whether some node's free GPUs hold the job's smallest per-node need:
        a pass could start it now. O(GPUs per node) (the need is the cached
        ``bound_key``'s)."""
        return self.index.largest_free() >= self.bound_key(job)[0]

    def cost_of(self: Cell, job: Job, gpus: int, estimate_s: float) -> float:
        spec = job.spec
        factor = 1.0
        if (spec.cpus or spec.mem_gb) and self.capacity_gpus:
            gpu_share = gpus / self.capacity_gpus
            if spec.cpus and self.capacity_cpus:
                factor = max(factor, (spec.cpus / self.capacity_cpus) / gpu_share)
            if spec.mem_gb and self.capacity_mem:
                factor = max(factor, (spec.mem_gb / self.capacity_mem) / gpu_share)
        return gpus * estimate_s * factor

    @property
    def capacity_gpus(self: Cell) -> int:
        return sum(n.total for n in self.index.nodes.values() if n.state != _DOWN)

    @property
    def capacity_cpus(self: Cell) -> float:
        return sum(n.cpus for n in self.index.nodes.values() if n.state != _DOWN)

    @property
    def capacity_mem(self: Cell) -> float:
        return sum(n.mem_gb for n in self.index.nodes.values() if n.state != _DOWN)

    def leaf_of(self: Cell, job: Job | Run) -> Flow:
        """The fair-share flow a job (or one of its runs) is charged to (cached:
        this is on every admission, placement and release)."""
        key = (job.tier, job.tenant, job.user)
        leaf = self.leaves.get(key)
        if leaf is not None:
            return leaf
        tier = self.config.tier(job.tier)
        tenant = self.config.tenant(job.tenant)
        user_weight = dict(tenant.user_weights).get(job.user, 1.0)
        leaf = self.leaves[key] = self.fair.leaf(
            key, (tier.weight if tier else 1.0, tenant.weight, user_weight)
        )
        return leaf

    # -- bounded state ------------------------------------------------------------
    def __getstate__(self: Cell) -> dict:
        """A snapshot leaves out caches of outputs (rebuilt on first use)."""
        state = self.__dict__
        if "_status_cache" in state:
            state = {k: v for k, v in state.items() if k != "_status_cache"}
        return state

    def __setstate__(self: Cell, state: dict) -> None:
        """Unpickle a snapshot; one taken before the breaker and bounded-state
        fields existed gets them empty (its old failure log, of bare times,
        is dropped: it cannot say which tenants failed)."""
        self.__dict__.update(state)
        for name, make in (
            ("breaker_probes", dict),
            ("breaker_trips", dict),
            ("finished_marks", deque),
            ("finished_expired", int),
            ("wait_bands", WaitBands),
            ("gang_runs", dict),
            ("health_seen", dict),
        ):
            if name not in self.__dict__:
                setattr(self, name, make())
        for run in self.runs.values():
            if not hasattr(run, "gang"):  # pickled before gangs were tracked per member
                run.gang = None
            if not hasattr(run, "saved_ms"):  # pickled before saves were kept per run
                run.saved_ms = run.started_ms
        for leaf in self.leaves.values():
            if not hasattr(leaf, "keys"):  # pickled before leaves were served by size
                leaf.keys, leaf.ordered = None, []
        if any(entries and isinstance(entries[0], int) for entries in self.failure_log.values()):
            self.failure_log.clear()

    def expire_finished(self: Cell) -> None:
        """Forget terminal job ids ``finished_horizon_s`` of cell time after they
        ended, and failure evidence older than the breaker window. Driven by
        Ticks only, so replay reproduces it exactly.

        ``finished`` is insertion-ordered and only ever appended to (a job ends
        once), so ids ever added = ``len(finished) + finished_expired``. A mark
        ``(t, count)`` says the first ``count`` ids had ended by time ``t``;
        marks are taken at most every 1/64 of the horizon, so an id is
        forgotten between one horizon and 1/64 more after it ended."""
        horizon_ms = int(self.config.finished_horizon_s * 1000)
        marks = self.finished_marks
        added = len(self.finished) + self.finished_expired
        if not marks or (
            marks[-1][1] != added and self.now_ms - marks[-1][0] >= max(1, horizon_ms // 64)
        ):
            marks.append((self.now_ms, added))
            self.prune_failure_log()
        upto = 0
        while marks and marks[0][0] < self.now_ms - horizon_ms:
            upto = marks.popleft()[1]
        if upto > self.finished_expired:
            for job_id in list(itertools.islice(self.finished, upto - self.finished_expired)):
                del self.finished[job_id]
            self.finished_expired = upto

    def prune_failure_log(self: Cell) -> None:
        window = self.now_ms - int(self.config.breaker_window_s * 1000)
        stale = [k for k, entries in self.failure_log.items() if entries[-1][0] <= window]
        for key in stale:
            del self.failure_log[key]

    # -- periodic outputs ---------------------------------------------------------
    def publish_periodic(self: Cell) -> None:
        self.expire_finished()
        # step-rate medians on their own cadence: straggler detection must not
        # depend on CellStatus being published (the simulator turns that off)
        median_every = int(self.config.straggler_interval_s * 1000)
        if (
            median_every
            and self.now_ms - self.__dict__.get("_medians_ms", -median_every) >= median_every
        ):
            self._medians_ms = self.now_ms
            self.refresh_medians()
        status_every = int(self.config.status_interval_s * 1000)
        if status_every and self.now_ms - self.last_status_ms >= status_every:
            self.last_status_ms = self.now_ms
            self.emit(
                ev.CellStatus,
                cell=self.cell_id,
                nodes=self.node_statuses(),
                queues=self.queue_depths(),
            )
        estimate_every = int(self.config.estimate_interval_s * 1000)
        if estimate_every and self.now_ms - self.last_estimate_ms >= estimate_every:
            self.last_estimate_ms = self.now_ms
            self.publish_estimates()

    def node_statuses(self: Cell) -> tuple[ev.NodeStatus, ...]:
        """Every node's status. A node whose state, GPU states and owners are as
        at the last status reuses that (immutable) status: O(GPUs) of tuple
        compares per node instead of building GPUs + 1 events."""
        cache: dict[str, tuple[tuple, ev.NodeStatus]] | None = self.__dict__.get("_status_cache")
        if cache is None:
            cache = {}
            self._status_cache = cache
        out = []
        for node in self.index.nodes.values():
            key = (node.state, tuple(node.gpu_state), tuple(node.owner), node.gpu_type, node.rail)
            hit = cache.get(node.node_id)
            if hit is not None and hit[0] == key:
                out.append(hit[1])
                continue
            gpus = []
            for i in range(node.total):
                owner = node.owner[i]
                state = node.gpu_state[i] if node.state != NodeState.DOWN else GpuSlot.DOWN
                if owner is not None:
                    state = GpuSlot.BUSY if state == GpuState.OK else state
                elif state == GpuState.OK:
                    state = GpuSlot.FREE
                gpus.append(
                    ev.GpuStatus(
                        index=i,
                        state=state,
                        job_id=owner[0] if owner else "",
                        run=owner[1] if owner else 0,
                    )
                )
            status = ev.NodeStatus(
                node_id=node.node_id,
                state=node.state,
                gpu_type=node.gpu_type,
                rail=node.rail,
                gpus=tuple(gpus),
            )
            cache[node.node_id] = (key, status)
            out.append(status)
        return tuple(out)

    def queue_depths(self: Cell) -> tuple[ev.QueueDepth, ...]:
        """Per (tier, tenant) of every live job or run: queued jobs, their GPUs,
        and the GPUs runs hold. Cost: O(rows log rows) per publish (every
        ``status_interval_s``): the rows are kept where jobs are queued,
        placed, reshaped and released (``depth_rows``), not re-counted from
        every job and run."""
        tiers = self.fair.root.children
        out = []
        for (tier, tenant), (_, _, queued_gpus, held) in sorted(self.depth_rows().items()):
            flow = tiers.get(tier)
            org = flow.children.get(tenant) if flow is not None else None
            out.append(
                ev.QueueDepth(
                    tier=tier,
                    tenant=tenant,
                    queued=org.queued if org is not None else 0,
                    queued_gpus=queued_gpus,
                    running_gpus=held,
                )
            )
        return tuple(out)

    def publish_estimates(self: Cell) -> None:
        """Refresh wait estimates of the jobs nearest the front of each flow,
        publishing only those that moved by more than 20% (and 5 s), each with
        its position and why it waits (``waiting.py``); and the reason alone
        (no band) of a job that became held by something other than the order
        and its GPUs, or stopped being (``HOLDING``).

        Cost per publish: O(Q * depth * log siblings) for the Q queued jobs
        whose point it recomputes (``LevelIndex``, built once per parent in
        O(siblings log siblings)): every queued job, in fair order, until
        ``estimate_publish_limit`` have moved enough to be published (a job's
        point must be computed to know whether it moved). At the start of the
        fleet cell's hour-3 window (docs/measuring.md; 185 queued jobs) every
        point took ~7 us, 1.4 ms a publish (``time.perf_counter`` around the
        loop's ``predicted_wait_s`` calls, best of 7, 2026-12-02), once every
        ``estimate_interval_s``. Plus O(runs) for the GPUs each
        flow holds, the share of the running GPUs whose run loaded its model
        (``running_cold``: the started GPUs' share remembers a fresh cell's
        first runs, which all loaded, for ``MIX_HALVE_AT`` starts; on the
        default flood it put its refreshed points 2-5 s, 2-5 %, over the wait
        left long after those runs ended, 1-3 s with the running runs' share)
        and the bands' censoring, O(queued + kept refreshes)."""
        budget = self.config.estimate_publish_limit
        # nothing here changes the fair tree: one LevelIndex per parent serves
        # every refresh (O(log siblings) a level instead of O(siblings))
        levels: dict[Flow, LevelIndex] = {}
        self.wait_bands.censor(self.now_ms)
        held: dict[tuple[str, ...], int] = {}  # by flow: (tier,), (tier, tenant), (..., user)
        loaded = self.loaded_runs
        kept: dict[tuple[ev.NodeSlice, ...], int] = {}
        for run in self.runs.values():
            for key in ((run.tier,), (run.tier, run.tenant), (run.tier, run.tenant, run.user)):
                held[key] = held.get(key, 0) + run.gpus
            if loaded and run.placement in loaded and run.phase != RunPhase.STOPPING:
                kept[run.placement] = run.gpus  # settled runs left running_gpus
        if loaded is not None:
            self.keep_loaded(kept)
        self.wait_bands.sample_held(self.now_ms, held)
        terms = self.wait_terms()  # nothing below changes them
        mean_cost = self.mean_queued_cost()
        types: dict[str, int] | None = None  # free GPUs per type, read once if a job asks
        for leaf in self.active_leaves():
            ahead = 0.0
            # a publish changes no queue
            for i, job_id in enumerate(leaf_jobs(leaf)):
                if budget <= 0:
                    return
                job = self.jobs[job_id]
                ahead += job.cost
                served: list[float] = []
                wait = self.predicted_wait_s(
                    job, ahead, levels=levels, terms=terms, ahead_out=served
                )
                position = self.position_of(i, served[0] - ahead if served else 0.0, mean_cost)
                if job.spec.gpu_type and types is None:
                    types = dict(self.free_by_type())
                code, why = self.wait_reason(job, position, types)
                old = job.wait_estimate_s
                told = getattr(job, "wait_code", "")
                if abs(wait - old) > max(5.0, 0.2 * abs(old)):
                    job.wait_estimate_s = wait
                    job.wait_code = code
                    budget -= 1
                    bands = self.wait_bands
                    bands.refreshed(job_id, self.band_key(job), self.now_ms, wait)
                    p50, p90 = bands.band(
                        self.band_key(job),
                        wait,
                        self.wait_depth(wait, job.shape[0], terms),
                        refresh=True,
                    )
                    self.emit(
                        ev.JobWaitEstimated,
                        job_id=job_id,
                        wait_estimate_s=round(wait, 3),
                        wait_p50_s=round(p50, 3),
                        wait_p90_s=round(p90, 3),
                        position=position,
                        reason=why,
                        reason_code=code,
                    )
                elif code != told and (code in HOLDING or told in HOLDING):
                    # held, or no longer held, while the point stayed: the reason
                    # alone, with no new band (bands learn from point refreshes)
                    job.wait_code = code
                    budget -= 1
                    self.emit(
                        ev.JobWaitEstimated,
                        job_id=job_id,
                        wait_estimate_s=round(old, 3),
                        position=position,
                        reason=why,
                        reason_code=code,
                    )

    def active_leaves(self: Cell) -> list[Flow]:
        leaves = []
        stack = [self.fair.root]
        while stack:
            flow = stack.pop()
            if not flow.children:
                if flow.queued:
                    leaves.append(flow)
                continue
            stack.extend(reversed(list(flow.active.values())))
        return leaves
