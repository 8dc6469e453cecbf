"""The API's deployment settings: the ``[api]`` section of the deployment file.

One file configures a deployment (``framespool up --config FILE``, and every
Compose service's ``--config``); each process reads its own sections. The
API's::

    [api]
    default_model = "demo"    # the model of a job that names none ("": model required)
    rate_per_s = 1000         # requests/s per tenant (0: no limit) ...
    burst = 5000              # ... and how many may come at once
    queue_cap = 10000         # jobs a tenant may have waiting (0: no cap)
    storage_quota_bytes = 0   # bytes a tenant's results and checkpoints may hold (0: no quota)
    artifact_retention_s = 604800   # a result is deleted this long after its job ended (0: kept)
    checkpoint_retention_s = 86400  # checkpoints: after the job ended, or once superseded

    [api.tiers.free]          # a tier's own limits, for the tenants whose default tier it is
    rate_per_s = 5
    burst = 20
    queue_cap = 200
    storage_quota_bytes = 1073741824
    artifact_retention_s = 86400

A tenant's limits are its own where its tenant entry sets them
(``[[tenants]]``'s ``rate_per_s``, ``burst``, ``queue_cap``,
``storage_quota_bytes``, carried in the secrets file's policy,
``producers.auth.TenantPolicy``), else its default tier's, else the section's.
Limits are synchronous: over them the API answers 429 with ``Retry-After``;
nothing is rejected later (``producers.ratelimit``). Retention is per tier (of
the job, not the tenant's default) and applied by the API's storage sweeper
(``framespool.projections.storage``); storage is counted from what the agents
report storing, so a submission is refused once the tenant holds its quota (a
job accepted below it may take the tenant over: the quota bounds what
accumulates, not one job's output).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from framespool.configfile import build, source_of
from framespool.producers.auth import TenantPolicy
from framespool.producers.ratelimit import RateLimit
from framespool.projections.retention import Retention


@dataclass(frozen=True)
class TierLimits:
    """One tier's API limits; None: the section's."""

    rate_per_s: float | None = None
    burst: int | None = None
    queue_cap: int | None = None
    storage_quota_bytes: int | None = None
    artifact_retention_s: float | None = None
    checkpoint_retention_s: float | None = None

    def __post_init__(self) -> None:
        _check(self.rate_per_s, self.burst, self.queue_cap)
        _check_storage(
            self.storage_quota_bytes, self.artifact_retention_s, self.checkpoint_retention_s
        )


@dataclass(frozen=True)
class ApiSettings:
    default_model: str = "demo"
    rate_per_s: float = RateLimit.rate_per_s
    burst: int = RateLimit.burst
    queue_cap: int = 10_000
    storage_quota_bytes: int = 0
    artifact_retention_s: float = Retention.artifact_s
    checkpoint_retention_s: float = Retention.checkpoint_s
    tiers: Mapping[str, TierLimits] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _check(self.rate_per_s, self.burst, self.queue_cap)
        _check_storage(
            self.storage_quota_bytes, self.artifact_retention_s, self.checkpoint_retention_s
        )

    def storage_quota_of(self, policy: TenantPolicy) -> int:
        """Bytes ``policy``'s tenant may keep stored (0: no quota)."""
        tier = self.tiers.get(policy.tier, TierLimits())
        return _first(
            policy.storage_quota_bytes, tier.storage_quota_bytes, self.storage_quota_bytes
        )

    def retention_of(self, tier_name: str) -> Retention:
        """How long a job of ``tier_name`` keeps its result and its checkpoints."""
        tier = self.tiers.get(tier_name, TierLimits())
        return Retention(
            artifact_s=_first(tier.artifact_retention_s, self.artifact_retention_s),
            checkpoint_s=_first(tier.checkpoint_retention_s, self.checkpoint_retention_s),
        )

    def rate_limit_of(self, policy: TenantPolicy) -> RateLimit:
        """The request rate ``policy``'s tenant is held to (module docstring)."""
        tier = self.tiers.get(policy.tier, TierLimits())
        rate = _first(policy.rate_per_s, tier.rate_per_s, self.rate_per_s)
        burst = _first(policy.burst, tier.burst, self.burst)
        return RateLimit(rate_per_s=rate, burst=burst)

    def queue_cap_of(self, policy: TenantPolicy) -> int:
        """Jobs ``policy``'s tenant may have waiting (0: no cap)."""
        tier = self.tiers.get(policy.tier, TierLimits())
        return _first(policy.queue_cap, tier.queue_cap, self.queue_cap)


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def _check(rate: float | None, burst: int | None, queue_cap: int | None) -> None:
    if rate is not None and not 0 <= rate < math.inf:
        raise ValueError(f"rate_per_s must be a finite number >= 0 (0: no limit), got {rate}")
    if burst is not None and burst < 1:
        raise ValueError(f"burst must be at least 1 request, got {burst}")
    if queue_cap is not None and queue_cap < 0:
        raise ValueError(f"queue_cap must be 0 (no cap) or more jobs, got {queue_cap}")


def _check_storage(quota: int | None, artifact_s: float | None, checkpoint_s: float | None) -> None:
    if quota is not None and quota < 0:
        raise ValueError(f"storage_quota_bytes must be 0 (no quota) or more bytes, got {quota}")
    for name, value in (
        ("artifact_retention_s", artifact_s),
        ("checkpoint_retention_s", checkpoint_s),
    ):
        if value is not None and not 0 <= value < math.inf:
            raise ValueError(f"{name} must be 0 (keep forever) or more seconds, got {value}")


def api_settings(doc: Mapping[str, Any]) -> ApiSettings:
    """The ``api`` section of a deployment document (defaults where absent); errors
    name the file, the key (``api.tiers.free.burst``) and what was expected."""
    return build(ApiSettings, doc.get("api") or {}, "api", file=source_of(doc))
