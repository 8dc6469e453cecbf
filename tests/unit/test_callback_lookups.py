"""One tenant's slow DNS slows no one else's submissions (framespool.callbacks.lookups)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from framespool.callbacks.lookups import LOOKUP_THREADS, CallbackLookups
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.http import LOOKUPS, METRICS
from framespool.projections.store import InMemoryViewStore

MALLORY = "mallory-key.m-secret"
ACME = "acme-key.a-secret"
BODY = {"prompt": "a red fox", "model": "demo"}


class Dns:
    """``socket.getaddrinfo`` as a tenant's DNS would answer: names under
    ``slow.test`` hang until released; the others answer from a table."""

    def __init__(self, real) -> None:
        self.real = real
        self.release = threading.Event()
        self.asked: list[str] = []
        self.table = {"hooks.acme.test": "93.184.216.34", "inside.acme.test": "10.1.2.3"}

    def __call__(self, host, *args, **kwargs):
        if not isinstance(host, str) or not host.endswith(".test"):
            return self.real(host, *args, **kwargs)
        self.asked.append(host)
        if host.endswith("slow.test"):
            self.release.wait(30)
            raise socket.gaierror(socket.EAI_NONAME, "no answer")
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (self.table[host], 0))]


@pytest.fixture
def dns(monkeypatch):
    fake = Dns(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    yield fake
    fake.release.set()


@contextlib.asynccontextmanager
async def api():
    keys = ApiKeys(
        [record_for(MALLORY, "mallory", "m"), record_for(ACME, "acme", "a")],
        {"mallory": TenantPolicy(("free",)), "acme": TenantPolicy(("free",))},
    )
    config = ApiConfig(
        auth=keys,
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        resolve_timeout_s=0.2,  # the real resolver (the lookups' threads) is used
    )
    async with TestClient(TestServer(make_app(config))) as client:
        yield client, client.server.app[LOOKUPS]


def submit(client, key: str, host: str):
    body = {**BODY, "callback_url": f"https://{host}/hook"}
    return client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"})


def test_a_tenant_whose_dns_hangs_does_not_starve_another_tenants_check(dns):
    async def go():
        loop = asyncio.get_running_loop()
        # the loop's default executor is full too: lookups do not use it
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        busy = loop.run_in_executor(None, dns.release.wait, 30)
        async with api() as (client, lookups):
            answers = await asyncio.gather(
                *(submit(client, MALLORY, f"h{i}.slow.test") for i in range(3 * LOOKUP_THREADS))
            )
            # accepted: a name that does not resolve in time is checked at delivery
            assert {r.status for r in answers} == {202}
            # its lookups still hang, past the requests: they still count
            assert lookups.in_flight == lookups.per_tenant
            assert lookups.skipped == 3 * LOOKUP_THREADS - lookups.per_tenant
            scraped = generate_latest(client.server.app[METRICS].registry).decode()
            assert (
                f'framespool_callback_lookups_skipped_total{{where="submit"}} {lookups.skipped}.0'
                in scraped
            )
            # another tenant's names are still looked up, and refused when private
            r = await submit(client, ACME, "inside.acme.test")
            err = (await r.json())["error"]
            assert r.status == 422 and err["field"] == "callback_url", err
            r = await submit(client, ACME, "hooks.acme.test")
            assert r.status == 202
        dns.release.set()
        await busy

    asyncio.run(go())


def test_answers_are_cached_per_host_name(dns):
    async def go():
        async with api() as (client, lookups):
            for _ in range(5):
                assert (await submit(client, ACME, "hooks.acme.test")).status == 202
            for _ in range(2):
                assert (await submit(client, ACME, "Inside.ACME.test")).status == 422
        assert dns.asked.count("hooks.acme.test") == 1
        assert len([h for h in dns.asked if h.lower() == "inside.acme.test"]) == 1

    asyncio.run(go())


def test_a_lookup_ends_its_tenants_count_when_it_ends_not_when_the_request_stops_waiting():
    now = [0.0]
    gates: list[asyncio.Event] = []

    async def resolve(host: str) -> list[str]:
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        return ["93.184.216.34"]

    async def asked(n: int) -> None:
        for _ in range(100):
            if len(gates) >= n:
                return
            await asyncio.sleep(0)

    async def go():
        lookups = CallbackLookups(resolve, per_tenant=1, ttl_s=10, clock=lambda: now[0])
        assert await lookups.addresses("t", "a.example", 0.01) is None  # timed out
        assert lookups.in_flight == 1
        assert await lookups.addresses("t", "b.example", 0.01) is None  # skipped: at its cap
        assert lookups.skipped == 1 and len(gates) == 1
        gates[0].set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert lookups.in_flight == 0
        task = asyncio.create_task(lookups.addresses("t", "b.example", 1))
        await asked(2)
        gates[1].set()
        assert await task == ["93.184.216.34"]
        assert await lookups.addresses("t", "b.example", 1) == ["93.184.216.34"]  # cached
        now[0] = 11  # expired: asked again
        task = asyncio.create_task(lookups.addresses("t", "b.example", 1))
        await asked(3)
        assert len(gates) == 3
        gates[2].set()
        await task

    asyncio.run(go())
