"""The OpenAPI document: valid 3.1, describes every route the app has, and carries the
limits the validation enforces (schemathesis checks the handlers against it, e2e)."""

from __future__ import annotations

import asyncio

import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from framespool.log.memory import MemoryProducer
from framespool.producers import openapi
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.validation import FIELDS, Limits, ValidationError, validate_submit
from framespool.projections import cluster
from framespool.projections.jobs import STATES, fold
from framespool.projections.serde import public_job
from framespool.projections.store import InMemoryViewStore
from tests.support.projections import cell_status, lifecycle

KEY = "acme-key.alice-secret"


def app_config(**kw) -> ApiConfig:
    keys = ApiKeys(
        [record_for(KEY, "acme", "alice")], {"acme": TenantPolicy(("enterprise", "free"), "free")}
    )
    return ApiConfig(auth=keys, store=InMemoryViewStore(), producer=MemoryProducer(), **kw)


def served_doc(**kw) -> dict:
    async def go():
        async with TestClient(TestServer(make_app(app_config(**kw)))) as client:
            resp = await client.get("/openapi.json")
            assert resp.status == 200 and resp.content_type == "application/json"
            return await resp.json()

    return asyncio.run(go())


def resolve(doc: dict, schema: dict) -> jsonschema.protocols.Validator:
    """A validator of one component schema whose $refs into the document resolve."""
    return jsonschema.validators.Draft202012Validator({**schema, "components": doc["components"]})


def test_served_document_is_valid_openapi_3_1():
    doc = served_doc()
    assert doc["openapi"] == "3.1.0"
    validate(doc)  # openapi-spec-validator picks the 3.1 validator from "openapi"


def test_every_route_of_the_app_is_documented_and_nothing_else():
    app = make_app(app_config())
    routes = set()
    for route in app.router.routes():
        info = route.resource.get_info()
        path = info.get("path") or info.get("formatter")
        if route.method == "HEAD" or path == "/" or path.startswith("/dashboard"):
            continue
        routes.add((route.method, path.replace("{key:.+}", "{key}")))
    documented = openapi.documented_routes(served_doc())
    assert routes == documented


def test_request_schema_carries_the_validation_limits():
    limits = Limits(
        prompt_max_chars=123, gpus_max=16, params_max_bytes=999, models=frozenset({"demo", "wan"})
    )
    doc = openapi.build(limits, max_body_bytes=4096)
    submit = doc["components"]["schemas"]["JobSubmit"]
    assert set(submit["properties"]) == set(FIELDS)
    assert submit["additionalProperties"] is False and submit["required"] == ["prompt", "model"]
    assert submit["properties"]["prompt"]["maxLength"] == 123
    assert submit["properties"]["gpus"]["maximum"] == 16
    assert submit["properties"]["model"]["enum"] == ["demo", "wan"]
    assert "999 bytes" in submit["properties"]["params"]["description"]
    assert "4096 bytes" in doc["info"]["description"]


def test_security_scheme_and_public_endpoints():
    doc = served_doc()
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "Authorization: Bearer <API key>",
    }
    assert {"bearerAuth": []} in doc["security"]
    for path in ("/healthz", "/openapi.json", "/v1/artifacts/{key}"):
        assert doc["paths"][path]["get"]["security"] == [], path
    # metrics carry every tenant's figures: the operator's key, not a tenant's, nor none
    assert doc["paths"]["/metrics"]["get"]["security"] == [{"operatorKey": []}]
    assert "security" not in doc["paths"]["/v1/jobs"]["post"]


def test_errors_share_one_schema_and_429_says_retry_after():
    doc = served_doc()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            for status, response in op["responses"].items():
                if status.startswith("4") and path not in ("/healthz",):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (path, status)
    submit = doc["paths"]["/v1/jobs"]["post"]["responses"]
    assert {"400", "401", "403", "409", "413", "422", "429", "503"} <= set(submit)
    assert "Retry-After" in submit["429"]["headers"]


