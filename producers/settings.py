"""The API's deployment settings: the ``[api]`` section of the deployment file.

One file configures a deployment (``framespool up --config FILE``, and every
Compose service's ``--config``); each process reads its own sections. The
API's::

    [api]
    default_model = "demo"    # the model of a job that names none ("": model required)
    rate_per_s = 1000         # requests/s per tenant (0: no limit) ...
    burst = 5000              # ... and how many may come at once
    queue_cap = 10000         # jobs a tenant may have waiting (0: no cap)

    [api.tiers.free]          # a tier's own limits, for the tenants whose default tier it is
    rate_per_s = 5
    burst = 20
    queue_cap = 200

A tenant's limits are its own where its tenant entry sets them
(``[[tenants]]``'s ``rate_per_s``, ``burst``, ``queue_cap``, carried in the
secrets file's policy, ``producers.auth.TenantPolicy``), else its default
tier's, else the section's. Limits are synchronous: over them the API answers
429 with ``Retry-After``; nothing is rejected later (``producers.ratelimit``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from framespool.configfile import build, source_of
from framespool.producers.auth import TenantPolicy
from framespool.producers.ratelimit import RateLimit


@dataclass(frozen=True)
class TierLimits:
    """One tier's API limits; None: the section's."""

    rate_per_s: float | None = None
    burst: int | None = None
    queue_cap: int | None = None

    def __post_init__(self) -> None:
        _check(self.rate_per_s, self.burst, self.queue_cap)


@dataclass(frozen=True)
class ApiSettings:
    default_model: str = "demo"
    rate_per_s: float = RateLimit.rate_per_s
    burst: int = RateLimit.burst
    queue_cap: int = 10_000
    tiers: Mapping[str, TierLimits] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _check(self.rate_per_s, self.burst, self.queue_cap)

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


def api_settings(doc: Mapping[str, Any]) -> ApiSettings:
    """The ``api`` section of a deployment document (defaults where absent); errors
    name the file, the key (``api.tiers.free.burst``) and what was expected."""
    return build(ApiSettings, doc.get("api") or {}, "api", file=source_of(doc))
