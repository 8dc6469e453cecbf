"""The OpenAPI document's component schemas, with the bounds the validation applies
(``framespool.producers.validation.Limits``) and the error codes the API answers."""

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
    "body_timeout",
    "disk_full",
    "storage_quota",
    "result_expired",
    "rotation_too_soon",
)
NAME_PATTERN = patterns.schema(patterns.NAME)
CURSOR_PATTERN = patterns.schema(patterns.CURSOR)
IDEMPOTENCY_KEY_PATTERN = patterns.schema(patterns.IDEMPOTENCY_KEY)


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


# --------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------


def _submit_schema(limits: Limits) -> dict[str, Any]:
    name = {"type": "string", "pattern": NAME_PATTERN}
    model: dict[str, Any] = {**name, "description": "the generator model, e.g. 'demo'"}
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
        "model_version": nullable(name),
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
        "gpu_type": nullable(name),
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
        "phase": nullable(s),
        "reason": nullable(s),
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
        "callback_url": nullable(s),
        "cell": nullable(s),
        "run": i,
        "nodes": {"type": "array", "items": s},
        "assigned_gpus": i,
        "progress": {"type": "number", "minimum": 0, "maximum": 1},
        "step": i,
        "total_steps": i,
        "progress_message": nullable(s),
        "wait_estimate_s": nullable(n),
        "wait_p50_s": nullable(n),
        "wait_p90_s": nullable(n),
        "position": nullable(i),
        "reason_code": {
            "type": ["string", "null"],
            "description": "while it waits, why, as a code (reason has the words): "
            + ", ".join(WaitCode),
        },
        "artifact_uri": nullable(s),
        "created_ms": i,
        "updated_ms": i,
        "started_ms": nullable(i),
        "finished_ms": nullable(i),
        "ignored_events": i,
    }
    required = list(props)
    if with_timeline:
        props["timeline"] = {"type": "array", "items": ref("TimelineEntry")}
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
            "job_id": nullable(s),
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
            "totals": ref("GpuTotals"),
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
            "totals": ref("GpuTotals"),
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
                "jobs": {"type": "array", "items": ref("JobSummary")},
                "next_cursor": nullable({"type": "string", "pattern": CURSOR_PATTERN}),
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
                    "contentSchema": {"oneOf": [ref("TimelineEntry"), ref("StreamEnd")]},
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
            "description": nullable(s),
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
                "properties": {"name": nullable(s), "content_type": nullable(s)},
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
            "default_model": nullable(s),
            "tiers": {"type": "array", "items": s, "description": "the caller's tenant's tiers"},
            "default_tier": s,
        },
    }
