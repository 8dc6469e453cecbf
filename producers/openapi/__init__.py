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

from framespool.producers.openapi.paths import paths
from framespool.producers.openapi.schemas import ERROR_CODES, schemas
from framespool.producers.validation import Limits

__all__ = ["ERROR_CODES", "build", "documented_routes"]


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
