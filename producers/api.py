"""The HTTP API: submit and cancel write commands to the log; reads come from projections.

``make_app(config)`` wires an aiohttp application from injected adapters (the
log producer, the view store, the artifact store, the key table), so tests run
it with fakes and ``framespool`` runs it with the real ones. Background work
(the projection consumer, the webhook dispatcher) starts and stops with the app
through ``cleanup_ctx``.

Every error is ``{"error": {"code", "message", "field"?}}``. A tenant sees only
its own jobs: another tenant's job id answers 404, exactly like an unknown one.
Every authenticated request takes a token from its tenant's bucket
(``framespool.producers.ratelimit``); an empty bucket answers 429 with ``Retry-After``.
A request without a valid key takes one from its address's bucket instead.
What one tenant may learn of others is totals: ``/v1/cluster`` shows the caller
its own queue rows and job ids only, ``/metrics`` needs the operator key (or
``metrics_app`` on a private address), and event streams are capped per key and
per tenant (429 with ``Retry-After``). Result URLs are bound to tenant, job, run
and expiry, and artifacts are served as attachments, never rendered.
``/openapi.json`` is built by ``framespool.producers.openapi`` from the same limits the
validation applies; ``/`` serves the dashboard (``projections/dashboard``).
Submission protocol (``POST /v1/jobs``):

1. authenticate, rate-limit, validate (a callback host that resolves to a
   non-public address is refused here, and again at delivery); the job id is
   derived from (tenant, Idempotency-Key) when the header is given, else random;
2. a known id with the same request fingerprint answers 200 with that job; a
   different request under the same key answers 409;
3. refuse with 429 and ``Retry-After`` a tenant that already has its queue cap
   of jobs waiting (SUBMITTED or QUEUED in the read model), and a job whose
   predicted wait in the best cell that can run it exceeds its tier's
   ``max_predicted_wait_s`` (``_check_predicted_wait``, from the cells' latest
   offers): what a tenant may not submit is refused now, never accepted with
   202 and rejected later; write ``SubmitJob`` (key = tenant) to ``commands``
   and wait for the ack;
4. store a provisional SUBMITTED view unless the projection already has one,
   so an immediate GET finds the job; answer 202.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from framespool.callbacks.lookups import CallbackLookups
from framespool.callbacks.targets import TargetPolicy, check_address, vet_target
from framespool.log import Sender
from framespool.processors.core.offers import (
    PREDICTED_WAIT,
    Own,
    limited,
    live_offers,
    wait_refusal,
)
from framespool.producers import openapi as openapi_doc
from framespool.producers import patterns
from framespool.producers.auth import ApiKeys, Principal, token_from_headers
from framespool.producers.cluster_reads import ClusterReads
from framespool.producers.diskguard import DiskGuard
from framespool.producers.metrics import (
    AdmissionWatch,
    AssignmentObserver,
    Metrics,
    ProjectionCollector,
    PublishTap,
    ViewCollector,
    projection_parts,
)
from framespool.producers.ratelimit import RateLimit, RateLimiter, retry_after_header
from framespool.producers.run_times import RunTimes
from framespool.producers.settings import ApiSettings
from framespool.producers.validation import (
    Limits,
    ModelDefaults,
    ValidationError,
    validate_submit,
)
from framespool.projections import cluster as cluster_view
from framespool.projections import dashboard
from framespool.projections.hub import Hub
from framespool.projections.jobs import COMPLETED, STATES, JobView, spec_fingerprint, submitted_view
from framespool.projections.serde import public_job
from framespool.projections.sse import parse_last_event_id, stream_job
from framespool.projections.storage import StorageLedger
from framespool.projections.store import ViewStore
from framespool.projections.webhook_secrets import RotationTooSoon
from framespool.schemas import codec
from framespool.schemas.events import CancelJob, JobSpec, SubmitJob
from framespool.schemas.topics import COMMANDS

DEFAULT_ESTIMATE_S = next(f.default for f in fields(JobSpec) if f.name == "estimate_s")
_CURSOR = re.compile(patterns.CURSOR)  # fullmatch: "$" would accept a trailing newline
_IDEMPOTENCY_KEY = re.compile(patterns.IDEMPOTENCY_KEY)


@dataclass
class ApiConfig:
    auth: ApiKeys
    store: ViewStore
    producer: Sender  # the commands topic is written through it (a LogProducer)
    artifacts: Any = None  # framespool.agents.artifacts.ArtifactStore
    hub: Hub = field(default_factory=Hub)
    commands_topic: str = COMMANDS.name
    limits: Limits = Limits()
    url_policy: TargetPolicy = TargetPolicy()
    result_url_ttl_s: int = 3600
    sse_keepalive_s: float = 15.0
    max_body_bytes: int = 64 * 1024
    background: Sequence[Callable[[], Awaitable[None]]] = ()  # e.g. consumer.run, dispatcher.run
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
    webhook_secrets: Any = None  # projections.webhook_secrets.WebhookSecrets; None: no rotation
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
OFFERS = web.AppKey("cell_offers", Callable[[], Mapping[str, Any]])
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
CLUSTER_VIEW = web.AppKey("cluster_view", Callable[[], cluster_view.ClusterView])
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


@web.middleware
async def _errors_and_metrics(request: web.Request, handler):
    metrics = request.app[METRICS]
    route = (
        request.match_info.route.resource.canonical
        if request.match_info.route.resource
        else "unmatched"
    )
    started = time.perf_counter()
    status = 500
    try:
        resource = request.match_info.route.resource
        if (resource.canonical if resource else None) in PUBLIC_ROUTES:
            _take_public(request)
        response = await handler(request)
        status = response.status
        return response
    except ApiError as e:
        status = e.status
        return error_body(e.status, e.code, e.message, e.field, e.headers)
    except ValidationError as e:
        status = e.status
        return error_body(e.status, e.code, e.message, e.field)
    except web.HTTPException as e:
        status = e.status
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(
            e.status, "http_error"
        )
        return error_body(
            e.status,
            code,
            e.reason
            if e.status != 413
            else f"the body exceeds {request.app[CONFIG].max_body_bytes} bytes",
        )
    finally:
        metrics.requests.labels(request.method, route, str(status)).inc()
        metrics.latency.labels(route).observe(time.perf_counter() - started)


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


def _take_public(request: web.Request) -> None:
    """Charge a request to a route without a key to its address (``public_rate_limit``)."""
    config = request.app[CONFIG]
    holder = request.app[PUBLIC_LIMITER]
    if len(holder[0]) >= _MAX_UNAUTHENTICATED_SOURCES:
        holder[0] = RateLimiter(config.public_rate_limit)  # bounded memory, as above
    wait_s = holder[0].take(source_of(request.remote), config.monotonic())
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


def _principal(request: web.Request) -> Principal:
    """The authenticated caller, after taking a token from its tenant's rate-limit bucket."""
    config = request.app[CONFIG]
    principal = config.auth.authenticate(token_from_headers(request.headers))
    if principal is None:
        # no tenant to charge: the caller's address pays, so guessing keys is slow too
        holder = request.app[ANON_LIMITER]
        if len(holder[0]) >= _MAX_UNAUTHENTICATED_SOURCES:
            # bounded memory; a fresh bucket is full, so starting over only forgives
            holder[0] = RateLimiter(config.unauthenticated_rate_limit)
        wait_s = holder[0].take(source_of(request.remote), config.monotonic())
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
    limit = _rate_limit_of(config, principal)
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


