"""Per-tenant webhook signing secrets: looked up by the dispatcher, rotated through the API.

Each tenant has its own secret, so the secret a tenant verifies its webhooks
with signs nothing of another tenant's. ``rotate(tenant)`` makes a new one,
hands it to ``persist`` (the server's secrets file) and returns it: the API
shows it once and keeps no other copy. Webhooks are signed with the new secret
from then on.

Rotation from the API (``rotate_soon``) must cost the other tenants nothing:

1. ``persist`` rewrites a file (read, encode, fsync): it runs on one thread of
   this object's own, never on the event loop, and one write at a time (each
   write is a read-modify-write of the whole file: two at once would lose one).
2. A tenant may rotate once per ``min_interval_s``; sooner is refused with how
   long to wait (``RotationTooSoon``), before anything is written. So the
   writes queued at once are at most one per tenant.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

MIN_ROTATION_INTERVAL_S = 60.0


def new_webhook_secret() -> str:
    return f"whsec_{secrets.token_urlsafe(32)}"


class RotationTooSoon(Exception):
    """The tenant rotated its secret less than ``min_interval_s`` ago (its fault)."""

    def __init__(self, tenant: str, retry_after_s: float, interval_s: float) -> None:
        super().__init__(
            f"tenant {tenant!r} rotated its webhook secret less than {interval_s:g} s ago; "
            f"retry after {retry_after_s:.0f} s"
        )
        self.retry_after_s = retry_after_s


class WebhookSecrets:
    def __init__(
        self,
        secrets_by_tenant: Mapping[str, str | bytes],
        persist: Callable[[str, str], None] | None = None,
        *,
        min_interval_s: float = MIN_ROTATION_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._secrets = {
            t: (s.encode() if isinstance(s, str) else bytes(s))
            for t, s in secrets_by_tenant.items()
            if s
        }
        self._persist = persist
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._last: dict[str, float] = {}  # tenant -> when its last rotation began
        self._writer: ThreadPoolExecutor | None = None

    def secret_for(self, tenant: str) -> bytes | None:
        return self._secrets.get(tenant)

    def add_missing(self, secrets_by_tenant: Mapping[str, str]) -> None:
        """Adopt the secrets of tenants this table does not know yet (added to the
        secrets file while the API runs). A known tenant's secret changes only by
        ``rotate``: a file read before a rotation was written must not undo it."""
        for tenant, secret in secrets_by_tenant.items():
            if secret and tenant not in self._secrets:
                self._secrets[tenant] = secret.encode()

    def rotate(self, tenant: str) -> str:
        """A new secret for ``tenant``, stored before it is returned (to be shown once).
        Blocking, unlimited: for tools and tests; the API uses ``rotate_soon``."""
        secret = new_webhook_secret()
        if self._persist is not None:
            self._persist(tenant, secret)  # fails before the old one is replaced
        self._secrets[tenant] = secret.encode()
        return secret

    async def rotate_soon(self, tenant: str) -> str:
        """``rotate`` with the file written off the event loop, at most once per
        ``min_interval_s`` per tenant (``RotationTooSoon`` otherwise)."""
        now = self._clock()
        last = self._last.get(tenant)
        if last is not None and now - last < self.min_interval_s:
            raise RotationTooSoon(tenant, self.min_interval_s - (now - last), self.min_interval_s)
        self._last[tenant] = now  # held from here: a concurrent second call is refused
        secret = new_webhook_secret()
        if self._persist is not None:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="webhook-secrets")
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._writer, self._persist, tenant, secret)
            except BaseException:
                if self._last.get(tenant) == now:
                    del self._last[tenant]  # nothing changed: the retry may come at once
                raise
        self._secrets[tenant] = secret.encode()
        return secret

    def close(self) -> None:
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
