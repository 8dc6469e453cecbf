"""A workload shaped like the mission: a text-to-video service with thousands of tenants.

- Tenants: about one per 6.4 jobs (27,000 jobs come from ~4,200 tenants), spread
  evenly over the five tiers, so a 100,000-job day has thousands per tier.
- Volumes are Zipf-like within a tier (tenant of rank r submits in proportion
  to 1/r): a few tenants submit thousands of jobs, most one to five.
- Shapes 1, 2, 4, 8, 16, 32 and 64 GPUs (8 per node above 8); interactive
  work is small and short, batch long; free and batch work mostly checkpoints
  (and so is preemptible).
- Arrivals are Poisson with a diurnal swing (x0.65 to x1.35 of the mean rate),
  sized so the mean offered load is ``load`` (default 1.3: the backlog grows
  for hours).
- Or, with ``jobs_per_day``, arrivals come at that many jobs a day (a 5 M-job
  day is 57.9 jobs/s) and every job's run time is scaled by one factor so the
  mean offered load is still ``load`` (``run_time_scale``): many jobs a day on
  a fleet of a given size means short jobs.

``partition`` splits one workload over several independent cells the way
admission routes jobs (rendezvous hashing of the job id), each cell keeping
the global job ids and seeing the same tenants.
"""

from __future__ import annotations

import bisect
import math
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from framespool.processors.core.admission import rendezvous

from .workload import TenantMix, TraceJob, Workload, _JobMaker, _pick, _poisson

DEFAULT_LOAD = 1.3
JOBS_PER_TENANT = 27_000 / 4_200
ALL_SIZES = ((1, 0.34), (2, 0.20), (4, 0.16), (8, 0.14), (16, 0.08), (32, 0.05), (64, 0.03))
SMALL_SIZES = ((1, 0.60), (2, 0.25), (4, 0.15))
FREE_SIZES = ((1, 0.40), (2, 0.25), (4, 0.17), (8, 0.12), (16, 0.06))
SIGMA = 1.0
MIN_S = 10.0
MAX_S = 4 * 3600.0
SWING = 0.35
# the shortest run of a workload whose run times are scaled (``jobs_per_day``)
MIN_SCALED_S = 1.0
DAY_S = 86_400.0


@dataclass(frozen=True)
class TierMix:
    tier: str
    job_share: float
    median_s: float
    sizes: tuple[tuple[int, float], ...]
    checkpoint_share: float
    weight: float = 1.0  # each tenant's weight in this tier


TIER_MIX = (
    TierMix("interactive", 0.15, 60.0, SMALL_SIZES, 0.0),
    TierMix("enterprise", 0.25, 420.0, ALL_SIZES, 0.1, 2.0),
    TierMix("paid", 0.25, 420.0, ALL_SIZES, 0.2),
    TierMix("free", 0.20, 300.0, FREE_SIZES, 0.5),
    TierMix("batch", 0.15, 900.0, ALL_SIZES, 0.8),
)


def mean_gpu_s() -> float:
    """Mean GPU-seconds of one job of the mix (before clipping at ``MAX_S``)."""
    total = 0.0
    for mix in TIER_MIX:
        gpus = sum(g * p for g, p in mix.sizes)
        total += mix.job_share * gpus * mix.median_s * math.exp(SIGMA * SIGMA / 2)
    return total


