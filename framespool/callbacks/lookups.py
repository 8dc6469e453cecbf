"""Lookups of tenants' callback hosts (at submit and at delivery), so that one
tenant's slow DNS slows no one else.

Theory of operation
-------------------
``POST /v1/jobs`` resolves a callback URL's host name to refuse, at once, a
name that points at a forbidden address (``framespool.callbacks.targets``).
The name belongs to the tenant, and so does the DNS server that answers for
it: it may answer slowly on purpose. ``getaddrinfo`` blocks a thread until
the system resolver gives up (seconds, beyond the API's own timeout), so
lookups must not share threads with anything else, and one tenant must not
hold all of them:

1. Lookups run on threads of their own (``LOOKUP_THREADS`` per
   :class:`CallbackLookups`: the API's checks have theirs, the webhook
   dispatcher its own), never on the event loop's default executor.
2. At most ``LOOKUPS_PER_TENANT`` lookups of one tenant are in flight, and at
   most ``LOOKUP_THREADS`` in all, counted until the lookup itself ends (not
   when the request stops waiting for it): a lookup never queues for a
   thread. A submission past either bound skips the submit-time check, as a
   name that does not resolve in time does already; delivery resolves the
   host again and checks every address it connects to
   (``framespool.callbacks.targets.PolicyResolver``), so skipping it refuses
   nothing that should pass and lets nothing through to a forbidden address.
   A tenant whose hosts hang so costs the others at most
   ``LOOKUPS_PER_TENANT`` of the threads while it hangs.
3. Answers are cached ``CACHE_TTL_S`` per host name (``CACHE_HOSTS`` names,
   the oldest forgotten first), so a tenant submitting many jobs with one
   callback host resolves it once a minute; an answer that came after the
   asker stopped waiting is cached too.
4. Webhook deliveries resolve through the same bounds (``TenantResolver``,
   the aiohttp resolver under ``PolicyResolver``): the delivering task names
   its tenant in ``LOOKUP_TENANT``, and a lookup past a bound or unanswered
   in time fails that attempt like a network error (retried with back-off),
   so one tenant's hanging names delay only its own notifications.

Cost per submission with a callback host name: a dict lookup on a cached
name; else two counter updates and one ``getaddrinfo`` on a lookup thread.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import cast

from aiohttp.abc import AbstractResolver, ResolveResult

LOOKUP_THREADS = 16
LOOKUPS_PER_TENANT = 2
CACHE_TTL_S = 60.0
CACHE_HOSTS = 10_000

# the tenant a webhook delivery's lookups count against (theory of operation, 4)
LOOKUP_TENANT: ContextVar[str] = ContextVar("lookup_tenant", default="")


def getaddrinfo_addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to (blocking: the system resolver)."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    # an IPv4 or IPv6 sockaddr (the only families a host name resolves to) starts with the address
    return [cast(str, info[4][0]) for info in infos]


class CallbackLookups:
    """Bounded, cached lookups (theory of operation); one per API app and one per
    webhook dispatcher, each used on its event loop."""

    def __init__(
        self,
        resolve: Callable[[str], Awaitable[list[str]]] | None = None,
        *,
        per_tenant: int = LOOKUPS_PER_TENANT,
        in_flight_max: int = LOOKUP_THREADS,
        ttl_s: float = CACHE_TTL_S,
        max_hosts: int = CACHE_HOSTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # None: getaddrinfo on threads of this object's own, one per lookup in flight
        self._resolve = resolve or self._on_own_thread
        self._pool: ThreadPoolExecutor | None = None
        self.per_tenant = per_tenant
        self.in_flight_max = in_flight_max
        self._ttl_s = ttl_s
        self._max_hosts = max_hosts
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, list[str]]] = OrderedDict()
        self._in_flight: dict[str, int] = {}  # tenant -> its lookups in flight (none: absent)
        self.skipped = 0  # submissions whose check was left to delivery (tests, metrics)

    @property
    def in_flight(self) -> int:
        """Lookups in flight, all tenants (at most ``in_flight_max`` entries to add)."""
        return sum(self._in_flight.values())

    async def _on_own_thread(self, host: str) -> list[str]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.in_flight_max, thread_name_prefix="callback-lookup"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, getaddrinfo_addresses, host)

    async def addresses(self, tenant: str, host: str, timeout_s: float) -> list[str] | None:
        """``host``'s addresses, or None when unknown now (no answer within
        ``timeout_s``, no such name, or a bound reached: theory of operation, 2)."""
        key = host.lower()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        if (
            self._in_flight.get(tenant, 0) >= self.per_tenant
            or self.in_flight >= self.in_flight_max
        ):
            self.skipped += 1
            return None
        self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        lookup = asyncio.ensure_future(self._resolve(host))
        lookup.add_done_callback(functools.partial(self._ended, tenant, key))
        try:
            return await asyncio.wait_for(asyncio.shield(lookup), timeout_s)
        except (TimeoutError, OSError, UnicodeError):
            return None

    def _ended(self, tenant: str, key: str, lookup: asyncio.Future) -> None:
        """A lookup ended (answered late too: the answer is cached for the next ask)."""
        if not lookup.cancelled() and lookup.exception() is None:
            self._cache[key] = (self._clock() + self._ttl_s, lookup.result())
            self._cache.move_to_end(key)
            while len(self._cache) > self._max_hosts:
                self._cache.popitem(last=False)
        left = self._in_flight[tenant] - 1
        if left:
            self._in_flight[tenant] = left
        else:
            del self._in_flight[tenant]


class TenantResolver(AbstractResolver):
    """An aiohttp resolver over :class:`CallbackLookups` that counts each lookup
    against the tenant in ``LOOKUP_TENANT`` (theory of operation, 4)."""

    def __init__(self, lookups: CallbackLookups, timeout_s: float) -> None:
        self._lookups = lookups
        self._timeout_s = timeout_s

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._lookups.addresses(LOOKUP_TENANT.get(), host, self._timeout_s)
        results: list[ResolveResult] = []
        for address in dict.fromkeys(found or ()):
            version = ipaddress.ip_address(address.split("%", 1)[0]).version
            fam = socket.AF_INET6 if version == 6 else socket.AF_INET
            if family in (socket.AF_UNSPEC, fam):
                results.append(
                    ResolveResult(
                        hostname=host,
                        host=address,
                        port=port,
                        family=fam,
                        proto=0,
                        flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                    )
                )
        if not results:
            # EAI_AGAIN ("try again"), with the reason as its text: aiohttp shows
            # the strerror of what a resolver raises, not its message
            raise socket.gaierror(
                socket.EAI_AGAIN,
                f"{host}: no address within {self._timeout_s:g} s, or this tenant has "
                "too many lookups in flight; the delivery is retried later",
            )
        return results

    async def close(self) -> None:
        return None