async def _check_callback_host(
    config: ApiConfig, lookups: CallbackLookups, tenant: str, url: str | None
) -> None:
    """Refuse a callback whose host name resolves to an address the policy forbids.

    The validation parsed the URL with the parser delivery uses
    (``framespool.callbacks.targets.vet_target``) and checked IP literals and
    loopback names; this looks up the very host name delivery will resolve.
    A name that does not resolve now (or is not looked up now:
    ``framespool.callbacks.lookups``) is accepted: delivery resolves it again
    and checks every address it connects to
    (``framespool.callbacks.targets.PolicyResolver``).
    """
    if not url:
        return
    policy = config.url_policy
    target = vet_target(url, policy)
    if isinstance(target, str):  # validate_submit refused it already; never looked up
        raise ApiError(
            422, "invalid_field", f"{target}; use a public http(s) endpoint", "callback_url"
        )
    if target.ip is not None or policy.allow_private or target.name in policy.allow_hosts:
        return
    addresses = await lookups.addresses(tenant, target.host, config.resolve_timeout_s)
    for address in addresses or ():
        problem = check_address(target.host, address, policy)
        if problem:
            raise ApiError(
                422, "invalid_field", f"{problem}; use a public http(s) endpoint", "callback_url"
            )


def _check_disk(config: ApiConfig) -> None:
    """503 + Retry-After while the guarded disk is nearly full (nothing is written)."""
    guard = config.disk_guard
    why = guard.refusal() if guard is not None else None
    if guard is not None and why is not None:
        raise ApiError(503, "disk_full", why, headers={"Retry-After": str(guard.retry_after_s)})


