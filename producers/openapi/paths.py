"""The OpenAPI document's paths, by resource: the jobs (submit, read, list, cancel,
events, result, artifacts), the deployment (cluster, models, webhook secret) and
the service (health, metrics, this document)."""

from __future__ import annotations

from typing import Any

from framespool.producers import patterns
from framespool.producers.openapi.schemas import (
    CURSOR_PATTERN,
    IDEMPOTENCY_KEY_PATTERN,
    json_content,
    ref,
)
from framespool.projections.jobs import STATES

# --------------------------------------------------------------------------
# Responses and parameters
# --------------------------------------------------------------------------
_ERRORS = {
    400: "The body is not valid JSON",
    401: "No valid API key",
    403: "Not allowed for this tenant (another tenant's listing, a tier it does not have)",
    404: "No such job for this tenant (another tenant's job answers the same)",
    408: "The request body did not arrive within the API's body_timeout_s",
    409: "Conflicts with the job's state or an earlier request",
    413: "The body is larger than the limit",
    422: "A field is invalid; 'field' names it",
    429: "Over the tenant's rate limit; retry after Retry-After seconds",
    503: "The log or a store is unavailable; retry",
}


def _error(status: int, description: str | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description or _ERRORS[status],
        "content": json_content(ref("Error")),
    }
    if status == 429:
        response["headers"] = {
            "Retry-After": {
                "description": "seconds after which the same request may succeed",
                "schema": {"type": "string", "pattern": patterns.schema(patterns.DIGITS)},
            }
        }
    return response


def _responses(ok: dict[int, dict[str, Any]], *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {str(k): v for k, v in ok.items()}
    for status in errors:
        out[str(status)] = _error(status)
    return out


def _ok(description: str, schema_name: str, **extra: Any) -> dict[str, Any]:
    return {"description": description, "content": json_content(ref(schema_name)), **extra}


_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
}
_PUBLIC: list[dict[str, Any]] = []  # ``security: []``: no API key


def paths() -> dict[str, Any]:
    return {**_job_paths(), **_deployment_paths(), **_service_paths()}


def _job_paths() -> dict[str, Any]:
    location = {"Location": {"description": "the job's status URL", "schema": {"type": "string"}}}
    accepted = {
        "description": "Recorded; the job is in the log",
        "content": json_content(ref("Accepted")),
        "headers": location,
    }
    return {
        "/v1/jobs": {
            "post": {
                "operationId": "submitJob",
                "summary": "Submit a job",
                "description": "Writes SubmitJob to the log. With Idempotency-Key the job id is "
                "derived from (tenant, key): the same request again answers 200 "
                "with that job, a different one 409.",
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
                    }
                ],
                "requestBody": {"required": True, "content": json_content(ref("JobSubmit"))},
                "responses": _responses(
                    {
                        200: {
                            **accepted,
                            "description": "Known job (same Idempotency-Key and request)",
                        },
                        202: accepted,
                    },
                    400,
                    401,
                    403,
                    408,
                    409,
                    413,
                    422,
                    503,
                )
                | {
                    "429": _error(
                        429,
                        "Refused now, never accepted and rejected later: over the tenant's "
                        "rate limit (code rate_limited), its queue cap (queue_full), or the "
                        "tier's predicted-wait limit, the job's predicted wait in the best "
                        "cell that can run it exceeding the tier's max_predicted_wait_s "
                        "(predicted_wait, field 'tier'); retry after Retry-After seconds "
                        "or use a higher tier",
                    )
                },
            },
            "get": {
                "operationId": "listJobs",
                "summary": "The tenant's jobs, newest first",
                "parameters": [
                    {
                        "name": "tenant",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "must be the caller's own tenant (403 otherwise)",
                    },
                    {
                        "name": "state",
                        "in": "query",
                        "schema": {
                            "type": "string",
                            "enum": list(STATES) + [s.lower() for s in STATES],
                        },
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string", "pattern": CURSOR_PATTERN},
                        "description": "next_cursor of the previous page",
                    },
                ],
                "responses": _responses(
                    {200: _ok("A page of jobs", "JobList")}, 401, 403, 422, 429
                ),
            },
        },
        "/v1/jobs/{job_id}": {
            "parameters": [_JOB_ID],
            "get": {
                "operationId": "getJob",
                "summary": "A job's status, progress and timeline",
                "parameters": [
                    {
                        "name": "timeline",
                        "in": "query",
                        "schema": {"type": "string", "enum": ["0", "1"]},
                        "description": "0 leaves the timeline out",
                    }
                ],
                "responses": _responses({200: _ok("The job", "Job")}, 401, 404, 429),
            },
            "delete": {
                "operationId": "cancelJob",
                "summary": "Ask to cancel a queued or running job",
                "responses": _responses(
                    {202: _ok("Cancel recorded", "CancelAccepted")}, 401, 404, 409, 429, 503
                ),
            },
        },
        "/v1/jobs/{job_id}/events": {
            "parameters": [_JOB_ID],
            "get": {
                "operationId": "jobEvents",
                "summary": "Server-sent events of a job",
                "description": "text/event-stream: one event per timeline entry (event: the "
                "event type, id: the entry's seq, data: a TimelineEntry as "
                "JSON), then `event: end` with {job_id, state} after the "
                "terminal entry. Comment lines keep the stream open. Reconnect "
                "with Last-Event-ID to resume after the last id received.",
                "parameters": [
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                    {
                        "name": "last_event_id",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "the same as the header, for clients that cannot set it",
                    },
                ],
                "responses": _responses(
                    {
                        200: {
                            "description": "The event stream",
                            "content": {"text/event-stream": {"schema": ref("JobEvent")}},
                        }
                    },
                    401,
                    404,
                )
                | {
                    "429": _error(
                        429,
                        "Over the tenant's rate limit, or the API key or tenant already holds "
                        "its limit of open event streams; retry after Retry-After seconds",
                    )
                },
            },
        },
        "/v1/jobs/{job_id}/result": {
            "parameters": [_JOB_ID],
            "get": {
                "operationId": "jobResult",
                "summary": "A signed, expiring URL of the result",
                "parameters": [
                    {
                        "name": "redirect",
                        "in": "query",
                        "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
                        "description": "1 or true: answer 302 to the signed URL",
                    }
                ],
                "responses": _responses(
                    {
                        200: _ok("The signed URL", "Result"),
                        302: {
                            "description": "Redirect to the signed URL",
                            "headers": {"Location": {"schema": {"type": "string"}}},
                        },
                    },
                    401,
                    404,
                    409,
                    429,
                    503,
                ),
            },
        },
        "/v1/artifacts/{key}": {
            "get": {
                "operationId": "getArtifact",
                "summary": "Download through a signed URL",
                "description": "The URL's tenant, expires and sig are the credentials; they "
                "are bound to the job, run and tenant whose result it is. A tampered, expired "
                "or rebound URL answers 403. Served as an attachment (Content-Disposition), "
                "never rendered.",
                "security": _PUBLIC,
                "parameters": [
                    {
                        "name": "key",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1},
                    },
                    {
                        "name": "tenant",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "expires",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {"name": "sig", "in": "query", "required": True, "schema": {"type": "string"}},
                ],
                "responses": _responses(
                    {200: {"description": "The artifact", "content": {"*/*": {"schema": {}}}}},
                    403,
                    404,
                ),
            },
        },
    }


