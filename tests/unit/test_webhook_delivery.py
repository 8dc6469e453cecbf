"""Webhook delivery against a local aiohttp receiver that dedupes by event id."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from framespool.log.memory import MemoryProducer
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.delivery_lanes import DELIVERED, FAILED, Delivery
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.projections.webhooks import TargetPolicy, WebhookConfig, WebhookDispatcher, verify
from tests.support.projections import lifecycle, records_for

SECRET = b"whsec-acme"


class Receiver:
    """Fails the first ``fail_first`` requests with ``fail_status``; dedupes by event id."""

    def __init__(self, fail_first: int = 0, fail_status: int = 503) -> None:
        self.fail_first, self.fail_status = fail_first, fail_status
        self.requests = 0
        self.accepted: dict[str, dict] = {}
        self.bad_signatures = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        body = await request.read()
        if not verify(SECRET, request.headers["Framespool-Signature"], body, int(time.time())):
            self.bad_signatures += 1
            return web.Response(status=401)
        if self.requests <= self.fail_first:
            return web.Response(status=self.fail_status)
        self.accepted.setdefault(request.headers["Framespool-Event-Id"], json.loads(body))
        return web.Response(status=204)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        return app


def delivery(url: str, n: int = 1) -> Delivery:
    body = json.dumps({"job_id": "j1", "state": "COMPLETED", "n": n})
    return Delivery(
        delivery_id=f"evt-{n}",
        job_id="j1",
        tenant="acme",
        url=url,
        body=body,
        created_ms=int(time.time() * 1000) + n,
    )


def config(**kw) -> WebhookConfig:
    kw.setdefault("policy", TargetPolicy(allow_private=True))
    return WebhookConfig(
        secret=b"default",
        tenant_secrets={"acme": SECRET},
        base_delay_s=0.01,
        max_delay_s=0.05,
        timeout_s=2,
        **kw,
    )


async def run_until(dispatcher: WebhookDispatcher, store, done, timeout=5.0) -> None:
    task = asyncio.create_task(dispatcher.run())
    try:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_delivers_signed_with_retries_and_backoff_and_records_it():
    async def go():
        receiver = Receiver(fail_first=2)
        async with TestServer(receiver.app(), host="127.0.0.1") as server:
            store = InMemoryViewStore()
            url = str(server.make_url("/hook"))
            store.commit(Batch(deliveries=[delivery(url, 1), delivery(url, 2)]))
            d = WebhookDispatcher(store, config())
            await run_until(d, store, lambda: not store.pending_deliveries())
        return receiver, store

    receiver, store = asyncio.run(go())
    assert set(receiver.accepted) == {"evt-1", "evt-2"} and receiver.bad_signatures == 0
    assert receiver.requests == 4
    records = [store.get_delivery("evt-1"), store.get_delivery("evt-2")]
    assert all(r.status == DELIVERED for r in records)
    assert sum(r.attempts for r in records) == 4  # two 503s were retried


def test_a_restart_does_not_redeliver_what_was_acknowledged():
    async def go():
        receiver = Receiver()
        async with TestServer(receiver.app(), host="127.0.0.1") as server:
            store = InMemoryViewStore()
            url = str(server.make_url("/hook"))
            store.commit(Batch(deliveries=[delivery(url, 1)]))
            await run_until(
                WebhookDispatcher(store, config()), store, lambda: not store.pending_deliveries()
            )
            store.commit(Batch(deliveries=[delivery(url, 1), delivery(url, 2)]))  # replayed outbox
            await run_until(
                WebhookDispatcher(store, config()), store, lambda: not store.pending_deliveries()
            )
        return receiver

    receiver = asyncio.run(go())
    assert receiver.requests == 2 and set(receiver.accepted) == {"evt-1", "evt-2"}


def test_client_errors_fail_at_once_and_server_errors_exhaust_attempts():
    async def go(status, attempts):
        receiver = Receiver(fail_first=100, fail_status=status)
        async with TestServer(receiver.app(), host="127.0.0.1") as server:
            store = InMemoryViewStore()
            store.commit(Batch(deliveries=[delivery(str(server.make_url("/hook")))]))
            await run_until(
                WebhookDispatcher(store, config(max_attempts=attempts)),
                store,
                lambda: not store.pending_deliveries(),
            )
        return store.get_delivery("evt-1")

    gone = asyncio.run(go(410, 5))
    assert gone.status == FAILED and gone.attempts == 1 and "410" in gone.last_error
    busy = asyncio.run(go(503, 3))
    assert busy.status == FAILED and busy.attempts == 3 and "503" in busy.last_error


def test_private_targets_are_refused_without_a_request():
    async def go():
        receiver = Receiver()
        async with TestServer(receiver.app(), host="127.0.0.1") as server:
            store = InMemoryViewStore()
            store.commit(Batch(deliveries=[delivery(str(server.make_url("/hook")))]))
            await run_until(
                WebhookDispatcher(store, config(policy=TargetPolicy())),
                store,
                lambda: not store.pending_deliveries(),
            )
        return receiver, store.get_delivery("evt-1")

    receiver, record = asyncio.run(go())
    assert receiver.requests == 0
    assert record.status == FAILED and "loopback" in record.last_error


def test_notifications_older_than_max_age_expire_without_a_request():
    async def go():
        receiver = Receiver()
        async with TestServer(receiver.app(), host="127.0.0.1") as server:
            store = InMemoryViewStore()
            old = replace(delivery(str(server.make_url("/hook"))), created_ms=1_000)
            store.commit(Batch(deliveries=[old]))
            await run_until(
                WebhookDispatcher(store, config()), store, lambda: not store.pending_deliveries()
            )
        return receiver, store.get_delivery("evt-1")

    receiver, record = asyncio.run(go())
    assert receiver.requests == 0 and record.status == FAILED and "expired" in record.last_error


def test_tenant_secrets_come_from_the_auth_config():
    from framespool.producers.auth import ApiKeys

    keys = ApiKeys.from_config({"tenants": {"acme": {"webhook_secret": "s1"}, "globex": {}}})
    cfg = WebhookConfig.for_tenants(keys.tenants)
    # no shared fallback: a tenant without its own secret gets no signature another could make
    assert cfg.secret_for("acme") == b"s1" and cfg.secret_for("globex") == b""


def test_unreachable_target_is_retried_then_failed():
    async def go():
        store = InMemoryViewStore()
        store.commit(Batch(deliveries=[delivery("http://127.0.0.1:9/hook")]))
        await run_until(
            WebhookDispatcher(store, config(max_attempts=2)),
            store,
            lambda: not store.pending_deliveries(),
        )
        return store.get_delivery("evt-1")

    record = asyncio.run(go())
    assert record.status == FAILED and record.attempts == 2


def test_deliver_once_skips_what_is_no_longer_pending():
    async def go():
        store = InMemoryViewStore()
        d = delivery("http://127.0.0.1:9/hook")
        store.put_delivery(replace(d, status=DELIVERED))
        async with aiohttp.ClientSession() as session:
            return await WebhookDispatcher(store, config()).deliver_once(session, d)

    assert asyncio.run(go()).status == DELIVERED


def test_job_state_changes_reach_the_receiver_once_each_in_order():
    async def go():
        receiver = Receiver(fail_first=1)
        order = []
        original = receiver.handle

        async def recording(request):
            response = await original(request)
            if response.status == 204:
                order.append(request.headers["Framespool-Event-Id"])
            return response

        app = web.Application()
        app.router.add_post("/hook", recording)
        async with TestServer(app, host="127.0.0.1") as server:
            store = InMemoryViewStore()
            dispatcher = WebhookDispatcher(store, config())
            consumer = ProjectionConsumer(
                store, on_deliveries=dispatcher.notify, dead_letter_sender=MemoryProducer()
            )
            now = int(time.time() * 1000)
            events = lifecycle("j1", ts0=now, runs=2, callback_url=str(server.make_url("/hook")))
            task = asyncio.create_task(dispatcher.run())
            records = records_for(events)
            await consumer.handle(records)
            await consumer.handle(records)  # a replay: nothing new to deliver
            deadline = time.monotonic() + 5
            while store.pending_deliveries() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return receiver, order

    receiver, order = asyncio.run(go())
    states = [receiver.accepted[e]["state"] for e in order]
    assert states == ["QUEUED", "ASSIGNED", "RUNNING", "QUEUED", "ASSIGNED", "RUNNING", "COMPLETED"]
    assert len(order) == len(set(order)) and receiver.bad_signatures == 0


def test_a_failed_delivery_is_logged_by_its_origin_without_path_or_query(caplog):
    """Issue #33, 15: a callback URL's path and query may carry the receiver's token."""

    async def go():
        async with TestServer(Receiver().app(), host="127.0.0.1") as server:
            store = InMemoryViewStore()
            url = str(server.make_url("/hooks/pathsecret")) + "?token=querysecret"
            store.commit(Batch(deliveries=[delivery(url)]))
            await run_until(
                WebhookDispatcher(store, config()), store, lambda: not store.pending_deliveries()
            )
            return str(server.make_url("/")).rstrip("/"), store.get_delivery("evt-1")

    with caplog.at_level("WARNING", logger="framespool.projections.webhooks"):
        origin, record = asyncio.run(go())
    assert record.status == FAILED and "404" in record.last_error
    assert origin in caplog.text and "j1" in caplog.text
    assert "pathsecret" not in caplog.text and "querysecret" not in caplog.text
