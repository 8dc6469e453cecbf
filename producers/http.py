"""What every handler of the API reads: its configuration (:class:`ApiConfig`),
the application's keys, the error shape (:class:`ApiError`, :func:`error_body`),
and who the caller is (:func:`caller`: authentication and the per-tenant and
per-address rate limits). ``framespool.producers.api`` builds the app from it."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from framespool.callbacks.lookups import CallbackLookups
from framespool.callbacks.targets import TargetPolicy
from framespool.log import Sender
from framespool.producers.auth import ApiKeys, Principal, token_from_headers
from framespool.producers.cluster_reads import ClusterReads
from framespool.producers.diskguard import DiskGuard
from framespool.producers.metrics import (
    AdmissionWatch,
    Metrics,
)
from framespool.producers.ratelimit import RateLimit, RateLimiter, retry_after_header
from framespool.producers.run_times import RunTimes
from framespool.producers.settings import ApiSettings
from framespool.producers.validation import (
    Limits,
)
from framespool.projections import cluster as cluster_view
from framespool.projections import dashboard
from framespool.projections.hub import Hub
from framespool.projections.jobs import JobView
from framespool.projections.storage import StorageLedger
from framespool.projections.store.port import ViewStore
from framespool.schemas.events import JobSpec

if TYPE_CHECKING:  # pragma: no cover
    from framespool.agents.artifacts.port import ArtifactStore
    from framespool.projections.webhook_secrets import WebhookSecrets
from framespool.schemas.topics import COMMANDS

DEFAULT_ESTIMATE_S = next(f.default for f in fields(JobSpec) if f.name == "estimate_s")


@dataclass
class ApiConfig:
    auth: ApiKeys
    store: ViewStore
    producer: Sender  # the commands topic is written through it (a LogProducer)
    artifacts: ArtifactStore | None = None
    hub: Hub = field(default_factory=Hub)
    commands_topic: str = COMMANDS.name
    limits: Limits = Limits()
    url_policy: TargetPolicy = TargetPolicy()
    result_url_ttl_s: int = 3600
    sse_keepalive_s: float = 15.0
    max_body_bytes: int = 64 * 1024
    # e.g. consumer.run, dispatcher.run (coroutine functions: each runs as a task)
    background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = ()
    clock: Callable[[], float] = time.time
    rate_limit: RateLimit = RateLimit()  # per tenant; generous by default
    rate_limit_overrides: dict[str, RateLimit] = field(default_factory=dict)
    # Jobs a tenant may have waiting (SUBMITTED or QUEUED in the read model); one
    # more is refused with 429 and Retry-After (0 = no cap). A cell's per-tenant
    # max_queued, when configured, is the deterministic backstop behind it.
    queue_cap: int = 10_000
    queue_cap_overrides: dict[str, int] = field(default_factory=dict)
    # the deployment's [api] section: per-tier (and per-tenant) rates and queue caps;
    # None: ``rate_limit`` and ``queue_cap`` for every tenant
    settings: ApiSettings | None = None
    queue_cap_retry_after_s: int = 30
    # what each tenant keeps in the artifact store (the projection consumer feeds
    # it, the storage sweeper deletes what retention lets go); None: no quota is
    # enforced and no result is known to have expired
    storage: StorageLedger | None = None
    monotonic: Callable[[], float] = time.monotonic  # the rate limiter's clock
    # The cells' latest offers (cell -> offer, as the cluster projection folds them
    # from job-events), to refuse a job past its tier's predicted-wait limit at
    # submit. None: those of the projection consumer among ``background``; no
    # consumer there, no offers, nothing refused. An offer older than
    # ``offer_stale_s`` (this API's clock) is unknown and refuses nothing.
    offers: Callable[[], Mapping[str, Any]] | None = None
    offer_stale_s: float = 15.0
    # callback host names at submit, bounded per tenant (framespool.callbacks.lookups);
    # None: getaddrinfo on the lookups' own threads; tests give a fake
    resolve_host: Callable[[str], Awaitable[list[str]]] | None = None
    resolve_timeout_s: float = 2.0
    dashboard_dir: Path | None = dashboard.DIRECTORY  # None: no dashboard
    webhook_secrets: WebhookSecrets | None = None  # None: no rotation
    # /metrics on this app only with this key ("Authorization: Bearer <key>"); without
    # one, serve it on its own (private) address with ``metrics_app``
    operator_key: str = ""
    sse_max_per_key: int = 20  # open event streams one API key may hold
    sse_max_per_tenant: int = 100  # ... and all of a tenant's keys together
    sse_retry_after_s: int = 5
    # requests without a valid key, per client address (key guessing, floods)
    unauthenticated_rate_limit: RateLimit = RateLimit(rate_per_s=5.0, burst=50)
    # routes that take no key (PUBLIC_ROUTES: the OpenAPI document, the dashboard's
    # assets, health, unknown paths), per client address (IPv4, IPv6 /64)
    public_rate_limit: RateLimit = RateLimit(rate_per_s=20.0, burst=200)
    # slow and greedy clients (framespool.producers.edge, theory of operation): a
    # connection without a complete request head this long after it opened or
    # after its last response is closed; a submit's body arrives within
    # body_timeout_s or is answered 408; one peer (IPv4 address, IPv6 /64) holds at
    # most max_connections_per_peer connections (0: no cap, behind a proxy), the
    # process at most max_connections; a client that reads nothing for
    # write_timeout_s while a response waits for it is disconnected
    idle_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    max_connections_per_peer: int = 256
    max_connections: int = 8192
    write_timeout_s: float = 30.0
    # new submissions are refused (503 disk_full) while the guarded disk is nearly
    # full (framespool.producers.diskguard); None: no guard
    disk_guard: DiskGuard | None = None


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers


CONFIG = web.AppKey("config", ApiConfig)


METRICS = web.AppKey("metrics", Metrics)


LOCKS = web.AppKey("submit_locks", dict)


# tenant -> its submissions between the queue-cap check and the store insert: the
# check and the hold happen with no await between them, so concurrent submits
# cannot all pass one check (check-then-act); per API process
QUEUE_HOLDS = web.AppKey("queue_holds", dict)


RUN_TIMES = web.AppKey("run_times", RunTimes)  # learned from published views (run_times.py)


TASKS = web.AppKey("background_tasks", list)


LIMITER = web.AppKey("rate_limiter", RateLimiter)


# (a type that is not a class goes in as the key's type argument, as aiohttp asks)
OFFERS = web.AppKey[Callable[[], Mapping[str, Any]]]("cell_offers")


OPENAPI = web.AppKey("openapi", dict)


ANON_LIMITER = web.AppKey("unauthenticated_rate_limiter", list)  # [RateLimiter]


PUBLIC_LIMITER = web.AppKey("public_rate_limiter", list)  # [RateLimiter] of PUBLIC_ROUTES


# routes served without an API key (so no tenant's bucket pays for them); None: a
# path no route matched. The signed artifact URLs are not here: a valid signature
# is their key, and a tenant's client may fetch many results at once
PUBLIC_ROUTES = frozenset(
    {"/openapi.json", "/healthz", "/", "/dashboard", "/dashboard/", "/dashboard/{name}", None}
)


STREAMS = web.AppKey("open_streams", dict)  # ("key"|"tenant", name) -> open SSE streams


LOOKUPS = web.AppKey("callback_lookups", CallbackLookups)  # submit-time callback host lookups


CLUSTER_VIEW = web.AppKey[Callable[[], cluster_view.ClusterView]]("cluster_view")


CLUSTER_READS = web.AppKey("cluster_reads", ClusterReads)  # rendered /v1/cluster documents


ADMISSION_WATCH = web.AppKey("admission_watch", AdmissionWatch)  # accepted, not yet shown back


def error_body(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    err: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        err["field"] = field
    return web.json_response({"error": err}, status=status, headers=headers)


_MAX_UNAUTHENTICATED_SOURCES = 65_536


def source_of(remote: str | None) -> str:
    """Who pays for a request without a key: its IPv4 address, or its IPv6 /64 (one
    host may hold a whole /64, so a per-address bucket would be no limit)."""
    try:
        ip = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return remote or "?"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def _take_for_address(request: web.Request, key: web.AppKey, limit: RateLimit) -> float:
    """Take a token for the request's address (``source_of``) from the limiter the
    app holds under ``key``; the seconds to wait, 0 if taken. Cost: O(1); memory is
    bounded: past ``_MAX_UNAUTHENTICATED_SOURCES`` addresses the limiter starts over
    (a fresh bucket is full, so starting over only forgives)."""
    holder = request.app[key]
    if len(holder[0]) >= _MAX_UNAUTHENTICATED_SOURCES:
        holder[0] = RateLimiter(limit)
    return holder[0].take(source_of(request.remote), request.app[CONFIG].monotonic())


def take_public(request: web.Request) -> None:
    """Charge a request to a route without a key to its address (``public_rate_limit``)."""
    config = request.app[CONFIG]
    wait_s = _take_for_address(request, PUBLIC_LIMITER, config.public_rate_limit)
    if wait_s > 0:
        retry = retry_after_header(wait_s)
        raise ApiError(
            429,
            "rate_limited",
            f"too many requests from this address to routes without a key "
            f"({config.public_rate_limit.rate_per_s:g}/s, burst "
            f"{config.public_rate_limit.burst}); retry after {retry} s",
            headers={"Retry-After": retry},
        )


def caller(request: web.Request) -> Principal:
    """The authenticated caller, after taking a token from its tenant's rate-limit bucket."""
    config = request.app[CONFIG]
    principal = config.auth.authenticate(token_from_headers(request.headers))
    if principal is None:
        # no tenant to charge: the caller's address pays, so guessing keys is slow too
        wait_s = _take_for_address(request, ANON_LIMITER, config.unauthenticated_rate_limit)
        if wait_s > 0:
            retry = retry_after_header(wait_s)
            raise ApiError(
                429,
                "rate_limited",
                "too many requests without a valid API key from this address; "
                f"retry after {retry} s with a valid key",
                headers={"Retry-After": retry},
            )
        raise ApiError(
            401,
            "unauthenticated",
            "send a valid API key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
        )
    limit = rate_limit_of(config, principal)
    wait_s = request.app[LIMITER].take(principal.tenant, config.monotonic(), limit)
    if wait_s > 0:
        request.app[METRICS].rate_limited.labels(principal.tenant).inc()
        retry = retry_after_header(wait_s)
        raise ApiError(
            429,
            "rate_limited",
            f"tenant {principal.tenant!r} is over its rate "
            f"limit of {limit.rate_per_s:g} requests/s (burst {limit.burst}); "
            f"retry after {retry} s",
            headers={"Retry-After": retry},
        )
    return principal


def rate_limit_of(config: ApiConfig, principal: Principal) -> RateLimit:
    """The caller's tenant's request rate: an override, else its own or its
    default tier's by the deployment's settings (``producers.settings``)."""
    override = config.rate_limit_overrides.get(principal.tenant)
    if override is not None:
        return override
    if config.settings is not None:
        return config.settings.rate_limit_of(principal.policy)
    return config.rate_limit


def own_job(request: web.Request, principal: Principal) -> JobView:
    job_id = request.match_info["job_id"]
    view = request.app[CONFIG].store.get(job_id)
    if view is None or view.tenant != principal.tenant:
        raise ApiError(404, "job_not_found", f"no job {job_id!r} for your tenant")
    return view
