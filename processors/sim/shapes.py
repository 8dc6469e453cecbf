"""Shape fairness: a tenant of whole-node gangs against a tenant of 1-GPU jobs.

Two equal-weight tenants of one tier on one cell. ``big`` submits 8- and
16-GPU jobs (8 GPUs per node, median 450 s); ``small`` submits 1-GPU jobs that
run longer (median 900 s). Both ask for more than their half of the GPUs
(at the default load 3.2: ``big`` 0.8 of them, ``small`` 2.4), so both stay
backlogged while they submit and the policy alone decides the split. A 1-GPU
job fits in any GPU that frees, a gang needs a whole node drained: without
reservations for the gang tenant's next jobs (conservative backfill), 1-GPU
backfill takes the freed GPUs and the gang tenant falls short of its half;
first-come-first-served gives each its share of the submissions (``big``
about a quarter). The summary's ``tenants[name].fair_ratio`` is a tenant's
GPU-time while backlogged over its entitlement (1.0 = its fair share).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from .workload import TenantMix, TraceJob, Workload, _JobMaker, _mean_gpu_s

DEFAULT_LOAD = 3.2
BIG_PART = 0.25  # of the offered load: 0.8 of the GPUs at the default load
BIG_SIZES = ((8, 0.5), (16, 0.5))
SMALL_SIZES = ((1, 1.0),)
BIG_MEDIAN_S, SMALL_MEDIAN_S, SIGMA = 450.0, 900.0, 0.5


def shapes(jobs: int, seed: int, capacity_gpus: int, load: float = DEFAULT_LOAD) -> Workload:
    """``jobs`` jobs of two tenants, Poisson arrivals; ``big`` offers
    ``BIG_PART`` of ``load`` times ``capacity_gpus`` in GPU-time, ``small`` the rest."""
    big, small = TenantMix("big", "paid"), TenantMix("small", "paid")
    big_rate = load * BIG_PART * capacity_gpus / _mean_gpu_s(BIG_SIZES, BIG_MEDIAN_S, SIGMA)
    small_rate = (
        load * (1 - BIG_PART) * capacity_gpus / _mean_gpu_s(SMALL_SIZES, SMALL_MEDIAN_S, SIGMA)
    )
    big_p = big_rate / (big_rate + small_rate)

    def jobs_iter() -> Iterator[TraceJob]:
        arrivals = random.Random(seed)
        maker = _JobMaker(seed + 1, max_s=4 * 3600.0, sigma=SIGMA)
        t = 0.0
        for idx in range(jobs):
            t += arrivals.expovariate(big_rate + small_rate)
            if maker.rng.random() < big_p:
                gpus = 8 if maker.rng.random() < BIG_SIZES[0][1] else 16
                duration = maker.duration(mu=math.log(BIG_MEDIAN_S))
                yield maker.make(idx, t, big, gpus, duration)
            else:
                yield maker.make(idx, t, small, 1, maker.duration(mu=math.log(SMALL_MEDIAN_S)))

    return Workload(
        name="shapes",
        total=jobs,
        tenants={"big": 1.0, "small": 1.0},
        jobs=jobs_iter,
        description="tenant 'big' submits 8- and 16-GPU gangs (median 450 s), tenant "
        "'small' 1-GPU jobs (median 900 s), equal weights, one tier; big asks for "
        f"{BIG_PART:.0%} of the offered load, small the rest (default load {DEFAULT_LOAD})",
    )
