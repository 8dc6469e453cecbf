"""The OpenAPI 3.1 document of the HTTP API, built from the limits the handlers enforce.

``build(limits, ...)`` returns the document ``GET /openapi.json`` serves. The
request schema takes its bounds from the same ``Limits`` that
``framespool.producers.validation`` applies, so the document cannot drift from the
validation; a unit test checks that every route of the app is described and
a schemathesis run checks that the handlers' answers conform to it.

Some rules are wider than a schema can say (``gpus_per_node`` must divide
``gpus``; ``tier`` must be one of the tenant's tiers; a callback must resolve
to a public address): the schema says them in descriptions, and the API
answers 403/422 naming the field.
"""

from __future__ import annotations

from typing import Any

from framespool.producers import patterns
from framespool.producers.validation import FIELDS, Limits
from framespool.projections.jobs import STATES
from framespool.schemas.waits import WaitCode

ERROR_CODES = (
    "unauthenticated",
    "forbidden",
    "invalid_field",
    "unknown_field",
    "invalid_body",
    "invalid_header",
    "malformed_json",
    "body_too_large",
    "tier_not_allowed",
    "model_not_allowed",
    "job_not_found",
    "job_terminal",
    "idempotency_key_reused",
    "not_completed",
    "artifact_unavailable",
    "no_artifact_store",
    "log_unavailable",
    "bad_signature",
    "artifact_not_found",
    "not_found",
    "method_not_allowed",
    "rate_limited",
    "queue_full",
    "predicted_wait",
    "too_many_streams",
    "webhooks_unavailable",
    "secret_not_stored",
    "http_error",
)
NAME_PATTERN = patterns.schema(patterns.NAME)
CURSOR_PATTERN = patterns.schema(patterns.CURSOR)
IDEMPOTENCY_KEY_PATTERN = patterns.schema(patterns.IDEMPOTENCY_KEY)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


# --------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------
def _submit_schema(limits: Limits) -> dict[str, Any]:
    name = {"type": "string", "pattern": NAME_PATTERN}
    model = {**name, "description": "the generator model, e.g. 'demo'"}
    if limits.models is not None:
        model["enum"] = sorted(limits.models)
    if limits.default_model:
        model["default"] = limits.default_model
        model["description"] += f"; default: {limits.default_model!r}"
    params = {
        "type": ["object", "null"],
        "description": f"generator parameters; at most {limits.params_max_bytes} bytes as "
        "compact JSON. Numbers and booleans are stored as strings.",
        "propertyNames": {"pattern": patterns.schema(patterns.PARAM_KEY)},
        "properties": {
            "resolution": {
                "type": "string",
                "anyOf": [
                    {"pattern": patterns.schema(patterns.RESOLUTION)},
                    {"enum": list(patterns.RESOLUTION_PRESETS)},
                ],
                "description": f"WIDTHxHEIGHT, each even, {limits.resolution_min}"
                f"-{limits.resolution_max}; or a preset ("
                + ", ".join(f"{k} = {v}" for k, v in patterns.RESOLUTION_PRESETS.items())
                + "), stored as WIDTHxHEIGHT",
            },
            "duration_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": limits.duration_max_s,
            },
            "fps": {"type": "integer", "minimum": limits.fps_min, "maximum": limits.fps_max},
            "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        },
        "additionalProperties": {
            "anyOf": [
                {"type": "string", "maxLength": limits.param_value_max_chars},
                {"type": "number"},
                {"type": "boolean"},
            ]
        },
    }
    gpus = {"type": "integer", "minimum": 1, "maximum": limits.gpus_max, "default": 1}
    per_node = {
        "type": "integer",
        "minimum": 1,
        "maximum": limits.gpus_per_node_max,
        "description": "GPUs per node; must divide gpus when the job spans nodes",
    }
    shape = {
        "type": "object",
        "additionalProperties": False,
        "required": ["estimate_s"],
        "properties": {
            "gpus": gpus,
            "gpus_per_node": per_node,
            "estimate_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": limits.estimate_max_s,
            },
        },
    }
    props: dict[str, Any] = {
        "prompt": {
            "type": "string",
            "minLength": 1,
            "maxLength": limits.prompt_max_chars,
            "description": "what the video shows; not blank, no NUL characters",
        },
        "model": model,
        "model_version": _nullable(name),
        "params": params,
        "gpus": gpus,
        "gpus_per_node": per_node,
        "tier": {
            "type": "string",
            "description": "one of the tenant's tiers; default: the "
            "tenant's default tier (403 otherwise)",
        },
        "preemptible": {"type": "boolean", "default": False},
        "callback_url": {
            "type": ["string", "null"],
            "format": "uri",
            "maxLength": limits.callback_url_max,
            "description": "http(s) webhook target; private, loopback and "
            "link-local addresses (also via DNS) are refused",
        },
        "shapes": {
            "type": ["array", "null"],
            "maxItems": limits.shapes_max,
            "items": shape,
            "description": "alternative gang shapes the scheduler may pick from",
        },
        "estimate_s": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": limits.estimate_max_s,
        },
        "checkpoint_interval_s": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": 3600,
            "not": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "description": "Seconds between checkpoints: 0 (none) or 1 to 3600",
        },
        "gpu_type": _nullable(name),
        "cpus": {"type": ["number", "null"], "minimum": 0, "maximum": 1024},
        "mem_gb": {"type": ["number", "null"], "minimum": 0, "maximum": 8192},
    }
    assert set(props) == set(FIELDS), (
        "the schema and framespool.producers.validation.FIELDS disagree"
    )
    return {
        "type": "object",
        "required": ["prompt"] if limits.default_model else ["prompt", "model"],
        "additionalProperties": False,
        "properties": props,
    }