def _rate_limit_of(config: ApiConfig, principal: Principal) -> RateLimit:
    """The caller's tenant's request rate: an override, else its own or its
    default tier's by the deployment's settings (``producers.settings``)."""
    override = config.rate_limit_overrides.get(principal.tenant)
    if override is not None:
        return override
    if config.settings is not None:
        return config.settings.rate_limit_of(principal.policy)
    return config.rate_limit


def _queue_cap_of(config: ApiConfig, tenant: str) -> int:
    """Jobs ``tenant`` may have waiting, by the same precedence as its rate."""
    override = config.queue_cap_overrides.get(tenant)
    if override is not None:
        return override
    if config.settings is not None:
        return config.settings.queue_cap_of(config.auth.policy(tenant))
    return config.queue_cap


def _check_queue_cap(config: ApiConfig, tenant: str, in_flight: int = 0) -> None:
    """Refuse a submission over the tenant's queue cap now, with when to retry.
    ``in_flight``: the tenant's submissions that passed this check and are being
    written to the log, not yet in the store (``QUEUE_HOLDS``)."""
    cap = _queue_cap_of(config, tenant)
    if cap <= 0:
        return
    waiting = config.store.queued_count(tenant) + in_flight
    if waiting >= cap:
        retry = str(config.queue_cap_retry_after_s)
        raise ApiError(
            429,
            "queue_full",
            f"tenant {tenant!r} has {waiting} jobs waiting, its queue cap of {cap}; "
            f"retry after {retry} s, when some have started (or cancel some)",
            headers={"Retry-After": retry},
        )


def _check_storage_quota(config: ApiConfig, tenant: str) -> None:
    """Refuse a submission while ``tenant``'s stored results and checkpoints hold
    its ``storage_quota_bytes`` (429; ``Retry-After`` when retention frees some)."""
    if config.storage is None or config.settings is None:
        return
    quota = config.settings.storage_quota_of(config.auth.policy(tenant))
    used = config.storage.used(tenant)
    if quota <= 0 or used < quota:
        return
    settings = config.settings
    release = config.storage.next_release_ms(tenant, settings.retention_of)
    headers, when = {}, "no stored object of yours expires: delete results or ask for more"
    if release is not None:
        retry = max(1, math.ceil(release / 1000 - config.clock()))
        headers["Retry-After"] = str(retry)
        when = f"retention frees some in {retry} s"
    raise ApiError(
        429,
        "storage_quota",
        f"tenant {tenant!r} stores {used} bytes of results and checkpoints, its "
        f"storage_quota_bytes of {quota}; {when} (the operator sets storage_quota_bytes "
        "per tenant or tier)",
        "storage_quota_bytes",
        headers=headers,
    )


def _check_predicted_wait(
    offers: Mapping[str, Any], config: ApiConfig, spec: JobSpec, run_times: RunTimes
) -> None:
    """Refuse now a job whose predicted wait in the best cell that can run it
    exceeds its tier's limit, which the cells publish with their offers
    (``framespool.processors.core.offers``: the arithmetic admission routes by),
    at the tenant's own place in the fair order: behind what it already has
    waiting and running (its jobs in the read model, each counted at this
    job's GPU-seconds, its estimate no less than the model's jobs were seen to
    run: ``run_times``), not behind another tenant's whole backlog (``offers``,
    item 6). Stale or missing offers are unknown: nothing is refused on them.
    Cost per submit: O(C * T) when no tier is limited (the default); else
    O(C * (T + G + s)) for C cells' offers of T tiers and G node groups, s
    shapes, and two count reads (in memory); the offers are the projection's,
    in memory."""
    if not offers:
        return
    live = live_offers(offers, sorted(offers), int(config.clock() * 1000), config.offer_stale_s)
    if not limited(live, spec.tier):
        return  # no limit (the default): nothing to count on the submit path
    own = Own.of_jobs(
        spec,
        config.store.queued_count(spec.tenant),
        config.store.running_count(spec.tenant),
        run_times.floor_s(spec.tenant, f"{spec.model}@{spec.model_version}"),
    )
    refusal = wait_refusal(live, spec, None, own)
    if refusal is None:
        return
    retry = str(refusal.retry_after_s)
    raise ApiError(
        429,
        PREDICTED_WAIT,
        f"tier {spec.tier!r}: {refusal.message}; retry after {retry} s",
        "tier",
        headers={"Retry-After": retry},
    )


