"""The routes that read the deployment rather than one job: the cluster map,
the models, health, metrics (the operator's) and the OpenAPI document."""

from __future__ import annotations

import hmac

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from framespool.producers.auth import token_from_headers
from framespool.producers.http import (
    CLUSTER_READS,
    CLUSTER_VIEW,
    CONFIG,
    DEFAULT_ESTIMATE_S,
    METRICS,
    OPENAPI,
    TASKS,
    ApiError,
    caller,
)
from framespool.producers.validation import (
    ModelDefaults,
)


async def get_cluster(request: web.Request) -> web.Response:
    """GPU map, totals and queue depths per cell, the caller's own jobs named;
    304 when ``If-None-Match`` holds the document's ``ETag``.

    Cost: O(1) for a repeat while the cluster view is unchanged; otherwise
    O(GPUs on the map) and a store read per job not seen before
    (``framespool.producers.cluster_reads``)."""
    config = request.app[CONFIG]
    principal = caller(request)
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
    policy = caller(request).policy
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
    return metrics_response(request.app)


def metrics_response(app: web.Application) -> web.Response:
    data = generate_latest(app[METRICS].registry)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    """This API's OpenAPI 3.1 document."""
    return web.json_response(request.app[OPENAPI])