def _job_schema(with_timeline: bool) -> dict[str, Any]:
    s, i, n, b = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
    props = {
        "job_id": s,
        "tenant": s,
        "user": s,
        "state": {"type": "string", "enum": list(STATES)},
        "phase": _nullable(s),
        "reason": _nullable(s),
        "tier": s,
        "model": s,
        "model_version": s,
        "prompt": s,
        "params": {"type": "object", "additionalProperties": s},
        "gpus": i,
        "gpus_per_node": i,
        "preemptible": b,
        "shapes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"gpus": i, "gpus_per_node": i, "estimate_s": n},
            },
        },
        "callback_url": _nullable(s),
        "cell": _nullable(s),
        "run": i,
        "nodes": {"type": "array", "items": s},
        "assigned_gpus": i,
        "progress": {"type": "number", "minimum": 0, "maximum": 1},
        "step": i,
        "total_steps": i,
        "progress_message": _nullable(s),
        "wait_estimate_s": _nullable(n),
        "wait_p50_s": _nullable(n),
        "wait_p90_s": _nullable(n),
        "position": _nullable(i),
        "reason_code": {
            "type": ["string", "null"],
            "description": "while it waits, why, as a code (reason has the words): "
            + ", ".join(WaitCode),
        },
        "artifact_uri": _nullable(s),
        "created_ms": i,
        "updated_ms": i,
        "started_ms": _nullable(i),
        "finished_ms": _nullable(i),
        "ignored_events": i,
    }
    required = list(props)
    if with_timeline:
        props["timeline"] = {"type": "array", "items": _ref("TimelineEntry")}
    return {"type": "object", "required": required, "properties": props}