def _projection(config: ApiConfig) -> Any | None:
    """The projection consumer that runs with the app (it holds the committed
    cluster view in memory, replaced by each commit), or None."""
    return next((p for p in projection_parts(config.background) if hasattr(p, "cluster")), None)


def _cluster_of(config: ApiConfig) -> Callable[[], cluster_view.ClusterView]:
    """Where the cluster view is read: the projection's, else the store."""
    part = _projection(config)
    return config.store.load_cluster if part is None else lambda: part.cluster


def _offers_of(config: ApiConfig) -> Callable[[], Mapping[str, Any]]:
    """Where the cells' latest offers are read: ``config.offers``, else the
    projection's cluster view (offers are not stored: none without one)."""
    if config.offers is not None:
        return config.offers
    part = _projection(config)
    return dict if part is None else lambda: part.cluster.offers


def _own_job(request: web.Request, principal: Principal) -> JobView:
    job_id = request.match_info["job_id"]
    view = request.app[CONFIG].store.get(job_id)
    if view is None or view.tenant != principal.tenant:
        raise ApiError(404, "job_not_found", f"no job {job_id!r} for your tenant")
    return view


def _job_id_for(tenant: str, idempotency_key: str | None) -> str:
    if idempotency_key is None:
        return f"job_{uuid.uuid4().hex}"
    digest = hashlib.sha256(f"{tenant}\x00{idempotency_key}".encode()).hexdigest()
    return f"job_{digest[:32]}"


def _accepted(view: JobView, status: int) -> web.Response:
    body = {
        "job_id": view.job_id,
        "state": view.state,
        "status_url": f"/v1/jobs/{view.job_id}",
        "events_url": f"/v1/jobs/{view.job_id}/events",
    }
    return web.json_response(body, status=status, headers={"Location": body["status_url"]})


async def submit_job(request: web.Request) -> web.Response:
    """Submit a job (Idempotency-Key supported).

    Cost per accepted submit: the body's JSON parse and validation, one Avro encode
    and produce (awaiting its delivery), the provisional view built once (one spec
    fingerprint) and inserted (one store commit); store reads: the tenant's queued
    count and, only with an Idempotency-Key, the earlier view (a replay or a
    conflict is answered from it, fingerprinting the request a second time).
    """
    config, metrics = request.app[CONFIG], request.app[METRICS]
    principal = _principal(request)
    if request.content_length is not None and request.content_length > config.max_body_bytes:
        raise ApiError(413, "body_too_large", f"the body exceeds {config.max_body_bytes} bytes")
    try:
        async with asyncio.timeout(config.body_timeout_s):
            raw = await request.read()
    except TimeoutError:
        raise ApiError(
            408,
            "body_timeout",
            f"the body did not arrive within {config.body_timeout_s:g} s (body_timeout_s)",
        ) from None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(
            400,
            "malformed_json",
            "the body is nested too deeply; a job is a flat object (params values are scalars)",
        ) from None
    fields = validate_submit(body, principal.policy, config.limits, config.url_policy)
    await _check_callback_host(
        config, request.app[LOOKUPS], principal.tenant, fields.get("callback_url")
    )
    key = request.headers.get("Idempotency-Key")
    if key is not None and not _IDEMPOTENCY_KEY.fullmatch(key):
        raise ApiError(
            422,
            "invalid_header",
            "Idempotency-Key must be 1-255 printable ASCII characters without spaces",
            "Idempotency-Key",
        )
    job_id = _job_id_for(principal.tenant, key)
    now_ms = int(config.clock() * 1000)
    spec = JobSpec(
        job_id=job_id, tenant=principal.tenant, user=principal.user, submitted_ms=now_ms, **fields
    )
    locks: dict[str, asyncio.Lock] = request.app[LOCKS]
    lock = locks.setdefault(job_id, asyncio.Lock())
    try:
        async with lock:
            # without an Idempotency-Key the id is 128 fresh random bits: no earlier
            # request can hold it, so there is nothing to look up
            existing = config.store.get(job_id) if key is not None else None
            if existing is not None:
                if existing.request_hash != spec_fingerprint(spec):
                    metrics.submits.labels(spec.tier, "conflict").inc()
                    raise ApiError(
                        409,
                        "idempotency_key_reused",
                        "this Idempotency-Key was used "
                        "for a different request; use a new key for a new job",
                        "Idempotency-Key",
                    )
                metrics.submits.labels(spec.tier, "replayed").inc()
                return _accepted(existing, 200)
            try:
                _check_disk(config)
            except ApiError:
                metrics.submits.labels(spec.tier, "disk_full").inc()
                raise
            holds: dict[str, int] = request.app[QUEUE_HOLDS]
            _check_queue_cap(config, principal.tenant, holds.get(principal.tenant, 0))
            try:
                _check_storage_quota(config, principal.tenant)
            except ApiError:
                metrics.submits.labels(spec.tier, "storage_quota").inc()
                raise
            try:
                _check_predicted_wait(request.app[OFFERS](), config, spec, request.app[RUN_TIMES])
            except ApiError:
                metrics.submits.labels(spec.tier, PREDICTED_WAIT).inc()
                raise
            holds[principal.tenant] = holds.get(principal.tenant, 0) + 1
            try:
                return await _record_submit(request, config, spec, key, now_ms)
            finally:
                left = holds[principal.tenant] - 1
                if left:
                    holds[principal.tenant] = left
                else:
                    del holds[principal.tenant]
    finally:
        if not lock.locked() and locks.get(job_id) is lock:
            del locks[job_id]