def test_sse_endpoint_is_text_event_stream():
    op = served_doc()["paths"]["/v1/jobs/{job_id}/events"]["get"]
    assert list(op["responses"]["200"]["content"]) == ["text/event-stream"]
    assert {p["name"] for p in op["parameters"]} == {"Last-Event-ID", "last_event_id"}


def test_a_body_the_schema_rejects_the_validation_rejects_too():
    """Spot checks that the two agree at the bounds (the schema is no wider)."""
    doc = openapi.build()
    schema = resolve(doc, doc["components"]["schemas"]["JobSubmit"])
    policy = TenantPolicy(("free",))
    good = {
        "prompt": "fox",
        "model": "demo",
        "gpus": 8,
        "gpus_per_node": 8,
        "params": {"resolution": "128x72", "fps": 8, "duration_s": 2, "seed": 1},
        "shapes": [{"gpus": 8, "estimate_s": 10}],
        "callback_url": None,
    }
    schema.validate(good)
    validate_submit(good, policy)
    for bad in (
        {**good, "prompt": "x" * 4001},
        {**good, "gpus": 65},
        {**good, "gpus": 0},
        {**good, "params": {"fps": 61}},
        {**good, "params": {"Bad": 1}},
        {**good, "extra": 1},
        {**good, "preemptible": None},
        {**good, "shapes": [{"gpus": 1}]},
        {"model": "demo"},
        {**good, "model": "-bad"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            schema.validate(bad)
        with pytest.raises(ValidationError):
            validate_submit(bad, policy)


def test_response_schemas_accept_what_the_handlers_return():
    doc = openapi.build()
    schemas = doc["components"]["schemas"]
    view = fold(lifecycle("job-1", runs=2))
    resolve(doc, schemas["Job"]).validate(public_job(view))
    resolve(doc, schemas["JobSummary"]).validate(public_job(view, timeline=False))
    cv = cluster.apply(None, cell_status("cell-0", 1_000, busy=3))
    resolve(doc, schemas["Cluster"]).validate(cluster.to_dict(cv, 2_000))
    resolve(doc, schemas["Cluster"]).validate(cluster.to_dict(cv, 2_000, detail=False))
    assert schemas["Job"]["properties"]["state"]["enum"] == list(STATES)


def _answered_codes() -> dict[str, str]:
    """Every error code a handler or the validation can answer (code -> where), read
    from the source: ``ApiError(status, CODE, ...)``, ``error_body(status, CODE,
    ...)``, ``ValidationError(field, message, status, CODE)`` and the middleware's status map."""
    import ast
    import importlib
    from pathlib import Path

    folder = Path(openapi.__file__).resolve().parent.parent
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.name == "client.py":
            continue  # the Python client's own errors, not answers of the API
        module = importlib.import_module(f"framespool.producers.{path.stem}")
        for node in ast.walk(ast.parse(path.read_text())):
            values: list[ast.expr] = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("ApiError", "error_body") and len(node.args) > 1:
                    values.append(node.args[1])
                if node.func.id == "ValidationError":  # (field, message, status, code)
                    values += [k.value for k in node.keywords if k.arg == "code"]
                    values += node.args[3:4]
            if isinstance(node, ast.Dict) and all(
                isinstance(k, ast.Constant) and isinstance(k.value, int) and 400 <= k.value < 600
                for k in node.keys
            ):
                values += node.values  # the middleware's {404: "not_found", ...}
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found[value.value] = path.name
                elif isinstance(value, ast.Name) and isinstance(
                    getattr(module, value.id, None), str
                ):
                    found[getattr(module, value.id)] = path.name
    return found


def test_every_error_code_the_api_answers_is_documented():
    """A code a handler answers but the document does not list is a contract a client
    cannot read; one the document lists that nothing answers is a stale promise."""
    answered = _answered_codes()
    assert len(answered) > 20  # the scan sees the handlers
    missing = {code: where for code, where in answered.items() if code not in openapi.ERROR_CODES}
    assert not missing, f"answered but not in ERROR_CODES: {missing}"
    stale = set(openapi.ERROR_CODES) - set(answered) - {"http_error"}
    assert not stale, f"in ERROR_CODES but never answered: {sorted(stale)}"
