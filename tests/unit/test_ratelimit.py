"""Per-tenant token buckets: the pure limiter, and the API's 429 with Retry-After."""

from __future__ import annotations

import asyncio
import copy

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.ratelimit import RateLimit, RateLimiter, retry_after_header
from framespool.projections.store import InMemoryViewStore
from framespool.schemas.topics import COMMANDS

ALICE, BOB = "acme-key.alice-secret", "globex-key.bob-secret"
BODY = {"prompt": "a red fox", "model": "demo"}


def test_burst_then_refusals_then_refill():
    limiter = RateLimiter(RateLimit(rate_per_s=2.0, burst=3))
    assert [limiter.take("acme", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("acme", 0.0) == pytest.approx(0.5)
    assert limiter.take("acme", 0.25) == pytest.approx(0.25)  # half a token back
    assert limiter.take("acme", 0.5) == 0.0  # a whole one: through
    assert limiter.refused == 2
    assert limiter.take("globex", 0.5) == 0.0  # buckets are per tenant


def test_refill_is_capped_at_burst_and_a_clock_step_back_refills_nothing():
    limiter = RateLimiter(RateLimit(rate_per_s=10.0, burst=2))
    limiter.take("acme", 0.0)
    limiter.take("acme", 1000.0)
    assert limiter.tokens("acme") == pytest.approx(1.0)
    limiter.take("acme", 1000.0)
    assert limiter.take("acme", 999.0) > 0  # went backwards: still empty


def test_disabled_and_per_tenant_overrides():
    limiter = RateLimiter(
        RateLimit(rate_per_s=0, burst=0), {"hobby": RateLimit(rate_per_s=1.0, burst=1)}
    )
    assert all(limiter.take("acme", 0.0) == 0.0 for _ in range(10_000))
    assert limiter.take("hobby", 0.0) == 0.0 and limiter.take("hobby", 0.0) > 0
    with pytest.raises(ValueError):
        RateLimit(rate_per_s=5, burst=0)


def test_default_is_generous_enough_for_the_bench():
    limit = RateLimit()
    assert limit.rate_per_s >= 1000 and limit.burst >= 2000


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 1000),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_admitted_never_exceeds_burst_plus_rate_times_elapsed(rate, burst, gaps):
    limiter = RateLimiter(RateLimit(rate_per_s=rate, burst=burst))
    now, admitted = 0.0, 0
    for gap in gaps:
        now += gap
        wait = limiter.take("t", now)
        if wait == 0.0:
            admitted += 1
        else:
            assert 0 < wait <= 1 / rate + 1e-9
            # waiting as long as it said is always enough
            assert copy.deepcopy(limiter).take("t", now + wait + 1e-9) == 0.0
    assert admitted <= burst + rate * now + 1e-6


def test_retry_after_is_whole_seconds_never_zero():
    assert retry_after_header(0.001) == "1"
    assert retry_after_header(1.0) == "1"
    assert retry_after_header(1.2) == "2"


def test_api_answers_429_with_retry_after_per_tenant():
    now = [100.0]

    async def go():
        keys = ApiKeys(
            [record_for(ALICE, "acme", "alice"), record_for(BOB, "globex", "bob")],
            {"acme": TenantPolicy(("free",))},
        )
        config = ApiConfig(
            auth=keys,
            store=InMemoryViewStore(),
            producer=MemoryProducer(),
            rate_limit=RateLimit(rate_per_s=0.5, burst=2),
            monotonic=lambda: now[0],
            operator_key="ops-key",
        )
        async with TestClient(TestServer(make_app(config))) as client:
            alice = {"Authorization": f"Bearer {ALICE}"}
            assert (await client.post("/v1/jobs", json=BODY, headers=alice)).status == 202
            assert (await client.get("/v1/jobs", headers=alice)).status == 200
            refused = await client.post("/v1/jobs", json=BODY, headers=alice)
            assert refused.status == 429
            assert refused.headers["Retry-After"] == "2"
            err = (await refused.json())["error"]
            assert err["code"] == "rate_limited" and "0.5 requests/s" in err["message"]
            assert len(config.producer.on(COMMANDS.name)) == 1  # nothing written
            # another tenant is unaffected; unauthenticated requests are 401, not 429
            assert (await client.get("/v1/jobs", headers={"X-API-Key": BOB})).status == 200
            assert (await client.get("/v1/jobs")).status == 401
            now[0] += 2.0
            assert (await client.get("/v1/jobs", headers=alice)).status == 200
            metrics = await (
                await client.get("/metrics", headers={"Authorization": "Bearer ops-key"})
            ).text()
            assert 'framespool_api_rate_limited_total{tenant="acme"} 1.0' in metrics

    asyncio.run(go())
