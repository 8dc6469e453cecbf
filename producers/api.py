"""The HTTP API: submit and cancel write commands to the log; reads come from projections.

``make_app(config)`` wires an aiohttp application from injected adapters (the
log producer, the view store, the artifact store, the key table), so tests run
it with fakes and ``framespool`` runs it with the real ones. Its parts: what every
handler reads (``producers/http.py``: the config, the app's keys, errors, the
caller), what a submission must pass (``producers/submit_checks.py``), the job
routes (``producers/job_routes.py``) and the routes that read the deployment
(``producers/read_routes.py``); this module is the middleware, the background
tasks and the app. Background work
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
   ``max_predicted_wait_s`` (``submit_checks.check_predicted_wait``, from the cells' latest
   offers): what a tenant may not submit is refused now, never accepted with
   202 and rejected later; write ``SubmitJob`` (key = tenant) to ``commands``
   and wait for the ack;
4. store a provisional SUBMITTED view unless the projection already has one,
   so an immediate GET finds the job; answer 202.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from framespool.callbacks.lookups import CallbackLookups
from framespool.producers import openapi as openapi_doc
from framespool.producers.cluster_reads import ClusterReads
from framespool.producers.http import (
    ADMISSION_WATCH,
    ANON_LIMITER,
    CLUSTER_READS,
    CLUSTER_VIEW,
    CONFIG,
    LIMITER,
    LOCKS,
    LOOKUPS,
    METRICS,
    OFFERS,
    OPENAPI,
    PUBLIC_LIMITER,
    PUBLIC_ROUTES,
    QUEUE_HOLDS,
    RUN_TIMES,
    STREAMS,
    TASKS,
    ApiConfig,
    ApiError,
    error_body,
    take_public,
)
from framespool.producers.job_routes import (
    cancel_job,
    get_artifact,
    get_job,
    job_events,
    job_result,
    list_jobs,
    rotate_webhook_secret,
    submit_job,
)
from framespool.producers.metrics import (
    AdmissionWatch,
    AssignmentObserver,
    Metrics,
    ProjectionCollector,
    PublishTap,
    ViewCollector,
    projection_parts,
)
from framespool.producers.ratelimit import RateLimiter
from framespool.producers.read_routes import (
    get_cluster,
    healthz,
    list_models,
    metrics_endpoint,
    metrics_response,
    openapi,
)
from framespool.producers.run_times import RunTimes
from framespool.producers.validation import (
    ValidationError,
)
from framespool.projections import cluster as cluster_view
from framespool.projections import dashboard


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
            take_public(request)
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
        return metrics_response(api)

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
