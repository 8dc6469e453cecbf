"""Webhook delivery for jobs that gave a ``callback_url``.

Theory of operation
-------------------
1. The projection consumer calls ``delivery_for(before, after, event)`` (no IO)
   for every applied job event; a state change into ``NOTIFY_STATES`` of a job
   with a callback becomes a ``Delivery`` whose id is the event id. The
   consumer commits it in the same batch as the view (an outbox), so a crash
   can neither lose nor invent a notification.
2. ``WebhookDispatcher`` POSTs pending deliveries with ``Framespool-Event-Id``
   (the receiver's idempotency key) and ``Framespool-Signature: t=<unix s>,
   v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``. A 2xx marks it delivered in
   the store, so a restart does not redeliver it. Network errors, 408, 429 and
   5xx are retried with exponential backoff and full jitter up to
   ``max_attempts``; other 4xx, refused targets and notifications older than
   ``max_age_s`` (a full replay re-creates the outbox) fail at once.
3. Targets: the policy is ``framespool.callbacks.targets`` (shared with request
   validation). Each attempt re-parses and re-checks the URL with the parser
   aiohttp uses and posts to that parsed URL (``vet_target``: an IP literal,
   which aiohttp connects to without resolving, is the address checked), and
   the HTTP session resolves
   hosts through its ``PolicyResolver``, which checks the very addresses it
   connects to. Host names are looked up on the dispatcher's own threads, at
   most ``per_tenant_concurrency`` of one tenant in flight
   (``framespool.callbacks.lookups``): a tenant whose names hang delays only
   its own notifications.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from yarl import URL

from framespool.callbacks.lookups import LOOKUP_TENANT, CallbackLookups, TenantResolver
from framespool.callbacks.targets import (
    PolicyResolver,
    TargetPolicy,
    TargetRefused,
    parse_target,
    vet_target,
)
from framespool.projections.delivery_lanes import DELIVERED, PENDING, Delivery, DeliveryLanes
from framespool.projections.delivery_lanes import FAILED as DELIVERY_FAILED
from framespool.projections.jobs import (
    ASSIGNED,
    CANCELLED,
    CHECKPOINTING,
    COMPLETED,
    FAILED,
    QUEUED,
    REJECTED,
    RUNNING,
    JobView,
)
from framespool.projections.store.port import ViewStore

log = logging.getLogger(__name__)

NOTIFY_STATES = frozenset({QUEUED, ASSIGNED, RUNNING, COMPLETED, FAILED, CANCELLED, REJECTED})
RETRYABLE_STATUS = frozenset({408, 425, 429})


# --------------------------------------------------------------------------
# Signing (pure)
# --------------------------------------------------------------------------
def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``Framespool-Signature`` header value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: bytes, header: str, body: bytes, now_s: int, tolerance_s: int = 300) -> bool:
    """Receiver side: a valid v1 signature made within ``tolerance_s`` of ``now_s``."""
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        parts.setdefault(name, []).append(value)
    try:
        timestamp = int(parts.get("t", [""])[0])
    except ValueError:
        return False
    if abs(now_s - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return any(hmac.compare_digest(expected, v) for v in parts.get("v1", []))


# --------------------------------------------------------------------------
# What to deliver (pure)
# --------------------------------------------------------------------------
def delivery_for(before: JobView | None, after: JobView | None, event: Any) -> Delivery | None:
    """A webhook for this event if it moved a job with a callback into a notified state."""
    if after is None or not after.callback_url or after.state not in NOTIFY_STATES:
        return None
    if before is not None and before.state == after.state:
        return None
    if before is not None and {before.state, after.state} <= {RUNNING, CHECKPOINTING}:
        return None  # back from writing a checkpoint: still the run it was
    body = {
        "type": "job.state_changed",
        "event_id": event.event_id,
        "event_type": type(event).__name__,
        "ts_ms": event.ts_ms,
        "job_id": after.job_id,
        "tenant": after.tenant,
        "run": after.run,
        "state": after.state,
        "previous_state": before.state if before else None,
        "reason": after.reason or None,
        "artifact_uri": after.artifact_uri or None,
        "status_url": f"/v1/jobs/{after.job_id}",
        "result_url": f"/v1/jobs/{after.job_id}/result" if after.state == COMPLETED else None,
    }
    return Delivery(
        delivery_id=event.event_id,
        job_id=after.job_id,
        tenant=after.tenant,
        url=after.callback_url,
        created_ms=event.ts_ms,
        seq=after.seq,
        body=json.dumps(body, sort_keys=True, separators=(",", ":")),
    )


def log_target(url: str) -> str:
    """What a log line may say of a callback URL: its origin. A path or query may
    carry the receiver's token (``/hooks/<token>``, ``?token=``); the job and
    event ids in the line find the delivery, whose record keeps the URL."""
    parsed = parse_target(url)
    if isinstance(parsed, str):
        return "<unparsable callback URL>"
    return str(parsed.url.origin())


def backoff_delay(attempt: int, base_s: float, cap_s: float, rand: float) -> float:
    """Full-jitter exponential backoff before retry number ``attempt`` (1-based)."""
    return rand * min(cap_s, base_s * (2 ** (attempt - 1)))


# --------------------------------------------------------------------------
# Delivery (IO)
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class WebhookConfig:
    """How the dispatcher delivers; secrets are per tenant and never shared between tenants.

    ``secrets`` (an object with ``secret_for(tenant) -> bytes | None``, e.g.
    ``framespool.projections.webhook_secrets.WebhookSecrets``) wins over the
    static ``tenant_secrets``; ``secret`` is a fallback for tests and single-tenant
    deployments only. A tenant without a secret gets no unsigned webhooks: its
    deliveries fail, saying how to get one.
    """

    secret: bytes = b""
    tenant_secrets: dict[str, bytes] = field(default_factory=dict)
    policy: TargetPolicy = TargetPolicy()
    max_attempts: int = 8
    base_delay_s: float = 1.0
    max_delay_s: float = 300.0
    timeout_s: float = 10.0  # one attempt: connect, send, status line, capped body
    concurrency: int = 8  # attempts in flight, all tenants together
    per_tenant_concurrency: int = 2  # ... and of one tenant, so its slow receivers wait alone
    max_response_bytes: int = 64 * 1024  # a reply body is read up to this, then dropped
    max_age_s: float = 24 * 3600.0  # older notifications (e.g. after a full replay) expire
    secrets: Any = None
    # a callback host name's lookup, per attempt (framespool.callbacks.lookups);
    # None resolves with getaddrinfo on the dispatcher's own threads (tests: a fake)
    dns_timeout_s: float = 5.0
    resolve_host: Callable[[str], Awaitable[list[str]]] | None = None

    @classmethod
    def for_tenants(cls, tenants: dict[str, Any], **kw: Any) -> WebhookConfig:
        """Per-tenant secrets from ``framespool.producers.auth`` tenant policies (``webhook_secret``)."""
        secrets = {
            name: p.webhook_secret.encode()
            for name, p in tenants.items()
            if getattr(p, "webhook_secret", "")
        }
        return cls(tenant_secrets=secrets, **kw)

    def secret_for(self, tenant: str) -> bytes:
        """The tenant's signing secret; b"" when it has none."""
        if self.secrets is not None:
            found = self.secrets.secret_for(tenant)
            if found:
                return found
        return self.tenant_secrets.get(tenant) or self.secret


