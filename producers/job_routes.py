"""The job routes: submit (the protocol in ``framespool.producers.api``), read,
list, cancel, stream events, fetch results and artifacts, rotate the webhook
secret. A tenant sees only its own jobs (:func:`~framespool.producers.http.own_job`)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
import uuid

from aiohttp import web

from framespool.agents.artifacts.port import ArtifactStore
from framespool.processors.core.offers import (
    PREDICTED_WAIT,
)
from framespool.producers import patterns
from framespool.producers.auth import Principal
from framespool.producers.http import (
    ADMISSION_WATCH,
    CONFIG,
    LOCKS,
    LOOKUPS,
    METRICS,
    OFFERS,
    QUEUE_HOLDS,
    RUN_TIMES,
    STREAMS,
    ApiConfig,
    ApiError,
    caller,
    own_job,
)
from framespool.producers.ratelimit import retry_after_header
from framespool.producers.submit_checks import (
    check_callback_host,
    check_disk,
    check_predicted_wait,
    check_queue_cap,
    check_storage_quota,
)
from framespool.producers.validation import (
    validate_submit,
)
from framespool.projections.jobs import COMPLETED, STATES, JobView, spec_fingerprint, submitted_view
from framespool.projections.serde import public_job
from framespool.projections.sse import parse_last_event_id, stream_job
from framespool.projections.store.port import ViewStore
from framespool.projections.webhook_secrets import RotationTooSoon
from framespool.schemas import codec
from framespool.schemas.events import CancelJob, JobSpec, SubmitJob

_CURSOR = re.compile(patterns.CURSOR)  # fullmatch: "$" would accept a trailing newline


_IDEMPOTENCY_KEY = re.compile(patterns.IDEMPOTENCY_KEY)


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
    principal = caller(request)
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
    await check_callback_host(
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
                check_disk(config)
            except ApiError:
                metrics.submits.labels(spec.tier, "disk_full").inc()
                raise
            holds: dict[str, int] = request.app[QUEUE_HOLDS]
            check_queue_cap(config, principal.tenant, holds.get(principal.tenant, 0))
            try:
                check_storage_quota(config, principal.tenant)
            except ApiError:
                metrics.submits.labels(spec.tier, "storage_quota").inc()
                raise
            try:
                check_predicted_wait(request.app[OFFERS](), config, spec, request.app[RUN_TIMES])
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
    view = own_job(request, caller(request))
    return web.json_response(public_job(view, timeline=request.query.get("timeline") != "0"))


async def list_jobs(request: web.Request) -> web.Response:
    """The tenant's jobs, newest first (state, limit, cursor)."""
    principal = caller(request)
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
    principal = caller(request)
    view = own_job(request, principal)
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
    principal = caller(request)
    view = own_job(request, principal)
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
    view = own_job(request, caller(request))
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


def _result_of(store: ViewStore, tenant: str, key: str, artifacts: ArtifactStore) -> bool:
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
    artifacts = None if config.artifacts is None else config.artifacts.served()
    if artifacts is None:
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
    principal = caller(request)
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
