"""Limits are synchronous: what a tenant may not submit is refused at submit time
(429 with Retry-After), and what is accepted with 202 is queued, never rejected
later for rate (admission does not rate-limit: test_admission_core)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from aiohttp.test_utils import TestClient, TestServer

from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.ratelimit import RateLimit
from framespool.projections.jobs import RUNNING
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.schemas.topics import COMMANDS

ALICE, BOB = "acme-key.alice-secret", "globex-key.bob-secret"
BODY = {"prompt": "a red fox", "model": "demo"}


def make_config(**kw) -> ApiConfig:
    keys = ApiKeys(
        [record_for(ALICE, "acme", "alice"), record_for(BOB, "globex", "bob")],
        {"acme": TenantPolicy(("free",))},
    )
    return ApiConfig(auth=keys, store=InMemoryViewStore(), producer=MemoryProducer(), **kw)


def test_a_tenant_at_its_queue_cap_gets_429_with_retry_after_at_submit_time():
    async def go():
        config = make_config(queue_cap=3, queue_cap_retry_after_s=7)
        async with TestClient(TestServer(make_app(config))) as client:
            alice, bob = {"Authorization": f"Bearer {ALICE}"}, {"X-API-Key": BOB}
            accepted = []
            for i in range(3):
                r = await client.post(
                    "/v1/jobs", json=BODY, headers={**alice, "Idempotency-Key": f"k{i}"}
                )
                assert r.status == 202
                accepted.append((await r.json())["job_id"])
            refused = await client.post(
                "/v1/jobs", json=BODY, headers={**alice, "Idempotency-Key": "k3"}
            )
            assert refused.status == 429 and refused.headers["Retry-After"] == "7"
            err = (await refused.json())["error"]
            assert err["code"] == "queue_full" and "queue cap of 3" in err["message"]
            assert len(config.producer.on(COMMANDS.name)) == 3, "nothing written for it"
            # a retry of an accepted job still answers 200; another tenant is unaffected
            again = await client.post(
                "/v1/jobs", json=BODY, headers={**alice, "Idempotency-Key": "k0"}
            )
            assert again.status == 200
            assert (await client.post("/v1/jobs", json=BODY, headers=bob)).status == 202
            # once one has started, there is room again
            started = replace(config.store.get(accepted[0]), state=RUNNING)
            config.store.commit(Batch(views={started.job_id: started}))
            ok = await client.post(
                "/v1/jobs", json=BODY, headers={**alice, "Idempotency-Key": "k3"}
            )
            assert ok.status == 202

    asyncio.run(go())


def test_the_edge_rate_limit_refuses_at_submit_time_and_accepted_means_queued():
    now = [50.0]

    async def go():
        config = make_config(
            rate_limit=RateLimit(rate_per_s=10.0, burst=20), monotonic=lambda: now[0]
        )
        async with TestClient(TestServer(make_app(config))) as client:
            alice = {"Authorization": f"Bearer {ALICE}"}
            statuses = [
                (await client.post("/v1/jobs", json=BODY, headers=alice)).status for _ in range(25)
            ]
            assert statuses == [202] * 20 + [429] * 5
            refused = await client.post("/v1/jobs", json=BODY, headers=alice)
            assert refused.headers["Retry-After"] == "1"
            # exactly the accepted submissions reached the log, as SubmitJobs
            assert len(config.producer.on(COMMANDS.name)) == 20
            now[0] += 1.0
            assert (await client.post("/v1/jobs", json=BODY, headers=alice)).status == 202

    asyncio.run(go())


def test_the_default_edge_limit_lets_a_burst_of_5000_through():
    limit = RateLimit()
    assert limit.burst >= 5000 and limit.rate_per_s >= 1000
    assert ApiConfig.__dataclass_fields__["queue_cap"].default >= 5000


class SlowLog(MemoryProducer):
    """A log whose writes wait until released: submissions overlap in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def send(self, *args, **kwargs):
        await self.release.wait()
        return await super().send(*args, **kwargs)


def test_concurrent_submits_cannot_exceed_the_queue_cap():
    """Issue #33, 11: the cap was checked before the log write and counted in the
    store after it, so submissions in flight together all passed one check."""

    async def go():
        log = SlowLog()
        config = replace(make_config(queue_cap=3), producer=log)
        async with TestClient(TestServer(make_app(config))) as client:
            alice = {"Authorization": f"Bearer {ALICE}"}
            posts = [
                asyncio.ensure_future(client.post("/v1/jobs", json=BODY, headers=alice))
                for _ in range(10)
            ]
            await asyncio.sleep(0.3)  # every request reached the log write or was refused
            log.release.set()
            statuses = sorted([(await p).status for p in posts])
            assert statuses == [202] * 3 + [429] * 7, statuses
            assert len(log.on(COMMANDS.name)) == 3
            # holds end with their requests: room again only as jobs start
            assert (await client.post("/v1/jobs", json=BODY, headers=alice)).status == 429

    asyncio.run(go())
