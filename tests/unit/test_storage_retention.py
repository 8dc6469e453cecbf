"""Hostile tenants, item 8: results and checkpoints are deleted when their tier's
retention ends (never an unexpired result, never what an unfinished job resumes
from), each tenant's stored bytes are counted as agents report them, a submit over
the tenant's ``storage_quota_bytes`` is refused (429 naming the quota), and an
expired result answers 410 saying why."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from framespool.agents.artifacts import LocalDirStore, checkpoint_key, output_key
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.settings import api_settings
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.retention import (
    CHECKPOINT,
    OUTPUT,
    JobFacts,
    JobStorage,
    Retention,
    StoredObject,
    due,
)
from framespool.projections.storage import StorageLedger, sweep_once
from framespool.projections.store import InMemoryViewStore
from framespool.schemas.events import JobCompleted, RunCheckpointed, RunCompleted
from framespool.schemas.topics import COMMANDS
from tests.support.projections import lifecycle, records_for

DAY_MS = 86400 * 1000
RET = Retention(artifact_s=7 * 86400.0, checkpoint_s=86400.0)


def obj(uri, size=100, kind=CHECKPOINT, node="n0", step=1, ts=0, run=1):
    return StoredObject(uri, size, kind, node, run, step, ts)


# ----------------------------------------------------------------------------
# What retention lets go (pure)
# ----------------------------------------------------------------------------
def test_a_result_stays_until_its_tier_retention_ends_checkpoints_go_sooner():
    js = JobStorage(
        "j1",
        "acme",
        "free",
        finished_ms=10 * DAY_MS,
        result_uri="local://r",
        objects=(
            obj("local://r", kind=OUTPUT),
            obj("local://c1"),
            obj("local://stale", kind=OUTPUT),
        ),
    )
    assert due(js, 10 * DAY_MS + DAY_MS - 1, RET) == []
    after_a_day = {o.uri for o, _ in due(js, 11 * DAY_MS, RET)}
    assert after_a_day == {"local://c1", "local://stale"}, "never the unexpired result"
    at_a_week = due(js, 17 * DAY_MS, RET)
    result_why = next(why for o, why in at_a_week if o.uri == "local://r")
    assert "artifact_retention_s=604800" in result_why and "'free'" in result_why
    assert due(js, 10**15, Retention(artifact_s=0, checkpoint_s=0)) == [], "0 keeps forever"


def test_an_unfinished_job_keeps_the_checkpoint_it_resumes_from_on_every_node():
    # a gang: n0 checkpointed steps 1, 2, 3 and n1 steps 1, 2; the job resumes from 2
    objects = (
        obj("c/n0/1", node="n0", step=1),
        obj("c/n0/2", node="n0", step=2),
        obj("c/n0/3", node="n0", step=3),
        obj("c/n1/1", node="n1", step=1),
        obj("c/n1/2", node="n1", step=2),
        obj("out/stale", kind=OUTPUT, step=-1),
    )
    js = JobStorage("j2", "acme", "free", objects=objects)
    gone = {o.uri for o, _ in due(js, 10**15, RET)}
    assert gone == {"c/n0/1", "c/n1/1"}, gone
    # a single node: only the newest stays, and nothing younger than the retention goes
    one = JobStorage("j3", "acme", "free", objects=objects[:3])
    assert {o.uri for o, _ in due(one, 10**15, RET)} == {"c/n0/1", "c/n0/2"}
    assert due(one, DAY_MS - 1, RET) == []


# ----------------------------------------------------------------------------
# The ledger: counted once, incrementally, durable
# ----------------------------------------------------------------------------
def test_the_ledger_counts_each_object_once_and_survives_a_restart(tmp_path):
    ledger = StorageLedger(tmp_path / "ledger")
    facts = JobFacts("j1", "acme", "free")
    ledger.record([(facts, obj("u1", 100)), (facts, obj("u2", 50))])
    ledger.record([(facts, obj("u1", 100))])  # at-least-once: read again
    ledger.record([(JobFacts("j2", "globex", "paid"), obj("u3", 7))])
    assert ledger.used("acme") == 150 and ledger.used("globex") == 7
    ledger.record([], [JobFacts("j1", "acme", "free", finished_ms=5, result_uri="u2")])
    ledger.deleted("j1", ["u2"], now_ms=99, why="result deleted: because")
    ledger.record([(facts, obj("u2", 50))])  # a replayed report of a deleted object
    assert ledger.used("acme") == 100 and ledger.gone("j1") == (99, "result deleted: because")
    ledger.close()
    again = StorageLedger(tmp_path / "ledger")
    assert again.used("acme") == 100 and again.used("globex") == 7
    assert again.gone("j1") == (99, "result deleted: because")
    again.close()


def test_the_projection_consumer_feeds_the_ledger_from_the_agents_reports():
    async def go():
        ledger = StorageLedger()
        consumer = ProjectionConsumer(InMemoryViewStore(), storage=ledger)
        events = lifecycle("j1", "acme")
        reports = [
            RunCheckpointed(
                event_id="n0/j1/1/checkpoint-5",
                ts_ms=1_100,
                job_id="j1",
                run=1,
                node_id="node-1",
                incarnation=1,
                checkpoint_uri="local://jobs/j1/runs/1/checkpoints/5",
                step=5,
                size_bytes=4_000,
            ),
            RunCompleted(
                event_id="n0/j1/1/completed",
                ts_ms=1_200,
                job_id="j1",
                run=1,
                node_id="node-1",
                incarnation=1,
                artifact_uri="local://jobs/j1/runs/1/output/out.gif",
                size_bytes=6_000,
            ),
        ]
        records = records_for(events + reports)
        await consumer.handle(records)
        await consumer.handle(records)  # read again
        assert ledger.used("acme") == 10_000
        completed = next(e for e in events if isinstance(e, JobCompleted))
        js = ledger.jobs["j1"]
        assert js.tenant == "acme" and js.finished_ms and js.result_uri == completed.artifact_uri
        assert consumer.counters.dead_lettered == 0
        consumer.close()

    asyncio.run(go())


def test_the_sweeper_deletes_only_what_retention_lets_go(tmp_path):
    store = LocalDirStore(tmp_path / "artifacts", secret="k")
    result = store.put_bytes(output_key("j1", 1, "out.gif"), b"r" * 300)
    ckpt = store.put_bytes(checkpoint_key("j1", 1, 4), b"c" * 200)
    live_old = store.put_bytes(checkpoint_key("j2", 1, 1), b"o" * 20)
    live_new = store.put_bytes(checkpoint_key("j2", 1, 2), b"n" * 10)
    ledger = StorageLedger()
    done = JobFacts("j1", "acme", "free", finished_ms=DAY_MS, result_uri=result.uri)
    running = JobFacts("j2", "acme", "free")
    ledger.record(
        [
            (done, obj(result.uri, 300, OUTPUT, step=-1, ts=0)),
            (done, obj(ckpt.uri, 200, step=4, ts=0)),
            (running, obj(live_old.uri, 20, step=1, ts=DAY_MS)),
            (running, obj(live_new.uri, 10, step=2, ts=DAY_MS)),
        ]
    )
    retention = lambda tier: RET
    assert asyncio.run(sweep_once(ledger, store, retention, now_ms=DAY_MS + 1)) == 0
    assert asyncio.run(sweep_once(ledger, store, retention, now_ms=2 * DAY_MS)) == 2
    assert not store.exists(ckpt.uri) and not store.exists(live_old.uri)
    assert store.exists(result.uri) and store.exists(live_new.uri)
    assert ledger.used("acme") == 310 and ledger.gone("j1") is None
    asyncio.run(sweep_once(ledger, store, retention, now_ms=8 * DAY_MS))
    assert not store.exists(result.uri) and store.exists(live_new.uri)
    assert ledger.used("acme") == 10 and "artifact_retention_s" in ledger.gone("j1")[1]


# ----------------------------------------------------------------------------
# The API: quota at submit, 410 for an expired result
# ----------------------------------------------------------------------------
ALICE, BOB = "acme-key.alice-secret", "globex-key.bob-secret"
BODY = {"prompt": "a red fox", "model": "demo"}


def make_config(ledger: StorageLedger, **api) -> ApiConfig:
    keys = ApiKeys(
        [record_for(ALICE, "acme", "alice"), record_for(BOB, "globex", "bob")],
        {
            "acme": TenantPolicy(("free",), storage_quota_bytes=1_000),
            "globex": TenantPolicy(("paid",)),
        },
    )
    return ApiConfig(
        auth=keys,
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        storage=ledger,
        settings=api_settings({"api": api}),
        clock=lambda: 2.0 * 86400,
    )


def test_a_tenant_holding_its_storage_quota_is_refused_at_submit_naming_it():
    async def go():
        ledger = StorageLedger()
        config = make_config(ledger, tiers={"paid": {"storage_quota_bytes": 10**9}})
        async with TestClient(TestServer(make_app(config))) as client:
            alice, bob = {"Authorization": f"Bearer {ALICE}"}, {"Authorization": f"Bearer {BOB}"}
            assert (await client.post("/v1/jobs", json=BODY, headers=alice)).status == 202
            ledger.record(
                [
                    (
                        JobFacts("j0", "acme", "free", finished_ms=DAY_MS, result_uri="r"),
                        obj("r", 1_000, OUTPUT),
                    )
                ]
            )
            refused = await client.post("/v1/jobs", json=BODY, headers=alice)
            assert refused.status == 429
            err = (await refused.json())["error"]
            assert err["code"] == "storage_quota" and err["field"] == "storage_quota_bytes"
            assert (
                "1000 bytes" in err["message"] and "storage_quota_bytes of 1000" in err["message"]
            )
            # retention frees the result 7 days after the job ended at day 1: 6 days from now
            assert refused.headers["Retry-After"] == str(6 * 86400)
            assert len(config.producer.on(COMMANDS.name)) == 1, "nothing written for it"
            assert (await client.post("/v1/jobs", json=BODY, headers=bob)).status == 202
            ledger.deleted("j0", ["r"], now_ms=3, why="gone")
            assert (await client.post("/v1/jobs", json=BODY, headers=alice)).status == 202

    asyncio.run(go())


def test_an_expired_result_answers_410_saying_why():
    async def go():
        ledger = StorageLedger()
        config = make_config(ledger)
        consumer = ProjectionConsumer(config.store, storage=ledger)
        events = lifecycle("j1", "acme")
        completed = next(e for e in events if isinstance(e, JobCompleted))
        report = RunCompleted(
            event_id="x",
            ts_ms=1_200,
            job_id="j1",
            run=completed.run,
            node_id="node-1",
            incarnation=1,
            artifact_uri=completed.artifact_uri,
            size_bytes=10,
        )
        await consumer.handle(records_for([*events, report]))
        ledger.deleted(
            "j1",
            [completed.artifact_uri],
            now_ms=DAY_MS,
            why="result deleted: tier 'free' keeps it artifact_retention_s=60 s after the job ended",
        )
        async with TestClient(TestServer(make_app(config))) as client:
            r = await client.get("/v1/jobs/j1/result", headers={"Authorization": f"Bearer {ALICE}"})
            assert r.status == 410
            err = (await r.json())["error"]
            assert err["code"] == "result_expired"
            assert (
                "artifact_retention_s=60" in err["message"]
                and "1970-01-02T00:00:00Z" in err["message"]
            )
        consumer.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    "api, key",
    [
        ({"storage_quota_bytes": -1}, "api"),
        ({"tiers": {"free": {"checkpoint_retention_s": -5}}}, "api.tiers.free"),
    ],
)
def test_storage_settings_are_checked_naming_the_key(api, key):
    from framespool.configfile import ConfigError

    with pytest.raises((ConfigError, ValueError)) as info:
        api_settings({"api": api})
    assert key in str(info.value)


def test_per_tier_retention_and_quota_come_from_the_api_section():
    s = api_settings(
        {
            "api": {
                "artifact_retention_s": 100,
                "tiers": {"free": {"artifact_retention_s": 60, "storage_quota_bytes": 5}},
            }
        }
    )
    assert s.retention_of("free") == Retention(60.0, 86400.0)
    assert s.retention_of("paid") == Retention(100.0, 86400.0)
    assert s.storage_quota_of(TenantPolicy(("free",))) == 5
    assert s.storage_quota_of(TenantPolicy(("free",), storage_quota_bytes=9)) == 9
    assert s.storage_quota_of(TenantPolicy(("paid",))) == 0
