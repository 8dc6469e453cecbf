"""Policy configuration of a cell: tiers, tenants, leases, health thresholds.

Everything the fold needs to decide is here or in the events; nothing is read
from the environment. Defaults are the product's defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace


def _check(
    where: str, name: str, value: float, *, positive: bool = False, finite: bool = False
) -> None:
    """``value`` is a number at least 0 (above 0 when ``positive``; not
    infinite when ``finite``), else ``ValueError`` naming ``name`` (after
    ``where``, the tier or tenant, when given)."""
    what = f"{where}: {name}" if where else name
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    bound = "greater than 0" if positive else "at least 0"
    if math.isnan(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{what} must be {bound}, got {value!r}")
    if finite and math.isinf(value):
        raise ValueError(f"{what} must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class TierConfig:
    """A service tier: its share weight, the wait it promises, and what it may do.

    ``rank``: lower is more important; only a lower rank may preempt a higher one.
    ``sla_wait_s``: queued longer than this, a job of a tier with ``may_preempt``
    may preempt preemptible, checkpointable work of higher-ranked tiers.
    ``max_predicted_wait_s``: the edge (the API at submit, the simulator's
    submit) refuses a job whose predicted wait in its best cell exceeds it, from
    the cells' offers, which carry it (``framespool.processors.core.offers``); the
    cell itself never rejects on it (0 = no limit).
    ``start_within_s`` (with ``may_preempt``): the start the tier promises. A
    job of it that does not fit plans from its first pass how to start by
    then, choosing per node between runs that end in time, a graceful
    checkpoint of a victim whose next checkpoint is near and a hard eviction
    of one whose last is recent (``rescue.py``); ``sla_wait_s`` then only
    matters once that deadline has passed (0 = no promise: preempt past
    ``sla_wait_s`` as before).
    """

    name: str
    weight: float
    rank: int
    sla_wait_s: float
    may_preempt: bool = False
    max_predicted_wait_s: float = 0.0
    reserved_gpus: int = 0
    start_within_s: float = 0.0

    def __post_init__(self) -> None:
        where = f"tier {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a tier needs a name, got {self.name!r}")
        _check(where, "weight", self.weight, positive=True, finite=True)
        _check(where, "sla_wait_s", self.sla_wait_s)  # inf: never past it
        _check(where, "max_predicted_wait_s", self.max_predicted_wait_s)
        _check(where, "reserved_gpus", self.reserved_gpus, finite=True)
        _check(where, "start_within_s", self.start_within_s, finite=True)


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """An organisation: weight, quotas and caps at org and per-user level."""

    name: str
    weight: float = 1.0
    max_gpus: int = 0  # GPUs in use at once (0 = unlimited)
    max_queued: int = 0  # queued jobs (0 = unlimited)
    max_running: int = 0  # concurrent runs (0 = unlimited)
    user_max_gpus: int = 0
    user_max_running: int = 0
    reserved_gpus: int = 0  # guaranteed minimum, lent to others while idle
    user_weights: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        where = f"tenant {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a tenant needs a name, got {self.name!r}")
        _check(where, "weight", self.weight, positive=True, finite=True)
        for name in (
            "max_gpus",
            "max_queued",
            "max_running",
            "user_max_gpus",
            "user_max_running",
            "reserved_gpus",
        ):
            _check(where, name, getattr(self, name), finite=True)
        for user, weight in self.user_weights:
            _check(where, f"user_weights[{user!r}]", weight, positive=True, finite=True)

    def capped(self) -> bool:
        """Whether a GPU or run cap applies, to the organisation or its users."""
        return bool(
            self.max_gpus or self.max_running or self.user_max_gpus or self.user_max_running
        )


DEFAULT_TIERS = (
    # interactive promises a start within 10 s (issue 34): it plans how from
    # its first pass (rescue.py), where preempting after a 5 s wait left its p99
    # at 36 s on the genai workload (each victim's checkpoint came only at its
    # next 60 s boundary); past the 10 s it preempts as before
    TierConfig(
        "interactive", weight=8.0, rank=0, sla_wait_s=5.0, may_preempt=True, start_within_s=10.0
    ),
    TierConfig("enterprise", weight=4.0, rank=1, sla_wait_s=300.0),
    TierConfig("paid", weight=2.0, rank=2, sla_wait_s=900.0),
    TierConfig("free", weight=1.0, rank=3, sla_wait_s=3600.0),
    TierConfig("batch", weight=1.0, rank=4, sla_wait_s=86400.0),
)

# Retry budget per failure class (runs that may fail with this class before the
# job ends FAILED). Preemption and checkpoint-and-move never consume budget.
DEFAULT_RETRIES = (
    ("node_lost", 5),
    ("lease_expired", 3),
    ("generator_error", 2),
    ("hung", 1),
    ("timeout", 1),
)


# A per-cell backstop for ``max_queued`` (the API's queue cap, 10,000 waiting
# jobs per tenant by default, refuses first). Not the default: the fairness
# guarantee is tested with floods far beyond it.
DEFAULT_MAX_QUEUED = 20_000


@dataclass(frozen=True, slots=True)
class CellConfig:
    tiers: tuple[TierConfig, ...] = DEFAULT_TIERS
    tenants: tuple[TenantConfig, ...] = ()
    # a tenant not listed; set its max_queued (e.g. DEFAULT_MAX_QUEUED) for a
    # per-cell backstop behind the API's submit-time queue cap (429 first)
    default_tenant: TenantConfig = TenantConfig("*")
    retries: tuple[tuple[str, int], ...] = DEFAULT_RETRIES
    default_retries: int = 2

    # Leases (seconds of cell time, which only Ticks advance)
    heartbeat_timeout_s: float = 10.0  # silent node -> DOWN
    start_lease_s: float = 30.0  # assigned but never reported -> requeue
    report_lease_s: float = 15.0  # running but missing from heartbeats -> requeue
    stop_lease_s: float = 60.0  # StopRun unconfirmed -> node DOWN
    checkpoint_grace_s: float = 60.0  # CheckpointRun unanswered -> stop anyway

    # Run time limit: estimate * factor + grace; past it the run is stopped
    # (failure class "timeout"). Reservations treat it as the latest end.
    overrun_factor: float = 2.0
    overrun_grace_s: float = 300.0

    # Fair share
    idle_credit_gpu_s: float = 0.0  # credit a returning entity may keep
    # candidates tested per pass after a block. 2048, not 256 (issue 34): on
    # the genai workload a backlogged cell's fair order led with hundreds of
    # blocked whole-node jobs of the tiers ahead, the walk ran out before the
    # small jobs behind them, and 4 % of the GPUs idled under backlog next to
    # queued jobs that fit (utilization under backlog 0.940 -> 0.956 with
    # 16 reservations; candidates of blocked classes cost a lookup each)
    backfill_depth: int = 2048
    # Jobs that hold a reservation at once (1 = EASY). More make backfill
    # conservative for the next blocked gangs too, so a tenant of big gangs is
    # not starved by a tenant of 1-GPU jobs between its gangs; each costs one
    # walk of the release list per full pass (reservation.py). 16, not 4
    # (issue 34): once a backlog holds only whole-node jobs, more nodes drain
    # for them at once and small arrivals do not refill them (genai:
    # utilization under backlog 0.947 at 4, 0.956 at 16, 0.961 at 32, for
    # 1.2x and 1.5x the simulation's time at 4)
    reservations: int = 16

    # Preemption churn limits
    preemptions_per_minute: int = 20
    min_run_before_preempt_s: float = 60.0
    max_preemptions_per_job: int = 3

    # Health thresholds
    throttle_temp_c: float = 87.0
    throttle_clock_ratio: float = 0.7
    ecc_corrected_limit: int = 1000
    straggler_ratio: float = 0.5
    straggler_strikes: int = 3
    straggler_interval_s: float = 5.0  # step-rate medians refreshed this often (0 = never)
    healthy_samples_to_recover: int = 5

    # Failure containment (processors/core/breakers.py). A breaker trips on
    # ``breaker_*_failures`` generator errors within the window that come from
    # at least ``breaker_min_tenants`` tenants (one tenant's failures only burn
    # its own jobs' retry budgets, and count for at most their share of a trip;
    # set 1 for a single-tenant cell). A tripped breaker is open for
    # ``breaker_probe_after_s``, then half-open: one short probe run, another
    # tenant's first; its success closes the breaker, its failure (or overrun
    # of ``breaker_probe_max_s``) reopens it for twice as long, up to
    # ``breaker_cooldown_s``, and bars its tenant from probing for that long.
    breaker_node_failures: int = 3
    breaker_type_failures: int = 5
    breaker_window_s: float = 600.0
    breaker_cooldown_s: float = 1800.0
    breaker_min_tenants: int = 2
    breaker_probe_after_s: float = 60.0

    # Bounded state: a terminal job's id stays in ``Cell.finished`` this long
    # (cell time) after it ended, to refuse a re-delivered admission and to
    # explain late reports; keep it above admission's idempotency_horizon_s.
    finished_horizon_s: float = 3600.0

    # Drain (processors/core/drain.py): a queued job no UP node here can run for
    # this long is rerouted to another cell (0 = never: a lone cell keeps it)
    drain_grace_s: float = 0.0

    # Read-model cadence (status_interval_s also paces the CellOffer to admission)
    status_interval_s: float = 5.0
    estimate_interval_s: float = 30.0
    estimate_publish_limit: int = 2000

    # Lookups by name, built once per config (``replace`` builds them again):
    # O(1) where a scan of thousands of tenants ran on every placement attempt.
    # The first entry of a name wins, as the scans did.
    _tiers: dict[str, TierConfig] = field(init=False, repr=False, compare=False)
    _tenants: dict[str, TenantConfig] = field(init=False, repr=False, compare=False)
    _retries: dict[str, int] = field(init=False, repr=False, compare=False)
    _defaulted: dict[str, TenantConfig] = field(init=False, repr=False, compare=False)
    # guaranteed GPUs by name, every entry of a name (guarantees add up)
    reserved_tenant_gpus: dict[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    reserved_tier_gpus: dict[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    # ``may_preempt`` by (tier, tenant). Last: a slotted dataclass pickles its
    # fields in order, so a config pickled before this field still loads
    _may_preempt: dict[tuple[str, str], bool] = field(init=False, repr=False, compare=False)
    # whether any tenant (the default one too) has a cap (``any_caps``); after
    # ``_may_preempt`` for the same reason
    _any_caps: bool = field(init=False, repr=False, compare=False)
    # GPU-seconds a run takes to load its model on GPUs that do not hold it
    # (the fleet's model-load time, which no job's estimate counts): the wait
    # estimates add it for the share of runs that load (estimates.load_terms);
    # decisions never read it. Last, for the reason above: read it with
    # ``getattr(config, "model_load_s", 0.0)`` where an older pickle may reach
    model_load_s: float = 0.0
    # Stragglers as evidence against a node (processors/core/stragglers.py): a
    # node is DEGRADED only when runs of ``straggler_tenants`` distinct tenants
    # straggled on it within ``straggler_window_s`` (one tenant chooses its own
    # step rates), and goes back UP after ``straggler_probation_s``, doubling
    # while it keeps being degraded, up to ``straggler_probation_max_s``. Last,
    # for the pickling reason above: read with ``stragglers.knob``.
    straggler_tenants: int = 2
    straggler_window_s: float = 1800.0
    straggler_probation_s: float = 600.0
    straggler_probation_max_s: float = 7200.0
    # A half-open breaker's probe is a job of at most this estimate, and shuts
    # the breaker to others for at most this long; still running then, it
    # reopens the breaker (processors/core/breakers.py). Last, as above.
    breaker_probe_max_s: float = 300.0
    # A tier's rescue (``TierConfig.start_within_s``, rescue.py) may stop a
    # victim without a checkpoint only when its last one is at most this old:
    # what it loses is its GPUs times that. Read with ``getattr(config,
    # "evict_max_lost_s", 0.0)`` (after ``model_load_s`` for pickles)
    evict_max_lost_s: float = 20.0
    # A user's own queue served by size (jobs.py ``size_key``): a job of cost C
    # GPU-s is passed over only by its flow's jobs admitted less than C / this
    # after it (0 = arrival order). Fair share between flows is untouched.
    # Read with getattr (after the fields above for pickles). Off by default:
    # on ``test_sim_flood_calibration``'s flood it broke the told bands (jobs
    # started by their P50 27 %, by their P90 36 %: a job's wait is told from
    # the jobs ahead at admission, and lighter ones admitted later pass it),
    # so it waits for bands that know the passing (issue 34)
    size_order_gpu_s_per_s: float = 0.0
    # Single-node jobs placed by expected end (placement.py
    # ``_single_by_end``): among partly used nodes that fit, the one whose
    # drain (the latest projected end of its runs) the job extends least,
    # counted in grains of this many seconds, then best fit (0 = best fit
    # alone). Off by default (issue 34): at 60, genai utilization under
    # backlog 0.961 -> 0.971 (best fit alone spread long small runs one or
    # two per node, so whole-node jobs queued beside 6-7 idle GPUs a node),
    # batch told-P50 held 61.0 -> 59.4 %, paid light-job p90 wait 56.3 ->
    # 46.6 s, every other target held; but the multitenant workload's free
    # tier was told a P90 held by 84.8 % of its jobs (87.6 % before), under
    # the 85-95 % band. At 300: 0.967, batch told-P50 held 57.9 %, every
    # band in range, but each successful single-node search then scans every
    # partly used node that fits: `bench core` light fell from 23.3k to 13.3k
    # events/s (placements 10.4k -> 5.2k/s) in one run, 2026-12-06. Off until
    # that search is indexed. Read with getattr (after the fields above for
    # pickles).
    pack_by_end_s: float = 0.0
    # Defragmentation for a reservation's holder (reservation.py
    # ``defragment``): a node held only by a few preemptible, checkpointable
    # runs of its tier or less important ones, projected to hold it at least
    # this long, whose runs fit now on idle GPUs elsewhere, is cleared for a
    # blocked single-node holder: the runs are asked to checkpoint and move,
    # and the holder claims the node (0 = never). Off by default (issue 34):
    # at 300 with ``pack_by_end_s`` 60, genai utilization under backlog rose
    # 0.971 -> 0.977 (35 moves; 120 s: 0.977, 53 moves), but the multitenant
    # workload's free tier was told a P90 held by 84.4 % of its jobs, under
    # the 85-95 % band. Read with getattr (after the fields above for pickles).
    defrag_after_s: float = 0.0

    def __post_init__(self) -> None:
        self.check()
        tiers: dict[str, TierConfig] = {}
        for tier in self.tiers:
            tiers.setdefault(tier.name, tier)
        tenants: dict[str, TenantConfig] = {}
        for tenant in self.tenants:
            tenants.setdefault(tenant.name, tenant)
        retries: dict[str, int] = {}
        for name, budget in self.retries:
            retries.setdefault(name, budget)
        set_ = object.__setattr__
        set_(self, "_tiers", tiers)
        set_(self, "_tenants", tenants)
        set_(self, "_retries", retries)
        set_(self, "_defaulted", {})
        set_(self, "_may_preempt", {})
        set_(self, "_any_caps", any(t.capped() for t in (*self.tenants, self.default_tenant)))
        set_(self, "reserved_tenant_gpus", _reserved(self.tenants))
        set_(self, "reserved_tier_gpus", _reserved(self.tiers))

    def check(self) -> None:
        """Refuse what no cell can run by (``ValueError`` naming the field; a
        config file's loader adds the file and section): no tier, a number that
        is NaN or negative (every knob here is a count, a duration, a threshold
        or a factor; ``inf`` is a duration that never ends), a ratio above 1,
        an overrun factor of 0 (every run would be past its limit at its start)
        or a negative retry budget. Tiers and tenants check their own fields."""
        if not self.tiers:
            raise ValueError("tiers: name at least one tier (every job names one)")
        for f in fields(self):
            value = getattr(self, f.name, None)
            if f.init and isinstance(value, (int, float)) and not isinstance(value, bool):
                _check("", f.name, value)
        _check("", "overrun_factor", self.overrun_factor, positive=True, finite=True)
        for name in ("straggler_ratio", "throttle_clock_ratio"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} must be a ratio from 0 to 1, got {getattr(self, name)}")
        for failure_class, budget in self.retries:
            _check("", f"retries[{failure_class!r}]", budget, finite=True)

    def tier(self, name: str) -> TierConfig | None:
        return self._tiers.get(name)

    def tier_of(self, name: str) -> TierConfig:
        """The tier of a job the cell holds (admitted jobs name a known tier)."""
        tier = self._tiers.get(name)
        if tier is None:
            raise LookupError(f"tier {name!r} is not configured in this cell")
        return tier

    def tenant(self, name: str) -> TenantConfig:
        tenant = self._tenants.get(name)
        if tenant is None:
            # the default, named; memoised (it is immutable) so hot paths do not
            # build a dataclass per call
            tenant = self._defaulted.get(name)
            if tenant is None:
                tenant = self._defaulted[name] = replace(self.default_tenant, name=name)
        return tenant

    def any_caps(self) -> bool:
        """Whether any tenant, the default one included, has a GPU or run cap."""
        found: bool | None = getattr(self, "_any_caps", None)
        if found is None:  # a config pickled before the flag
            found = any(t.capped() for t in (*self.tenants, self.default_tenant))
            object.__setattr__(self, "_any_caps", found)
        return found

    def may_preempt(self, tier: str, tenant: str) -> bool:
        """Whether a job of ``tier`` and ``tenant`` may ever preempt: its tier
        may, or a guarantee (the tenant's, the tier's, a default tenant's)
        could put it under its share. Memoised per pair (the config is
        immutable): the walk asks for every candidate that does not fit."""
        memo: dict[tuple[str, str], bool] | None = getattr(self, "_may_preempt", None)
        if memo is None:  # also a config unpickled from before the memo
            memo = {}
            object.__setattr__(self, "_may_preempt", memo)
        found = memo.get((tier, tenant))
        if found is None:
            config = self._tiers.get(tier)
            found = memo[(tier, tenant)] = bool(
                (config is not None and config.may_preempt)
                or tenant in self.reserved_tenant_gpus
                or tier in self.reserved_tier_gpus
                or self.tenant(tenant).reserved_gpus
            )
        return found

    def retry_budget(self, failure_class: str) -> int:
        return self._retries.get(failure_class, self.default_retries)


def _reserved(
    entries: tuple[TenantConfig, ...] | tuple[TierConfig, ...],
) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for entry in entries:
        if entry.reserved_gpus:
            out[entry.name] = out.get(entry.name, ()) + (entry.reserved_gpus,)
    return out
