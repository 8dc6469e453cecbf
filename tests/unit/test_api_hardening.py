"""The smaller holes of the hostile-tenants review, each played as the request that found it.

Names with a trailing newline, lone surrogates, deeply nested JSON, unknown
models, idempotency keys reused with other resources, SigV2 presigned URLs,
artifacts rendered on the dashboard's origin, fec0::/10 callbacks, unkeyed
floods and secrets in logs; and what the API accepts where users commonly
send something else (a default model, resolution presets).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from urllib.parse import urlsplit

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.agents.artifacts import LocalDirStore
from framespool.callbacks.targets import check_target
from framespool.log.memory import MemoryProducer
from framespool.producers import openapi
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.validation import Limits, ValidationError, validate_submit
from framespool.projections.jobs import fold
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.schemas import codec
from framespool.schemas.events import SubmitJob
from framespool.schemas.topics import COMMANDS
from framespool.telemetry.jsonlog import JsonFormatter, redact
from tests.support.api import run
from tests.support.projections import lifecycle

KEY = "acme-key.alice-secret"
H = {"Authorization": f"Bearer {KEY}"}
BODY = {"prompt": "a red fox", "model": "demo"}


@contextlib.asynccontextmanager
async def api(tmp_path=None, **overrides):
    keys = ApiKeys([record_for(KEY, "acme", "alice")], {"acme": TenantPolicy(("free",))})
    if tmp_path is not None:
        overrides.setdefault(
            "artifacts",
            LocalDirStore(tmp_path / "artifacts", url_base="http://api.test", secret=b"k"),
        )
    config = ApiConfig(auth=keys, store=InMemoryViewStore(), producer=MemoryProducer(), **overrides)
    async with TestClient(TestServer(make_app(config))) as client:
        yield client, config


def submitted(config) -> list:
    return [
        e
        for e in (codec.decode(s.value) for s in config.producer.on(COMMANDS.name))
        if isinstance(e, SubmitJob)
    ]


# -- names, encodings, nesting -------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [("model", "demo\n"), ("gpu_type", "H100\n"), ("model_version", "v1\n")],
)
def test_a_trailing_newline_is_not_part_of_a_valid_name(field, value):
    with pytest.raises(ValidationError) as err:
        validate_submit({**BODY, field: value}, TenantPolicy())
    assert err.value.field == field


def test_trailing_newlines_in_query_and_param_names_are_refused():
    async def go():
        async with api() as (client, _):
            r = await client.get("/v1/jobs", params={"cursor": "1700000000000/job_1\n"}, headers=H)
            assert r.status == 422 and (await r.json())["error"]["field"] == "cursor"
            r = await client.post("/v1/jobs", json={**BODY, "params": {"seed\n": 1}}, headers=H)
            assert r.status == 422

    run(go())


def test_lone_surrogates_are_a_422_naming_the_field_not_a_503():
    async def go():
        async with api() as (client, config):
            raw = '{"prompt": "a fox \\ud800", "model": "demo"}'
            r = await client.post("/v1/jobs", data=raw, headers=H)
            assert r.status == 422, await r.text()
            assert (await r.json())["error"]["field"] == "prompt"
            raw = '{"prompt": "a fox", "model": "demo", "params": {"style": "\\udfff"}}'
            r = await client.post("/v1/jobs", data=raw, headers=H)
            assert r.status == 422 and (await r.json())["error"]["field"] == "params.style"
            assert submitted(config) == []

    run(go())


def test_deeply_nested_json_is_a_400_not_a_500():
    async def go():
        async with api() as (client, _):
            deep = "[" * 20_000 + "]" * 20_000
            r = await client.post("/v1/jobs", data=deep, headers=H)
            assert r.status == 400 and (await r.json())["error"]["code"] == "malformed_json"
            nested = '{"prompt": "x", "model": "demo", "params": {"a": ' + "[" * 5000
            nested += "]" * 5000 + "}}"
            r = await client.post("/v1/jobs", data=nested, headers=H)
            assert r.status in (400, 422)

    run(go())


# -- models and presets -------------------------------------------------------
def test_the_deployment_serves_only_its_profiles_models_and_defaults_to_one():
    from framespool import bootstrap as services
    from framespool.agents.profiles import load_profiles

    limits = services.api_limits()
    assert limits.models == frozenset(load_profiles())
    with pytest.raises(ValidationError) as err:
        validate_submit({**BODY, "model": "sora-9000"}, TenantPolicy(), limits)
    assert err.value.field == "model" and "demo" in err.value.message
    spec = validate_submit({"prompt": "a fox"}, TenantPolicy(), limits)
    assert spec["model"] == limits.default_model == "demo"


def test_without_a_default_model_the_error_lists_what_is_served():
    limits = Limits(models=frozenset({"demo", "noop"}))
    with pytest.raises(ValidationError) as err:
        validate_submit({"prompt": "a fox"}, TenantPolicy(), limits)
    assert err.value.field == "model" and "demo, noop" in err.value.message


@pytest.mark.parametrize(
    "given, stored",
    [("720p", "1280x720"), ("1080p", "1920x1080"), ("480p", "854x480"), ("1280x720", "1280x720")],
)
def test_resolution_presets_are_accepted_beside_width_x_height(given, stored):
    spec = validate_submit({**BODY, "params": {"resolution": given}}, TenantPolicy())
    assert spec["params"]["resolution"] == stored


def test_an_unknown_resolution_names_the_accepted_forms():
    with pytest.raises(ValidationError) as err:
        validate_submit({**BODY, "params": {"resolution": "999p"}}, TenantPolicy())
    assert "720p" in err.value.message and "WIDTHxHEIGHT" in err.value.message


# -- idempotency --------------------------------------------------------------
@pytest.mark.parametrize(
    "change",
    [{"estimate_s": 600.0}, {"gpu_type": "A100"}, {"cpus": 16.0}, {"mem_gb": 128.0}],
)
def test_an_idempotency_key_reused_for_other_resources_conflicts(change):
    async def go():
        async with api() as (client, config):
            headers = {**H, "Idempotency-Key": "k-1"}
            first = await client.post(
                "/v1/jobs", json={**BODY, "estimate_s": 60.0}, headers=headers
            )
            assert first.status == 202
            again = await client.post(
                "/v1/jobs", json={**BODY, "estimate_s": 60.0, **change}, headers=headers
            )
            assert again.status == 409, change
            assert len(submitted(config)) == 1

    run(go())


# -- artifacts ----------------------------------------------------------------
def test_s3_urls_are_presigned_with_sigv4(monkeypatch):
    from framespool.agents.artifacts import S3Store

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    store = S3Store("bucket", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
    url = store.signed_url("jobs/j1/runs/1/output/video.mp4", 60)
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url and "Signature=" not in url.split("X-Amz")[0]


def test_only_a_store_the_api_serves_has_its_artifacts_downloaded_here(tmp_path):
    """GET /v1/artifacts/... answers 404 unless the store names itself served
    (ArtifactStore.served(): a local directory); an S3 or in-memory store's URLs
    point elsewhere, and without a store there is nothing to serve."""
    from framespool.agents.artifacts.memory import MemoryArtifactStore

    async def go():
        path = "/v1/artifacts/jobs/job-a/runs/1/output/out?tenant=acme&expires=9&sig=00"
        for store in (MemoryArtifactStore(), None):
            async with api(artifacts=store) as (client, _):
                got = await client.get(path)
                assert got.status == 404
                assert (await got.json())["error"]["code"] == "not_found"
        async with api(tmp_path) as (client, _):
            assert (await client.get(path)).status == 403  # served: the signature is checked

    run(go())


def test_artifacts_are_downloads_never_pages_on_the_dashboard_origin(tmp_path):
    async def go():
        async with api(tmp_path) as (client, config):
            config.store.commit(Batch(views={"job-a": fold(lifecycle("job-a", "acme"))}))
            page = tmp_path / "evil.html"
            page.write_bytes(b"<script>steal(document.cookie)</script>")
            key = config.store.get("job-a").artifact_uri.removeprefix("local://")
            config.artifacts.put_file(key, page)
            result = await (await client.get("/v1/jobs/job-a/result", headers=H)).json()
            url = urlsplit(result["url"])
            got = await client.get(f"{url.path}?{url.query}")
            assert got.status == 200
            assert got.headers["X-Content-Type-Options"] == "nosniff"
            assert got.headers["Content-Disposition"].startswith("attachment")

    run(go())


# -- callbacks, floods, logs --------------------------------------------------
@pytest.mark.parametrize("host", ["[fec0::1]", "[fec0:1234::5]", "[feff::1]"])
def test_site_local_ipv6_callbacks_are_refused(host):
    assert check_target(f"http://{host}/hook") != ""


def test_requests_without_a_key_are_rate_limited_too():
    async def go():
        async with api(monotonic=lambda: 0.0) as (client, _):
            statuses = []
            for _ in range(200):
                r = await client.get("/v1/jobs", headers={"Authorization": "Bearer guess"})
                statuses.append(r.status)
            assert statuses[0] == 401 and 429 in statuses
            refused = await client.get("/v1/jobs")
            assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
            ok = await client.get("/v1/jobs", headers=H)  # a valid key is not held up
            assert ok.status == 200

    run(go())


@pytest.mark.parametrize(
    "line, secret",
    [
        ("request headers {'X-API-Key': 'acme-key.alice-secret'}", "alice-secret"),
        ('"x-api-key": "fsk1.abcdef"', "abcdef"),
        ("X-API-Key: fsk1.abcdef", "abcdef"),
        ("callback https://hooks.example.com/h?token=sekrit&x=1 failed", "sekrit"),
        ("webhook to http://h.example/cb?auth=sekrit2: refused", "sekrit2"),
    ],
)
def test_logs_never_carry_api_keys_or_callback_query_strings(line, secret):
    assert secret not in redact(line)
    record = logging.LogRecord("t", logging.INFO, "", 0, "%s", (line,), None)
    assert secret not in JsonFormatter().format(record)


_SECRET_BITS = st.sampled_from(
    [
        "Bearer ",
        "bEaReR\t",
        "?",
        "&",
        "sig=",
        "Signature=",
        "X-Amz-Credential=",
        "x-api-KEY",
        "X-API-Key: ",
        "'X-API-Key': '",
        "https://",
        "http://h/p?",
        "\u212a",
        "\u0130",
        "\u017f",
        "=",
        " ",
        "'",
        '"',
        "#",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_SECRET_BITS, st.text(max_size=8)), max_size=12).map("".join))
def test_redact_quick_check_never_changes_what_is_masked(text):
    """``redact`` skips the full pattern when no trigger occurs: that must mask
    exactly what the full pattern masks, for any text (case folding included)."""
    from framespool.telemetry.jsonlog import _mask

    assert redact(text) == _mask(text)


# -- one definition of each pattern -------------------------------------------
def test_openapi_and_validation_share_one_definition_of_each_pattern():
    from framespool.producers import patterns

    doc = openapi.build(Limits())
    props = doc["components"]["schemas"]["JobSubmit"]["properties"]
    assert props["model"]["pattern"] == patterns.schema(patterns.NAME)
    assert props["params"]["propertyNames"]["pattern"] == patterns.schema(patterns.PARAM_KEY)
    text = json.dumps(doc)
    assert json.dumps(patterns.schema(patterns.CURSOR)) in text
    assert json.dumps(patterns.schema(patterns.IDEMPOTENCY_KEY)) in text


def test_unkeyed_requests_are_charged_to_an_ipv4_address_or_an_ipv6_64():
    from framespool.producers.http import source_of

    assert source_of("2001:db8::1") == source_of("2001:db8::ffff") == "2001:db8::/64"
    assert source_of("::ffff:192.0.2.7") == source_of("192.0.2.7") == "192.0.2.7"


def test_routes_without_a_key_are_rate_limited_per_address():
    """Issue #33, 13: /openapi.json and the dashboard's assets had no limit at all."""
    from aiohttp.test_utils import TestClient, TestServer

    from framespool.log.memory import MemoryProducer
    from framespool.producers.api import ApiConfig, make_app
    from framespool.producers.auth import ApiKeys, record_for
    from framespool.producers.ratelimit import RateLimit
    from framespool.projections.store import InMemoryViewStore

    key = "acme-key.alice-secret"
    config = ApiConfig(
        auth=ApiKeys([record_for(key, "acme", "alice")]),
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        public_rate_limit=RateLimit(rate_per_s=0.001, burst=4),
    )

    async def go():
        async with TestClient(TestServer(make_app(config))) as client:
            statuses = [(await client.get("/openapi.json")).status for _ in range(3)]
            statuses.append((await client.get("/dashboard/index.html")).status)
            refused = await client.get("/dashboard/app.js")
            body = await refused.json()
            unknown = await client.get("/no/such/path")
            # a keyed route is charged to its tenant, not to the address's public bucket
            keyed = await client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"})
            return statuses, refused, body, unknown.status, keyed.status

    statuses, refused, body, unknown, keyed = asyncio.run(go())
    assert statuses == [200, 200, 200, 200]
    assert refused.status == 429 and int(refused.headers["Retry-After"]) > 0
    assert body["error"]["code"] == "rate_limited" and "without a key" in body["error"]["message"]
    assert unknown == 429 and keyed == 200