async def _record_submit(
    request: web.Request, config: ApiConfig, spec: JobSpec, key: str | None, now_ms: int
) -> web.Response:
    """Write the accepted submission to the log and the store; answer 202."""
    metrics, job_id = request.app[METRICS], spec.job_id
    command = SubmitJob(event_id=f"{job_id}/submit", ts_ms=now_ms, spec=spec, idempotency_key=key)
    watch = request.app[ADMISSION_WATCH]
    watch.writing(job_id)
    try:
        await config.producer.send(config.commands_topic, spec.tenant, codec.encode(command))
    except Exception as exc:
        watch.not_written(job_id)
        metrics.submits.labels(spec.tier, "unavailable").inc()
        raise ApiError(
            503,
            "log_unavailable",
            f"the job could not be recorded ({exc}); retry with the same Idempotency-Key",
            headers={"Retry-After": "5"},
        ) from exc
    view = submitted_view(spec, now_ms)
    if not config.store.insert_if_absent(view):
        # the projection stored the job first (it read SubmitJob's outcome
        # already): answer with what it knows
        view = config.store.get(job_id) or view
    metrics.submits.labels(spec.tier, "accepted").inc()
    return _accepted(view, 202)


async def get_job(request: web.Request) -> web.Response:
    """A job's status, progress and timeline."""
    view = _own_job(request, _principal(request))
    return web.json_response(public_job(view, timeline=request.query.get("timeline") != "0"))