def _cluster_schemas() -> dict[str, dict[str, Any]]:
    i, s = {"type": "integer"}, {"type": "string"}
    totals = {
        "type": "object",
        "required": ["busy", "free", "degraded", "down", "total", "nodes"],
        "properties": {k: i for k in ("busy", "free", "degraded", "down", "total", "nodes")},
    }
    depth = {
        "type": "object",
        "additionalProperties": {
            "type": "object",
            "required": ["queued", "queued_gpus", "running_gpus"],
            "properties": {"queued": i, "queued_gpus": i, "running_gpus": i},
        },
    }
    gpu = {
        "type": "object",
        "required": ["index", "state", "bucket", "job_id", "run"],
        "properties": {
            "index": i,
            "state": s,
            "bucket": {"type": "string", "enum": ["busy", "free", "degraded", "down"]},
            "job_id": _nullable(s),
            "run": i,
        },
    }
    node = {
        "type": "object",
        "required": ["node_id", "state", "gpus"],
        "properties": {
            "node_id": s,
            "state": s,
            "gpu_type": s,
            "rail": s,
            "gpus": {"type": "array", "items": gpu},
        },
    }
    cell = {
        "type": "object",
        "required": ["cell", "ts_ms", "totals"],
        "properties": {
            "cell": s,
            "ts_ms": i,
            "totals": _ref("GpuTotals"),
            "nodes": {"type": "array", "items": node, "description": "absent with ?detail=0"},
        },
    }
    breaker = {
        "type": "object",
        "properties": {
            "model_version": s,
            "scope": s,
            "key": s,
            "until_ms": i,
            "reason": s,
            "active": {"type": "boolean"},
        },
    }
    cluster = {
        "type": "object",
        "required": ["updated_ms", "totals", "queues", "cells", "breakers"],
        "properties": {
            "updated_ms": i,
            "totals": _ref("GpuTotals"),
            "queues": {
                "type": "object",
                "required": ["by_tier", "by_tenant"],
                "properties": {"by_tier": depth, "by_tenant": depth},
            },
            "cells": {"type": "array", "items": cell},
            "breakers": {"type": "array", "items": breaker},
        },
    }
    return {"GpuTotals": totals, "Cluster": cluster}


def schemas(limits: Limits) -> dict[str, dict[str, Any]]:
    s, i = {"type": "string"}, {"type": "integer"}
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "additionalProperties": False,
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {
                        "code": {"type": "string", "examples": list(ERROR_CODES)},
                        "message": {
                            "type": "string",
                            "description": "what is wrong and what to do",
                        },
                        "field": {"type": "string", "description": "the offending field or header"},
                    },
                }
            },
        },
        "JobSubmit": _submit_schema(limits),
        "Accepted": {
            "type": "object",
            "required": ["job_id", "state", "status_url", "events_url"],
            "properties": {
                "job_id": s,
                "state": {"type": "string", "enum": list(STATES)},
                "status_url": s,
                "events_url": s,
            },
        },
        "TimelineEntry": {
            "type": "object",
            "required": ["job_id", "seq", "event_id", "ts_ms", "type", "state", "summary"],
            "properties": {
                "job_id": s,
                "seq": i,
                "event_id": s,
                "ts_ms": i,
                "type": s,
                "state": s,
                "summary": s,
                "status": {
                    "type": "object",
                    "description": "in an event stream: where the job stands as the event "
                    "is sent (its state; while it waits, why, its position and its band)",
                    "properties": {
                        "state": s,
                        "phase": {"type": ["string", "null"]},
                        "reason": {"type": ["string", "null"]},
                        "reason_code": {"type": ["string", "null"]},
                        "position": {"type": ["integer", "null"]},
                        "wait_p50_s": {"type": ["number", "null"]},
                        "wait_p90_s": {"type": ["number", "null"]},
                        "progress": {"type": "number"},
                    },
                },
            },
        },
        "Job": _job_schema(True),
        "JobSummary": _job_schema(False),
        "JobList": {
            "type": "object",
            "required": ["jobs", "next_cursor"],
            "properties": {
                "jobs": {"type": "array", "items": _ref("JobSummary")},
                "next_cursor": _nullable({"type": "string", "pattern": CURSOR_PATTERN}),
            },
        },
        "CancelAccepted": {
            "type": "object",
            "required": ["job_id", "state", "cancel_requested"],
            "properties": {"job_id": s, "state": s, "cancel_requested": {"const": True}},
        },
        "Result": {
            "type": "object",
            "required": ["job_id", "url", "expires_in_s", "expires_at_ms", "artifact_uri"],
            "properties": {
                "job_id": s,
                "url": {"type": "string", "format": "uri"},
                "expires_in_s": i,
                "expires_at_ms": i,
                "artifact_uri": s,
            },
        },
        # One server-sent event (the schema of each event of the stream, as OpenAPI 3.2's
        # itemSchema would say): data is JSON, a TimelineEntry or, for event "end", StreamEnd.
        "JobEvent": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "event": {"type": "string", "description": "the timeline entry's type, or 'end'"},
                "id": {
                    "type": "string",
                    "pattern": patterns.schema(patterns.DIGITS),
                    "description": "the entry's seq: send it back as Last-Event-ID",
                },
                "retry": {"type": "integer"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"oneOf": [_ref("TimelineEntry"), _ref("StreamEnd")]},
                },
            },
        },
        "StreamEnd": {
            "type": "object",
            "required": ["job_id", "state"],
            "additionalProperties": False,
            "properties": {"job_id": s, "state": {"type": "string", "enum": list(STATES)}},
        },
        "WebhookSecret": {
            "type": "object",
            "required": ["tenant", "webhook_secret", "signature_header"],
            "properties": {
                "tenant": s,
                "webhook_secret": {
                    "type": "string",
                    "description": "shown once; webhooks are signed with it from now on",
                },
                "signature_header": s,
                "note": s,
            },
        },
        "Health": {
            "type": "object",
            "required": ["status", "stopped_background_tasks"],
            "properties": {
                "status": {"type": "string", "enum": ["ok", "degraded"]},
                "stopped_background_tasks": {"type": "array", "items": s},
            },
        },
        **_cluster_schemas(),
        "Models": _models_schema(),
    }


