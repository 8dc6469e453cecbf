"""What the cells' offers say about a job: where it could go, how long it would
wait there, and whether its tier's wait limit refuses it (pure).

Theory of operation
-------------------
Each cell publishes a ``CellOffer`` every status interval (``drain.py``): its UP
nodes grouped by healthy GPUs, its capacity and free GPUs, the GPU-seconds its
running work still needs, and per tier the GPU-seconds queued in that tier and
every more important one, with the tier's ``max_predicted_wait_s``
(``TierBacklog.max_wait_s``). Two readers take the same decisions from them,
through the functions here:

- admission's routing (``admission.py``) sends a job to the host with the
  lowest predicted wait;
- the edge (the HTTP API, and the simulator's submit) refuses a job whose
  predicted wait in that best host exceeds its tier's limit (``wait_refusal``),
  before it is accepted, so a job that was accepted is never rejected later for
  its predicted wait.

1. ``live_offers``: an offer older than ``stale_s`` of the reader's clock says
   nothing (a dead or partitioned scheduler), nor does one with no UP node (a
   cell starting, its agents restarting): such a cell is unknown.
2. ``hosts``: a live offer hosts a job when its UP nodes could run every shape
   of it (``drain.job_fits``).
3. ``predicted_wait_s``: ``estimates.point_wait_s``, the arithmetic of
   ``WaitEstimates.predicted_wait_s``, on the offer: the work ahead ``A`` (GPU-
   seconds queued in its tier and every more important one + GPU-seconds
   routed there since the offer), the job's GPUs times the running work's mean
   residual per running GPU, and a share ``min(1, A / R)`` of the rest of the
   running work ``R``, over the capacity; or 0 when nothing is queued ahead and
   enough GPUs of the type are free. The running GPUs are the offer's capacity
   less its free GPUs, so no new field. (The cell's own estimate adds what an
   offer cannot carry: it is told after the admission's pass; each fair-share
   flow drains at the GPUs it held lately, ``WaitEstimates.drain_wait_s``; and a
   deep job starts a busy GPU's mean residual before the work ahead has ended,
   ``WaitEstimates.run_residual_s``. So a job the edge lets through can be told
   a longer wait by its cell (a drain) or a shorter one (the residual). Both
   stay out of the offer on purpose: they need state the offer does not carry
   (per-flow service rates, the started mix's moments: new schema fields), and
   the number here decides routing and the edge's refusal, which estimate
   changes must not move.)
4. ``best_host``: the host with the lowest wait (ties: the order of ``cells``),
   or None when no live offer hosts the job: unknown, never refused.
5. ``wait_refusal``: the best host's wait exceeds the limit that cell publishes
   for the job's tier (0 = no limit). Unknown is never refused: a missing or
   stale offer lets the job through, and the cell queues it.
6. **The tenant's own place** (``Own``, the edge's refusal only; routing keeps
   the tier's whole backlog). Fair share serves a tenant with little queued
   before one with much, so the tier's queued total would make one tenant's
   flood refuse every tenant of the tier. With the GPU-seconds the submitting
   tenant already has waiting, ``q``, and running, ``r``, the work ahead in a
   tier is ``fair_ahead_gpu_s``: the more important tiers' backlog, plus what
   the fair order serves of this tier's while the tenant's virtual time goes
   ``r + q`` past the tier's least (``TierBacklog.fair_gpu_s`` read there,
   linearly between the offer's steps, the whole backlog past the last), plus
   ``q`` itself; never more than the tier-level figure, which is the wait
   behind everything queued. ``r`` is there because a run is charged its
   estimate when it starts (``fairshare``): a tenant's virtual time leads the
   least settled one by at least what it has running, so a tenant holding
   much of the cell is told a wait behind the others it is ahead of. What is
   approximate: the tenant's settled usage beyond that (a tenant that used
   much and holds nothing now starts later than told: its wait is
   under-told), weight 1, ``q`` and ``r`` as counts of its jobs (in every cell
   and tier, all the API's read model knows) at this job's GPU-seconds, and
   its own waiting jobs also among the served (told longer). So a tenant with
   nothing waiting or running is told the wait of the work above its tier and
   the running work, however deep another tenant's queue; the flooding tenant
   is told the whole backlog, as before.

Cost model: ``live_offers`` is O(C) for C cells; ``best_host`` and
``wait_refusal`` are O(C * (T + G + s)) for T tiers, G node groups and s shapes
per offer, all small; nothing here allocates per queued job.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from framespool.schemas import events as ev

from .drain import FAIR_STEPS_GPU_S, Groups, job_fits
from .estimates import point_wait_s

PREDICTED_WAIT = "predicted_wait"


def offer_groups(offer: ev.CellOffer) -> Groups:
    """An offer's UP nodes as ``drain.Groups``."""
    return tuple((t.gpu_type, g.gpus, g.nodes) for t in offer.gpu_types for g in t.groups)


