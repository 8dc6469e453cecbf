"""The cell state machine: ``Cell.apply(event) -> [output events]``.

Theory of operation
-------------------
One Cell owns one partition of the scheduler topic: its nodes, queues, runs
and reservations. Its inputs are totally ordered; ``apply`` folds one of them
and returns what must be published, in order. The fold is pure and
deterministic:

1. time only advances on ``Tick`` (``now_ms`` never goes backwards);
2. output ``event_id``s are ``<position>/<index>``, derived from the input
   position, so a re-emitted output after a crash is the same event;
3. every iteration is over insertion-ordered dicts or sorted lists (never a
   set), and nothing reads a clock, a random source or the environment.

The handlers live in mixins along the domain's seams: ``jobs`` (admission,
cancellation, run reports), ``nodes`` (registration, heartbeats, health, leases),
``gangs`` (a multi-node run's start barrier, per-member liveness and per-rank
checkpoints), the scheduling pass in four (``scheduling``: fair order,
backfill and the walk; ``walkproofs``: when a walk may stop; ``starts``:
placing one job; ``allocations``: a run's GPUs taken and given back),
``reservation`` (reservations and preemption), ``rescue`` (a promised start:
wait, checkpoint or evict), ``estimates`` (the wait a queued job is told),
``waiting`` (why it waits and its position, in words and as a code),
``breakers`` (failure containment), ``stragglers`` (slow runs as evidence
against nodes) and ``accounting`` (costs, bounded state, the periodic
read-model output).

Cost model (``scheduling.py`` states it for the pass, ``walkproofs.py``,
``starts.py`` and ``allocations.py`` for their parts; ``test_core_costmodel.py``
tests it): with n backlogged flows, q queued jobs and F nodes with free GPUs,
every handler costs O(log n + log q) amortized, plus O(F) per shape a
placement searches; a Tick's pass tests at most ``backfill_depth`` candidates
after a block, is skipped outright when nothing it reads has changed, and
stops once no candidate left can start, reserve or preempt (``queuebounds.py``).
Not yet within it: ``work_ahead`` (admission, estimates) visits every
backlogged sibling flow; each full pass re-places every reservation (one lazy
walk of the release list each; a sticky one reads only its own nodes'); the
periodic CellStatus is O(nodes + status rows) per publish (the rows, one per
tier and tenant with live work, are kept as jobs move: ``depth_rows``) and the
estimates O(runs + refreshed jobs); and gang liveness is checked over every
running gang per Tick.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

from framespool.schemas import events as ev
from framespool.schemas.refusals import IgnoreCode

from . import lifecycle as lc
from .accounting import Accounting
from .allocations import Allocations
from .breakers import Breakers
from .config import CellConfig
from .drain import Drain
from .estimates import WaitEstimates
from .fairshare import FairTree
from .gangs import GangHandlers
from .jobs import JobHandlers
from .model import HealthSeen, Job, Node, Run, RunKey
from .nodes import NodeHandlers
from .placement import NodeIndex
from .rescue import Rescue
from .reservation import Reservations
from .scheduling import Scheduling
from .starts import Starts
from .stragglers import Stragglers
from .waitbands import WaitBands
from .waiting import Waiting
from .walkproofs import WalkProofs


class TenantUse:
    """What one organisation (or one user) holds right now, for quotas."""

    __slots__ = ("gpus", "running", "queued")

    def __init__(self) -> None:
        self.gpus = 0
        self.running = 0
        self.queued = 0


class Cell(
    JobHandlers,
    NodeHandlers,
    GangHandlers,
    Scheduling,
    WalkProofs,
    Starts,
    Allocations,
    Reservations,
    Rescue,
    Drain,
    WaitEstimates,
    Breakers,
    Stragglers,
    Accounting,
    Waiting,
):
    def __init__(self, config: CellConfig | None = None, cell_id: str = "cell-0") -> None:
        self.config = config or CellConfig()
        self.cell_id = cell_id
        self.now_ms = 0
        self.jobs: dict[str, Job] = {}  # live (non-terminal) jobs
        self.finished: dict[str, str] = {}  # job id -> terminal state, oldest first
        # (cell time, ids ever added to ``finished``): when what; expiry reads it
        self.finished_marks: deque[tuple[int, int]] = deque()
        self.finished_expired: int = 0
        self.runs: dict[RunKey, Run] = {}
        self.index: NodeIndex = NodeIndex()
        self.fair: FairTree = FairTree(self.config.idle_credit_gpu_s)
        self.leaves: dict[tuple[str, str, str], Any] = {}  # (tier, org, user) -> leaf flow
        self.org_use: dict[str, TenantUse] = {}
        self.user_use: dict[tuple[str, str], TenantUse] = {}
        self.tier_use: dict[str, int] = {}
        self.queued_count: int = 0
        self.running_gpus = 0
        self.running_end_gpu_s = 0.0  # sum of gpus * (assigned_s + estimate_s) of runs
        # leases and timers
        self.node_seen: dict[str, None] = {}  # oldest heartbeat first
        # node id -> its last health fold, so a repeat is O(1) (nodes.py)
        self.health_seen: dict[str, HealthSeen] = {}
        self.assigned_unstarted: dict[RunKey, None] = {}
        self.exiting: dict[RunKey, None] = {}
        self.stopping: dict[RunKey, None] = {}
        self.gang_runs: dict[RunKey, None] = {}  # gangs past their start barrier
        self.limits: list[tuple[int, str, int]] = []  # heap of (limit_ms, job, run)
        # scheduling state
        self.reservation_job: str = ""
        self.reservation_nodes: tuple[str, ...] = ()
        self.reservation_shadow_ms = 0
        self.claims: dict[str, tuple[tuple[str, ...], int]] = {}  # job -> (nodes, expiry)
        self.preempt_times: list[int] = []
        self.breakers: dict[tuple[str, str, str], int] = {}  # (model, scope, key) -> until
        # (model, scope, key) -> [(ts, tenant, node)] within the breaker window
        self.failure_log: dict[tuple[str, str, str], list[tuple[int, str, str]]] = {}
        self.breaker_probes: dict[tuple[str, str, str], RunKey] = {}  # half-open probe runs
        self.breaker_trips: dict[tuple[str, str, str], int] = {}  # consecutive trips (backoff)
        self.breaker_tripped_by: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self.breaker_no_probe: dict[tuple[str, str, str], dict[str, int]] = {}  # barred probers
        self.model_rates: dict[str, dict[RunKey, float]] = {}
        # (model, tenant) and model -> reference step rate (stragglers.py)
        self.model_median: dict = {}
        self.node_slow: dict[str, dict[str, int]] = {}  # node -> tenant -> sighted ms
        self.straggler_nodes: dict[str, tuple[int, int, int]] = {}  # node -> probation
        self.last_status_ms: int = -1
        self.last_estimate_ms: int = -1
        self.wait_bands = WaitBands()  # P50/P90 learned from observed waits
        self.counters: dict[str, int] = {}
        self.init_drain()  # offers to admission, jobs drained to other cells (drain.py)
        # per-apply output buffer
        self._out: list[Any] = []
        self._pos = ""
        self._input: Any = None

    # ------------------------------------------------------------------
    def apply(self, event: Any, position: str | None = None) -> list[Any]:
        """Fold one input event; return the events to publish, in order."""
        self._out = []
        self._pos = position if position is not None else event.event_id
        self._input = event
        handler: Callable[[Any, Any], None] | None = self._HANDLERS.get(type(event))
        if handler is None:
            self._count("unknown_event")
            self.ignore(
                getattr(event, "event_id", "?"),
                IgnoreCode.UNKNOWN_INPUT,
                f"unknown event type {type(event).__name__} for the scheduler",
                event,
            )
        else:
            handler(self, event)
        self._input = None  # only a refusal during this fold names it
        return self._out

    # -- outputs ----------------------------------------------------------
    def emit(self, cls: type, **fields: Any) -> Any:
        out = cls(event_id=f"{self._pos}/{len(self._out)}", ts_ms=self.now_ms, **fields)
        self._out.append(out)
        return out

    def hold_output(self) -> int:
        """Keep the next output's place (and so its event id) for an event this
        apply builds later, with ``emit_held``: an event that must go out first
        but says what the rest of the apply decides."""
        self._out.append(None)
        return len(self._out) - 1

    def emit_held(self, place: int, cls: type, **fields: Any) -> Any:
        """Fill a place kept by ``hold_output`` (the event id ``emit`` would
        have given an event emitted then)."""
        out = cls(event_id=f"{self._pos}/{place}", ts_ms=self.now_ms, **fields)
        self._out[place] = out
        return out

    def instruct(self, cls: type, node: Node, job_id: str, run: int, reason: str) -> Any:
        """Emit the agent command ``cls`` (``StopRun``, ``CheckpointRun``,
        ``BeginRun``) for run ``run`` of ``job_id`` to ``node``'s current incarnation."""
        return self.emit(
            cls,
            node_id=node.node_id,
            incarnation=node.incarnation,
            job_id=job_id,
            run=run,
            reason=reason,
        )

    def ignore(self, subject: str, code: IgnoreCode, reason: str, source: Any) -> None:
        """Record a report the fold refused (``code`` says why for readers, ``reason``
        in words for audit); it changes nothing else."""
        self._count("ignored")
        self.emit(
            ev.ReportIgnored,
            subject=subject,
            reason=reason,
            source_event_id=getattr(source, "event_id", ""),
            code=code.value,
        )

    def refused(self, job: Job, action: str, source: Any = None) -> bool:
        """Whether the lifecycle table refuses ``action`` for ``job`` now. Callers ask
        before they change anything; a refusal is recorded (a ``ReportIgnored``
        naming the transition, ``source`` defaulting to the input being folded)
        and the caller must then leave the cell as it was."""
        if lc.allowed(job.state, action):
            return False
        self._count("illegal_transition")
        self.ignore(
            job.job_id,
            IgnoreCode.ILLEGAL_TRANSITION,
            lc.refusal(job.state, action),
            source or self._input,
        )
        return True

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # -- time -------------------------------------------------------------
    def on_tick(self, event: ev.Tick) -> None:
        if self.now_ms == 0 and event.now_ms > 0:
            self.rebase_time(event.now_ms)
        if event.now_ms > self.now_ms:
            if self.now_ms:
                self.wait_bands.ticked(event.now_ms - self.now_ms)
            self.now_ms = event.now_ms
        self.expire_nodes()
        self.end_straggler_probations()
        self.expire_breaker_probes()
        self.expire_runs()
        self.wait_bands.in_tick = True  # starts now are on the Tick (waitbands.py, 10.)
        try:
            self.schedule(full=True)
        finally:
            del self.wait_bands.in_tick  # back to the class's False: nothing in snapshots
        self.publish_periodic()
        self.offer_and_drain()

    def rebase_time(self, first_ms: int) -> None:
        """Before the first Tick the cell has no clock: whatever happened then
        (registrations, admissions) is taken to have happened at the first Tick,
        so leases do not expire the moment time starts."""
        for node in self.index.nodes.values():
            node.last_seen_ms = first_ms
        for job in self.jobs.values():
            job.queued_ms = first_ms
        for leaf in self.leaves.values():
            if leaf.keys is not None:  # keyed by the admission times just moved
                self.order_leaf(leaf)
        for run in self.runs.values():
            span = run.limit_ms - run.assigned_ms
            run.assigned_ms = run.started_ms = run.last_report_ms = first_ms
            if run.gang is not None:
                run.gang.seen = dict.fromkeys(run.gang.members, first_ms)
            run.limit_ms = first_ms + span
        self.__dict__.pop("_release_ends", None)  # every static end moved: rebuilt on use
        self.limits = [(r.limit_ms, r.job_id, r.run) for r in self.runs.values()]
        heapq.heapify(self.limits)
        self.running_end_gpu_s = sum(
            r.gpus * (first_ms / 1000 + r.estimate_s) for r in self.runs.values()
        )

    # -- shared helpers ---------------------------------------------------
    def use_of(self, job_or_run: Job | Run) -> tuple[TenantUse, TenantUse]:
        org = self.org_use.get(job_or_run.tenant)
        if org is None:
            org = self.org_use[job_or_run.tenant] = TenantUse()
        key = (job_or_run.tenant, job_or_run.user)
        user = self.user_use.get(key)
        if user is None:
            user = self.user_use[key] = TenantUse()
        return org, user

    def tenant_jobs(self, tenant: str) -> tuple[int, int]:
        """Jobs ``tenant`` has queued and running in this cell, every tier (the
        simulator's edge counts them as the API does its read model's). O(1);
        changes nothing."""
        org = self.org_use.get(tenant)
        return (org.queued, org.running) if org is not None else (0, 0)

    def push_limit(self, run: Run) -> None:
        heapq.heappush(self.limits, (run.limit_ms, run.job_id, run.run))

    def node(self, node_id: str) -> Node | None:
        return self.index.nodes.get(node_id)

    _HANDLERS: dict[type, Callable[[Any, Any], None]] = {}


Cell._HANDLERS = {
    ev.Tick: Cell.on_tick,
    ev.JobAdmitted: Cell.on_admitted_here,  # drain.py: minds jobs that drained away
    ev.CancelJob: Cell.on_cancel_here,
    ev.NodeRegistered: Cell.on_node_registered,
    ev.NodeHeartbeat: Cell.on_heartbeat,
    ev.RunStarted: Cell.on_run_started,
    ev.RunCheckpointed: Cell.on_run_checkpointed,
    ev.RunCompleted: Cell.on_run_completed,
    ev.RunFailed: Cell.on_run_failed,
    ev.RunStopped: Cell.on_run_stopped,
}

# Outputs the shell routes to agents (by node id); everything else is a job event.
AGENT_COMMANDS = (ev.StartRun, ev.StopRun, ev.CheckpointRun, ev.BeginRun)
