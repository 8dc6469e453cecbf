"""Admission: the pure fold of the commands topic (``SubmitJob``, ``CancelJob``).

Theory of operation
-------------------
The commands topic is keyed by tenant, so one partition holds all of a
tenant's commands, in order, and one ``AdmissionState`` per partition decides
them. ``apply(command, position)`` returns the events to publish; it reads no
clock (time is the command's ``ts_ms``), draws no randomness and iterates
only insertion-ordered dicts, so the same log replays to the same decisions.

For a ``SubmitJob``, in this order:

1. **Idempotency.** A job id, and a (tenant, idempotency key), is decided
   once: a repeat of either produces nothing new, only a ``ReportIgnored``
   that says which earlier decision stands (the API derives the job id from
   the key, so a retry with the same key is the same job).
2. **Rate limit.** A token bucket per tenant, refilled by the commands' own
   ``ts_ms`` (a timestamp older than the bucket's refills nothing; time never
   runs backwards). An empty bucket rejects with ``rate_limited``, naming the
   limit and how long to wait.
3. **Validation** the API cannot do: the tier must be one the cells know.
4. **Routing.** Among the cells that offer the job's GPU type (a cell with no
   listed types offers any), the job goes to the one with the highest
   rendezvous hash of (cell, job id): stable for a job, spread evenly, and
   adding a cell moves only the jobs that now hash to it.
5. ``JobAdmitted(spec, cell)``: the shell sends it to the cell's partition of
   the scheduler topic and to job-events.

A decision is remembered whatever it was, so "exactly one terminal event per
job" holds: a rejected job stays rejected. A ``CancelJob`` goes to the cell
that holds the job (wrapped in :class:`CellCommand`); a cancel of an unknown,
rejected or foreign job becomes a ``ReportIgnored``. Output event ids are
``f"{position}/{i}"``, as in the cell core.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from framespool.schemas import events as ev

from .config import DEFAULT_TIERS

RATE_LIMITED = "rate_limited"
INVALID_TIER = "invalid_tier"
NO_MATCHING_CELL = "no_matching_cell"


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket: ``rate_per_s`` submissions a second on average, bursts of
    up to ``burst``. ``rate_per_s == 0`` means unlimited."""

    rate_per_s: float = 10.0
    burst: float = 20.0

    def __post_init__(self) -> None:
        if self.rate_per_s < 0:
            raise ValueError(f"rate_per_s={self.rate_per_s} must be >= 0 (0 = unlimited)")
        if self.rate_per_s > 0 and self.burst < 1:
            raise ValueError(f"burst={self.burst} must be >= 1 when a rate is set")


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Where jobs may go and how fast a tenant may submit them."""

    cells: tuple[str, ...] = ("cell-0",)
    cell_gpu_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tiers: tuple[str, ...] = tuple(t.name for t in DEFAULT_TIERS)
    rate: RateLimit = RateLimit()
    tenant_rates: Mapping[str, RateLimit] = field(default_factory=dict)

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

    def limit_for(self, tenant: str) -> RateLimit:
        return self.tenant_rates.get(tenant, self.rate)

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


@dataclass(slots=True)
class Decision:
    """What admission decided about one job; ``cell == ""`` means rejected."""

    tenant: str
    cell: str


@dataclass(slots=True)
class Bucket:
    tokens: float
    last_ms: int


def rendezvous(job_id: str, cells: tuple[str, ...]) -> str:
    """The cell with the highest hash of (cell, job id): stable for a job id."""

    def weight(cell: str) -> bytes:
        return hashlib.blake2b(f"{cell}\x00{job_id}".encode(), digest_size=8).digest()

    return max(cells, key=weight)


def take_token(bucket: Bucket, limit: RateLimit, now_ms: int) -> int:
    """Take one token; return 0, or the milliseconds until one is available."""
    if limit.rate_per_s <= 0:
        return 0
    if now_ms > bucket.last_ms:
        bucket.tokens = min(
            limit.burst, bucket.tokens + (now_ms - bucket.last_ms) * limit.rate_per_s / 1000.0
        )
        bucket.last_ms = now_ms
    if bucket.tokens >= 1.0:
        bucket.tokens -= 1.0
        return 0
    missing = 1.0 - bucket.tokens
    return max(1, -int(-missing * 1000.0 // limit.rate_per_s))  # ceil, at least 1 ms


class AdmissionState:
    """The admission state of one commands partition; picklable for snapshots."""

    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.config = config or AdmissionConfig()
        self.jobs: dict[str, Decision] = {}
        self.keys: dict[tuple[str, str], str] = {}  # (tenant, idempotency key) -> job id
        self.buckets: dict[str, Bucket] = {}
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
        if key is not None:
            self.keys[key] = spec.job_id
        problem = self._problem(spec)
        if problem is not None:
            self.jobs[spec.job_id] = Decision(spec.tenant, "")
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
        self.jobs[spec.job_id] = Decision(spec.tenant, cell)
        self._count("admitted")
        self._emit(ev.JobAdmitted, spec=spec, cell=cell)

    def _problem(self, spec: ev.JobSpec) -> tuple[str, str] | None:
        limit = self.config.limit_for(spec.tenant)
        bucket = self.buckets.get(spec.tenant)
        if bucket is None:
            bucket = self.buckets[spec.tenant] = Bucket(limit.burst, self._ts)
        wait_ms = take_token(bucket, limit, self._ts)
        if wait_ms:
            return RATE_LIMITED, (
                f"tenant {spec.tenant!r} is over its submission rate limit of "
                f"{limit.rate_per_s:g}/s (burst {limit.burst:g}); retry in {wait_ms} ms "
                f"(at ts_ms {self._ts + wait_ms}) with a new Idempotency-Key"
            )
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
        if decided is None:
            self._ignore(command.job_id, "cancel refused: unknown job", command)
        elif decided.tenant != command.tenant:
            self._ignore(command.job_id, "cancel refused: job belongs to another tenant", command)
        elif not decided.cell:
            self._ignore(command.job_id, "cancel refused: job was rejected at admission", command)
        else:
            self._count("cancels_forwarded")
            forwarded = ev.CancelJob(
                event_id=f"{self._pos}/{len(self._out)}",
                ts_ms=self._ts,
                job_id=command.job_id,
                tenant=command.tenant,
                reason=command.reason,
            )
            self._out.append(CellCommand(decided.cell, forwarded))


_HANDLERS: dict[type, Callable[[AdmissionState, Any], None]] = {
    ev.SubmitJob: AdmissionState.on_submit,
    ev.CancelJob: AdmissionState.on_cancel,
}

# The command types admission folds; anything else on the commands topic is dead-lettered.
ADMISSION_INPUTS = tuple(_HANDLERS)
