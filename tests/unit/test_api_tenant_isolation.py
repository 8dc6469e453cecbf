"""Hostile tenants against the HTTP API: what one tenant can learn about, or take from, another.

Each test plays the attack: reading other tenants' names, queues and job ids
from ``/v1/cluster``; scraping ``/metrics`` without a key; reading who preempted
a job; holding open more event streams than its share.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp.test_utils import TestClient, TestServer

from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app, metrics_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.projections import cluster
from framespool.projections.jobs import fold
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.schemas.events import (
    BreakerTripped,
    CellStatus,
    GpuStatus,
    JobAdmitted,
    JobAssigned,
    JobPreempted,
    JobQueued,
    JobRequeued,
    NodeSlice,
    NodeStatus,
    QueueDepth,
)
from tests.support.api import auth, run
from tests.support.projections import lifecycle, spec

ALICE, ALICE2, BOB = "acme-key.alice-secret", "acme-key2.carol-secret", "globex-key.bob-secret"
OPERATOR = "operator-metrics-key"


@contextlib.asynccontextmanager
async def api(**overrides):
    keys = ApiKeys(
        [
            record_for(ALICE, "acme", "alice"),
            record_for(ALICE2, "acme", "carol"),
            record_for(BOB, "globex", "bob"),
        ],
        {"acme": TenantPolicy(("free",)), "globex": TenantPolicy(("paid", "free"), "paid")},
    )
    config = ApiConfig(auth=keys, store=InMemoryViewStore(), producer=MemoryProducer(), **overrides)
    async with TestClient(TestServer(make_app(config))) as client:
        yield client, config


def _fold(store, events):
    views = {}
    for e in events:
        job = e.spec.job_id if hasattr(e, "spec") else e.job_id
        views[job] = fold([e], views.get(job) or store.get(job))
    store.commit(Batch(views=views))


def _two_tenant_cell() -> CellStatus:
    gpus = (
        GpuStatus(index=0, state="busy", job_id="job_acme1", run=1),
        GpuStatus(index=1, state="busy", job_id="job_globexsecret", run=2),
        GpuStatus(index=2, state="free", job_id="", run=0),
    )
    return CellStatus(
        event_id="cell-0:status:1",
        ts_ms=5_000,
        cell="cell-0",
        nodes=(NodeStatus(node_id="n0", state="UP", gpu_type="H100", rail="r0", gpus=gpus),),
        queues=(
            QueueDepth(tier="free", tenant="acme", queued=2, queued_gpus=2, running_gpus=1),
            QueueDepth(tier="paid", tenant="globex", queued=5, queued_gpus=40, running_gpus=1),
        ),
    )


def test_cluster_shows_the_caller_its_own_queues_and_jobs_and_only_totals_of_others():
    async def go():
        async with api() as (client, config):
            store = config.store
            _fold(store, lifecycle("job_acme1", "acme")[:3])
            _fold(store, lifecycle("job_globexsecret", "globex")[:3])
            view = cluster.apply(None, _two_tenant_cell())
            store.commit(Batch(cells=dict(view.cells)))
            r = await client.get("/v1/cluster", headers=auth(ALICE))
            assert r.status == 200
            doc = await r.json()
            text = await r.text()
            assert "globex" not in text and "job_globexsecret" not in text
            assert set(doc["queues"]["by_tenant"]) == {"acme"}
            assert doc["queues"]["by_tenant"]["acme"]["queued"] == 2
            # totals stay whole: the tier rows sum every tenant's jobs
            assert doc["queues"]["by_tier"]["paid"]["queued"] == 5
            assert doc["totals"]["busy"] == 2
            gpus = {g["index"]: g for g in doc["cells"][0]["nodes"][0]["gpus"]}
            assert gpus[0]["job_id"] == "job_acme1" and gpus[0]["bucket"] == "busy"
            assert gpus[1]["job_id"] is None and gpus[1]["bucket"] == "busy"
            theirs = await (await client.get("/v1/cluster", headers=auth(BOB))).json()
            assert set(theirs["queues"]["by_tenant"]) == {"globex"}
            assert "job_acme1" not in str(theirs)

    run(go())


def test_metrics_need_the_operator_key_and_tenant_keys_are_refused():
    async def go():
        async with api(operator_key=OPERATOR) as (client, _):
            await client.get("/v1/cluster", headers=auth(ALICE))
            assert (await client.get("/metrics")).status == 401
            assert (await client.get("/metrics", headers=auth(ALICE))).status == 401
            ok = await client.get("/metrics", headers=auth(OPERATOR))
            assert ok.status == 200 and "framespool_api_requests_total" in await ok.text()
        async with api() as (client, _):  # no operator key: not served on the API's address
            assert (await client.get("/metrics", headers=auth(ALICE))).status == 404
            # ... but on its own (private) address, from the same registry
            async with TestClient(TestServer(metrics_app(client.server.app))) as private:
                text = await (await private.get("/metrics")).text()
                assert 'route="/metrics",status="404"' in text

    run(go())


def test_a_victim_never_reads_the_preempting_tenant_or_job():
    async def go():
        async with api() as (client, config):
            victim = spec("job_victim", "acme")
            events = [
                JobAdmitted(event_id="v:0", ts_ms=1_000, spec=victim, cell="cell-0"),
                JobQueued(
                    event_id="v:1", ts_ms=1_010, job_id="job_victim", tenant="acme", tier="free"
                ),
                JobAssigned(
                    event_id="v:2",
                    ts_ms=1_020,
                    job_id="job_victim",
                    run=1,
                    gpus=1,
                    estimate_s=60.0,
                    placement=(NodeSlice(node_id="n0", gpus=(0,)),),
                ),
                JobPreempted(
                    event_id="v:3",
                    ts_ms=1_030,
                    job_id="job_victim",
                    run=1,
                    by_job_id="job_globex77",
                    reason="preempted by job_globex77: reclaiming reserved capacity of globex/paid",
                ),
                JobRequeued(
                    event_id="v:4",
                    ts_ms=1_040,
                    job_id="job_victim",
                    run=1,
                    reason="preempted by job_globex77: reclaiming reserved capacity of globex/paid",
                ),
            ]
            _fold(config.store, events)
            r = await client.get("/v1/jobs/job_victim", headers=auth(ALICE))
            assert r.status == 200
            text = await r.text()
            assert "globex" not in text and "job_globex77" not in text
            assert "preempted" in (await r.json())["reason"]

    run(go())


def _open_job(store, job_id):
    _fold(store, lifecycle(job_id, "acme")[:3])


def test_event_streams_are_capped_per_key_and_per_tenant_with_retry_after():
    async def go():
        async with api(sse_max_per_key=2, sse_max_per_tenant=3) as (client, config):
            _open_job(config.store, "job_s")
            _fold(config.store, lifecycle("job_g", "globex")[:3])
            streams = []
            for _ in range(2):
                r = await client.get("/v1/jobs/job_s/events", headers=auth(ALICE))
                assert r.status == 200
                streams.append(r)
            over_key = await client.get("/v1/jobs/job_s/events", headers=auth(ALICE))
            assert over_key.status == 429 and int(over_key.headers["Retry-After"]) >= 1
            assert (await over_key.json())["error"]["code"] == "too_many_streams"
            r = await client.get("/v1/jobs/job_s/events", headers=auth(ALICE2))
            assert r.status == 200
            streams.append(r)
            over_tenant = await client.get("/v1/jobs/job_s/events", headers=auth(ALICE2))
            assert over_tenant.status == 429 and "Retry-After" in over_tenant.headers
            other = await client.get("/v1/jobs/job_g/events", headers=auth(BOB))
            assert other.status == 200  # another tenant's share is its own
            other.close()
            streams.pop(0).close()
            for _ in range(100):  # the server notices the closed stream
                await asyncio.sleep(0.01)
                again = await client.get("/v1/jobs/job_s/events", headers=auth(ALICE))
                if again.status == 200:
                    break
                await again.release()
            assert again.status == 200
            again.close()
            for s in streams:
                s.close()

    run(go())


def test_cluster_breaker_reasons_name_no_other_tenants_job():
    """Issue #33, 10: breaker reasons written before the scheduler stopped naming
    probe runs still sit in the log; a tenant's view leaves other tenants' out."""
    hexid = "job_" + "ab12" * 8

    def tripped(n: int, reason: str) -> BreakerTripped:
        return BreakerTripped(
            event_id=f"b{n}",
            ts_ms=2_000 + n,
            model_version="m@1",
            scope="node",
            key=f"n{n}",
            until_ms=10**13,
            reason=reason,
        )

    async def go():
        async with api() as (client, config):
            store = config.store
            _fold(store, lifecycle("job_acme1", "acme")[:3])
            _fold(store, lifecycle("job_globexsecret", "globex")[:3])
            view = cluster.apply(None, _two_tenant_cell())
            for n, reason in enumerate(
                (
                    "probe run job_globexsecret#2 failed; open again, next probe in 120s",
                    "closed: probe run job_acme1#1 completed",
                    f"stop of {hexid}#3 unconfirmed",
                )
            ):
                view = cluster.apply(view, tripped(n, reason))
            store.commit(Batch(cells=dict(view.cells), breakers=dict(view.breakers)))
            text = await (await client.get("/v1/cluster", headers=auth(ALICE))).text()
            assert "job_globexsecret" not in text and hexid not in text
            assert "probe run job_acme1#1 completed" in text  # its own stays
            assert "another job" in text and "probe run failed" in text
            # the operator's view (no tenant) keeps the reasons whole
            whole = cluster.to_dict(view)
            assert any("job_globexsecret" in b["reason"] for b in whole["breakers"])

    run(go())
