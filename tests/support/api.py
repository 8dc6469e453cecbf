"""The HTTP API on aiohttp's test client, a recording producer and the in-memory store
(moved from test_api_handlers.py): ``api(tmp_path)`` yields a :class:`Ctx`."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from aiohttp.test_utils import TestClient, TestServer

from framespool.agents.artifacts import LocalDirStore
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.projections.jobs import fold
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.schemas import codec
from framespool.schemas.topics import COMMANDS

ALICE, BOB = "acme-key.alice-secret", "globex-key.bob-secret"


BODY = {
    "prompt": "a red fox in the snow",
    "model": "demo",
    "params": {"resolution": "1280x720", "duration_s": 5, "fps": 24, "seed": 7},
}


def auth(token=ALICE):
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Ctx:
    client: TestClient
    store: InMemoryViewStore
    producer: MemoryProducer
    artifacts: LocalDirStore
    config: ApiConfig
    now: list

    def commands(self, cls):
        return [
            codec.decode(s.value)
            for s in self.producer.on(COMMANDS.name)
            if isinstance(codec.decode(s.value), cls)
        ]

    def fold_in(self, events):
        """Feed job events as the projection consumer would (no broker)."""
        views = {}
        for e in events:
            job = e.spec.job_id if hasattr(e, "spec") else e.job_id
            views[job] = fold([e], views.get(job) or self.store.get(job))
        self.store.commit(Batch(views=views))


@contextlib.asynccontextmanager
async def api(tmp_path, **overrides):
    keys = ApiKeys(
        [record_for(ALICE, "acme", "alice"), record_for(BOB, "globex", "bob")],
        {"acme": TenantPolicy(("enterprise", "free"), "free")},
    )
    now = [1_700_000_000.0]
    artifacts = LocalDirStore(
        tmp_path / "artifacts",
        url_base="http://api.test",
        secret=b"url-secret",
        clock=lambda: now[0],
    )
    config = ApiConfig(
        auth=keys,
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        artifacts=artifacts,
        clock=lambda: now[0],
        **overrides,
    )
    async with TestClient(TestServer(make_app(config))) as client:
        yield Ctx(client, config.store, config.producer, artifacts, config, now)


def run(coro):
    return asyncio.run(coro)
