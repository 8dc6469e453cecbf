"""What the simulator feeds the cell: a workload of jobs in submit order.

A workload is a named, re-iterable stream of ``TraceJob``s (so several
policies run on exactly the same jobs) plus its tenants and their weights.
Streams are generated lazily: a million-job workload never sits in memory.
Workloads come from a trace file (``trace.py``) or from the synthetic
generators below, sized to the fleet by an offered load.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


class TraceJob:
    """One job of the workload, as the simulator knows it (true duration included)."""

    __slots__ = (
        "idx",
        "submit_ms",
        "tenant",
        "tier",
        "gpus",
        "gpus_per_node",
        "duration_s",
        "estimate_s",
        "preemptible",
        "checkpoint_s",
        "model",
        "model_version",
        "fail_prob",
        "checkpoint_on_request",
    )

    def __init__(
        self,
        idx: int,
        submit_ms: int,
        tenant: str,
        tier: str,
        gpus: int,
        gpus_per_node: int,
        duration_s: float,
        estimate_s: float,
        preemptible: bool = False,
        checkpoint_s: float = 0.0,
        model: str = "demo",
        model_version: str = "1",
        fail_prob: float = 0.0,
        checkpoint_on_request: bool = True,
    ) -> None:
        self.idx = idx
        self.submit_ms = submit_ms
        self.tenant = tenant
        self.tier = tier
        self.gpus = gpus
        self.gpus_per_node = gpus_per_node
        self.duration_s = duration_s
        self.estimate_s = estimate_s
        self.preemptible = preemptible
        self.checkpoint_s = checkpoint_s
        self.model = model
        self.model_version = model_version
        self.fail_prob = fail_prob
        # False: the generator checkpoints only every ``checkpoint_s`` of work
        # (segment boundaries), so a CheckpointRun is answered at the next one
        self.checkpoint_on_request = checkpoint_on_request

    @property
    def job_id(self) -> str:
        return job_id_of(self.idx)


def job_id_of(idx: int) -> str:
    return f"j{idx}"


def idx_of(job_id: str) -> int:
    return int(job_id[1:])


@dataclass
class Workload:
    """A re-iterable job stream: ``jobs()`` starts it afresh each time."""

    name: str
    total: int
    tenants: dict[str, float]  # tenant -> weight
    jobs: Callable[[], Iterator[TraceJob]]
    node_failures_per_hour: float | None = None  # the workload's default, if any
    description: str = ""
    notes: list[str] = field(default_factory=list)
    # the stream stops early although the workload goes on: a cell's share
    # cut at the horizon (``multitenant.route``); the run goes on to the horizon
    cut: bool = False


# ---------------------------------------------------------------------------
# Synthetic workloads
# ---------------------------------------------------------------------------
MODELS = tuple(f"m{i}" for i in range(8))
SMALL_SIZES = ((1, 0.55), (2, 0.20), (4, 0.15), (8, 0.10))
GANG_SIZES = ((8, 0.35), (16, 0.30), (32, 0.20), (64, 0.15))
FLOOD_SIZES = ((1, 0.7), (2, 0.3))


@dataclass(frozen=True)
class TenantMix:
    name: str
    tier: str
    weight: float = 1.0
    activity: float = 1.0  # relative submission rate
    checkpoint_share: float = 0.0  # fraction of its jobs that checkpoint (and are preemptible)


STEADY_TENANTS = tuple(
    [TenantMix("t00", "enterprise", 2.0, 3.0), TenantMix("t01", "enterprise", 2.0, 2.0)]
    + [TenantMix(f"t{i:02d}", "paid", 1.0, 2.0) for i in range(2, 6)]
    + [TenantMix(f"t{i:02d}", "free", 1.0, 1.0, 0.5) for i in range(6, 12)]
    + [TenantMix(f"t{i:02d}", "batch", 1.0, 1.5, 0.8) for i in range(12, 14)]
    + [TenantMix(f"t{i:02d}", "interactive", 1.0, 1.0) for i in range(14, 16)]
)


def _pick(rng: random.Random, table: tuple[tuple[int, float], ...]) -> int:
    u = rng.random()
    for value, p in table:
        u -= p
        if u <= 0:
            return value
    return table[-1][0]


class _JobMaker:
    """Draws job shapes and durations; one instance per stream (own RNG)."""

    def __init__(
        self,
        seed: int,
        median_s: float = 180.0,
        sigma: float = 0.8,
        max_s: float = 7200.0,
        estimate_sigma: float = 0.25,
        min_s: float = 10.0,
    ) -> None:
        self.rng = random.Random(seed)
        self.mu = math.log(median_s)
        self.sigma = sigma
        self.max_s = max_s
        self.min_s = min_s
        self.estimate_sigma = estimate_sigma

    def duration(self, mu: float | None = None, max_s: float | None = None) -> float:
        d = self.rng.lognormvariate(self.mu if mu is None else mu, self.sigma)
        return round(min(max(d, self.min_s), self.max_s if max_s is None else max_s), 1)

    def estimate(self, duration: float) -> float:
        if self.estimate_sigma <= 0:
            return duration
        return round(max(5.0, duration * self.rng.lognormvariate(0.0, self.estimate_sigma)), 1)

    def make(
        self,
        idx: int,
        t_s: float,
        tenant: TenantMix,
        gpus: int,
        duration: float,
        fail_prob: float = 0.0,
        model_version: str = "1",
    ) -> TraceJob:
        rng = self.rng
        checkpoint = tenant.checkpoint_share and rng.random() < tenant.checkpoint_share
        # 70% of a tenant's jobs use its favourite model: warm GPUs can be reused
        model = MODELS[
            _stable_model(tenant.name) if rng.random() < 0.7 else rng.randrange(len(MODELS))
        ]
        return TraceJob(
            idx=idx,
            submit_ms=int(t_s * 1000),
            tenant=tenant.name,
            tier=tenant.tier,
            gpus=gpus,
            gpus_per_node=min(gpus, 8),
            duration_s=duration,
            estimate_s=self.estimate(duration),
            preemptible=bool(checkpoint),
            checkpoint_s=120.0 if checkpoint else 0.0,
            model=model,
            model_version=model_version,
            fail_prob=fail_prob,
        )


def _mean_gpu_s(sizes: tuple[tuple[int, float], ...], median_s: float, sigma: float) -> float:
    mean_gpus = sum(g * p for g, p in sizes)
    return mean_gpus * median_s * math.exp(sigma * sigma / 2)


def _poisson(rng: random.Random, rate_of: Callable[[float], float], peak: float) -> Iterator[float]:
    """Arrival times of a (possibly time-varying) Poisson process, by thinning."""
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if rate_of(t) >= peak or rng.random() * peak <= rate_of(t):
            yield t


def _stable_model(tenant: str) -> int:
    # hash() of a str is salted per process; the favourite model must not be.
    return sum(tenant.encode()) % len(MODELS)


def _mixed(
    name: str,
    jobs: int,
    seed: int,
    capacity_gpus: int,
    load: float,
    tenants: tuple[TenantMix, ...],
    sizes=SMALL_SIZES,
    median_s: float = 180.0,
    sigma: float = 0.8,
    rate_shape: Callable[[float, float], float] | None = None,
    gang_share: float = 0.0,
    fail_prob: float = 0.0,
    bad_share: float = 0.0,
    description: str = "",
    node_failures: float | None = None,
) -> Workload:
    """Tenants submitting a size/duration mix at a Poisson rate sized to ``load``."""
    mean = _mean_gpu_s(sizes, median_s, sigma)
    if gang_share:
        gang_mean = _mean_gpu_s(GANG_SIZES, median_s * 2, sigma)
        mean = (1 - gang_share) * mean + gang_share * gang_mean
    rate = load * capacity_gpus / mean  # jobs per second on average
    span_s = jobs / rate
    activity = [t.activity for t in tenants]
    total_activity = sum(activity)
    cumulative = []
    acc = 0.0
    for a in activity:
        acc += a / total_activity
        cumulative.append(acc)

    def jobs_iter() -> Iterator[TraceJob]:
        arrivals = random.Random(seed)
        maker = _JobMaker(seed + 1, median_s, sigma)
        if rate_shape is None:
            times = _poisson(arrivals, lambda t: rate, rate)
        else:
            peak = rate * rate_shape(-1.0, span_s)
            times = _poisson(arrivals, lambda t: rate * rate_shape(t, span_s), peak)
        for idx in range(jobs):
            t = next(times)
            u = maker.rng.random()
            tenant = tenants[min(bisect.bisect_left(cumulative, u), len(tenants) - 1)]
            if gang_share and maker.rng.random() < gang_share:
                gpus = _pick(maker.rng, GANG_SIZES)
                duration = maker.duration(mu=math.log(median_s * 2))
            else:
                gpus = _pick(maker.rng, sizes)
                duration = maker.duration()
            version = "1"
            job_fail = fail_prob
            if bad_share and maker.rng.random() < bad_share:
                version, job_fail = "2-rc", 0.8  # a bad release: most of its runs crash
            yield maker.make(idx, t, tenant, gpus, duration, job_fail, version)

    return Workload(
        name=name,
        total=jobs,
        tenants={t.name: t.weight for t in tenants},
        jobs=jobs_iter,
        node_failures_per_hour=node_failures,
        description=description or name,
    )


def steady(jobs: int, seed: int, capacity_gpus: int, load: float = 0.9) -> Workload:
    return _mixed(
        "steady",
        jobs,
        seed,
        capacity_gpus,
        load,
        STEADY_TENANTS,
        description=f"16 tenants over 5 tiers, Poisson arrivals at {load:.0%} load, "
        "1-8 GPU jobs, log-normal durations (median 180 s)",
    )


def diurnal(jobs: int, seed: int, capacity_gpus: int, load: float = 0.9) -> Workload:
    def shape(t: float, span_s: float) -> float:
        # A day, or a third of the run when the run is shorter than three days
        # (small runs still see peaks and troughs). t < 0 asks for the peak.
        period = min(86400.0, max(600.0, span_s / 3))
        if t < 0:
            return 1.6
        return 1.0 + 0.6 * math.sin(2 * math.pi * t / period)

    return _mixed(
        "diurnal",
        jobs,
        seed,
        capacity_gpus,
        load,
        STEADY_TENANTS,
        rate_shape=shape,
        description=f"steady's mix with a sinusoidal day (x0.4 to x1.6 of {load:.0%} load)",
    )


def gangs(jobs: int, seed: int, capacity_gpus: int, load: float = 0.9) -> Workload:
    return _mixed(
        "gangs",
        jobs,
        seed,
        capacity_gpus,
        load,
        STEADY_TENANTS,
        sizes=((1, 0.7), (2, 0.3)),
        gang_share=0.25,
        description="25% of jobs are 8-64 GPU gangs (8 per node, median 360 s) among 1-2 GPU jobs",
    )


def failures(jobs: int, seed: int, capacity_gpus: int, load: float = 0.9) -> Workload:
    tenants = tuple(
        TenantMix(t.name, t.tier, t.weight, t.activity, max(t.checkpoint_share, 0.5))
        for t in STEADY_TENANTS
    )
    return _mixed(
        "failures",
        jobs,
        seed,
        capacity_gpus,
        load,
        tenants,
        fail_prob=0.03,
        bad_share=0.02,
        node_failures=0.01,
        description="steady with 3% of runs failing (generator_error), 2% of jobs on a "
        "bad model release (80% of its runs fail), node failures "
        "0.01/node-hour unless --node-failures says otherwise",
    )


def flood(jobs: int, seed: int, capacity_gpus: int, load: float = 0.9) -> Workload:
    """Four equal-weight tenants of one tier; one submits 100x as many jobs.

    Each small tenant alone asks for 3x its 1/4 share while it submits, so all
    four stay backlogged and the fair-share guarantee is what decides the split.
    Jobs take 1 or 2 GPUs, so this measures flooding alone; ``gangs`` measures
    what job sizes do to the split.
    """
    small = ("a", "b", "c")
    names = ("flood",) + small
    median, sigma = 120.0, 0.5
    mean = _mean_gpu_s(FLOOD_SIZES, median, sigma)
    small_rate = 3.0 * capacity_gpus / len(names) / mean
    total_rate = small_rate * (100 + len(small))
    tenants = tuple(TenantMix(n, "paid") for n in names)

    def jobs_iter() -> Iterator[TraceJob]:
        arrivals = random.Random(seed)
        maker = _JobMaker(seed + 1, median, sigma, max_s=900.0)
        t = 0.0
        for idx in range(jobs):
            t += arrivals.expovariate(total_rate)
            u = maker.rng.random() * (100 + len(small))
            tenant = tenants[0] if u < 100 else tenants[1 + min(int(u - 100), len(small) - 1)]
            yield maker.make(idx, t, tenant, _pick(maker.rng, FLOOD_SIZES), maker.duration())

    return Workload(
        name="flood",
        total=jobs,
        tenants={n: 1.0 for n in names},
        jobs=jobs_iter,
        description="tenant 'flood' submits 100x the jobs of a, b and c (equal "
        "weights, one tier, 1-2 GPU jobs); each small tenant asks for 3x "
        "its share",
    )


SYNTHETIC: dict[str, Callable[..., Workload]] = {
    "steady": steady,
    "flood": flood,
    "gangs": gangs,
    "diurnal": diurnal,
    "failures": failures,
}


def synthetic(
    name: str,
    jobs: int,
    seed: int,
    capacity_gpus: int,
    load: float | None = None,
    jobs_per_day: int = 0,
) -> Workload:
    """``load=None``: the workload's own default (0.9; 1.3 for ``multitenant`` and ``genai``).

    ``jobs_per_day`` (``multitenant`` only; 0 = off) fixes the arrival rate at
    that many jobs a day and scales run times so the offered load stays
    ``load`` (``multitenant.multitenant``)."""
    maker = SYNTHETIC.get(name)
    if maker is None:
        raise ValueError(
            f"unknown synthetic workload {name!r}; choose one of {', '.join(SYNTHETIC)}"
        )
    if jobs < 1:
        raise ValueError(f"--jobs={jobs} must be at least 1")
    if jobs_per_day:
        if name != "multitenant":
            raise ValueError(f"--jobs-per-day is for --synthetic multitenant, not {name!r}")
        if jobs_per_day < 1:
            raise ValueError(f"--jobs-per-day={jobs_per_day} must be at least 1")
        return multitenant(jobs, seed, capacity_gpus, load, jobs_per_day=jobs_per_day)
    if load is None:
        return maker(jobs, seed, capacity_gpus)
    return maker(jobs, seed, capacity_gpus, load)


from .genai import genai  # noqa: E402  (they build on the helpers above)
from .multitenant import multitenant  # noqa: E402
from .shapes import shapes  # noqa: E402

SYNTHETIC["multitenant"] = multitenant
SYNTHETIC["shapes"] = shapes
SYNTHETIC["genai"] = genai
