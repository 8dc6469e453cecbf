"""Secrets of a deployment: per-tenant webhook secrets, a server-only URL key, private files.

The attack: a tenant is given the key that signs its webhooks. With one key for
every tenant and for artifact URLs, it could forge a download URL for another
tenant's result and forge webhooks to another tenant's receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import stat
import time
from urllib.parse import parse_qs, quote, urlsplit

from aiohttp.test_utils import TestClient, TestServer

from framespool import bootstrap as services
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.projections.jobs import fold
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.projections.webhooks import TargetPolicy, sign, verify
from framespool.stack import Stack, StackConfig
from tests.support.projections import lifecycle

TENANTS = (("acme", "enterprise"), ("globex", "paid"))


def write_stack_secrets(tmp_path):
    """What ``framespool up`` writes, and what it shows the tenants (``stack.json``)."""
    stack = Stack(StackConfig(data_dir=tmp_path, tenants=TENANTS))
    stack.data_dir.mkdir(parents=True, exist_ok=True)
    stack.write_secrets()
    shown = {t["name"]: t for t in stack.tenant_keys}
    return stack, shown


@contextlib.asynccontextmanager
async def stack_api(tmp_path):
    """The API wired the way ``framespool.bootstrap`` wires it, on an in-memory store."""
    _, shown = write_stack_secrets(tmp_path)
    secrets = services.stack_secrets(tmp_path)
    keys = services.api_keys(secrets)
    api_url = "http://api.test"
    artifacts = services.artifact_store(tmp_path, secrets, api_url)
    webhooks = services.webhook_config(tmp_path, secrets, keys, TargetPolicy())
    store = InMemoryViewStore()
    config = ApiConfig(
        auth=keys,
        store=store,
        producer=MemoryProducer(),
        artifacts=artifacts,
        webhook_secrets=webhooks.secrets,
    )
    for tenant in ("acme", "globex"):
        events = lifecycle(f"job-{tenant}", tenant)
        store.commit(Batch(views={f"job-{tenant}": fold(events)}))
        video = tmp_path / f"{tenant}.mp4"
        video.write_bytes(f"{tenant}'s private video".encode())
        artifacts.put_file(store.get(f"job-{tenant}").artifact_uri.removeprefix("local://"), video)
    async with TestClient(TestServer(make_app(config))) as client:
        yield client, shown, webhooks, artifacts, store


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def test_a_tenants_webhook_secret_forges_neither_urls_nor_other_tenants_webhooks(tmp_path):
    async def go():
        async with stack_api(tmp_path) as (client, shown, webhooks, artifacts, store):
            acme = shown["acme"]
            mine = acme["webhook_secret"]
            assert mine and mine != shown["globex"]["webhook_secret"]
            # 1. the secret acme verifies its webhooks with signs only acme's webhooks
            assert webhooks.secret_for("acme") == mine.encode()
            body = b'{"job_id":"job-globex","state":"COMPLETED"}'
            forged = sign(mine.encode(), int(time.time()), body)
            assert not verify(webhooks.secret_for("globex"), forged, body, int(time.time()))
            # 2. ... and no download URL: forge one for globex's result
            key = store.get("job-globex").artifact_uri.removeprefix("local://")
            expires = int(time.time()) + 600
            for message in (f"{key}\n{expires}", f"globex\n{key}\n{expires}"):
                sig = hmac.new(mine.encode(), message.encode(), hashlib.sha256).hexdigest()
                for query in (
                    f"expires={expires}&sig={sig}",
                    f"tenant=globex&expires={expires}&sig={sig}",
                ):
                    r = await client.get(f"/v1/artifacts/{quote(key)}?{query}")
                    assert r.status == 403, query
            # 3. a genuine URL of acme's result works, and is bound to acme's job and run
            r = await client.get("/v1/jobs/job-acme/result", headers=bearer(acme["api_key"]))
            url = urlsplit((await r.json())["url"])
            assert parse_qs(url.query)["tenant"] == ["acme"]
            got = await client.get(f"{url.path}?{url.query}")
            assert got.status == 200 and await got.read() == b"acme's private video"
            other = url.query.replace("tenant=acme", "tenant=globex")
            assert (await client.get(f"{url.path}?{other}")).status == 403
            theirs = url.path.replace("job-acme", "job-globex")
            assert (await client.get(f"{theirs}?{url.query}")).status == 403

    asyncio.run(go())


def test_rotating_a_webhook_secret_shows_it_once_and_signs_with_it_from_then_on(tmp_path):
    async def go():
        async with stack_api(tmp_path) as (client, shown, webhooks, _, _):
            acme = bearer(shown["acme"]["api_key"])
            old = shown["acme"]["webhook_secret"]
            r = await client.post("/v1/webhook-secret", headers=acme)
            assert r.status == 200 and r.headers["Cache-Control"] == "no-store"
            doc = await r.json()
            new = doc["webhook_secret"]
            assert doc["tenant"] == "acme" and new and new != old
            assert webhooks.secret_for("acme") == new.encode()
            assert webhooks.secret_for("globex") == shown["globex"]["webhook_secret"].encode()
            assert (await client.get("/v1/webhook-secret", headers=acme)).status == 405
            assert (await client.post("/v1/webhook-secret")).status == 401
            # it survives a restart: the server's secrets file holds the new one
            reloaded = services.webhook_config(
                tmp_path,
                services.stack_secrets(tmp_path),
                services.api_keys(services.stack_secrets(tmp_path)),
                TargetPolicy(),
            )
            assert reloaded.secret_for("acme") == new.encode()

    asyncio.run(go())


def test_the_url_key_is_the_servers_alone_and_api_keys_are_stored_hashed(tmp_path):
    write_stack_secrets(tmp_path)
    doc = json.loads((tmp_path / "stack-secrets.json").read_text())
    shown = json.dumps(doc["auth"]["tenants"])
    assert doc["url_signing_key"] and doc["url_signing_key"] not in shown
    assert "signing_secret" not in doc
    assert all("key" not in k and k["sha256"] for k in doc["auth"]["keys"])


def test_stack_files_with_keys_are_private_to_the_owner(tmp_path):
    old = os.umask(0o022)
    try:
        stack, _ = write_stack_secrets(tmp_path)
        stack.info = {"api_url": stack.api_url, "tenants": stack.tenant_keys}
        stack.write_info()
    finally:
        os.umask(old)
    for name in ("stack-secrets.json", "stack.json"):
        mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    info = json.loads((tmp_path / "stack.json").read_text())
    assert info["api_url"] and all(t["api_key"] for t in info["tenants"])


def test_one_secrets_builder_for_the_stack_and_compose():
    import importlib.util
    from pathlib import Path

    from framespool import stack_secrets

    path = Path(__file__).resolve().parents[2] / "compose" / "init_stack.py"
    spec = importlib.util.spec_from_file_location("compose_init_stack", path)
    init_stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(init_stack)
    assert init_stack.build_secrets is stack_secrets.build
    assert init_stack.write_private is stack_secrets.write_private
