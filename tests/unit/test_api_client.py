"""The sync client against the real app served on a loopback port in a background thread."""

from __future__ import annotations

import asyncio
import threading
import urllib.request

import pytest
from aiohttp import web

from framespool.agents.artifacts import LocalDirStore
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, record_for
from framespool.producers.client import ApiError, Client
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.hub import Hub
from framespool.projections.store import InMemoryViewStore
from framespool.schemas import codec
from framespool.schemas.events import JobAdmitted, SubmitJob
from tests.support.projections import lifecycle, records_for

KEY = "acme-key.secret"


class Server:
    def __init__(self, tmp_path):
        self.loop = asyncio.new_event_loop()
        self.store, self.hub = InMemoryViewStore(), Hub()
        self.producer = MemoryProducer()
        self.artifacts = LocalDirStore(tmp_path / "a", url_base="http://pending", secret=b"s")
        self.config = ApiConfig(
            auth=ApiKeys([record_for(KEY, "acme", "alice")]),
            store=self.store,
            producer=self.producer,
            hub=self.hub,
            artifacts=self.artifacts,
            sse_keepalive_s=0.2,
        )
        self.consumer = ProjectionConsumer(
            self.store, hub=self.hub, dead_letter_sender=MemoryProducer()
        )
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def __enter__(self):
        self.thread.start()

        async def start():
            self.runner = web.AppRunner(make_app(self.config))
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return site._server.sockets[0].getsockname()[1]

        port = self.call(start())
        self.url = f"http://127.0.0.1:{port}"
        self.artifacts.url_base = self.url
        return self

    def __exit__(self, *exc):
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def feed(self, records, delay=0.0):
        async def go():
            for r in records:
                await self.consumer.handle([r])
                await asyncio.sleep(delay)

        return asyncio.run_coroutine_threadsafe(go(), self.loop)


def test_submit_status_jobs_watch_result_cancel(tmp_path):
    with Server(tmp_path) as srv:
        client = Client(srv.url, KEY, timeout_s=5)
        job = client.submit(prompt="a fox", model="demo", idempotency_key="k1", params={"fps": 24})
        assert (
            client.submit(prompt="a fox", model="demo", idempotency_key="k1", params={"fps": 24})[
                "job_id"
            ]
            == job["job_id"]
        )
        job_id = job["job_id"]
        assert client.status(job_id)["state"] == "SUBMITTED"
        assert [j["job_id"] for j in client.jobs()["jobs"]] == [job_id]

        spec = codec.decode(srv.producer.sent[0].value).spec
        events = lifecycle(job_id)
        events[0] = JobAdmitted(
            event_id=events[0].event_id, ts_ms=events[0].ts_ms, spec=spec, cell="cell-0"
        )
        records = records_for(events)
        srv.feed(records[:2]).result(5)
        feeding = srv.feed(records[2:], delay=0.05)
        watched = list(client.watch(job_id))
        feeding.result(5)
        assert [e["event"] for e in watched][:2] == ["JobAdmitted", "JobQueued"]
        assert (
            watched[-1]["event"] == "JobCompleted" and watched[-1]["data"]["state"] == "COMPLETED"
        )
        ids = [e["id"] for e in watched]
        assert ids == sorted(ids)
        assert list(client.watch(job_id, last_event_id=ids[-1])) == []

        view = srv.store.get(job_id)
        video = tmp_path / "v.mp4"
        video.write_bytes(b"video bytes")
        srv.artifacts.put_file(view.artifact_uri.removeprefix("local://"), video)
        result = client.result(job_id)
        with urllib.request.urlopen(result["url"], timeout=5) as resp:
            assert resp.read() == b"video bytes"

        with pytest.raises(ApiError) as err:
            client.cancel(job_id)
        assert err.value.status == 409 and err.value.code == "job_terminal"
        second = client.submit(prompt="another", model="demo")
        assert client.cancel(second["job_id"])["cancel_requested"] is True
        with pytest.raises(ApiError) as err:
            client.submit(prompt="", model="demo")
        assert err.value.status == 422 and err.value.field == "prompt"
        with pytest.raises(ApiError) as err:
            Client(srv.url, "wrong").status(job_id)
        assert err.value.status == 401
        assert len(list(client.all_jobs(page_size=1))) == 2
        assert sum(isinstance(codec.decode(s.value), SubmitJob) for s in srv.producer.sent) == 2


def test_the_client_rotates_its_tenants_webhook_secret(tmp_path):
    from framespool.projections.webhook_secrets import WebhookSecrets

    with Server(tmp_path) as srv:
        secrets = WebhookSecrets({"acme": "whsec_old"})
        srv.config.webhook_secrets = secrets
        got = Client(srv.url, KEY, timeout_s=5).rotate_webhook_secret()
        assert got["tenant"] == "acme" and got["webhook_secret"] != "whsec_old"
        assert secrets.secret_for("acme") == got["webhook_secret"].encode()
