"""Submit-time lookups of tenants' callback hosts, so that one tenant's slow DNS
slows no one else.

Theory of operation
-------------------
``POST /v1/jobs`` resolves a callback URL's host name to refuse, at once, a
name that points at a forbidden address (``framespool.callbacks.targets``).
The name belongs to the tenant, and so does the DNS server that answers for
it: it may answer slowly on purpose. ``getaddrinfo`` blocks a thread until
the system resolver gives up (seconds, beyond the API's own timeout), so
lookups must not share threads with anything else, and one tenant must not
hold all of them:

1. Lookups run on threads of their own (``LOOKUP_THREADS``), never on the
   event loop's default executor.
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
   callback host resolves it once a minute.

Cost per submission with a callback host name: a dict lookup on a cached
name; else two counter updates and one ``getaddrinfo`` on a lookup thread.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

LOOKUP_THREADS = 8
LOOKUPS_PER_TENANT = 2
CACHE_TTL_S = 60.0
CACHE_HOSTS = 10_000

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _lookup_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=LOOKUP_THREADS, thread_name_prefix="callback-lookup"
            )
        return _pool


async def resolve_host(host: str) -> list[str]:
    """The addresses ``host`` resolves to, looked up on the lookup threads
    (the default ``ApiConfig.resolve_host``)."""
    lookup = functools.partial(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
    infos = await asyncio.get_running_loop().run_in_executor(_lookup_pool(), lookup)
    return [info[4][0] for info in infos]


class CallbackLookups:
    """Bounded, cached lookups (theory of operation); one per API app, used on its loop."""

    def __init__(
        self,
        resolve: Callable[[str], Awaitable[list[str]]] = resolve_host,
        *,
        per_tenant: int = LOOKUPS_PER_TENANT,
        in_flight_max: int = LOOKUP_THREADS,
        ttl_s: float = CACHE_TTL_S,
        max_hosts: int = CACHE_HOSTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolve = resolve
        self.per_tenant = per_tenant
        self.in_flight_max = in_flight_max
        self._ttl_s = ttl_s
        self._max_hosts = max_hosts
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, list[str]]] = OrderedDict()
        self._in_flight: dict[str, int] = {}
        self.in_flight = 0
        self.skipped = 0  # submissions whose check was left to delivery (tests, metrics)

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
        self.in_flight += 1
        lookup = asyncio.ensure_future(self._resolve(host))
        lookup.add_done_callback(functools.partial(self._ended, tenant))
        try:
            found = await asyncio.wait_for(asyncio.shield(lookup), timeout_s)
        except (TimeoutError, OSError, UnicodeError):
            return None
        self._cache[key] = (self._clock() + self._ttl_s, found)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_hosts:
            self._cache.popitem(last=False)
        return found

    def _ended(self, tenant: str, lookup: asyncio.Future) -> None:
        if not lookup.cancelled():
            lookup.exception()  # retrieved: a failed lookup that no one awaited is no error
        self.in_flight -= 1
        left = self._in_flight[tenant] - 1
        if left:
            self._in_flight[tenant] = left
        else:
            del self._in_flight[tenant]
