"""Issue #33, 4: rotating a webhook secret writes the secrets file off the event
loop and at most once a minute per tenant, so rotations cost the other tenants
nothing (40 rotations made another tenant's GET take 895 ms)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.projections.store import InMemoryViewStore
from framespool.projections.webhook_secrets import WebhookSecrets

TENANTS = [f"t{i}" for i in range(40)]


def key(tenant: str) -> str:
    return f"{tenant}-key.{tenant}-secret"


def api(secrets: WebhookSecrets) -> TestClient:
    names = [*TENANTS, "other"]
    keys = ApiKeys(
        [record_for(key(t), t, "u") for t in names],
        {t: TenantPolicy(("free",)) for t in names},
    )
    config = ApiConfig(
        auth=keys, store=InMemoryViewStore(), producer=MemoryProducer(), webhook_secrets=secrets
    )
    return TestClient(TestServer(make_app(config)))


@pytest.mark.slow
def test_rotations_write_off_the_loop_and_other_tenants_are_answered_meanwhile():
    written: list[str] = []
    lock = threading.Lock()

    def slow_file(tenant: str, secret: str) -> None:  # a file rewrite with fsync
        time.sleep(0.05)
        with lock:
            written.append(tenant)

    async def go():
        secrets = WebhookSecrets({}, persist=slow_file)
        async with api(secrets) as client:
            rotations = [
                asyncio.ensure_future(
                    client.post("/v1/webhook-secret", headers={"X-API-Key": key(t)})
                )
                for t in TENANTS
            ]
            await asyncio.sleep(0.02)
            started = time.monotonic()
            r = await client.get("/v1/jobs", headers={"X-API-Key": key("other")})
            took = time.monotonic() - started
            assert r.status == 200
            statuses = [(await x).status for x in rotations]
        getattr(secrets, "close", lambda: None)()
        return took, statuses

    took, statuses = asyncio.run(go())
    assert statuses == [200] * len(TENANTS)
    assert sorted(written) == sorted(TENANTS)  # one write each, none lost
    assert took < 0.5, f"another tenant's GET took {took * 1000:.0f} ms"


def test_a_tenant_rotates_at_most_once_per_interval():
    now = [1000.0]
    secrets = WebhookSecrets({}, persist=lambda t, s: None, clock=lambda: now[0])

    async def go():
        async with api(secrets) as client:
            t0 = {"X-API-Key": key("t0")}
            first = await client.post("/v1/webhook-secret", headers=t0)
            again = await client.post("/v1/webhook-secret", headers=t0)
            other = await client.post("/v1/webhook-secret", headers={"X-API-Key": key("t1")})
            now[0] += 60
            later = await client.post("/v1/webhook-secret", headers=t0)
            return first, again, other, later, (await again.json())["error"]

    first, again, other, later, err = asyncio.run(go())
    assert first.status == 200 and other.status == 200 and later.status == 200
    assert again.status == 429 and again.headers["Retry-After"] == "60"
    assert err["code"] == "rotation_too_soon" and "60 s" in err["message"]


def test_a_failed_write_keeps_the_old_secret_and_allows_a_retry_at_once():
    def broken(tenant: str, secret: str) -> None:
        raise OSError("disk full")

    secrets = WebhookSecrets({"t0": "whsec_old"}, persist=broken)

    async def go():
        async with api(secrets) as client:
            t0 = {"X-API-Key": key("t0")}
            return [(await client.post("/v1/webhook-secret", headers=t0)).status for _ in "ab"]

    assert asyncio.run(go()) == [503, 503]
    assert secrets.secret_for("t0") == b"whsec_old"