def _models_schema() -> dict[str, Any]:
    s, i = {"type": "string"}, {"type": "integer"}
    model = {
        "type": "object",
        "required": ["name", "default", "gpus", "estimate_s", "output", "checkpoints"],
        "properties": {
            "name": s,
            "default": {"type": "boolean", "description": "the model of a job that names none"},
            "description": _nullable(s),
            "gpus": {
                "type": "object",
                "description": "GPUs a job of this model may ask for, and what it gets if it "
                "asks for none",
                "properties": {"min": i, "max": i, "default": i},
            },
            "estimate_s": {
                "type": "number",
                "description": "run-time estimate of a job that gives none",
            },
            "output": {
                "type": "object",
                "properties": {"name": _nullable(s), "content_type": _nullable(s)},
            },
            "checkpoints": {
                "type": "boolean",
                "description": "whether its runs checkpoint (and so can be preempted and resume)",
            },
        },
    }
    return {
        "type": "object",
        "required": ["models", "default_model", "tiers", "default_tier"],
        "properties": {
            "models": {"type": "array", "items": model},
            "default_model": _nullable(s),
            "tiers": {"type": "array", "items": s, "description": "the caller's tenant's tiers"},
            "default_tier": s,
        },
    }


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
        "content": _json(_ref("Error")),
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
    return {"description": description, "content": _json(_ref(schema_name)), **extra}


_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
}
_PUBLIC: list[dict[str, Any]] = []  # ``security: []``: no API key


def paths() -> dict[str, Any]:
    location = {"Location": {"description": "the job's status URL", "schema": {"type": "string"}}}
    accepted = {
        "description": "Recorded; the job is in the log",
        "content": _json(_ref("Accepted")),
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
                "requestBody": {"required": True, "content": _json(_ref("JobSubmit"))},
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
                            "content": {"text/event-stream": {"schema": _ref("JobEvent")}},
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
                    "200": {"description": "OpenAPI 3.1", "content": _json({"type": "object"})}
                },
            },
        },
    }


def build(
    limits: Limits = Limits(),
    *,
    max_body_bytes: int = 64 * 1024,
    server_url: str | None = None,
    version: str = "1",
) -> dict[str, Any]:
    """The whole document; ``max_body_bytes`` is the API's request body limit (413 above)."""
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "framespool",
            "version": version,
            "description": "Submit long-running GPU jobs (video generation), follow them "
            "live, fetch their results. Every error is "
            "{\"error\": {\"code\", \"message\", \"field\"?}}. Request "
            f"bodies are limited to {max_body_bytes} bytes (413 above). "
            "A tenant sees only its own jobs.",
        },
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "paths": paths(),
        "components": {
            "schemas": schemas(limits),
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Authorization: Bearer <API key>",
                },
                "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "operatorKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Authorization: Bearer <operator key> (/metrics only)",
                },
            },
        },
        "security": [{"bearerAuth": []}, {"apiKeyHeader": []}],
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc


def documented_routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """(METHOD, path template) of every operation in ``doc``."""
    out = set()
    for path, item in doc["paths"].items():
        for method in item:
            if method in ("get", "post", "put", "patch", "delete"):
                out.add((method.upper(), path))
    return out