def live_offers(
    offers: Mapping[str, ev.CellOffer], cells: Iterable[str], now_ms: int, stale_s: float
) -> dict[str, ev.CellOffer]:
    """The offers of ``cells`` (in that order) no older than ``stale_s`` at
    ``now_ms`` and with UP nodes (item 1 of the theory of operation)."""
    oldest = now_ms - int(stale_s * 1000)
    return {
        c: offer
        for c in cells
        if (offer := offers.get(c)) is not None and offer.ts_ms >= oldest and offer_groups(offer)
    }


def hosts(offer: ev.CellOffer, spec: ev.JobSpec) -> bool:
    """Whether the offer's UP nodes could run every shape of ``spec``."""
    return offer.capacity_gpus > 0 and job_fits(offer_groups(offer), spec, every_shape=True)


class Own(NamedTuple):
    """What the submitting tenant already has, in GPU-seconds (item 6)."""

    waiting_gpu_s: float = 0.0
    running_gpu_s: float = 0.0

    @classmethod
    def of_jobs(cls, spec: ev.JobSpec, waiting: int, running: int, run_floor_s: float = 0.0) -> Own:
        """``waiting`` and ``running`` jobs of the tenant, each counted at
        ``spec``'s GPU-seconds (what both edges know: counts, not the jobs),
        its estimate taken as at least ``run_floor_s``: what the model's jobs
        were seen to run (a tenant's tiny ``estimate_s`` must not make its own
        backlog weigh nothing)."""
        job_gpu_s = spec.gpus * max(spec.estimate_s, run_floor_s)
        return cls(waiting * job_gpu_s, running * job_gpu_s)


def fair_ahead_gpu_s(backlog: ev.TierBacklog, own: Own) -> float:
    """The work ahead of a job of a tenant that has ``own``, in ``backlog``'s
    tier (item 6 of the theory of operation); the tier-level ``queued_gpu_s``
    when the offer carries no ``fair_gpu_s``. O(steps)."""
    fair = backlog.fair_gpu_s
    if len(fair) != len(FAIR_STEPS_GPU_S) + 1:
        return backlog.queued_gpu_s  # nothing queued in the tier, or an older cell
    waiting = max(0.0, own.waiting_gpu_s)
    lead = waiting + max(0.0, own.running_gpu_s)
    above = backlog.queued_gpu_s - fair[-1]
    served = fair[-1]
    for i in range(1, len(FAIR_STEPS_GPU_S)):
        if lead <= FAIR_STEPS_GPU_S[i]:
            lo, hi = FAIR_STEPS_GPU_S[i - 1], FAIR_STEPS_GPU_S[i]
            served = fair[i - 1] + (fair[i] - fair[i - 1]) * (lead - lo) / (hi - lo)
            break
    return min(backlog.queued_gpu_s, above + served + waiting)


