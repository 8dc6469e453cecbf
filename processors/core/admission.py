"""Admission: the pure fold of the commands topic (``SubmitJob``, ``CancelJob``).

Theory of operation
-------------------
The commands topic is keyed by tenant, so one partition holds all of a
tenant's commands, in order, and one ``AdmissionState`` per partition decides
them. ``apply(command, position)`` returns the events to publish; it reads no
clock (time is the command's ``ts_ms``), draws no randomness and iterates
only insertion-ordered containers, so the same log replays to the same
decisions, and the same snapshots.

For a ``SubmitJob``, in this order:

1. **Idempotency.** A job id, and a (tenant, idempotency key), is decided
   once within the idempotency horizon: a repeat of either produces nothing
   new, only a ``ReportIgnored`` that says which earlier decision stands (the
   API derives the job id from the key, so a retry with the same key is the
   same job). Rejections are remembered too (for the same horizon), so a job
   has one terminal event; with no asynchronous rate limit they are rare
   (an unknown tier or GPU type), not one per over-eager submit.
2. **Validation** the API cannot do: the tier must be one the cells know.
3. **Routing by predicted wait.** Candidates are the cells configured for the
   job's GPU type (a cell with no listed types offers any). Each cell's
   scheduler publishes a ``CellOffer`` every status interval
   (``framespool.processors.core.drain``); the shell sends it to every commands
   partition, so this fold reads offers in its own log order and its decisions
   stay a pure function of its input log. An offer older than
   ``offer_stale_s`` of this state's clock is unknown (a dead scheduler).

   a. Of the candidates with a fresh offer, those whose UP nodes could host
      every shape of the job (``drain.job_fits``) are hosts. The job goes to the
      host with the lowest predicted wait: (GPU-seconds queued in its tier and
      every more important one + GPU-seconds routed there by this partition
      since that offer + what running work still needs) / capacity, or 0 when
      nothing is queued ahead and enough GPUs of the type are free: the
      arithmetic of ``WaitEstimates.predicted_wait_s``. Ties go to config order.
      Freshness, hosting and the wait are ``framespool.processors.core.offers``,
      which the edge also uses to refuse a job past its tier's wait limit.
   b. Stickiness: the tenant's home cell (the host with the highest rendezvous
      hash of (cell, tenant)) wins while its wait is within
      ``max(sticky_slack_s, sticky_slack_ratio * best)`` of the best, so a
      tenant's jobs stay where its models are warm until waits really differ;
      but never past the tier's predicted-wait limit (``TierBacklog.max_wait_s``)
      when the best host is within it: the edge admitted the job by the best
      host's wait (``offers.wait_refusal``).
   c. No fresh host: the candidates with no fresh offer, or a fresh one with
      no UP node (a cell starting, or whose agents are restarting, says nothing
      about what it can run), by rendezvous hash of (cell, job id); none
      either: ``JobRejected(no_cell_can_run)`` naming the largest job any cell
      can run now.
   d. No offer at all yet (start-up, a stack whose cells do not publish):
      rendezvous of (cell, job id) over the candidates, as before offers.
   e. Quotas across cells (before a-d): a tenant with a quota or a cap
      (``AdmissionConfig.quota_tenants``, or every tenant with
      ``quota_default``) goes to its quota home, the rendezvous of (cell,
      tenant) over all the cells, whatever the waits, as long as the home can
      run the job's GPU type and its fresh offer has UP nodes that can run its
      shape (no fresh offer is no reason to leave: a dead scheduler's cell is
      taken over).
      Each cell enforces quotas and caps on the work it holds; with all of a
      tenant's work in one cell, that is the tenant's quota across cells, with
      no protocol between cells and nothing in the fold but its input log.
      The price: such a tenant waits in its home while another cell may have
      free GPUs. A job the home cannot run (its shape, or no UP node now), or
      one the home gave up (``JobRerouted``), goes where rules a-d send it
      (counted as ``quota_spills``): while the tenant has work in two cells,
      its quota counts once in each.
4. ``JobAdmitted(spec, cell)``: the shell sends it to the cell's partition of
   the scheduler topic and to job-events.

A cell that cannot run a queued job for its drain grace gives it up with a
``JobRerouted`` (to job-events, and here, keyed by the tenant). It is routed
again by the same rule without the cell it came from (a new ``JobAdmitted``)
or rejected if no other cell can run it. A reroute counts only if it comes
from the cell this state last sent the job to (a re-delivered or stale one is
ignored); a reroute of a job whose cancel was forwarded meanwhile ends it
(``JobCancelled``): the cancel reached a cell that no longer held it. A
reroute of a job whose decision has expired is routed afresh, and remembered
again from then.

Admission does not rate-limit. Limits are synchronous: the API refuses what a
tenant may not submit (its rate limit, its queue cap) at submit time with 429
and ``Retry-After`` (``framespool.producers.ratelimit``); whatever reaches the
log is queued, and a burst is the fair-share order's problem, not a reason to
reject later. The cell enforces a tenant's ``max_queued`` deterministically as
the backstop (``JobRejected(reason="queue_cap")``).

Bounded state. A decision (and its idempotency key) is remembered for
``AdmissionConfig.idempotency_horizon_s`` of command time after it was made
(default 10 minutes: the API answers a retry from its read model, so this
only has to outlast re-sends of one command). Time here is the highest command
``ts_ms`` seen, so expiry is a pure function of the log and replay stays
byte-identical. A ``CancelJob`` for a job whose decision has expired is still
forwarded, to each cell its id can have been routed to; the cell that holds it
acts, the others record it as ignored (once cells publish offers, a job can
have been routed to any cell, and every cell gets it). Output event ids are
``f"{position}/{i}"``, as in the cell core.

Cost model: an offer costs O(T + G) (tiers, GPU types); a submit costs
O(C * (T + G + s)) for C candidate cells and s shapes, all small.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from framespool.schemas import events as ev
from framespool.schemas.refusals import IgnoreCode

from .config import DEFAULT_TIERS
from .drain import largest_job
from .offers import hosts, live_offers, offer_groups, predicted_wait_s, tier_limit_s

INVALID_TIER = "invalid_tier"
NO_MATCHING_CELL = "no_matching_cell"
NO_CELL_CAN_RUN = "no_cell_can_run"


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Where jobs may go, and how long a decision is remembered.

    ``idempotency_horizon_s``: seconds of command time a job id and its
    idempotency key stay decided; a repeat after that is a new submission
    (default 10 minutes; it only has to outlast re-sends of one command).

    ``offer_stale_s``: a cell's latest ``CellOffer`` older than this (command
    time) says nothing: the cell is unknown (default 15 s, three of the cells'
    default 5 s status intervals). ``sticky_slack_s`` and
    ``sticky_slack_ratio``: a tenant's home cell keeps its jobs while its
    predicted wait is within ``max(sticky_slack_s, sticky_slack_ratio * best)``
    of the best cell's (defaults 5 s and 20 %; 0 and 0 route purely by wait). The
    absolute slack is about one cold start of a model: affinity may cost a job a
    warm-up's worth of waiting, never tens of seconds while GPUs idle elsewhere.
    """

    cells: tuple[str, ...] = ("cell-0",)
    cell_gpu_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tiers: tuple[str, ...] = tuple(t.name for t in DEFAULT_TIERS)
    idempotency_horizon_s: float = 600.0
    offer_stale_s: float = 15.0
    sticky_slack_s: float = 5.0
    sticky_slack_ratio: float = 0.2
    # tenants whose quotas and caps must hold across cells: all their jobs go to
    # one cell (theory of operation, 3e); ``quota_default``: every tenant (the
    # cells' default tenant has a cap). Last: older pickles load (``same_config``)
    quota_tenants: tuple[str, ...] = ()
    quota_default: bool = False

    def __post_init__(self) -> None:
        if not self.cells:
            raise ValueError("cells must name at least one cell")
        if len(set(self.cells)) != len(self.cells):
            raise ValueError(f"cells {list(self.cells)} lists a cell twice")
        unknown = sorted(set(self.cell_gpu_types) - set(self.cells))
        if unknown:
            raise ValueError(
                f"cell_gpu_types names cells {unknown} that are not in cells {list(self.cells)}"
            )
        if not self.tiers:
            raise ValueError("tiers must name at least one tier")
        if not 0 < self.idempotency_horizon_s < math.inf:  # NaN too: nothing would expire
            raise ValueError(
                f"idempotency_horizon_s={self.idempotency_horizon_s} must be a finite positive "
                "number of seconds (the decided ids it keeps are bounded by it)"
            )
        if not self.offer_stale_s > 0:
            raise ValueError(
                f"offer_stale_s={self.offer_stale_s} must be positive; use about three "
                "times the cells' status_interval_s"
            )
        if not self.sticky_slack_s >= 0:
            raise ValueError(f"sticky_slack_s={self.sticky_slack_s} must be 0 or more")
        if not 0 <= self.sticky_slack_ratio <= 1:
            raise ValueError(
                f"sticky_slack_ratio={self.sticky_slack_ratio} must be between 0 and 1"
            )

    def quota_bound(self, tenant: str) -> bool:
        """Whether ``tenant``'s jobs all go to its quota home (theory of operation, 3e)."""
        return self.quota_default or tenant in self.quota_tenants

    def cells_for(self, gpu_type: str) -> tuple[str, ...]:
        """The cells that can run ``gpu_type`` ("" = any GPU type), in config order."""
        if not gpu_type:
            return self.cells
        return tuple(
            c
            for c in self.cells
            if not self.cell_gpu_types.get(c) or gpu_type in self.cell_gpu_types[c]
        )