def _clipped_lognormal_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """E[min(max(X, low), high)] for X log-normal(mu, sigma), in closed form."""

    def cdf(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    a, b = math.log(low), math.log(high)
    inside = math.exp(mu + sigma * sigma / 2) * (
        cdf((b - mu - sigma * sigma) / sigma) - cdf((a - mu - sigma * sigma) / sigma)
    )
    return low * cdf((a - mu) / sigma) + high * (1.0 - cdf((b - mu) / sigma)) + inside


def clipped_mean_gpu_s(scale: float = 1.0, min_s: float = MIN_S) -> float:
    """Mean GPU-seconds of one job of the mix whose medians are multiplied by
    ``scale``, with run times clipped to [``min_s``, ``MAX_S``] as drawn."""
    shares = sum(m.job_share for m in TIER_MIX)
    total = 0.0
    for mix in TIER_MIX:
        gpus = sum(g * p for g, p in mix.sizes)
        seconds = _clipped_lognormal_mean(math.log(mix.median_s * scale), SIGMA, min_s, MAX_S)
        total += mix.job_share / shares * gpus * seconds
    return total


def run_time_scale(target_gpu_s: float) -> float:
    """The factor on every tier's median run time that makes the mix's mean
    job ``target_gpu_s`` GPU-seconds, run times clipped to [``MIN_SCALED_S``,
    ``MAX_S``] as drawn. Bisection on the closed-form clipped mean (monotone in
    the factor): about 60 evaluations of five tiers, once per workload.
    ValueError when no factor reaches it (the clip bounds the mean)."""
    low, high = 1e-6, 1e6
    if not (
        clipped_mean_gpu_s(low, MIN_SCALED_S)
        < target_gpu_s
        < clipped_mean_gpu_s(high, MIN_SCALED_S)
    ):
        raise ValueError(
            f"no run-time scale gives a mean job of {target_gpu_s:,.1f} GPU-s with run times "
            f"of {MIN_SCALED_S:g} to {MAX_S:,.0f} s: change --jobs-per-day, --load or the fleet"
        )
    for _ in range(200):
        mid = math.sqrt(low * high)
        if clipped_mean_gpu_s(mid, MIN_SCALED_S) < target_gpu_s:
            low = mid
        else:
            high = mid
        if high / low < 1 + 1e-12:
            break
    return math.sqrt(low * high)


def multitenant(
    jobs: int,
    seed: int,
    capacity_gpus: int,
    load: float | None = None,
    tenants: int = 0,
    jobs_per_day: int = 0,
) -> Workload:
    """``jobs`` of the mix; arrivals sized by ``load`` or, with ``jobs_per_day``, fixed.

    Without ``jobs_per_day`` the arrival rate is ``load x capacity_gpus /
    mean_gpu_s()`` and the diurnal period a third of the run (at most a day).

    With ``jobs_per_day`` (N) the arrival rate is N / 86,400 per second, the
    diurnal period a day, and the tenant mix, tiers, shapes and swing are kept;
    every tier's median run time is multiplied by one factor (``run_time_scale``)
    so the mean job is ``load x capacity_gpus x 86,400 / N`` GPU-seconds (276 at
    5 M a day on 16,000 GPUs and load 1.0) and the offered load stays ``load``.
    Run times are then clipped to [1 s, 4 h] rather than [10 s, 4 h], and the
    factor accounts for the clip in closed form. Cost: the same per job as
    without it (one draw per field); the factor is computed once."""
    load = DEFAULT_LOAD if load is None else load
    n_tenants = tenants or max(len(TIER_MIX), round(jobs / JOBS_PER_TENANT))
    per_tier = [n_tenants // len(TIER_MIX)] * len(TIER_MIX)
    for i in range(n_tenants % len(TIER_MIX)):
        per_tier[i] += 1
    mixes: list[tuple[TierMix, tuple[TenantMix, ...], list[float]]] = []
    for mix, count in zip(TIER_MIX, per_tier):
        members = tuple(
            TenantMix(f"{mix.tier[:3]}{i:05d}", mix.tier, mix.weight, 1.0, mix.checkpoint_share)
            for i in range(count)
        )
        cumulative, acc = [], 0.0
        for rank in range(1, count + 1):
            acc += 1.0 / rank
            cumulative.append(acc)
        mixes.append((mix, members, [c / acc for c in cumulative]))
    tier_cumulative, acc = [], 0.0
    for mix in TIER_MIX:
        acc += mix.job_share
        tier_cumulative.append(acc / sum(m.job_share for m in TIER_MIX))
    scale, min_s = 1.0, MIN_S
    if jobs_per_day:
        rate = jobs_per_day / DAY_S
        period = DAY_S
        scale = run_time_scale(load * capacity_gpus / rate)
        min_s = MIN_SCALED_S
    else:
        rate = load * capacity_gpus / mean_gpu_s()
        span_s = jobs / rate
        period = min(DAY_S, max(600.0, span_s / 3))
    mus = [math.log(mix.median_s * scale) for mix, _, _ in mixes]

    def jobs_iter() -> Iterator[TraceJob]:
        arrivals = random.Random(seed)
        maker = _JobMaker(seed + 1, sigma=SIGMA, max_s=MAX_S, min_s=min_s)
        times = _poisson(
            arrivals,
            lambda t: rate * (1.0 + SWING * math.sin(2 * math.pi * t / period)),
            rate * (1.0 + SWING),
        )
        rng = maker.rng
        for idx in range(jobs):
            t = next(times)
            k = min(bisect.bisect_left(tier_cumulative, rng.random()), len(mixes) - 1)
            mix, members, cumulative = mixes[k]
            tenant = members[min(bisect.bisect_left(cumulative, rng.random()), len(members) - 1)]
            gpus = _pick(rng, mix.sizes)
            duration = maker.duration(mu=mus[k])
            yield maker.make(idx, t, tenant, gpus, duration)

    medians = f"median {60 * scale:.3g} s interactive to {900 * scale:.3g} s batch"
    per_day = ""
    if jobs_per_day:
        per_day = f", {jobs_per_day:,} jobs a day (run times x{scale:.3g})"
    return Workload(
        name="multitenant",
        total=jobs,
        tenants={m.name: m.weight for _, members, _ in mixes for m in members},
        jobs=jobs_iter,
        description=f"{n_tenants:,} tenants over 5 tiers with Zipf-like volumes, diurnal "
        f"Poisson arrivals at {load:.0%} mean load{per_day}, 1-64 GPU shapes "
        f"(log-normal durations, {medians})",
    )


@dataclass(frozen=True)
class Routing:
    """Where admission sends each job of a workload's stream, read once.

    ``owners[k]`` is the index in ``cells`` of the stream's k-th job; only
    jobs at or before the horizon are listed. ``cut`` holds the cells that
    have a job after the horizon: their streams stop there although their
    day goes on (so their simulation runs to the horizon, as it would with
    the whole stream)."""

    cells: tuple[str, ...]
    owners: bytearray | array
    cut: frozenset[int]
    horizon_ms: int | None

    def total(self, index: int) -> int:
        return self.owners.count(index)


def route(workload: Workload, cells: tuple[str, ...], horizon_ms: int | None = None) -> Routing:
    """Route every job of ``workload`` up to ``horizon_ms`` (all of them when None).

    Cost: one pass of the stream up to the horizon and on until every cell
    has had a job after it (about ``cells x ln(cells)`` more jobs), one
    ``rendezvous`` (``len(cells)`` hashes) per job; one byte per job inside
    the horizon (two past 256 cells). Jobs after the horizon are not kept."""
    index = {c: i for i, c in enumerate(cells)}
    owners: bytearray | array = bytearray() if len(cells) <= 256 else array("H")
    cut: set[int] = set()
    for job in workload.jobs():
        owner = index[rendezvous(job.job_id, cells)]
        if horizon_ms is None or job.submit_ms <= horizon_ms:
            owners.append(owner)
            continue
        cut.add(owner)
        if len(cut) == len(cells):
            break
    return Routing(cells, owners, frozenset(cut), horizon_ms)


def partition(
    workload: Workload, cells: tuple[str, ...], cell: str, routing: Routing | None = None
) -> Workload:
    """The jobs admission would route to ``cell`` (rendezvous hashing by job id).

    With a ``routing`` (``route``, read once for all cells) nothing is hashed
    again: the cell's stream regenerates the workload's up to the routing's
    horizon and keeps its own jobs, so each cell pays for the jobs inside the
    horizon, not for the whole day."""
    routing = routing or route(workload, cells)
    if routing.cells != cells:
        raise ValueError(f"routing is for cells {routing.cells}, not {cells}")
    mine = cells.index(cell)
    owners = routing.owners

    def jobs_iter() -> Iterator[TraceJob]:
        # owners first: the stream is not read past the last routed job
        for owner, job in zip(owners, workload.jobs()):
            if owner == mine:
                yield job

    return Workload(
        name=workload.name,
        total=routing.total(mine),
        tenants=workload.tenants,
        jobs=jobs_iter,
        node_failures_per_hour=workload.node_failures_per_hour,
        description=f"{workload.description}; the share of {len(cells)} cells routed to {cell}",
        notes=list(workload.notes),
        cut=mine in routing.cut,
    )