def _deployment_paths() -> dict[str, Any]:
    return {
        "/v1/cluster": {
            "get": {
                "operationId": "getCluster",
                "summary": "GPU map, totals and queue depths",
                "parameters": [
                    {
                        "name": "detail",
                        "in": "query",
                        "schema": {"type": "string", "enum": ["0", "1"]},
                        "description": "0 leaves the per-node GPU map out",
                    }
                ],
                "description": "Totals (GPUs by state, queue depth by tier) cover everyone; "
                "the per-tenant queue rows and the job ids on GPUs are the caller's own only. "
                "Send the ETag back in If-None-Match: 304 while the document is unchanged.",
                "responses": _responses(
                    {
                        200: _ok(
                            "The cluster view",
                            "Cluster",
                            headers={"ETag": {"schema": {"type": "string"}}},
                        )
                    },
                    401,
                    429,
                )
                | {"304": {"description": "Unchanged since the ETag sent in If-None-Match"}},
            },
        },
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "summary": "The models the caller's tenant may submit, with their defaults",
                "description": "Each model the deployment serves (its [[profiles]]) and the "
                "tenant may run: its GPU limits and default, its run-time estimate, what it "
                "produces, whether it checkpoints; the default model and the tenant's tiers.",
                "responses": _responses({200: _ok("The models", "Models")}, 401, 429),
            },
        },
        "/v1/webhook-secret": {
            "post": {
                "operationId": "rotateWebhookSecret",
                "summary": "A new webhook signing secret for the caller's tenant",
                "description": "Each tenant has its own secret. The new one is returned once "
                "and signs every webhook from now on (Framespool-Signature: t=<unix s>,"
                "v1=<hex HMAC-SHA256(secret, '<t>.<body>')>). A tenant may rotate once a "
                "minute (429 rotation_too_soon with Retry-After otherwise).",
                "responses": _responses(
                    {
                        200: _ok(
                            "The new secret (shown once)",
                            "WebhookSecret",
                            headers={"Cache-Control": {"schema": {"type": "string"}}},
                        )
                    },
                    401,
                    429,
                    503,
                )
                | {"404": _error(404, "This deployment delivers no webhooks")},
            },
        },
    }


def _service_paths() -> dict[str, Any]:
    return {
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness of the API and its background tasks",
                "security": _PUBLIC,
                "responses": {
                    "200": _ok("Healthy", "Health"),
                    "503": _ok("A background task stopped", "Health"),
                },
            },
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (the operator's: every tenant's figures)",
                "description": "Needs the operator key (not a tenant's API key) as a bearer "
                "token; answers 404 where the deployment serves metrics on its own address.",
                "security": [{"operatorKey": []}],
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": _error(401, "Not the operator key"),
                    "404": _error(404, "Metrics are served on the operator's own address"),
                },
            },
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": _PUBLIC,
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": json_content({"type": "object"}),
                    }
                },
            },
        },
    }