@dataclass(frozen=True, slots=True)
class CellCommand:
    """A command for the scheduler of ``cell`` (the shell sends it to that partition)."""

    cell: str
    command: Any


class Decision(NamedTuple):
    """What admission decided about one job; ``cell == ""`` means rejected.
    A tuple: it never changes, and pickles small (snapshots hold many)."""

    tenant: str
    cell: str
    ts_ms: int = 0  # the state's clock when decided (never behind): expires a horizon later
    key: str | None = None  # the idempotency key it was submitted under
    cancelled: bool = False  # a cancel was forwarded to ``cell``


def rendezvous(job_id: str, cells: tuple[str, ...]) -> str:
    """The cell with the highest hash of (cell, job id): stable for a job id
    (also used with a tenant for ``job_id``: the tenant's home cell)."""

    def weight(cell: str) -> bytes:
        return hashlib.blake2b(f"{cell}\x00{job_id}".encode(), digest_size=8).digest()

    return max(cells, key=weight)


class AdmissionState:
    """The admission state of one commands partition; picklable for snapshots."""

    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.config = config or AdmissionConfig()
        self.jobs: dict[str, Decision] = {}
        self.keys: dict[tuple[str, str], str] = {}  # (tenant, idempotency key) -> job id
        self.expiry: deque[str] = deque()  # job ids of ``jobs``, oldest decision first
        self.clock_ms = 0  # highest command ts_ms seen: the state's notion of now
        self.forgotten_ms = -1  # decision time of the newest expired decision
        self.counters: dict[str, int] = {}
        self.init_offers()
        self._out: list[Any] = []
        self._pos = ""
        self._ts = 0

    def init_offers(self) -> None:
        self.offers: dict[str, ev.CellOffer] = {}  # cell -> its latest offer
        # cell -> (GPU-seconds, GPUs) routed there since its latest offer
        self.routed: dict[str, tuple[float, int]] = {}
        self.superseded: dict[str, int] = {}  # job -> stale entries of it in ``expiry``

    def __setstate__(self, state: dict) -> None:
        """A snapshot from before offers gets them empty."""
        self.__dict__.update(state)
        if "offers" not in state:
            self.init_offers()

    # ------------------------------------------------------------------
    def apply(self, command: Any, position: str | None = None) -> list[Any]:
        """Fold one command; return the events to publish, in order."""
        self._out = []
        self._pos = position if position is not None else getattr(command, "event_id", "?")
        self._ts = getattr(command, "ts_ms", 0)
        if self._ts > self.clock_ms:
            self.clock_ms = self._ts
            self._expire()
        handler: Callable[[AdmissionState, Any], None] | None = _HANDLERS.get(type(command))
        if handler is None:
            self._ignore(
                getattr(command, "event_id", "?"),
                IgnoreCode.UNKNOWN_INPUT,
                f"unknown command type {type(command).__name__} for admission",
                command,
            )
        else:
            handler(self, command)
        return self._out

    def _emit(self, cls: type, **fields: Any) -> Any:
        out = cls(event_id=f"{self._pos}/{len(self._out)}", ts_ms=self._ts, **fields)
        self._out.append(out)
        return out

    def _ignore(self, subject: str, code: IgnoreCode, reason: str, source: Any) -> None:
        self._count("ignored")
        self._emit(
            ev.ReportIgnored,
            subject=subject,
            reason=reason,
            source_event_id=getattr(source, "event_id", ""),
            code=code.value,
        )

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _remember(self, job_id: str, decision: Decision) -> None:
        if job_id in self.jobs:  # decided again (a reroute): its older entry is stale
            self.superseded[job_id] = self.superseded.get(job_id, 0) + 1
        self.jobs[job_id] = decision
        if decision.key is not None:
            self.keys[(decision.tenant, decision.key)] = job_id
        self.expiry.append(job_id)

    def _expire(self) -> None:
        """Forget decisions made more than the horizon before ``clock_ms``."""
        cutoff = self.clock_ms - int(self.config.idempotency_horizon_s * 1000)
        expiry, jobs, superseded = self.expiry, self.jobs, self.superseded
        # an id is in ``jobs`` until its last entry in ``expiry`` leaves here; its
        # earlier entries (``superseded``) are skipped without a look at the time
        while expiry:
            stale = superseded.get(expiry[0])
            if stale:
                if stale == 1:
                    del superseded[expiry[0]]
                else:
                    superseded[expiry[0]] = stale - 1
                expiry.popleft()
                continue
            if jobs[expiry[0]].ts_ms >= cutoff:
                break
            job_id = expiry.popleft()
            decision = jobs.pop(job_id)
            self.forgotten_ms = max(self.forgotten_ms, decision.ts_ms)
            if (
                decision.key is not None
                and self.keys.get((decision.tenant, decision.key)) == job_id
            ):
                del self.keys[(decision.tenant, decision.key)]

    # -- SubmitJob ---------------------------------------------------------
    def on_submit(self, command: ev.SubmitJob) -> None:
        spec = command.spec
        if not spec.job_id or not spec.tenant:
            self._ignore(
                spec.job_id or command.event_id,
                IgnoreCode.MALFORMED,
                "malformed submission: spec.job_id and spec.tenant are required",
                command,
            )
            return
        key = (spec.tenant, command.idempotency_key) if command.idempotency_key else None
        earlier = self.keys.get(key) if key is not None else None
        if earlier is not None and earlier != spec.job_id:
            self._ignore(
                spec.job_id,
                IgnoreCode.DUPLICATE,
                f"duplicate submission: idempotency key "
                f"{command.idempotency_key!r} was already used for job {earlier}",
                command,
            )
            return
        decided = self.jobs.get(spec.job_id)
        if decided is not None:
            outcome = f"admitted to {decided.cell}" if decided.cell else "rejected"
            self._ignore(
                spec.job_id,
                IgnoreCode.DUPLICATE,
                f"duplicate submission: job {spec.job_id} was already {outcome}",
                command,
            )
            return
        problem = self._problem(spec)
        if problem is not None:
            self._remember(
                spec.job_id, Decision(spec.tenant, "", self.clock_ms, command.idempotency_key)
            )
            self._count(f"rejected_{problem[0]}")
            self._emit(
                ev.JobRejected,
                job_id=spec.job_id,
                tenant=spec.tenant,
                reason=problem[0],
                detail=problem[1],
            )
            return
        self._admit(spec, command.idempotency_key, exclude="")

    def _admit(
        self,
        spec: ev.JobSpec,
        key: str | None,
        exclude: str,
        why: str = "",
        moved: ev.JobRerouted | None = None,
    ) -> None:
        """Route ``spec`` (never to ``exclude``): ``JobAdmitted``, or ``JobRejected``
        when no cell can run it (``why`` says what came before). A job ``moved``
        from another cell keeps its run numbers and its checkpoint."""
        cell = self._route(spec, exclude)
        if cell is None:
            self._remember(spec.job_id, Decision(spec.tenant, "", self.clock_ms, key))
            self._count(f"rejected_{NO_CELL_CAN_RUN}")
            self._emit(
                ev.JobRejected,
                job_id=spec.job_id,
                tenant=spec.tenant,
                reason=NO_CELL_CAN_RUN,
                detail=(f"{why}; " if why else "") + self._cannot_run(spec, exclude),
            )
            return
        self._remember(spec.job_id, Decision(spec.tenant, cell, self.clock_ms, key))
        if cell in self.offers:
            cost, gpus = self.routed.get(cell, (0.0, 0))
            self.routed[cell] = (cost + spec.gpus * spec.estimate_s, gpus + spec.gpus)
        self._count("admitted" if not exclude else "rerouted")
        if moved is None:
            self._emit(ev.JobAdmitted, spec=spec, cell=cell)
        else:
            self._emit(
                ev.JobAdmitted, spec=spec, cell=cell, run=moved.run, resume_from=moved.resume_from
            )

    # -- routing (item 3 of the theory of operation) -------------------------
    def _route(self, spec: ev.JobSpec, exclude: str) -> str | None:
        candidates = tuple(c for c in self.config.cells_for(spec.gpu_type) if c != exclude)
        if not candidates:
            return None
        if self.config.quota_bound(spec.tenant):
            home = rendezvous(spec.tenant, self.config.cells)
            if home in candidates and self._may_host(home, spec):
                return home
            self._count("quota_spills")
        if not self.offers:
            return rendezvous(spec.job_id, candidates)
        fresh = self._live_offers(candidates)
        hosts = tuple(c for c in candidates if c in fresh and self._hosts(fresh[c], spec))
        if hosts:
            waits = {c: self._wait(fresh[c], spec) for c in hosts}
            best = min(hosts, key=lambda c: waits[c])  # ties: config order
            home = rendezvous(spec.tenant, hosts)
            slack = max(self.config.sticky_slack_s, self.config.sticky_slack_ratio * waits[best])
            if waits[home] > waits[best] + slack:
                return best
            # the edge let the job in by the best host's wait: stickiness may not
            # take it past its tier's limit where the best host keeps it within
            limit = tier_limit_s(fresh[home], spec.tier)
            return best if 0 < limit < waits[home] and waits[best] <= limit else home
        unknown = tuple(c for c in candidates if c not in fresh)
        return rendezvous(spec.job_id, unknown) if unknown else None

    def _may_host(self, cell: str, spec: ev.JobSpec) -> bool:
        """Whether ``cell`` may run ``spec`` as a quota home: its fresh offer has UP
        nodes that could (no fresh offer is unknown, not "no": a scheduler taken
        over; a fresh one with no UP node is "not now", and while its nodes are
        down the tenant holds no GPUs there to count twice)."""
        offer = self.offers.get(cell)
        if offer is None or offer.ts_ms < self.clock_ms - int(self.config.offer_stale_s * 1000):
            return True
        return bool(offer_groups(offer)) and self._hosts(offer, spec)

    def _live_offers(self, cells: tuple[str, ...]) -> dict[str, ev.CellOffer]:
        """Fresh offers of cells with UP nodes (``offers.live_offers``)."""
        return live_offers(self.offers, cells, self.clock_ms, self.config.offer_stale_s)

    @staticmethod
    def _hosts(offer: ev.CellOffer, spec: ev.JobSpec) -> bool:
        return hosts(offer, spec)

    def _wait(self, offer: ev.CellOffer, spec: ev.JobSpec) -> float:
        cost, gpus = self.routed.get(offer.cell, (0.0, 0))
        return predicted_wait_s(offer, spec, cost, gpus)

    def _cannot_run(self, spec: ev.JobSpec, exclude: str) -> str:
        """Why no cell takes ``spec``, naming the largest job any cell can run."""
        cells = tuple(c for c in self.config.cells_for(spec.gpu_type) if c != exclude)
        fresh = self._live_offers(cells)
        kind = f"{spec.gpu_type} " if spec.gpu_type else ""
        if not fresh:
            return f"no cell other than {exclude} offers {kind or 'any '}GPUs"
        sizes = {c: largest_job(offer_groups(o), spec.gpu_type) for c, o in fresh.items()}
        biggest = max(sizes, key=lambda c: sizes[c])
        return (
            f"no cell can run {spec.gpus} {kind}GPU(s) at {spec.gpus_per_node} per node now; "
            f"the largest job any cell can run is {sizes[biggest]} {kind}GPU(s) "
            f"({biggest}); ask for at most that many"
        )

    # -- CellOffer ---------------------------------------------------------
    def on_offer(self, offer: ev.CellOffer) -> None:
        """Keep each configured cell's newest offer; it produces nothing."""
        if offer.cell not in self.config.cells:
            self._count("offers_unknown_cell")
            return
        held = self.offers.get(offer.cell)
        if held is not None and held.ts_ms > offer.ts_ms:
            self._count("offers_stale")  # a re-delivered older one never wins
            return
        self._count("offers")
        self.offers[offer.cell] = offer
        self.routed.pop(offer.cell, None)

    # -- JobRerouted -------------------------------------------------------
    def on_rerouted(self, event: ev.JobRerouted) -> None:
        decided = self.jobs.get(event.job_id)
        if decided is not None and decided.cell != event.from_cell:
            where = f"now routed to {decided.cell}" if decided.cell else "ended"
            self._ignore(
                event.job_id,
                IgnoreCode.STALE_REROUTE,
                f"stale reroute: job {event.job_id} left {event.from_cell} before and is {where}",
                event,
            )
            return
        if decided is not None and decided.tenant != event.tenant:
            self._ignore(
                event.job_id,
                IgnoreCode.WRONG_TENANT,
                "reroute refused: job belongs to another tenant",
                event,
            )
            return
        key = decided.key if decided is not None else None
        if decided is not None and decided.cancelled:
            self._remember(event.job_id, Decision(event.tenant, "", self.clock_ms, key))
            self._count("cancelled_in_reroute")
            self._emit(
                ev.JobCancelled,
                job_id=event.job_id,
                run=0,
                reason=f"cancelled while {event.from_cell} gave it up ({event.reason})",
            )
            return
        self._admit(event.spec, key, exclude=event.from_cell, why=event.reason, moved=event)

    def _problem(self, spec: ev.JobSpec) -> tuple[str, str] | None:
        if spec.tier not in self.config.tiers:
            return INVALID_TIER, (
                f"tier {spec.tier!r} is unknown; use one of: {', '.join(self.config.tiers)}"
            )
        if not self.config.cells_for(spec.gpu_type):
            offered = sorted({t for types in self.config.cell_gpu_types.values() for t in types})
            return NO_MATCHING_CELL, (
                f"no cell offers gpu_type {spec.gpu_type!r}; use one of: "
                f"{', '.join(offered)}, or leave gpu_type empty"
            )
        return None

    # -- CancelJob ---------------------------------------------------------
    def on_cancel(self, command: ev.CancelJob) -> None:
        decided = self.jobs.get(command.job_id)
        if decided is None and self.forgotten_ms >= 0:
            # Perhaps decided before the horizon: let the cell that holds it act.
            for cell in self._cells_that_may_hold(command.job_id):
                self._forward_cancel(cell, command)
        elif decided is None:
            self._ignore(
                command.job_id, IgnoreCode.UNKNOWN_JOB, "cancel refused: unknown job", command
            )
        elif decided.tenant != command.tenant:
            self._ignore(
                command.job_id,
                IgnoreCode.WRONG_TENANT,
                "cancel refused: job belongs to another tenant",
                command,
            )
        elif not decided.cell:
            self._ignore(
                command.job_id,
                IgnoreCode.NOT_HERE,
                "cancel refused: job was rejected at admission",
                command,
            )
        else:
            self.jobs[command.job_id] = decided._replace(cancelled=True)
            self._forward_cancel(decided.cell, command)

    def _forward_cancel(self, cell: str, command: ev.CancelJob) -> None:
        self._count("cancels_forwarded")
        forwarded = ev.CancelJob(
            event_id=f"{self._pos}/{len(self._out)}",
            ts_ms=self._ts,
            job_id=command.job_id,
            tenant=command.tenant,
            reason=command.reason,
        )
        self._out.append(CellCommand(cell, forwarded))

    def _cells_that_may_hold(self, job_id: str) -> list[str]:
        """Every cell routing can have sent ``job_id`` to, whatever its GPU type
        was, in config order (every cell, once routing follows offers)."""
        if self.offers:
            return list(self.config.cells)
        listed = sorted({t for types in self.config.cell_gpu_types.values() for t in types})
        unlisted = "\x00unlisted"  # a type no cell lists: only the untyped cells offer it
        found = set()
        for gpu_type in ["", unlisted, *listed]:
            cells = self.config.cells_for(gpu_type)
            if cells:
                found.add(rendezvous(job_id, cells))
        return [c for c in self.config.cells if c in found]


_HANDLERS: dict[type, Callable[[AdmissionState, Any], None]] = {
    ev.SubmitJob: AdmissionState.on_submit,
    ev.CancelJob: AdmissionState.on_cancel,
    ev.CellOffer: AdmissionState.on_offer,  # from the cells' schedulers, never the API
    ev.JobRerouted: AdmissionState.on_rerouted,  # likewise
}

# What admission folds; anything else on the commands topic is dead-lettered.
ADMISSION_INPUTS = tuple(_HANDLERS)
