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
3. **Routing.** Among the cells that offer the job's GPU type (a cell with no
   listed types offers any), the job goes to the one with the highest
   rendezvous hash of (cell, job id): stable for a job, spread evenly, and
   adding a cell moves only the jobs that now hash to it.
4. ``JobAdmitted(spec, cell)``: the shell sends it to the cell's partition of
   the scheduler topic and to job-events.

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
acts, the others record it as ignored. Output event ids are
``f"{position}/{i}"``, as in the cell core.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from framespool.schemas import events as ev

from .config import DEFAULT_TIERS

INVALID_TIER = "invalid_tier"
NO_MATCHING_CELL = "no_matching_cell"


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Where jobs may go, and how long a decision is remembered.

    ``idempotency_horizon_s``: seconds of command time a job id and its
    idempotency key stay decided; a repeat after that is a new submission
    (default 10 minutes; it only has to outlast re-sends of one command).
    """

    cells: tuple[str, ...] = ("cell-0",)
    cell_gpu_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tiers: tuple[str, ...] = tuple(t.name for t in DEFAULT_TIERS)
    idempotency_horizon_s: float = 600.0

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
        if self.idempotency_horizon_s <= 0:
            raise ValueError(f"idempotency_horizon_s={self.idempotency_horizon_s} must be positive")

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


def rendezvous(job_id: str, cells: tuple[str, ...]) -> str:
    """The cell with the highest hash of (cell, job id): stable for a job id."""

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
        self._out: list[Any] = []
        self._pos = ""
        self._ts = 0

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

    def _ignore(self, subject: str, reason: str, source: Any) -> None:
        self._count("ignored")
        self._emit(
            ev.ReportIgnored,
            subject=subject,
            reason=reason,
            source_event_id=getattr(source, "event_id", ""),
        )

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _remember(self, job_id: str, decision: Decision) -> None:
        self.jobs[job_id] = decision
        if decision.key is not None:
            self.keys[(decision.tenant, decision.key)] = job_id
        self.expiry.append(job_id)

    def _expire(self) -> None:
        """Forget decisions made more than the horizon before ``clock_ms``."""
        cutoff = self.clock_ms - int(self.config.idempotency_horizon_s * 1000)
        expiry, jobs = self.expiry, self.jobs
        # each id is in ``expiry`` once, and in ``jobs`` until it leaves both here
        while expiry and jobs[expiry[0]].ts_ms < cutoff:
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
                "malformed submission: spec.job_id and spec.tenant are required",
                command,
            )
            return
        key = (spec.tenant, command.idempotency_key) if command.idempotency_key else None
        earlier = self.keys.get(key) if key is not None else None
        if earlier is not None and earlier != spec.job_id:
            self._ignore(
                spec.job_id,
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
        cell = rendezvous(spec.job_id, self.config.cells_for(spec.gpu_type))
        self._remember(
            spec.job_id, Decision(spec.tenant, cell, self.clock_ms, command.idempotency_key)
        )
        self._count("admitted")
        self._emit(ev.JobAdmitted, spec=spec, cell=cell)

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
            self._ignore(command.job_id, "cancel refused: unknown job", command)
        elif decided.tenant != command.tenant:
            self._ignore(command.job_id, "cancel refused: job belongs to another tenant", command)
        elif not decided.cell:
            self._ignore(command.job_id, "cancel refused: job was rejected at admission", command)
        else:
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
        was, in config order."""
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
}

# The command types admission folds; anything else on the commands topic is dead-lettered.
ADMISSION_INPUTS = tuple(_HANDLERS)
