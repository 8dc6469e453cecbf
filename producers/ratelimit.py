"""Per-tenant rate limits for the API: one token bucket per tenant, no IO.

Theory of operation
-------------------
A bucket holds at most ``burst`` tokens and refills at ``rate_per_s``. Each
authenticated request takes one token from its tenant's bucket:

1. refill: ``tokens = min(burst, tokens + (now - last) * rate_per_s)``;
2. if at least one token is left, take it: the request goes ahead;
3. otherwise refuse it, saying how long until one token is back
   (``Retry-After``), and take nothing, so a client that waits that long
   gets through.

Time arrives as an argument (``now``, seconds on a monotonic clock), so the
limiter is a pure state machine that tests drive without sleeping. A clock
that steps backwards refills nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RateLimit:
    """How fast one tenant may call the API; ``rate_per_s <= 0`` disables limiting.

    The default is generous (the pipeline bench submits ~300 jobs/s for one
    tenant, and a burst of 5,000 submits at once passes: bursts are queued, and
    the fair-share order protects the other tenants); deployments that face
    the internet set their own. This is framespool's one rate limit: it
    refuses at the edge, at request time, with 429 and ``Retry-After``;
    nothing behind it rejects for rate later.
    """

    rate_per_s: float = 1000.0
    burst: int = 5000

    def __post_init__(self) -> None:
        if self.rate_per_s > 0 and self.burst < 1:
            raise ValueError(f"burst must be at least 1 when rate_per_s > 0, got {self.burst}")

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0


@dataclass
class _Bucket:
    tokens: float
    last: float


class RateLimiter:
    """Token buckets keyed by tenant; ``take(tenant, now)`` is the only question it answers."""

    def __init__(
        self, limit: RateLimit = RateLimit(), overrides: dict[str, RateLimit] | None = None
    ) -> None:
        self.limit = limit
        self.overrides = dict(overrides or {})
        self._buckets: dict[str, _Bucket] = {}
        self.refused = 0

    def limit_for(self, tenant: str) -> RateLimit:
        return self.overrides.get(tenant, self.limit)

    def take(self, tenant: str, now: float, limit: RateLimit | None = None) -> float:
        """0.0 if the request may proceed (a token was taken), else seconds to wait.
        ``limit``: the tenant's limit when the caller knows it (its tier's), else
        ``limit_for(tenant)``."""
        if limit is None or tenant in self.overrides:
            limit = self.limit_for(tenant)
        if not limit.enabled:
            return 0.0
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(limit.burst), now)
        elapsed = max(0.0, now - bucket.last)
        bucket.tokens = min(float(limit.burst), bucket.tokens + elapsed * limit.rate_per_s)
        bucket.last = max(bucket.last, now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        self.refused += 1
        return (1.0 - bucket.tokens) / limit.rate_per_s

    def __len__(self) -> int:
        """How many buckets it keeps (one per key ever seen)."""
        return len(self._buckets)

    def tokens(self, tenant: str) -> float | None:
        """Tokens left at the last ``take`` (tests, metrics); None for an unseen tenant."""
        bucket = self._buckets.get(tenant)
        return None if bucket is None else bucket.tokens


def retry_after_header(wait_s: float) -> str:
    """``Retry-After`` is whole seconds: round up, and never say 0 for a refusal."""
    return str(max(1, math.ceil(wait_s)))
