"""The simulator's edge: at submit, what the API refuses before a job reaches a cell.

The stack refuses a job whose predicted wait exceeds its tier's
``max_predicted_wait_s`` at the API, from the cells' latest offers
(``framespool.processors.core.offers.wait_refusal``); the cell queues whatever
it is given. The simulator feeds ``JobAdmitted`` to the cell directly, so its
submit plays the edge with the same function, on what the API would see:

1. an offer of the cell, taken every ``interval_s`` of virtual time (the cells'
   default status interval, 5 s: the cadence they publish offers at). The
   simulator turns the cell's read-model outputs off, so the offer is built
   from the cell between inputs (``Cell.offer_fields`` reads the state and
   changes nothing, so the run's decisions are the same as without the edge);
2. plus the work let through since that offer, as admission counts the work
   it routed (``routed``), so a burst between two offers is not all let in;
3. at the tenant's own place in the fair order, as the API counts it: its
   jobs waiting and running in the cell, each at this job's GPU-seconds
   (``offers``, theory of operation 6);
4. a refused job ends ``REJECTED`` with reason ``predicted_wait`` and the
   API's message; it never reaches the cell.

Cost model: nothing when no tier has a limit; otherwise an offer, O(N * G)
for N nodes of G GPUs, per ``interval_s`` of virtual time, and O(T + G + s)
(tiers, node groups, shapes) per submit.
"""

from __future__ import annotations

from collections.abc import Callable

from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.offers import (
    PREDICTED_WAIT,
    Own,
    WaitRefusal,
    live_offers,
    wait_refusal,
)
from framespool.schemas import events as ev

DEFAULT_INTERVAL_S = CellConfig().status_interval_s


class SubmitEdge:
    """The predicted-wait refusal of one simulated cell's submissions."""

    def __init__(self, config: CellConfig, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.active = any(t.max_predicted_wait_s > 0 for t in config.tiers)
        self.every_ms = max(1, int(interval_s * 1000))
        self.offer: ev.CellOffer | None = None
        self.routed = (0.0, 0)  # GPU-seconds and GPUs let through since the offer
        self.refused = 0

    def refusal(self, cell: Cell, spec: ev.JobSpec, now_ms: int) -> WaitRefusal | None:
        """Why ``spec`` is refused now, or None (then it counts as let through)."""
        if not self.active:
            return None
        if self.offer is None or now_ms - self.offer.ts_ms >= self.every_ms:
            # ``offer_fields`` holds CellOffer's own fields, typed dict[str, object]
            # by the core: the offer is built as the core's ``emit`` builds it
            make: Callable[..., ev.CellOffer] = ev.CellOffer
            self.offer = make(event_id=f"edge@{now_ms}", ts_ms=now_ms, **cell.offer_fields())
            self.routed = (0.0, 0)
        offer = self.offer
        live = live_offers({offer.cell: offer}, (offer.cell,), now_ms, self.every_ms / 1000)
        own = Own.of_jobs(spec, *cell.tenant_jobs(spec.tenant))
        refused = wait_refusal(live, spec, {offer.cell: self.routed}, own)
        if refused is not None:
            self.refused += 1
            return refused
        cost, gpus = self.routed
        self.routed = (cost + spec.gpus * spec.estimate_s, gpus + spec.gpus)
        return None

    def rejection(self, spec: ev.JobSpec, refused: WaitRefusal, now_ms: int) -> ev.JobRejected:
        """The ``JobRejected`` the simulator records for a refused job (the API
        answers 429 instead; the job never reaches the log)."""
        return ev.JobRejected(
            event_id=f"edge:{spec.job_id}",
            ts_ms=now_ms,
            job_id=spec.job_id,
            tenant=spec.tenant,
            reason=PREDICTED_WAIT,
            detail=refused.message,
        )
