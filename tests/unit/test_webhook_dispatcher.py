"""The webhook dispatcher under hostile receivers: hung endpoints, huge replies, deep backlogs.

One tenant's receivers must not delay another tenant's notifications, a reply
body is never read past a small cap, and new deliveries reach the dispatcher
without rescanning every pending one.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

from aiohttp import web
from aiohttp.test_utils import TestServer

from framespool.log.memory import MemoryProducer
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.delivery_lanes import DELIVERED, PENDING, Delivery
from framespool.projections.store import InMemoryViewStore
from framespool.projections.webhooks import TargetPolicy, WebhookConfig, WebhookDispatcher
from tests.support.projections import lifecycle, records_for


class Receivers:
    """``/hang`` never answers (until released), ``/hook`` answers 204, ``/huge`` answers
    200 with ``huge_bytes`` of body, counting what it managed to send."""

    def __init__(self, huge_bytes: int = 64 << 20) -> None:
        self.release = asyncio.Event()
        self.hanging = 0
        self.max_hanging = 0
        self.hooked: list[str] = []
        self.huge_bytes = huge_bytes
        self.huge_sent = 0

    async def hang(self, request: web.Request) -> web.Response:
        self.hanging += 1
        self.max_hanging = max(self.max_hanging, self.hanging)
        try:
            await self.release.wait()
        finally:
            self.hanging -= 1
        return web.Response(status=204)

    async def hook(self, request: web.Request) -> web.Response:
        self.hooked.append(request.headers["Framespool-Event-Id"])
        return web.Response(status=204)

    async def huge(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200)
        resp.content_length = self.huge_bytes
        await resp.prepare(request)
        chunk = b"x" * (1 << 20)
        try:
            while self.huge_sent < self.huge_bytes:
                await resp.write(chunk)
                self.huge_sent += len(chunk)
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hang", self.hang)
        app.router.add_post("/hook", self.hook)
        app.router.add_post("/huge", self.huge)
        return app


def delivery(tenant: str, job: str, url: str) -> Delivery:
    return Delivery(
        delivery_id=f"{job}:evt",
        job_id=job,
        tenant=tenant,
        url=url,
        body=json.dumps({"job_id": job}),
        created_ms=int(time.time() * 1000),
    )


def config(**kw) -> WebhookConfig:
    kw.setdefault("timeout_s", 30)
    return WebhookConfig(
        tenant_secrets={"slow": b"s1", "fast": b"s2", "acme": b"s3"},
        policy=TargetPolicy(allow_private=True),
        base_delay_s=0.01,
        max_delay_s=0.05,
        **kw,
    )


async def run_until(dispatcher, done, timeout=10.0) -> None:
    task = asyncio.create_task(dispatcher.run())
    try:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_one_tenants_hung_receivers_do_not_delay_another_tenants_webhooks():
    async def go():
        receivers = Receivers()
        async with TestServer(receivers.app()) as server:
            store = InMemoryViewStore()
            for i in range(20):
                store.put_delivery(delivery("slow", f"s{i}", str(server.make_url("/hang"))))
            late = delivery("fast", "f0", str(server.make_url("/hook")))
            late.created_ms += 1_000  # behind the whole backlog of the slow tenant
            store.put_delivery(late)
            dispatcher = WebhookDispatcher(store, config(concurrency=8))
            await run_until(dispatcher, lambda: store.get_delivery("f0:evt").status == DELIVERED)
            receivers.release.set()
            return receivers, store

    receivers, store = asyncio.run(go())
    assert receivers.hooked == ["f0:evt"]
    assert store.get_delivery("f0:evt").status == DELIVERED
    # the slow tenant held at most its own share of the dispatcher
    assert receivers.max_hanging <= 2  # WebhookConfig().per_tenant_concurrency


def test_one_tenants_hanging_dns_does_not_delay_another_tenants_webhooks():
    gate = asyncio.Event()
    asked = {"slow": 0, "slow_max": 0}

    async def dns(host: str) -> list[str]:
        if host.endswith(".slow.test"):  # the slow tenant's DNS never answers
            asked["slow"] += 1
            asked["slow_max"] = max(asked["slow_max"], asked["slow"])
            try:
                await gate.wait()
            finally:
                asked["slow"] -= 1
            raise OSError("no answer")
        return ["127.0.0.1"]

    async def go():
        receivers = Receivers()
        async with TestServer(receivers.app()) as server:
            store = InMemoryViewStore()
            for i in range(20):
                url = f"http://h{i}.slow.test:{server.port}/hook"
                store.put_delivery(delivery("slow", f"s{i}", url))
            dispatcher = WebhookDispatcher(
                store, config(concurrency=8, resolve_host=dns, dns_timeout_s=0.2)
            )
            # the slow tenant's lookups hang, and its later attempts fail at once
            await run_until(
                dispatcher,
                lambda: any(
                    "too many lookups" in store.get_delivery(f"s{i}:evt").last_error
                    for i in range(20)
                ),
            )
            assert asked["slow"] == 2
            late = delivery("fast", "f0", f"http://hooks.fast.test:{server.port}/hook")
            store.put_delivery(late)
            dispatcher.notify([late])
            await run_until(dispatcher, lambda: store.get_delivery("f0:evt").status == DELIVERED)
            still_hanging = asked["slow"]
            gate.set()
            assert still_hanging == 2
            return receivers, store

    receivers, store = asyncio.run(go())
    assert receivers.hooked == ["f0:evt"]
    # the slow tenant's lookups never held more than its share, even once abandoned
    assert asked["slow_max"] == 2  # WebhookConfig().per_tenant_concurrency
    assert all(store.get_delivery(f"s{i}:evt").status != DELIVERED for i in range(20))


def test_a_huge_reply_is_not_read_past_the_cap():
    async def go():
        receivers = Receivers(huge_bytes=64 << 20)
        async with TestServer(receivers.app()) as server:
            store = InMemoryViewStore()
            store.put_delivery(delivery("acme", "j1", str(server.make_url("/huge"))))
            dispatcher = WebhookDispatcher(store, config())  # the default cap
            await run_until(dispatcher, lambda: store.get_delivery("j1:evt").status != PENDING)
            return receivers, store

    receivers, store = asyncio.run(go())
    assert store.get_delivery("j1:evt").status == DELIVERED
    assert receivers.huge_sent < 16 << 20


class CountingStore(InMemoryViewStore):
    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    def pending_deliveries(self) -> list[Delivery]:
        self.scans += 1
        return super().pending_deliveries()


def test_new_deliveries_reach_the_dispatcher_without_rescanning_the_backlog():
    async def go():
        receivers = Receivers()
        async with TestServer(receivers.app()) as server:
            store = CountingStore()
            url = str(server.make_url("/hook"))
            dispatcher = WebhookDispatcher(store, config())
            consumer = ProjectionConsumer(
                store,
                dead_letter_sender=MemoryProducer(),
                on_deliveries=dispatcher.notify,
            )
            task = asyncio.create_task(dispatcher.run())
            try:
                now_ms = int(time.time() * 1000)
                for n in range(10):
                    await consumer.handle(
                        records_for(lifecycle(f"job-{n}", callback_url=url, ts0=now_ms))
                    )
                    await asyncio.sleep(0)
                deadline = time.monotonic() + 10
                pending = store._deliveries
                while time.monotonic() < deadline and any(
                    d.status == PENDING for d in pending.values()
                ):
                    await asyncio.sleep(0.01)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            return store, receivers

    store, receivers = asyncio.run(go())
    assert store._deliveries and all(d.status == DELIVERED for d in store._deliveries.values())
    assert len(receivers.hooked) == len(store._deliveries)
    assert store.scans <= 1  # once at start; afterwards new deliveries are handed over


def test_each_attempt_at_a_hung_receiver_ends_at_the_timeout_and_is_retried():
    async def go():
        receivers = Receivers()
        async with TestServer(receivers.app()) as server:
            store = InMemoryViewStore()
            store.put_delivery(delivery("slow", "s0", str(server.make_url("/hang"))))
            dispatcher = WebhookDispatcher(store, config(timeout_s=0.2, max_attempts=2))
            await run_until(dispatcher, lambda: store.get_delivery("s0:evt").status != PENDING)
            receivers.release.set()
            return store.get_delivery("s0:evt")

    record = asyncio.run(go())
    assert record.status == "failed" and record.attempts == 2
    assert "TimeoutError" in record.last_error


def test_lanes_take_tenants_in_turn_and_a_job_in_fold_order():
    from framespool.projections.delivery_lanes import DeliveryLanes

    lanes = DeliveryLanes(per_tenant=1)

    def d(tenant, job, seq):
        return Delivery(
            delivery_id=f"{job}:{seq}", job_id=job, tenant=tenant, url="u", body="", seq=seq
        )

    for i in range(3):
        lanes.add(d("big", f"b{i}", 1))
    lanes.add(d("small", "s0", 2))
    lanes.add(d("small", "s0", 1))  # arrives late, but goes first
    first, second = lanes.pick(0), lanes.pick(0)
    assert {first.tenant, second.tenant} == {"big", "small"}
    assert lanes.pick(0) is None  # both tenants hold their one slot
    small = first if first.tenant == "small" else second
    assert small.delivery_id == "s0:1"
    lanes.done(replace(small, status=DELIVERED))
    assert lanes.pick(0).delivery_id == "s0:2"
    retry = replace(first if first.tenant == "big" else second, next_attempt_ms=500)
    lanes.done(retry)
    assert lanes.pick(100).tenant == "big" and lanes.next_due_ms() is None