def predicted_wait_s(
    offer: ev.CellOffer,
    spec: ev.JobSpec,
    routed_gpu_s: float = 0.0,
    routed_gpus: int = 0,
    own: Own | None = None,
) -> float:
    """The wait ``offer``'s cell predicts for ``spec``, after the work routed
    there since the offer (``WaitEstimates.predicted_wait_s``'s arithmetic,
    ``point_wait_s``; -1 when the cell has no capacity). ``own``: what the
    submitting tenant has waiting and running, for its own place in the fair
    order (item 6); None: behind the tier's whole backlog (routing)."""
    if offer.capacity_gpus <= 0:
        return -1.0
    ahead = routed_gpu_s
    for tier in offer.tiers:
        if tier.tier == spec.tier:
            if own is None:
                ahead += tier.queued_gpu_s
            else:
                ahead += fair_ahead_gpu_s(tier, own)
            break
    if spec.gpu_type:
        free = sum(t.free_gpus for t in offer.gpu_types if t.gpu_type == spec.gpu_type)
    else:
        free = offer.free_gpus
    if free - routed_gpus >= spec.gpus and ahead <= 0:
        return 0.0
    running = offer.capacity_gpus - offer.free_gpus
    return point_wait_s(ahead, spec.gpus, offer.running_gpu_s, running, offer.capacity_gpus)


def tier_limit_s(offer: ev.CellOffer, tier: str) -> float:
    """The longest predicted wait the offering cell admits for ``tier`` (0 = no limit)."""
    for backlog in offer.tiers:
        if backlog.tier == tier:
            return backlog.max_wait_s
    return 0.0


def limited(live: Mapping[str, ev.CellOffer], tier: str) -> bool:
    """Whether any live offer limits ``tier``'s predicted wait (the default: none,
    and then the edge has nothing to compute or count). O(C * T)."""
    return any(tier_limit_s(offer, tier) > 0 for offer in live.values())


class Host(NamedTuple):
    cell: str
    wait_s: float


def best_host(
    live: Mapping[str, ev.CellOffer],
    spec: ev.JobSpec,
    routed: Mapping[str, tuple[float, int]] | None = None,
    own: Own | None = None,
) -> Host | None:
    """The live offer that hosts ``spec`` with the lowest predicted wait (ties:
    ``live``'s order); ``routed``: cell -> (GPU-seconds, GPUs) sent there since
    its offer; ``own``: as for ``predicted_wait_s``. None: no live offer hosts
    it (unknown)."""
    best: Host | None = None
    for cell, offer in live.items():
        if not hosts(offer, spec):
            continue
        cost, gpus = routed.get(cell, (0.0, 0)) if routed else (0.0, 0)
        wait = predicted_wait_s(offer, spec, cost, gpus, own)
        if best is None or wait < best.wait_s:
            best = Host(cell, wait)
    return best


class WaitRefusal(NamedTuple):
    """A job refused because even its best host predicts a wait past its tier's limit."""

    cell: str
    wait_s: float
    limit_s: float
    tier: str

    @property
    def retry_after_s(self) -> int:
        """When the work ahead could have drained to the limit: the excess wait,
        rounded up, at least 1 s."""
        return max(1, math.ceil(self.wait_s - self.limit_s))

    @property
    def message(self) -> str:
        return (
            f"predicted wait {self.wait_s:.0f}s exceeds the {self.tier} tier limit of "
            f"{self.limit_s:.0f}s (best cell {self.cell}); retry later or use a higher tier"
        )


def wait_refusal(
    live: Mapping[str, ev.CellOffer],
    spec: ev.JobSpec,
    routed: Mapping[str, tuple[float, int]] | None = None,
    own: Own | None = None,
) -> WaitRefusal | None:
    """Why ``spec`` is refused for its predicted wait, or None (item 5 of the
    theory of operation: within the limit, no limit, or unknown); with
    ``own``, by the tenant's own place in the fair order (item 6)."""
    if not limited(live, spec.tier):
        return None  # no limit anywhere (the default): no wait to compute
    best = best_host(live, spec, routed, own)
    if best is None:
        return None
    limit = tier_limit_s(live[best.cell], spec.tier)
    if limit > 0 and best.wait_s > limit:
        return WaitRefusal(best.cell, best.wait_s, limit, spec.tier)
    return None