class WebhookDispatcher:
    """Delivers the store's pending deliveries until cancelled.

    The store is scanned once, when ``run`` starts; afterwards the projection
    consumer hands new deliveries over through ``notify(deliveries)`` (after it
    committed them), and the dispatcher keeps its own index (``DeliveryLanes``).
    """

    def __init__(
        self,
        store: ViewStore,
        config: WebhookConfig,
        *,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        self._rand = rand
        self._wake = asyncio.Event()
        self._lanes = DeliveryLanes(max(1, config.per_tenant_concurrency))
        # host names are looked up at most per_tenant_concurrency per tenant in flight,
        # on threads of the dispatcher's own (framespool.callbacks.lookups); counted
        # across runs, since a lookup outlives the attempt that started it
        self.lookups = CallbackLookups(
            config.resolve_host, per_tenant=max(1, config.per_tenant_concurrency)
        )
        self._rescan = True
        self._running = 0
        self.delivered = 0
        self.failed = 0

    def notify(self, deliveries: Iterable[Delivery] | None = None) -> None:
        """New deliveries were committed: index them (all pending ones when not given)."""
        if deliveries is None:
            self._rescan = True
        else:
            for d in deliveries:
                self._lanes.add(d)
        self._wake.set()

    async def run(self) -> None:
        resolver = TenantResolver(self.lookups, self._config.dns_timeout_s)
        connector = aiohttp.TCPConnector(
            resolver=PolicyResolver(self._config.policy, resolver),
            limit=self._config.concurrency,
        )
        timeout = aiohttp.ClientTimeout(total=self._config.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            tasks: set[asyncio.Task] = set()
            try:
                while True:
                    self._wake.clear()
                    if self._rescan:
                        self._rescan = False
                        for pending in self._store.pending_deliveries():
                            self._lanes.add(pending)
                    now_ms = int(self._clock() * 1000)
                    while self._running < self._config.concurrency:
                        d = self._lanes.pick(now_ms)
                        if d is None:
                            break
                        self._running += 1
                        task = asyncio.create_task(self._deliver_and_release(session, d))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    next_due = self._lanes.next_due_ms()
                    wait_s = 5.0 if next_due is None else max(0.01, (next_due - now_ms) / 1000)
                    try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel
                        async with asyncio.timeout(wait_s):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _deliver_and_release(self, session: aiohttp.ClientSession, d: Delivery) -> None:
        # if the attempt breaks unexpectedly (the store), wait one base delay, not a hot loop
        retry_ms = int((self._clock() + self._config.base_delay_s) * 1000)
        outcome = replace(d, next_attempt_ms=max(d.next_attempt_ms, retry_ms))
        try:
            outcome = await self.deliver_once(session, d)
        except Exception:
            log.exception("webhook for job %s event %s: attempt failed", d.job_id, d.delivery_id)
        finally:
            self._running -= 1
            self._lanes.done(outcome)
            self._wake.set()

    async def deliver_once(self, session: aiohttp.ClientSession, d: Delivery) -> Delivery:
        """One attempt; records the outcome in the store and returns it."""
        current = self._store.get_delivery(d.delivery_id) or d
        if current.status != PENDING:
            return current
        now = self._clock()
        body = current.body.encode()
        target = vet_target(current.url, self._config.policy)
        problem = target if isinstance(target, str) else ""
        status: int | None = None
        secret = self._config.secret_for(current.tenant)
        if not problem and now * 1000 - current.created_ms > self._config.max_age_s * 1000:
            problem = f"expired: the event is older than {self._config.max_age_s:.0f} s"
        if not problem and not secret:
            problem = (
                f"tenant {current.tenant!r} has no webhook secret; "
                "create one with POST /v1/webhook-secret"
            )
        if not problem and not isinstance(target, str):
            headers = {
                "Content-Type": "application/json",
                "Framespool-Event-Id": current.delivery_id,
                "Framespool-Signature": sign(secret, int(now), body),
                "User-Agent": "framespool-webhooks/1",
            }
            LOOKUP_TENANT.set(current.tenant)  # this task's lookups count against it
            try:
                async with asyncio.timeout(self._config.timeout_s):
                    # the parsed URL itself: aiohttp connects to the host just checked
                    status = await self._post(session, target.url, body, headers)
                problem = "" if 200 <= status < 300 else f"receiver answered HTTP {status}"
            except TargetRefused as exc:
                problem = str(exc)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
                status = -1
        return self._record(current, now, status, problem)

    async def _post(
        self, session: aiohttp.ClientSession, url: URL, body: bytes, headers: dict[str, str]
    ) -> int:
        """POST and return the status; at most ``max_response_bytes`` of the reply are read
        (enough to reuse the connection for a short reply); a longer one closes it."""
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
            left = self._config.max_response_bytes
            while left > 0 and not resp.content.at_eof():
                left -= len(await resp.content.read(left)) or left
            if not resp.content.at_eof():
                resp.close()
            return resp.status

    def _record(self, d: Delivery, now: float, status: int | None, problem: str) -> Delivery:
        attempts = d.attempts + 1
        now_ms = int(now * 1000)
        if not problem:
            out = replace(d, status=DELIVERED, attempts=attempts, done_ms=now_ms, last_error="")
            self.delivered += 1
        else:
            retryable = status is not None and (
                status == -1 or status >= 500 or status in RETRYABLE_STATUS
            )
            if retryable and attempts < self._config.max_attempts:
                delay = backoff_delay(
                    attempts, self._config.base_delay_s, self._config.max_delay_s, self._rand()
                )
                out = replace(
                    d,
                    attempts=attempts,
                    last_error=problem,
                    next_attempt_ms=now_ms + int(delay * 1000),
                )
            else:
                out = replace(
                    d, status=DELIVERY_FAILED, attempts=attempts, done_ms=now_ms, last_error=problem
                )
                self.failed += 1
                log.warning(
                    "webhook for job %s event %s to %s failed after %d attempt(s): %s",
                    d.job_id,
                    d.delivery_id,
                    log_target(d.url),
                    attempts,
                    problem,
                )
        self._store.put_delivery(out)
        return out
