"""Wait estimates: the point a queued job is told, and what it reads.

The point: GPU-seconds the fair order will serve before the job (its
own flow's backlog ahead of it, and each backlogged sibling flow up to the
virtual time this job's flow reaches), plus the job's GPUs times the running
work's mean residual per GPU (the wait for its own GPUs to free) and the
share of the other running work that the work ahead waits behind, over the
cell's healthy capacity, less as much of a busy GPU's mean residual when the
job starts (the work ahead has then started, not ended: ``point_wait_s``);
with ``model_load_s`` set, the model loads the queued and running runs are
expected to take, from the share of placements that load (``load_terms``).

Shapes: a queued job is not behind work of bigger shapes that it can pass
(``shape_class``, ``class_work``). The bands around the point are
``waitbands.py``; the periodic publish of refreshed estimates is
``Accounting.publish_estimates``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, cast

from framespool.schemas import events as ev
from framespool.schemas.states import NodeState

from .fairshare import Flow, LevelIndex
from .model import Job

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell


_DOWN = NodeState.DOWN  # bound once: these sums run on every admission
MIX_HALVE_AT = 4096.0  # run starts after which the started mix's moments are halved
LOAD_PRIOR_GPUS = 256.0  # GPU starts the model-mix prior of the loads' share weighs
SHAPE_CLASSES = 3  # GPUs a queued job needs on a node: 1-2, 3-4, more or a gang


def point_wait_s(
    ahead: float,
    gpus: int,
    running_gpu_s: float,
    running: int,
    capacity: int,
    residual_s: float = 0.0,
) -> float:
    """The point wait of a ``gpus``-GPU job with ``ahead`` GPU-seconds of others'
    work before it in a cell of ``capacity`` GPUs, ``running`` of them busy with
    ``running_gpu_s`` GPU-seconds still to run, when a busy GPU's run has
    ``residual_s`` left on average as the job starts (``WaitEstimates.predicted_wait_s``
    says why; 0: the time for the work ahead to end). The residual taken off is
    at most the running work the formula adds (``R + (R - g * r)``), so the point
    never falls as the work ahead grows and is never under ``g * r / capacity``. O(1)."""
    own = gpus * running_gpu_s / running if running > 0 else 0.0
    extra = max(0.0, running_gpu_s - own)
    behind = min(1.0, ahead / running_gpu_s) if running_gpu_s > 0 else 1.0
    started = min(residual_s * capacity, running_gpu_s + extra)
    return (ahead + own + behind * (extra - started)) / capacity


@dataclass(slots=True)
class StartMix:
    """Moments of the runs the cell starts, GPU-weighted, halved every
    ``MIX_HALVE_AT`` starts so the mix follows the load."""

    starts: float = 0.0
    gpu_e: float = 0.0  # sum of g * e (GPUs times estimate)
    gpu_e2: float = 0.0  # sum of g * e**2
    gpus: float = 0.0

    def note(self, gpus: int, estimate_s: float) -> None:
        self.starts += 1.0
        self.gpu_e += gpus * estimate_s
        self.gpu_e2 += gpus * estimate_s * estimate_s
        self.gpus += gpus
        if self.starts >= MIX_HALVE_AT:
            self.starts, self.gpu_e, self.gpu_e2, self.gpus = (
                self.starts / 2,
                self.gpu_e / 2,
                self.gpu_e2 / 2,
                self.gpus / 2,
            )

    def residual_s(self) -> float:
        return self.gpu_e2 / (2 * self.gpu_e) if self.gpu_e > 0 else 0.0


@dataclass(slots=True)
class LoadMix:
    """Which started runs loaded their model, in GPUs, halved with the starts
    (``WaitEstimates.note_load``)."""

    starts: float = 0.0
    gpus: float = 0.0
    loaded: float = 0.0  # GPUs of the runs that loaded their model
    warm: float = 0.0  # GPUs of the runs whose GPUs all held a model
    warm_loaded: float = 0.0  # ... and loaded (another model)
    model_sq: float = 0.0  # sum over models of their GPUs squared
    models: dict[str, float] = field(default_factory=dict)  # model -> GPUs started

    def note(self, gpus: int, model: str, cold: bool, all_held: bool) -> None:
        self.starts += 1.0
        self.gpus += gpus
        if cold:
            self.loaded += gpus
        if all_held:  # every GPU held a model: loads only for another one
            self.warm += gpus
            if cold:
                self.warm_loaded += gpus
        was = self.models.get(model, 0.0)
        self.models[model] = was + gpus
        self.model_sq += (was + gpus) ** 2 - was * was
        if self.starts >= MIX_HALVE_AT:
            self.starts /= 2
            self.gpus /= 2
            self.loaded /= 2
            self.warm /= 2
            self.warm_loaded /= 2
            self.model_sq /= 4
            for name in self.models:
                self.models[name] /= 2


class LoadTerms(NamedTuple):
    """What model loads add to the point wait (``WaitEstimates.load_terms``)."""

    factor: float  # the work ahead is A * factor
    loading: float  # GPU-seconds the running runs hold past their estimates
    residual: float  # a busy GPU's mean residual as the job starts
    late_s: float  # how much after their estimated ends the running runs free their GPUs


class WaitEstimates:
    start_mix: StartMix | None = None  # the runs started (note_run_start)
    load_mix: LoadMix | None = None  # which of them loaded their model (note_load)
    # placements of the runs that loaded their model -> GPUs (note_load; pruned
    # to the running runs and summed on the estimate cadence: running_cold)
    loaded_runs: dict[tuple[ev.NodeSlice, ...], int] | None = None
    running_cold: float = -1.0  # that sample's share of the running GPUs; -1: none yet
    # queued work per flow and shape class (``class_work``; no class default:
    # absent until built, so a cell restored from an older snapshot builds it)
    _class_work: dict[tuple[str, ...], list[float]]

    def predicted_wait_s(
        self: Cell,
        job: Job,
        own_ahead: float,
        passed_over: bool = False,
        levels: dict[Flow, LevelIndex] | None = None,
        terms: tuple[int, LoadTerms, float] | None = None,
        ahead_out: list[float] | None = None,
    ) -> float:
        """The time until the work ahead of the job has started and the job's own
        GPUs have freed (``point_wait_s``, shared with ``offers.predicted_wait_s``):
        ``(A + g * r + min(1, A / R) * (R - g * r - rho * capacity)) / capacity``,
        where ``A`` is the GPU-seconds the fair order serves before the job
        (others' work, not the job's own cost), ``g`` its GPUs, ``R`` the running
        work left, ``r = R / running GPUs`` its mean residual per GPU and ``rho``
        a busy GPU's mean residual for the mix of runs the cell starts
        (``run_residual_s``). With nothing ahead the job waits for its own ``g``
        GPUs to free (``g * r / capacity``), not for all the running work to end
        (the former ``R / capacity``: 1,000-2,000 s in a full cell whose jobs
        start within a second of the next end). The work ahead starts on GPUs as
        the running work ends, so the more there is, the more of the running
        work the job waits behind: all of it once ``A >= R`` (a flood's deep
        queue), where ``(A + R) / capacity`` is when all of it has *ended*. The
        job starts when it has *started*: the runs then in flight still hold
        ``rho`` per GPU, ``sum(g * e**2) / (2 * sum(g * e))`` (a renewal
        process's mean residual: a GPU is caught in a run in proportion to its
        length, halfway through on average). Measured on the default flood
        (from the runs in flight at each deep job's start): 90 s, what the
        started mix's estimates give (96 s).

        Model loads (``model_load_s``, ``load_terms``): a run placed on GPUs
        that do not hold its model loads it first, ``L`` GPU-seconds no
        estimate counts. The cell knows which placements load (``note_load``),
        so ``A`` becomes ``A * (1 + n * L / e)`` (``n`` the share of the next
        starts that load, ``e`` the started mix's mean estimate per GPU), ``R``
        gains ``s * L`` per running GPU (``s`` the share of the started GPUs
        that loaded), ``rho`` counts the loads in the runs' lengths, and the
        running runs' ends come ``s * L`` later. The default flood's deep jobs
        waited ~40 s over the point without this (the first runs all load:
        +20 s; then 38 % of the runs: +5 % of the depth); with it they wait it
        +16 s (shallowest tenth) to -28 s (deepest), as without cold starts
        (+16 to -20 s: estimates 3 % above the durations).

        At least the time the running runs take to free the GPUs the work ahead
        and the job need, by their estimated ends (``first_ends_wait_s``): runs
        that started together end together, not in turn.

        At least the work ahead within each of the job's flows over the GPUs
        that flow drains at (``drain_wait_s``): the fair order sees only the
        work queued now, not what the others submit while the job waits.

        A job passed over while it fits the free GPUs now is not behind the
        bigger shapes queued in the cell (``unpassable_share`` of the cell's
        queued work: a gang that does not fit them waits for a reservation,
        the job for the next pass to reach it or its cap to lift), so ``A``
        counts only that share. Where the free GPUs do not fit it, the bigger
        work ahead starts as GPUs free, and the job behind it.

        0 when ``g`` GPUs are free and nothing is ahead, unless the scheduler
        has just ``passed_over`` the job (admission asks after the admission's
        own pass: a job still queued then is held by something the free GPUs
        do not show, a reservation, a guarantee, a cap or fragments).

        ``own_ahead``: GPU-seconds queued in the job's own flow up to and
        including the job itself; ``levels``: ``FairTree.work_ahead``'s cache
        for a publish's many calls; ``terms``: ``wait_terms()``, which a
        publish takes once for all its calls; ``ahead_out``: gets the GPU-seconds
        the fair order serves up to and including the job (its position,
        ``waiting.py``). Cost: O(depth of the fair tree * siblings)
        plus O(tiers); the loads O(1); the shape classes O(1) a level plus
        O(max GPUs per node) for ``largest_free``."""
        leaf = self.leaf_of(job)
        below: list[float] = []
        ahead = self.fair.work_ahead(leaf, own_ahead, below, levels)
        if ahead_out is not None:
            ahead_out.append(ahead)
        capacity, loads, remaining = terms if terms is not None else self.wait_terms()
        if capacity <= 0:
            return -1.0
        gpus = job.shape[0]
        if not passed_over and self.index.free_total >= gpus and ahead <= job.cost:
            return 0.0
        if passed_over and self.fits_free_now(job):  # the bigger shapes ahead are passed too
            ahead *= self.unpassable_share((), self.shape_class(job))
        others = max(0.0, ahead - job.cost)
        loaded = others * loads.factor
        point = point_wait_s(loaded, gpus, remaining, self.running_gpus, capacity, loads.residual)
        if loaded < remaining:  # deeper, the point is past what the ends can say
            ends = self.first_ends_wait_s(others, gpus, capacity, remaining, loads)
            point = max(point, ends)
        return max(point, self.drain_wait_s(job, leaf, below, capacity, passed_over))

    def wait_terms(self: Cell) -> tuple[int, LoadTerms, float]:
        """What every point reads of the cell as a whole: the capacity (the
        free and running GPUs, else every node's; 0: no GPUs at all), the
        model loads' terms (``load_terms``) and the running work left, loads
        included. O(1) but for a cell without running or free GPUs (O(nodes))."""
        capacity = self.index.free_total + self.running_gpus
        if capacity <= 0:
            capacity = sum(n.total for n in self.index.nodes.values())
        loads = self.load_terms()
        return capacity, loads, self.running_left_gpu_s() + loads.loading

    def deep_point_s(
        self: Cell, gpus: int, capacity: int, remaining: float, residual: float
    ) -> float:
        """The point of a job behind a queue as deep as the running work
        (``point_wait_s`` with ``A = R``): what the running runs' ends can say
        at most (``first_ends_wait_s``). O(1)."""
        return point_wait_s(remaining, gpus, remaining, self.running_gpus, capacity, residual)

    def first_ends_wait_s(
        self: Cell, ahead: float, gpus: int, capacity: int, remaining: float, loads: LoadTerms
    ) -> float:
        """When the running runs will have freed the GPUs the work ahead and the
        job take (``ahead`` GPU-seconds over the started mix's mean estimate
        per GPU, plus ``gpus``), by their static ends (``release_list``, sorted):
        the point's ``g * r`` has the GPUs free in turn, one every ``r / capacity``,
        but runs that started together end together (a flood into an empty cell:
        its first ~1,000 forecasts waited 2-3x that point). At most the point of
        a queue as deep as the running work (``point_wait_s`` with ``A = R``):
        past it the work ahead starts on GPUs freed twice, which the ends alone
        do not count (so ``predicted_wait_s`` asks only while ``ahead < R``:
        deeper, the point is past the cap). 0 before any start. O(1): the
        release list is kept sorted as runs start and end, and its GPUs per
        slice are taken as even (the ``k``-th GPU is read at slice
        ``k * slices / running GPUs``); ``remaining`` and ``loads``: the
        caller's running work left (loads included) and ``load_terms``."""
        mix = self.start_mix
        running = self.running_gpus
        if not mix or mix.gpu_e <= 0 or running <= 0:
            return 0.0
        ends = self.release_list()
        if not ends:
            return 0.0
        # GPUs: GPU-seconds over the mean estimate; a part of a job still takes a GPU
        need = math.ceil(ahead * mix.gpus / mix.gpu_e - 1e-9) + gpus
        i = max(0, min(len(ends) - 1, math.ceil(need * len(ends) / running) - 1))
        free_s = max(0.0, (ends[i][0] - self.now_ms) / 1000) + loads.late_s
        return min(free_s, self.deep_point_s(gpus, capacity, remaining, loads.residual))

    def band_key(self: Cell, job: Job) -> str:
        """What a job's wait bands learn and read under (waitbands.py): its
        tier and its ``shape_class``. Jobs of one tier wait apart by shape
        (on the genai workload, interactive jobs told a positive P50 waited
        0.7 s at the median on 1 GPU and 6.2 s on 8; under the tier's one band
        15 % of the 4-GPU and 5 % of the 8-GPU ones were under their P50)."""
        return f"{job.tier}/{self.shape_class(job)}"

    def shape_class(self: Cell, job: Job) -> int:
        """Which work a job can pass within its flow (``class_work``): 0 for at
        most 2 GPUs on a node, 1 for at most 4, 2 for more or a gang, by its
        smallest shape (fixed for its life). O(1) (the cached ``bound_key``)."""
        need, nodes = self.bound_key(job)[:2]
        return _shape_class(need, nodes)

    def class_work(self: Cell) -> dict[tuple[str, ...], list[float]]:
        """Per flow (``(tier,)``, ``(tier, tenant)``, ``(tier, tenant, user)``
        and the cell's, ``()``) with queued jobs: ``[jobs, GPU-seconds]`` of
        its queued jobs per ``shape_class`` (``SHAPE_CLASSES`` pairs), kept by
        ``note_queued`` as jobs are queued and dequeued, O(depth) each. Built from the queues on first
        use (a new cell, or one restored from a snapshot taken before it was
        kept), O(queued)."""
        table: dict[tuple[str, ...], list[float]] | None = self.__dict__.get("_class_work")
        if table is None:
            table = self._class_work = {}
            for leaf in self.leaves.values():
                for source in (leaf.requeued, leaf.queue):
                    for job_id in source:
                        self._add_class_work(table, self.jobs[job_id], 1)
        return table

    def note_queued(self: Cell, job: Job, delta: int, bound: tuple | None = None) -> None:
        """The job joined (``delta`` 1) or left (-1) its flow's queue: called
        after the queue changed, so a table built now already counts it.
        ``bound``: the job's ``bound_key`` when the caller has it (its smallest
        per-node need and node count give the class without a second look at
        its shapes). O(depth + shapes)."""
        table = self.__dict__.get("_class_work")
        if table is None:
            self.class_work()
        else:
            self._add_class_work(table, job, delta, bound)

    def _add_class_work(
        self: Cell,
        table: dict[tuple[str, ...], list[float]],
        job: Job,
        delta: int,
        bound: tuple | None = None,
    ) -> None:
        c = self.shape_class(job) if bound is None else _shape_class(bound[0], bound[1])
        tier, tenant = job.tier, job.tenant
        for path in ((tier, tenant, job.user), (tier, tenant), (tier,), ()):
            row = table.get(path)
            if row is None:
                row = table[path] = [0.0] * (2 * SHAPE_CLASSES)
            row[c] += delta
            # exact zero once the class is empty (no float drift kept)
            row[SHAPE_CLASSES + c] = row[SHAPE_CLASSES + c] + delta * job.cost if row[c] else 0.0
            if not any(row[:SHAPE_CLASSES]):
                del table[path]

    def unpassable_share(self: Cell, path: tuple[str, ...], cls: int) -> float:
        """The share of a flow's queued GPU-seconds a job of ``shape_class``
        ``cls`` cannot pass: the work of its own class and smaller ones (the
        bigger shapes ahead of it are blocked where it fits: a queued flow's
        small job backfills past its own flow's blocked gangs in the next full
        pass). 1 with nothing kept. O(1)."""
        row = self.class_work().get(path)
        if row is None or cls >= SHAPE_CLASSES - 1:
            return 1.0
        work = row[SHAPE_CLASSES:]
        total = sum(work)
        return sum(work[: cls + 1]) / total if total > 0 else 1.0

    def drain_wait_s(
        self: Cell, job: Job, leaf: Flow, below: list[float], capacity: int, passed_over: bool
    ) -> float:
        """The longest of the job's flows' drain times: the work ahead within a
        flow (``below``: within its user's, its tenant's, its tier's flow) over
        the GPUs that flow drains at, the GPUs its runs held lately
        (``WaitBands.sample_held``), at least its weighted share of
        ``capacity`` among its backlogged siblings at every level above.

        At admission a flow's work ahead is only the share of its queued
        GPU-seconds the job cannot pass (``unpassable_share``: its own shape
        class and smaller): a small job backfills past its own flow's blocked
        gangs in the next full pass. Without it the heaviest paid tenant's
        small jobs were told 1,500-15,000 s (~400,000 GPU-s of gangs ahead
        over the ~21 GPUs the flow held) and started within seconds:
        multitenant, of the paid jobs told a P50 >= 1,000 s 59 % started
        within 60 s, 8 % with it (told>0 within P50/P90 53.5/89.0 -> 55.2/92.1
        %; 7 % and 60.0/91.8 % with the fair order's share of
        ``predicted_wait_s`` too). On refreshes it is left out (the tier
        level's share of a cumulative ``own_ahead`` is no better than the
        whole: refreshed bands 62.7/86.1 -> 53.0/80.3 % with it).

        The fair order's work ahead counts the others' work queued now, not
        what they submit while the job waits: in a sustained backlog the tiers
        above keep submitting and being served first, and within a tier the
        light tenants keep jumping a heavy tenant's queue, so a flow's queue
        drains at what the flow is served. The tier's term always applies (its
        floor is the tier's share); a tenant's or user's applies at admission
        and only once its service was sampled: a flow with no record (new, or
        a flood admitted before the first sample) has the fair order's
        arithmetic alone, since its share floor ignores siblings too small to
        use their share (measured: the default flood's forecasts went from
        87.6 to 93.8 % under their P50 with it). On refreshes the lower levels
        made the refreshed P50 cover 77.7 % (their own multipliers did not
        absorb it), so they are left out there. O(siblings) per level used: the
        tiers' on a refresh, every level's at admission (as ``work_ahead``),
        plus O(1) a level for the shape classes."""
        path = (job.tier, job.tenant, job.user)
        flows = list(leaf.chain())  # the user's flow, its tenant's, its tier's
        held_by = self.wait_bands.held
        top = len(below) - 1
        share = float(capacity)
        wait = 0.0
        cls = self.shape_class(job) if passed_over else 0  # read only at admission
        for level in range(top, -1, -1):  # the tier first: each level's share nests
            if level != top and not passed_over:
                break
            flow = flows[level]
            parent = cast(Flow, flow.parent)
            total = sum(f.weight for f in parent.active.values())
            if flow.name not in parent.active:
                total += flow.weight
            share *= flow.weight / total if total > 0 else 1.0
            key = path[: len(path) - level]
            unpassable = self.unpassable_share(key, cls) if passed_over else 1.0
            work = below[level] * unpassable - job.cost
            if work <= 0:
                continue
            held = held_by.get(key)
            if held is None and level != top:
                continue
            wait = max(wait, work / max(share, held or 0.0, 1.0))
        return wait

    def note_run_start(self: Cell, gpus: int, estimate_s: float) -> None:
        """A run started: fold its GPUs and estimate into the started mix's
        moments (``run_residual_s``); halved every ``MIX_HALVE_AT`` starts so
        the mix follows the load. O(1)."""
        if self.start_mix is None:
            self.start_mix = StartMix()
        self.start_mix.note(gpus, estimate_s)

    def run_residual_s(self: Cell) -> float:
        """The mean time a busy GPU still needs at a random moment, for the mix
        of runs the cell starts: ``sum(g * e**2) / (2 * sum(g * e))`` over the
        started runs (a renewal process's mean residual life, GPU-weighted: a
        run of estimate ``e`` holds its GPUs for ``e`` and is caught, on
        average, halfway). 0 before any start. O(1)."""
        return self.start_mix.residual_s() if self.start_mix else 0.0

    def note_load(
        self: Cell, slices: tuple[ev.NodeSlice, ...], model: str, gpus: int, estimate_s: float
    ) -> None:
        """A run is placed: fold whether it loads ``model`` into the loads'
        moments (``load_terms``). It loads when a GPU of ``slices`` holds
        another model or none, and then all its GPUs wait (a run starts when
        its slowest GPU is ready). Asked before the GPUs are marked warm;
        halved every ``MIX_HALVE_AT`` starts, like the started mix. A run that
        loads is kept by its placement (``loaded_runs``, for ``running_cold``).
        O(GPUs of the run), O(models started) on a halving, O(runs) once the
        kept placements outnumber twice the runs."""
        nodes = self.index.nodes
        held = [nodes[p.node_id].warm[i] for p in slices for i in p.gpus]
        if self.load_mix is None:
            self.load_mix = LoadMix()
        cold = any(m != model for m in held)
        self.load_mix.note(gpus, model, cold, all(held))
        loaded = self.loaded_runs
        if loaded is None:
            loaded = self.loaded_runs = {}
        if not cold:
            loaded.pop(slices, None)
            return
        loaded[slices] = gpus
        if len(loaded) > 2 * len(self.runs) + 64:  # the ended runs' (amortized O(1))
            runs = self.runs.values()
            self.loaded_runs = {r.placement: r.gpus for r in runs if r.placement in loaded}

    def keep_loaded(self: Cell, kept: dict[tuple[ev.NodeSlice, ...], int]) -> None:
        """The estimate cadence's sample of the runs that loaded their model:
        ``kept`` (by placement, the running ones) and their share of the running
        GPUs (``running_cold``, -1 with none running). O(len(kept))."""
        self.loaded_runs = kept
        running = self.running_gpus
        self.running_cold = sum(kept.values()) / running if running > 0 else -1.0

    def cold_share(self: Cell) -> float:
        """The share of started GPUs whose run loaded its model (0 before any
        start): the running runs' share (``load_terms``). O(1)."""
        mix = self.load_mix
        return mix.loaded / mix.gpus if mix and mix.gpus > 0 else 0.0

    def next_cold_share(self: Cell) -> float:
        """The share of the GPUs started next whose run will load its model:
        the share among the started GPUs that all held a model (a GPU that
        held none, a fresh cell's, loads once and never again), with a prior
        worth ``LOAD_PRIOR_GPUS`` starts: ``1 - sum(p_m ** 2)``, ``p_m`` the
        share of started GPUs that run model ``m``, the chance that a GPU freed
        by the started mix holds another model than a job drawn from it (warm
        placement does better when several GPUs are free at once). A flood
        admitted into a fresh cell has only the prior: its first runs took
        GPUs that held nothing, and none ends before it is all admitted
        (measured on the default flood: prior 0.45, the share it then had
        0.385). O(1)."""
        mix = self.load_mix
        if not mix or mix.gpus <= 0:
            return 0.0
        prior = max(0.0, 1.0 - mix.model_sq / (mix.gpus * mix.gpus))
        return (mix.warm_loaded + LOAD_PRIOR_GPUS * prior) / (mix.warm + LOAD_PRIOR_GPUS)

    def load_terms(self: Cell) -> LoadTerms:
        """What model loads add to the point wait, ``L = model_load_s`` the GPU
        time a run that loads its model takes before its work starts (no
        estimate counts it), ``s`` the share of the running GPUs whose run
        loaded (``running_cold``, counted on the estimate cadence; before the
        first count the started GPUs' share, ``cold_share``), ``n`` that of
        the GPUs started next
        (``next_cold_share``), ``e`` the started mix's mean estimate per GPU:

        - ``factor``: the work ahead is ``A * factor``, ``1 + n * L / e``: ``A / e``
          GPUs ahead, each loading ``n * L`` on average;
        - ``loading``: GPU-seconds the running runs hold past their estimates,
          ``s * L`` per running GPU (a run that loads ends ``L`` after its
          estimated end, whether or not it is still loading);
        - ``residual``: a busy GPU's mean residual as the job starts
          (``run_residual_s``) for runs that hold their GPUs ``L`` longer a
          share ``n`` of the time, ``(E[g e**2] + 2 n L e + n L**2) / (2 (e + n L))``
          per started GPU;
        - ``late_s``: how much after their estimated ends the running runs free
          their GPUs, ``s * L`` on average.

        ``(1, 0, run_residual_s(), 0)`` when ``model_load_s`` is 0 (the default,
        and a config pickled before the knob) or before any start. O(1): the
        moments are kept as runs start (``note_run_start``, ``note_load``)."""
        load_s = getattr(self.config, "model_load_s", 0.0)
        mix = self.start_mix
        if load_s <= 0 or not self.load_mix or not mix or mix.gpu_e <= 0:
            return LoadTerms(1.0, 0.0, self.run_residual_s(), 0.0)
        late_s = (self.running_cold if self.running_cold >= 0 else self.cold_share()) * load_s
        next_s = self.next_cold_share() * load_s
        m1, m2 = mix.gpu_e / mix.gpus, mix.gpu_e2 / mix.gpus  # per GPU started: e and e**2
        factor = 1.0 + next_s / m1
        residual = (m2 + 2 * next_s * m1 + next_s * load_s) / (2 * (m1 + next_s))
        return LoadTerms(factor, late_s * self.running_gpus, residual, late_s)

    def running_left_gpu_s(self: Cell) -> float:
        """GPU-seconds the running work still needs by its estimates (never
        negative: a run past its estimate needs 0). O(1): ``running_end_gpu_s``
        and ``running_gpus`` are kept as runs start and end."""
        return max(0.0, self.running_end_gpu_s - self.running_gpus * self.now_ms / 1000)

    def wait_depth(
        self: Cell, wait_s: float, gpus: int = 1, terms: tuple[int, LoadTerms, float] | None = None
    ) -> float:
        """Jobs that must end before a ``gpus``-GPU job told ``wait_s`` starts,
        for the wait bands' depth prior: one (the first end that frees its GPUs)
        plus the queued work the wait drains, over the mean cost of a queued job.
        The queued work is what the wait holds beyond the running work it
        waits behind (``point_wait_s``: its own GPUs' residual ``g * r``, up to
        all of the running work ``R`` as the queue ahead grows to ``R``, less as
        much of the started runs' residual ``rho``), inverted:
        ``wait * capacity = A + g * r + min(1, A / R) * (R - g * r - rho * capacity)``;
        at most the jobs ahead that the running runs' ends imply when they
        decide the wait (``_jobs_ahead_of_ends``). ``terms``: ``wait_terms()``,
        the capacity, loads and running work the point was computed with.
        O(tiers + log slices): the tier flows keep their queued count and backlog."""
        queued, backlog = 0, 0.0
        for tier in self.fair.root.active.values():
            queued += tier.queued
            backlog += tier.backlog
        if wait_s <= 0 or queued <= 0 or backlog <= 0:
            return 1.0
        capacity, loads, remaining = terms if terms is not None else self.wait_terms()
        own = gpus * (remaining / self.running_gpus) if self.running_gpus > 0 else 0.0
        held = wait_s * capacity - own  # A + min(1, A / R) * net
        extra = max(0.0, remaining - own)
        net = extra - min(loads.residual * capacity, remaining + extra)
        if remaining <= 0:
            ahead = held
        elif held <= remaining + net and remaining + net > 0:  # A <= R
            ahead = held * remaining / (remaining + net)
        else:
            ahead = held - net
        depth = 1.0 + max(0.0, ahead) / loads.factor * queued / backlog
        ends = self._jobs_ahead_of_ends(wait_s, gpus, capacity, remaining, loads)
        return min(depth, 1.0 + ends)

    def _jobs_ahead_of_ends(
        self: Cell, wait_s: float, gpus: int, capacity: int, remaining: float, loads: LoadTerms
    ) -> float:
        """``first_ends_wait_s`` inverted: the fewest jobs ahead whose GPUs the
        running runs free by ``wait_s``, at the started mix's GPUs per run (inf
        where the ends do not decide the wait). The point is the larger of the
        two arithmetics, so the depth it implies is the smaller of the two: a
        job told when a wave of runs that started together ends is one end
        deep, not as deep as the GPU-seconds that wave holds. O(log slices)."""
        mix = self.start_mix
        running = self.running_gpus
        if not mix or mix.gpu_e <= 0 or running <= 0:
            return math.inf
        ends = self.release_list()
        if not ends or wait_s >= self.deep_point_s(gpus, capacity, remaining, loads.residual):
            return math.inf
        i = bisect_left(ends, (self.now_ms + int((wait_s - loads.late_s) * 1000),))
        freed = (i + 1) * running / len(ends)  # GPUs freed by the end at slice i
        return max(0.0, freed - gpus) * mix.starts / mix.gpus


def _shape_class(need: int, nodes: int) -> int:
    """``WaitEstimates.shape_class`` of a job's smallest per-node need and node count."""
    return 2 if nodes > 1 or need > 4 else 1 if need > 2 else 0