async def list_jobs(request: web.Request) -> web.Response:
    """The tenant's jobs, newest first (state, limit, cursor)."""
    principal = _principal(request)
    q = request.query
    if q.get("tenant", principal.tenant) != principal.tenant:
        raise ApiError(403, "forbidden", "you can list only your own tenant's jobs", "tenant")
    state = q.get("state")
    if state is not None and state.upper() not in STATES:
        raise ApiError(422, "invalid_field", f"state must be one of {', '.join(STATES)}", "state")
    try:
        limit = int(q.get("limit", "50"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 200:
        raise ApiError(422, "invalid_field", "limit must be an integer from 1 to 200", "limit")
    cursor = q.get("cursor")
    if cursor is not None and not _CURSOR.fullmatch(cursor):
        raise ApiError(
            422,
            "invalid_field",
            "cursor is not one this API returned; start over without it",
            "cursor",
        )
    page = request.app[CONFIG].store.list_jobs(
        principal.tenant, state.upper() if state else None, limit, cursor
    )
    return web.json_response(
        {
            "jobs": [public_job(v, timeline=False) for v in page.jobs],
            "next_cursor": page.next_cursor,
        }
    )


async def cancel_job(request: web.Request) -> web.Response:
    """Ask to cancel a queued or running job."""
    config = request.app[CONFIG]
    principal = _principal(request)
    view = _own_job(request, principal)
    if view.terminal:
        raise ApiError(
            409,
            "job_terminal",
            f"job {view.job_id} is already {view.state}; there is nothing to cancel",
        )
    command = CancelJob(
        event_id=f"{view.job_id}/cancel/{uuid.uuid4().hex}",
        ts_ms=int(config.clock() * 1000),
        job_id=view.job_id,
        tenant=principal.tenant,
        reason=f"cancelled by {principal.user or 'user'}",
    )
    try:
        await config.producer.send(config.commands_topic, principal.tenant, codec.encode(command))
    except Exception as exc:
        raise ApiError(
            503, "log_unavailable", f"the cancel could not be recorded ({exc}); retry"
        ) from exc
    return web.json_response(
        {"job_id": view.job_id, "state": view.state, "cancel_requested": True}, status=202
    )


@contextlib.contextmanager
def _stream_slot(request: web.Request, principal: Principal):
    """Hold one of the caller's event-stream slots, or refuse with 429 when none is left."""
    config, streams = request.app[CONFIG], request.app[STREAMS]
    slots = (
        (("key", principal.key_id), config.sse_max_per_key, "API key"),
        (("tenant", principal.tenant), config.sse_max_per_tenant, f"tenant {principal.tenant!r}"),
    )
    for slot, cap, who in slots:
        if streams.get(slot, 0) >= cap:
            retry = str(config.sse_retry_after_s)
            raise ApiError(
                429,
                "too_many_streams",
                f"this {who} already has {cap} open event streams, the limit; close one "
                f"(or poll GET /v1/jobs/{{id}}) and retry after {retry} s",
                headers={"Retry-After": retry},
            )
    for slot, _, _ in slots:
        streams[slot] = streams.get(slot, 0) + 1
    try:
        yield
    finally:
        for slot, _, _ in slots:
            streams[slot] -= 1
            if not streams[slot]:
                del streams[slot]


async def job_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events of a job, resumable with Last-Event-ID."""
    principal = _principal(request)
    view = _own_job(request, principal)
    with _stream_slot(request, principal):
        return await _stream_events(request, view)


async def _stream_events(request: web.Request, view: JobView) -> web.StreamResponse:
    config, metrics = request.app[CONFIG], request.app[METRICS]
    last = parse_last_event_id(
        request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
    )
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    metrics.sse_clients.inc()
    try:
        await stream_job(
            response.write,
            config.hub,
            view.job_id,
            lambda: config.store.get(view.job_id),
            last,
            config.sse_keepalive_s,
        )
    except ConnectionResetError:
        pass  # the client went away; it resumes with Last-Event-ID
    finally:
        metrics.sse_clients.dec()
    return response


async def job_result(request: web.Request) -> web.Response:
    """A signed, expiring URL of a completed job's video."""
    config = request.app[CONFIG]
    view = _own_job(request, _principal(request))
    if view.state != COMPLETED or not view.artifact_uri:
        raise ApiError(
            409,
            "not_completed",
            f"job {view.job_id} is {view.state}; its result exists once it is COMPLETED",
        )
    gone = config.storage.gone(view.job_id) if config.storage is not None else None
    if gone is not None:
        when, why = gone
        raise ApiError(
            410,
            "result_expired",
            f"the result of job {view.job_id} was deleted at "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(when / 1000))}: {why}; "
            "fetch results within the retention of the job's tier",
        )
    if config.artifacts is None:
        raise ApiError(503, "no_artifact_store", "this API has no artifact store configured")
    ttl = config.result_url_ttl_s
    try:
        url = config.artifacts.signed_url(view.artifact_uri, ttl, tenant=view.tenant)
    except ValueError as exc:  # an artifact URI this store cannot serve
        raise ApiError(
            409,
            "artifact_unavailable",
            f"the result of job {view.job_id} is not available from this API: {exc}",
        ) from exc
    if request.query.get("redirect") in ("1", "true"):
        raise web.HTTPFound(url)
    return web.json_response(
        {
            "job_id": view.job_id,
            "url": url,
            "expires_in_s": ttl,
            "expires_at_ms": int((config.clock() + ttl) * 1000),
            "artifact_uri": view.artifact_uri,
        }
    )


def _result_of(store: ViewStore, tenant: str, key: str, artifacts: Any) -> bool:
    """Whether ``key`` is the published result of a job of ``tenant`` (its job and run are
    in the key: ``jobs/{job}/runs/{run}/...``)."""
    parts = key.split("/")
    if len(parts) < 4 or parts[0] != "jobs" or parts[2] != "runs":
        return False
    view = store.get(parts[1])
    if view is None or view.tenant != tenant or not view.artifact_uri:
        return False
    try:
        return artifacts.key_of(view.artifact_uri) == key
    except ValueError:
        return False


