"""A workload shaped like public GenAI video-serving traces (issue 34).

- Tenants: about one per 6.4 jobs (27,000 jobs from ~4,200 tenants), in five
  tiers of very different populations: thousands of free and paid tenants, a
  few hundred interactive ones, a few dozen enterprise and batch ones. Every
  tenant submits at least one job; the rest of a tier's jobs go to its
  tenants in proportion to ``1 / rank ** ZIPF_S`` (heavy-tailed: a handful of
  tenants submit hundreds of jobs each, most one to three).
- Per-tier mixes (``GENAI_TIERS``): interactive previews are short (median
  25 s) and small; enterprise and paid renders take minutes on 1-8 GPUs, with
  rare 16-GPU gangs; free work is smaller; batch is long and holds the rare
  32-GPU gangs. Run times are log-normal, clipped to ``MIN_S``..``MAX_S``
  (seconds to 45 minutes); the scheduler is told an estimate off by a
  log-normal factor (sigma 0.25).
- Bursts: a tenant submits in bursts of ``1 + geometric`` jobs (mean
  ``BURST_MEAN``) ``BURST_GAP_S`` apart on average, variations of one
  request (same shape most of the time); bursts arrive at random times with a
  diurnal swing of x(1 - SWING)..x(1 + SWING).
- Checkpoints: most non-interactive work checkpoints every
  ``CHECKPOINT_S`` (60 s) of work, at segment boundaries only, so a
  ``CheckpointRun`` is answered at the next boundary, not at once
  (``TraceJob.checkpoint_on_request`` False); a run stopped without a
  checkpoint loses the work since its last one. Such work is preemptible.
- The span is sized so the mean offered load is ``load`` (default 1.3: the
  backlog grows through the arrivals).

The whole arrival schedule is drawn up front (one tuple per burst), so a
million-job workload holds a few hundred thousand bursts, not its jobs.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from .workload import MODELS, TraceJob, Workload, _pick, _stable_model

DEFAULT_LOAD = 1.3
JOBS_PER_TENANT = 27_000 / 4_200
ZIPF_S = 1.1
BURST_MEAN = 3.0  # jobs per burst, mean (1 + geometric)
BURST_GAP_S = 4.0  # mean seconds between a burst's jobs
SAME_SHAPE = 0.8  # a burst's later job keeps its first job's GPU count
SWING = 0.35
MIN_S, MAX_S = 5.0, 2700.0
ESTIMATE_SIGMA = 0.25
CHECKPOINT_S = 60.0


@dataclass(frozen=True)
class GenaiTier:
    tier: str
    tenant_share: float  # of the tenants
    job_share: float  # of the jobs
    median_s: float
    sigma: float
    sizes: tuple[tuple[int, float], ...]
    checkpoint_share: float  # of its jobs (they are also preemptible)
    weight: float = 1.0  # each tenant's weight in this tier


GENAI_TIERS = (
    GenaiTier(
        "interactive", 0.10, 0.22, 25.0, 0.7, ((1, 0.70), (2, 0.20), (4, 0.08), (8, 0.02)), 0
    ),
    GenaiTier(
        "enterprise",
        0.01,
        0.10,
        240.0,
        0.9,
        ((1, 0.35), (2, 0.25), (4, 0.20), (8, 0.18), (16, 0.02)),
        0.4,
        2.0,
    ),
    GenaiTier(
        "paid",
        0.34,
        0.22,
        180.0,
        0.9,
        ((1, 0.40), (2, 0.25), (4, 0.18), (8, 0.15), (16, 0.02)),
        0.5,
    ),
    GenaiTier("free", 0.54, 0.43, 120.0, 0.9, ((1, 0.55), (2, 0.25), (4, 0.15), (8, 0.05)), 0.6),
    GenaiTier(
        "batch",
        0.01,
        0.03,
        600.0,
        1.0,
        ((1, 0.30), (2, 0.20), (4, 0.20), (8, 0.24), (16, 0.04), (32, 0.02)),
        0.9,
    ),
)


def tier_mean_gpu_s(mix: GenaiTier) -> float:
    """Mean GPU-seconds of one job of ``mix``: mean GPUs times the mean of the
    log-normal run time clipped to ``MIN_S``..``MAX_S``."""
    gpus = sum(g * p for g, p in mix.sizes)
    mu, sigma = math.log(mix.median_s), mix.sigma

    def cdf(x: float) -> float:
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    lo, hi = (math.log(MIN_S) - mu) / sigma, (math.log(MAX_S) - mu) / sigma
    inside = math.exp(mu + sigma * sigma / 2) * (cdf(hi - sigma) - cdf(lo - sigma))
    return gpus * (inside + MIN_S * cdf(lo) + MAX_S * (1 - cdf(hi)))


def _counts(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights``, each at least 1 (largest remainders)."""
    n = len(weights)
    spare = max(0, total - n)
    scale = sum(weights)
    raw = [spare * w / scale for w in weights]
    counts = [1 + int(r) for r in raw]
    order = sorted(range(n), key=lambda i: (-(raw[i] - int(raw[i])), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def genai(
    jobs: int, seed: int, capacity_gpus: int, load: float | None = None, tenants: int = 0
) -> Workload:
    load = DEFAULT_LOAD if load is None else load
    n_tenants = tenants or max(len(GENAI_TIERS), round(jobs / JOBS_PER_TENANT))
    rng = random.Random(seed)
    # (tier, tenant name, weight, jobs) for every tenant
    roster: list[tuple[GenaiTier, str, float, int]] = []
    offered = 0.0
    for mix in GENAI_TIERS:
        count = max(1, round(mix.tenant_share * n_tenants))
        tier_jobs = max(count, round(mix.job_share * jobs))
        volumes = _counts(tier_jobs, [1.0 / r**ZIPF_S for r in range(1, count + 1)])
        for i, volume in enumerate(volumes):
            roster.append((mix, f"{mix.tier[:3]}{i:05d}", mix.weight, volume))
        offered += tier_jobs * tier_mean_gpu_s(mix)
    scheduled = sum(r[3] for r in roster)
    span_s = offered / (load * capacity_gpus)
    period = min(86_400.0, max(600.0, span_s / 3))
    # bursts: (start, tenant index, size); each tenant's jobs split into bursts
    bursts: list[tuple[float, int, int]] = []
    for t_index, (_, _, _, volume) in enumerate(roster):
        left = volume
        while left > 0:
            size = 1
            while size < left and rng.random() > 1.0 / BURST_MEAN:
                size += 1
            while True:  # a diurnal swing, by rejection
                t = rng.random() * span_s
                if rng.random() * (1 + SWING) <= 1 + SWING * math.sin(2 * math.pi * t / period):
                    break
            bursts.append((t, t_index, size))
            left -= size
    bursts.sort()

    def jobs_iter() -> Iterator[TraceJob]:
        draw = random.Random(seed + 1)
        pending: list[tuple[float, int, TraceJob]] = []  # by submit time, then draw order
        made = 0
        idx = 0
        for start, t_index, size in bursts:
            while pending and pending[0][0] <= start:
                yield _numbered(heapq.heappop(pending)[2], idx)
                idx += 1
            mix, name, _, _ = roster[t_index]
            t = start
            first = _pick(draw, mix.sizes)
            for k in range(size):
                gpus = first if k == 0 or draw.random() < SAME_SHAPE else _pick(draw, mix.sizes)
                job = _job(draw, mix, name, t, gpus)
                heapq.heappush(pending, (t, made, job))
                made += 1
                t += draw.expovariate(1.0 / BURST_GAP_S)
        while pending:
            yield _numbered(heapq.heappop(pending)[2], idx)
            idx += 1

    return Workload(
        name="genai",
        total=scheduled,
        tenants={name: weight for _, name, weight, _ in roster},
        jobs=jobs_iter,
        description=f"GenAI video serving: {len(roster):,} tenants over 5 tiers "
        f"(Zipf s={ZIPF_S} volumes), bursts of ~{BURST_MEAN:.0f} requests, diurnal "
        f"arrivals at {load:.0%} mean load, log-normal run times {MIN_S:.0f} s-"
        f"{MAX_S / 60:.0f} min, 1-8 GPUs with rare 16/32-GPU gangs, checkpoints every "
        f"{CHECKPOINT_S:.0f} s at segment boundaries",
    )


def _job(rng: random.Random, mix: GenaiTier, tenant: str, t_s: float, gpus: int) -> TraceJob:
    """One request (its index is set when the stream is in submit order)."""
    duration = rng.lognormvariate(math.log(mix.median_s), mix.sigma)
    duration = round(min(max(duration, MIN_S), MAX_S), 1)
    estimate = round(max(MIN_S, duration * rng.lognormvariate(0.0, ESTIMATE_SIGMA)), 1)
    checkpoints = mix.checkpoint_share > 0 and rng.random() < mix.checkpoint_share
    model = MODELS[_stable_model(tenant) if rng.random() < 0.7 else rng.randrange(len(MODELS))]
    return TraceJob(
        idx=-1,
        submit_ms=int(t_s * 1000),
        tenant=tenant,
        tier=mix.tier,
        gpus=gpus,
        gpus_per_node=min(gpus, 8),
        duration_s=duration,
        estimate_s=estimate,
        preemptible=checkpoints,
        checkpoint_s=CHECKPOINT_S if checkpoints else 0.0,
        model=model,
        checkpoint_on_request=False,
    )


def _numbered(job: TraceJob, idx: int) -> TraceJob:
    job.idx = idx
    return job
