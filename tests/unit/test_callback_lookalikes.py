"""Issue #33, 1: a callback host in any spelling that means loopback is refused at
submit and never connected to; one parser (yarl's, which delivery uses) decides the
host for the check and for the connection, and patterns take ASCII digits only."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from framespool.callbacks.targets import TargetPolicy, check_target, vet_target
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.validation import ValidationError, validate_submit
from framespool.projections.delivery_lanes import FAILED, Delivery
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.projections.webhooks import WebhookConfig, WebhookDispatcher
from framespool.schemas.topics import COMMANDS

SEGMENTED = "\U0001fbf1\U0001fbf2\U0001fbf7.\U0001fbf0.\U0001fbf0.\U0001fbf1"  # 127.0.0.1
ARABIC_INDIC = "\u0661\u0662\u0667.\u0660.\u0660.\u0661"
FULLWIDTH = "\uff11\uff12\uff17.\uff10.\uff10.\uff11"
LOOPBACK_SPELLINGS = [
    SEGMENTED,
    ARABIC_INDIC,
    FULLWIDTH,
    "\u06f1\u06f2\u06f7.0.0.1",  # extended Arabic-Indic
    "127\u30020\u30020\u30021",  # ideographic full stops
    "127.0.0.1.",
    "localhost.",
    "LocalHost",
    "api.localhost",
    "\u24db\u24de\u24d2\u24d0\u24db\u24d7\u24de\u24e2\u24e3",  # circled "localhost"
    "127.1",
    "2130706433",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "[::1]",
    "[::ffff:127.0.0.1]",
]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_every_spelling_of_loopback_is_refused_by_the_shared_check(host):
    assert check_target(f"http://{host}:8080/hook") != ""
    # allowing private targets does not make a look-alike acceptable: it is not ASCII
    if not host.isascii():
        assert check_target(f"http://{host}:8080/hook", TargetPolicy(allow_private=True))


@pytest.mark.parametrize(
    "url, host",
    [
        ("https://hooks.example.com/h", "hooks.example.com"),
        ("https://hooks.example.com./h", "hooks.example.com."),  # an FQDN stays one
        ("https://b\u00fccher.example/h", "xn--bcher-kva.example"),  # a real IDN: punycode
        ("https://123.example.com/h", "123.example.com"),
        ("https://[2606:4700:4700::1111]/h", "2606:4700:4700::1111"),
    ],
)
def test_the_checked_host_is_the_canonical_ascii_host_delivery_connects_to(url, host):
    target = vet_target(url)
    assert not isinstance(target, str), target
    assert target.host == host and target.url.raw_host == host and host.isascii()


KEY = "acme-key.alice-secret"


@contextlib.asynccontextmanager
async def api():
    async def resolve(host: str) -> list[str]:
        raise OSError(f"{host}: no answer")  # as if every lookup were skipped or slow

    config = ApiConfig(
        auth=ApiKeys([record_for(KEY, "acme", "alice")], {"acme": TenantPolicy(("free",))}),
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        resolve_host=resolve,
        resolve_timeout_s=0.2,
    )
    async with TestClient(TestServer(make_app(config))) as client:
        yield client, config


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_submit_refuses_loopback_in_any_spelling_without_a_lookup(host):
    async def go():
        async with api() as (client, config):
            r = await client.post(
                "/v1/jobs",
                json={"prompt": "a fox", "model": "demo", "callback_url": f"http://{host}/h"},
                headers={"Authorization": f"Bearer {KEY}"},
            )
            err = (await r.json())["error"]
            assert r.status in (400, 422) and err["field"] == "callback_url", err
            assert config.producer.on(COMMANDS.name) == []

    asyncio.run(go())


@pytest.mark.parametrize("spelling", [SEGMENTED, FULLWIDTH, "127\u30020\u30020\u30021"])
def test_delivery_never_connects_to_a_look_alike_of_loopback(spelling):
    """A delivery already in the outbox (e.g. accepted before this check existed)
    is refused at delivery, without a request, however yarl folds its host."""

    async def go():
        hits = []

        async def hook(request: web.Request) -> web.Response:
            hits.append(request.host)
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/hook", hook)
        async with TestServer(app, host="127.0.0.1") as server:
            store = InMemoryViewStore()
            url = f"http://{spelling}:{server.port}/hook"
            store.commit(
                Batch(
                    deliveries=[
                        Delivery(
                            delivery_id="evt-1",
                            job_id="j1",
                            tenant="acme",
                            url=url,
                            body="{}",
                            created_ms=int(time.time() * 1000),
                        )
                    ]
                )
            )
            dispatcher = WebhookDispatcher(
                store, WebhookConfig(tenant_secrets={"acme": b"s"}, base_delay_s=0.01)
            )
            task = asyncio.create_task(dispatcher.run())
            deadline = time.monotonic() + 5
            while store.pending_deliveries() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return hits, store.get_delivery("evt-1")

    hits, record = asyncio.run(go())
    assert hits == [] and record.status == FAILED, record


@pytest.mark.parametrize(
    "resolution",
    [
        "\u0661\u0662\u0668\u0660x\u0667\u0662\u0660",  # Arabic-Indic
        "\uff11\uff12\uff18\uff10x720",  # fullwidth
        "1280x\u0967\u0968\u0966",  # Devanagari
    ],
)
def test_resolution_takes_ascii_digits_only(resolution):
    with pytest.raises(ValidationError) as refused:
        validate_submit(
            {"prompt": "a fox", "model": "demo", "params": {"resolution": resolution}},
            TenantPolicy(("free",)),
        )
    assert refused.value.field == "params.resolution"


def test_list_cursor_takes_ascii_digits_only():
    async def go():
        async with api() as (client, _):
            cursor = "\u0661" * 13 + "/j1"
            r = await client.get(
                "/v1/jobs", params={"cursor": cursor}, headers={"Authorization": f"Bearer {KEY}"}
            )
            err = (await r.json())["error"]
            assert r.status == 422 and err["field"] == "cursor", err

    asyncio.run(go())