async def get_artifact(request: web.Request) -> web.StreamResponse:
    """Download an artifact through a signed URL, bound to a tenant, job, run and expiry."""
    config = request.app[CONFIG]
    artifacts = config.artifacts
    if artifacts is None or not hasattr(artifacts, "verify_signature"):
        raise ApiError(404, "not_found", "this API does not serve artifacts")
    key = request.match_info["key"]
    tenant = request.query.get("tenant", "")
    if (
        not tenant
        or not artifacts.verify_signature(
            key, request.query.get("expires", ""), request.query.get("sig", ""), tenant=tenant
        )
        or not _result_of(config.store, tenant, key, artifacts)
    ):
        raise ApiError(
            403,
            "bad_signature",
            "the URL's signature is invalid or has expired; "
            "get a fresh one from GET /v1/jobs/{id}/result",
        )
    path = artifacts.local_path(key)
    if not path.is_file():
        raise ApiError(404, "artifact_not_found", f"no artifact {key!r}")
    # served on the dashboard's origin: never rendered or sniffed as a page there
    name = path.name.replace('"', "")
    return web.FileResponse(
        path,
        headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox; default-src 'none'",
            "Cache-Control": "private, no-store",
        },
    )


async def rotate_webhook_secret(request: web.Request) -> web.Response:
    """A new webhook signing secret for the caller's tenant, shown once."""
    config = request.app[CONFIG]
    principal = _principal(request)
    if config.webhook_secrets is None:
        raise ApiError(404, "webhooks_unavailable", "this deployment delivers no webhooks")
    try:
        # the secrets file is written off the event loop, once a minute per tenant at
        # most (framespool.projections.webhook_secrets)
        secret = await config.webhook_secrets.rotate_soon(principal.tenant)
    except RotationTooSoon as exc:
        retry = retry_after_header(exc.retry_after_s)
        raise ApiError(429, "rotation_too_soon", str(exc), headers={"Retry-After": retry}) from None
    except OSError as exc:
        raise ApiError(
            503, "secret_not_stored", f"the new secret could not be stored ({exc}); retry"
        ) from exc
    return web.json_response(
        {
            "tenant": principal.tenant,
            "webhook_secret": secret,
            "signature_header": "Framespool-Signature",
            "note": "shown once: store it now. Webhooks are signed with it from now on; "
            "verify HMAC-SHA256(secret, '<t>.<body>') against v1 in the header.",
        },
        headers={"Cache-Control": "no-store"},
    )


async def get_cluster(request: web.Request) -> web.Response:
    """GPU map, totals and queue depths per cell, the caller's own jobs named;
    304 when ``If-None-Match`` holds the document's ``ETag``.

    Cost: O(1) for a repeat while the cluster view is unchanged; otherwise
    O(GPUs on the map) and a store read per job not seen before
    (``framespool.producers.cluster_reads``)."""
    config = request.app[CONFIG]
    principal = _principal(request)
    view = request.app[CLUSTER_VIEW]()

    def tenant_of(job_id: str) -> str | None:
        job = config.store.get(job_id)
        return None if job is None else job.tenant

    body, etag = request.app[CLUSTER_READS].body(
        view,
        int(config.clock() * 1000),
        principal.tenant,
        request.query.get("detail") != "0",
        tenant_of,
    )
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type="application/json", headers=headers)


async def list_models(request: web.Request) -> web.Response:
    """The models the caller's tenant may submit, each with its GPU limits and
    defaults, the deployment's default model and the tenant's tiers."""
    limits = request.app[CONFIG].limits
    policy = _principal(request).policy
    served = limits.models if limits.models is not None else frozenset(limits.model_defaults)
    names = sorted(m for m in served if not policy.models or m in policy.models)
    models = []
    for name in names:
        info = limits.model_defaults.get(name, ModelDefaults())
        high = min(limits.gpus_max, info.max_gpus or limits.gpus_max)
        models.append(
            {
                "name": name,
                "default": name == limits.default_model,
                "description": info.description or None,
                "gpus": {
                    "min": min(info.min_gpus, high),
                    "max": high,
                    "default": min(max(info.default_gpus, info.min_gpus), high),
                },
                "estimate_s": info.estimate_s or DEFAULT_ESTIMATE_S,
                "output": {
                    "name": info.output_name or None,
                    "content_type": info.content_type or None,
                },
                "checkpoints": info.checkpoints,
            }
        )
    default = limits.default_model if limits.default_model in names else None
    return web.json_response(
        {
            "models": models,
            "default_model": default,
            "tiers": list(policy.tiers),
            "default_tier": policy.tier,
        }
    )


