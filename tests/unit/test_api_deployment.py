"""The API as a deployment file configures it (issue #32): the models its
``[[profiles]]`` declare with their GPU limits and defaults (``GET /v1/models``),
a default model, per-tier rate limits and queue caps, a tenant's own models and
limits, and a key table reloaded from the secrets file without a restart."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from framespool import bootstrap as services
from framespool import stack_secrets
from framespool.configfile import ConfigError
from framespool.log.memory import MemoryProducer
from framespool.processors.config_file import TenantEntry, UserEntry
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.settings import api_settings
from framespool.projections.store import InMemoryViewStore
from framespool.projections.webhooks import TargetPolicy
from framespool.schemas import codec
from framespool.schemas.topics import COMMANDS

DEPLOYMENT = """
[api]
default_model = "flipbook"
[api.tiers.free]
rate_per_s = 2
burst = 3
queue_cap = 2

[[profiles]]
name = "flipbook"
description = "a flip-book of the prompt"
command = ["{python}", "{config_dir}/flipbook.py", "--prompt={prompt}", "--out", "{out}"]
output_name = "flipbook.txt"
content_type = "text/plain"
min_gpus = 1
max_gpus = 4
default_gpus = 2
estimate_s = 30
"""

TENANTS = (
    TenantEntry("acme", tiers=("interactive", "enterprise", "free"), default_tier="enterprise"),
    TenantEntry("hobby", tiers=("free",)),
    TenantEntry("narrow", tiers=("paid",), models=("demo",), queue_cap=1),
)


@pytest.fixture
def deployment(tmp_path):
    path = tmp_path / "deploy.toml"
    path.write_text(DEPLOYMENT)
    doc, shown = stack_secrets.build(TENANTS)
    stack_secrets.write_private(tmp_path / stack_secrets.SECRETS_FILE, doc)
    return path, {s["name"]: s["api_key"] for s in shown}


def app_config(tmp_path, path) -> ApiConfig:
    secrets = services.stack_secrets(tmp_path)
    settings = api_settings(services.deployment(path))
    return ApiConfig(
        auth=services.api_keys(secrets),
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        limits=services.api_limits(services.profiles_of(path), settings.default_model),
        settings=settings,
    )


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_models_lists_what_a_tenant_may_submit_with_its_defaults(tmp_path, deployment):
    path, keys = deployment

    async def go():
        async with TestClient(TestServer(make_app(app_config(tmp_path, path)))) as client:
            doc = await (await client.get("/v1/models", headers=bearer(keys["acme"]))).json()
            by_name = {m["name"]: m for m in doc["models"]}
            assert {"demo", "noop", "hold", "flipbook"} <= set(by_name)
            flip = by_name["flipbook"]
            assert flip["default"] and doc["default_model"] == "flipbook"
            assert flip["gpus"] == {"min": 1, "max": 4, "default": 2}
            assert flip["estimate_s"] == 30 and flip["output"]["content_type"] == "text/plain"
            assert doc["tiers"] == ["interactive", "enterprise", "free"]
            assert doc["default_tier"] == "enterprise"
            narrow = await (await client.get("/v1/models", headers=bearer(keys["narrow"]))).json()
            assert [m["name"] for m in narrow["models"]] == ["demo"]
            assert narrow["default_model"] is None  # flipbook is not one of its models

    asyncio.run(go())


def test_a_job_without_a_model_gets_the_default_and_its_gpus_and_estimate(tmp_path, deployment):
    path, keys = deployment
    config = app_config(tmp_path, path)

    async def go():
        async with TestClient(TestServer(make_app(config))) as client:
            r = await client.post(
                "/v1/jobs", json={"prompt": "a fox"}, headers=bearer(keys["acme"])
            )
            assert r.status == 202, await r.text()
            spec = codec.decode(config.producer.on(COMMANDS.name)[-1].value).spec
            assert (spec.model, spec.gpus, spec.estimate_s) == ("flipbook", 2, 30.0)
            too_big = await client.post(
                "/v1/jobs", json={"prompt": "a fox", "gpus": 8}, headers=bearer(keys["acme"])
            )
            err = (await too_big.json())["error"]
            assert too_big.status == 422 and err["field"] == "gpus"
            assert "1 to 4 GPUs" in err["message"] and "/v1/models" in err["message"]
            foreign = await client.post(
                "/v1/jobs",
                json={"prompt": "a fox", "model": "flipbook"},
                headers=bearer(keys["narrow"]),
            )
            assert foreign.status == 403
            assert (await foreign.json())["error"]["code"] == "model_not_allowed"

    asyncio.run(go())


def test_every_tier_of_a_tenant_is_reachable_and_no_other(tmp_path, deployment):
    path, keys = deployment

    async def go():
        async with TestClient(TestServer(make_app(app_config(tmp_path, path)))) as client:
            for tier in ("interactive", "enterprise", "free"):
                body = {"prompt": "a fox", "model": "demo", "tier": tier}
                r = await client.post("/v1/jobs", json=body, headers=bearer(keys["acme"]))
                assert r.status == 202, (tier, await r.text())
            body = {"prompt": "a fox", "model": "demo", "tier": "batch"}
            r = await client.post("/v1/jobs", json=body, headers=bearer(keys["acme"]))
            assert r.status == 403

    asyncio.run(go())


def test_rate_limits_and_queue_caps_come_from_the_tenants_tier_or_its_own(tmp_path, deployment):
    path, keys = deployment
    body = {"prompt": "a fox", "model": "demo"}

    async def go():
        config = app_config(tmp_path, path)
        config.monotonic = lambda: 100.0  # no refill: the burst is all there is
        async with TestClient(TestServer(make_app(config))) as client:
            hobby = [
                (await client.post("/v1/jobs", json=body, headers=bearer(keys["hobby"]))).status
                for _ in range(4)
            ]
            # free: burst 3 and a queue cap of 2 (the third request is refused by the cap)
            assert hobby == [202, 202, 429, 429]
            acme = [
                (await client.post("/v1/jobs", json=body, headers=bearer(keys["acme"]))).status
                for _ in range(4)
            ]
            assert acme == [202] * 4  # enterprise: the section's defaults
            narrow = [
                (await client.post("/v1/jobs", json=body, headers=bearer(keys["narrow"]))).status
                for _ in range(2)
            ]
            assert narrow == [202, 429]  # its own queue cap of 1

    asyncio.run(go())


def test_a_default_model_without_a_profile_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError) as err:
        services.api_limits(services.profiles_of(None), "sora-9000")
    assert err.value.key == "api.default_model" and "demo" in err.value.detail


def test_a_bad_profile_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "deploy.toml"
    path.write_text('[[profiles]]\nname = "x"\ncommand = "gen {prompt}"\n')
    with pytest.raises(ConfigError) as err:
        services.profiles_of(path)
    assert (err.value.file, err.value.key) == (str(path), "profiles[0]")
    assert "list of strings" in err.value.detail
    path.write_text('[[profiles]]\nname = "x"\ncommand = ["gen"]\nmax_gpus = 2\ndefault_gpus = 4\n')
    with pytest.raises(ConfigError) as err:
        services.profiles_of(path)
    assert "min_gpus <= default_gpus <= max_gpus" in err.value.detail


def test_the_api_reloads_the_secrets_file_when_a_tenant_is_added_or_a_key_rotated(tmp_path):
    doc, shown = stack_secrets.build(TENANTS[:1])
    path = tmp_path / stack_secrets.SECRETS_FILE
    stack_secrets.write_private(path, doc)
    old_key = shown[0]["api_key"]
    secrets = services.stack_secrets(tmp_path)
    keys = services.api_keys(secrets)
    webhooks = services.webhook_config(tmp_path, secrets, keys, TargetPolicy())
    config = ApiConfig(
        auth=keys,
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        webhook_secrets=webhooks.secrets,
    )
    config.background = (services.watch_secrets(tmp_path, config, webhooks, interval_s=0.05),)

    async def go():
        async with TestClient(TestServer(make_app(config))) as client:
            added = stack_secrets.update(
                path,
                lambda d: stack_secrets.add_tenant(
                    d, TenantEntry("newco", tiers=("paid",), users=(UserEntry("ann"),))
                ),
            )
            rotated = stack_secrets.update(path, lambda d: stack_secrets.rotate_key(d, "acme"))
            for _ in range(100):
                await asyncio.sleep(0.05)
                if config.auth.authenticate(added[0]["api_key"]) is not None:
                    break
            new = await client.get("/v1/models", headers=bearer(added[0]["api_key"]))
            assert new.status == 200 and (await new.json())["tiers"] == ["paid"]
            assert config.auth.authenticate(added[0]["api_key"]).user == "ann"
            assert webhooks.secrets.secret_for("newco") is not None
            assert (await client.get("/v1/models", headers=bearer(old_key))).status == 401
            fresh = await client.get("/v1/models", headers=bearer(rotated["api_key"]))
            assert fresh.status == 200

    asyncio.run(go())


def test_a_secrets_file_that_does_not_load_keeps_the_keys_loaded_before(tmp_path):
    doc, shown = stack_secrets.build(TENANTS[:1])
    path = tmp_path / stack_secrets.SECRETS_FILE
    stack_secrets.write_private(path, doc)
    secrets = services.stack_secrets(tmp_path)
    keys = services.api_keys(secrets)
    webhooks = services.webhook_config(tmp_path, secrets, keys, TargetPolicy())
    config = ApiConfig(auth=keys, store=InMemoryViewStore(), producer=MemoryProducer())
    watch = services.watch_secrets(tmp_path, config, webhooks, interval_s=0.02)

    async def go():
        task = asyncio.create_task(watch())
        await asyncio.sleep(0.05)
        path.write_text(json.dumps({"auth": {"keys": [{"key": "k"}]}, "signing_secret": "x"}))
        await asyncio.sleep(0.2)
        assert not task.done()
        task.cancel()

    asyncio.run(go())
    assert config.auth is keys and keys.authenticate(shown[0]["api_key"]) is not None