async def healthz(request: web.Request) -> web.Response:
    """Liveness of the API and its background tasks."""
    tasks = request.app[TASKS]
    dead = [t.get_name() for t in tasks if t.done()]
    body = {"status": "degraded" if dead else "ok", "stopped_background_tasks": dead}
    return web.json_response(body, status=503 if dead else 200)


async def metrics_endpoint(request: web.Request) -> web.Response:
    """Prometheus metrics, for the operator: they carry every tenant's figures."""
    key = request.app[CONFIG].operator_key
    token = token_from_headers(request.headers) or ""
    if not key:
        raise ApiError(404, "not_found", "metrics are served on the operator's metrics address")
    if not hmac.compare_digest(token.encode(), key.encode()):
        raise ApiError(
            401, "unauthenticated", "send the operator key as 'Authorization: Bearer <key>'"
        )
    return _metrics_response(request.app)


def _metrics_response(app: web.Application) -> web.Response:
    data = generate_latest(app[METRICS].registry)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    """This API's OpenAPI 3.1 document."""
    return web.json_response(request.app[OPENAPI])


async def _background(app: web.Application):
    config = app[CONFIG]
    assigned = AssignmentObserver(app[METRICS].submit_to_assigned)
    admitted = app[ADMISSION_WATCH]
    run_times = app[RUN_TIMES]

    def observe(job_id: str, view: Any) -> None:
        assigned(job_id, view)
        admitted(job_id, view)
        run_times(job_id, view)

    tap = PublishTap(config.hub, observe)
    tasks = [
        asyncio.create_task(run(), name=getattr(run, "__qualname__", "background"))
        for run in config.background
    ]
    app[TASKS].extend(tasks)
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    tap.remove()


def _register_collectors(metrics: Metrics, config: ApiConfig, lookups: CallbackLookups) -> None:
    metrics.registry.register(ViewCollector(config.store.load_cluster))
    parts = projection_parts(config.background)
    metrics.registry.register(ProjectionCollector(parts, config.hub, lookups))


def metrics_app(api: web.Application) -> web.Application:
    """``GET /metrics`` of ``api`` alone, to bind on an address only the operator reaches."""

    async def scrape(request: web.Request) -> web.Response:
        return _metrics_response(api)

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    return app


def make_app(config: ApiConfig) -> web.Application:
    app = web.Application(middlewares=[_errors_and_metrics], client_max_size=config.max_body_bytes)
    app[CONFIG] = config
    app[METRICS] = Metrics()
    app[LOOKUPS] = CallbackLookups(config.resolve_host)
    _register_collectors(app[METRICS], config, app[LOOKUPS])
    app[LOCKS] = {}
    app[QUEUE_HOLDS] = {}
    app[RUN_TIMES] = RunTimes()
    app[TASKS] = []
    app[STREAMS] = {}
    app[ANON_LIMITER] = [RateLimiter(config.unauthenticated_rate_limit)]
    app[PUBLIC_LIMITER] = [RateLimiter(config.public_rate_limit)]
    app[LIMITER] = RateLimiter(config.rate_limit, config.rate_limit_overrides)
    app[OFFERS] = _offers_of(config)
    app[CLUSTER_VIEW] = _cluster_of(config)
    app[CLUSTER_READS] = ClusterReads()
    app[ADMISSION_WATCH] = AdmissionWatch(config.monotonic)
    app[METRICS].watch_admission(app[ADMISSION_WATCH])
    app[OPENAPI] = openapi_doc.build(config.limits, max_body_bytes=config.max_body_bytes)
    app.cleanup_ctx.append(_background)
    app.router.add_post("/v1/jobs", submit_job)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_delete("/v1/jobs/{job_id}", cancel_job)
    app.router.add_get("/v1/jobs/{job_id}/events", job_events)
    app.router.add_get("/v1/jobs/{job_id}/result", job_result)
    app.router.add_get("/v1/artifacts/{key:.+}", get_artifact)
    app.router.add_get("/v1/cluster", get_cluster)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/webhook-secret", rotate_webhook_secret)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/openapi.json", openapi)
    if config.dashboard_dir is not None:
        dashboard.add_routes(app, config.dashboard_dir)
    return app
