"""The per-tier predicted-wait limit is refused at submit time (issue #10): a
job whose predicted wait in the best cell that can run it exceeds its tier's
``max_predicted_wait_s`` gets 429 with ``Retry-After`` naming the tier, the wait
and the limit, and nothing reaches the log; under the limit it gets 202, and the
cell then queues it (it no longer rejects on predicted wait:
test_core_knobs_admission). The wait comes from the cells' latest offers, which
the cluster projection folds from job-events; stale or missing offers refuse
nothing."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from aiohttp.test_utils import TestClient, TestServer

from framespool.log.memory import MemoryProducer
from framespool.processors.routing import destinations
from framespool.producers import openapi
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.http import OFFERS
from framespool.projections import cluster
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.store import InMemoryViewStore
from framespool.schemas import events as ev
from framespool.schemas.topics import COMMANDS, JOB_EVENTS
from tests.support.projections import records_for

ALICE = "acme-key.alice-secret"
HEADERS = {"Authorization": f"Bearer {ALICE}"}
NOW_S = 1_000.0  # the API's clock in these tests
BODY = {"prompt": "a red fox", "model": "demo", "tier": "free", "gpus": 8, "gpus_per_node": 8}


def offer(
    cell: str = "cell-0",
    *,
    limit_s: float = 600.0,
    running_gpu_s: float = 8 * 3590.0,
    free: int = 0,
    age_s: float = 1.0,
    nodes: int = 1,
) -> ev.CellOffer:
    """One 8-GPU node; by default busy for another 3590 s, so an 8-GPU job would
    wait 3590 s, and the free tier's limit is ``limit_s``."""
    groups = (ev.NodeGroup(gpus=8, nodes=nodes),) if nodes else ()
    return ev.CellOffer(
        event_id=f"{cell}@1/0",
        ts_ms=int((NOW_S - age_s) * 1000),
        cell=cell,
        capacity_gpus=8 * nodes,
        free_gpus=free,
        running_gpu_s=running_gpu_s,
        gpu_types=(
            ev.GpuOffer(gpu_type="H100", healthy_gpus=8 * nodes, free_gpus=free, groups=groups),
        ),
        tiers=(
            ev.TierBacklog(tier="interactive"),
            ev.TierBacklog(tier="paid"),
            ev.TierBacklog(tier="free", max_wait_s=limit_s),
        ),
    )


def make_config(offers, store=None, **kw) -> ApiConfig:
    keys = ApiKeys([record_for(ALICE, "acme", "alice")], {"acme": TenantPolicy(("free", "paid"))})
    return ApiConfig(
        auth=keys,
        store=store if store is not None else InMemoryViewStore(),
        producer=MemoryProducer(),
        clock=lambda: NOW_S,
        offers=(lambda: offers) if offers is not None else None,
        **kw,
    )


async def submit(config: ApiConfig, body=BODY):
    async with TestClient(TestServer(make_app(config))) as client:
        r = await client.post("/v1/jobs", json=body, headers=HEADERS)
        return r.status, dict(r.headers), await r.json()


def test_a_submit_past_its_tiers_predicted_wait_limit_gets_429_naming_tier_wait_and_limit():
    config = make_config({"cell-0": offer()})
    status, headers, body = asyncio.run(submit(config))
    assert status == 429
    assert headers["Retry-After"] == "2990"  # the excess wait: 3590 - 600
    err = body["error"]
    assert err["code"] == "predicted_wait" and err["field"] == "tier"
    assert "tier 'free'" in err["message"]
    assert "predicted wait 3590s" in err["message"]
    assert "free tier limit of 600s" in err["message"]
    assert "retry later or use a higher tier" in err["message"]
    assert config.producer.on(COMMANDS.name) == [], "nothing written for a refused job"


def test_under_the_limit_without_a_limit_or_in_another_tier_the_submit_is_accepted():
    """Controls: each changes one thing of the refused case, and gets 202."""
    for offers, body in [
        ({"cell-0": offer(limit_s=7200)}, BODY),  # a limit above the wait
        ({"cell-0": offer(limit_s=0)}, BODY),  # 0 = no limit
        ({"cell-0": offer()}, {**BODY, "tier": "paid"}),  # paid has no limit
        ({"cell-0": offer(running_gpu_s=0, free=8)}, BODY),  # the node is free: wait 0
    ]:
        config = make_config(offers)
        status, _, _ = asyncio.run(submit(config, body))
        assert status == 202, (offers, body)
        assert len(config.producer.on(COMMANDS.name)) == 1


def test_the_best_cell_that_can_run_the_job_decides():
    """A busy cell and an idle one: the job would go to the idle one (admission
    routes by the same wait), so it is accepted; a cell whose nodes cannot host
    the job's shape is not its host, however idle."""
    idle = offer("cell-1", running_gpu_s=0, free=8)
    assert asyncio.run(submit(make_config({"cell-0": offer(), "cell-1": idle})))[0] == 202
    small = half_node(offer("cell-1", running_gpu_s=0, free=8))
    status, _, body = asyncio.run(submit(make_config({"cell-0": offer(), "cell-1": small})))
    assert status == 429 and "best cell cell-0" in body["error"]["message"]


def half_node(o: ev.CellOffer) -> ev.CellOffer:
    """``o`` with one 4-GPU node: it cannot host an 8-GPU job."""
    half = ev.GpuOffer(
        gpu_type="H100", healthy_gpus=4, free_gpus=4, groups=(ev.NodeGroup(gpus=4, nodes=1),)
    )
    return replace(o, gpu_types=(half,), capacity_gpus=4, free_gpus=4)


def test_stale_or_missing_offers_refuse_nothing():
    """Unknown is never refused: an offer older than offer_stale_s, a cell with
    no UP node, or no offers at all let the job through to the cell."""
    for offers in [
        {"cell-0": offer(age_s=16)},  # older than the default 15 s
        {"cell-0": offer(nodes=0)},  # no UP node: says nothing
        {},
        None,  # no offers source and no projection consumer
    ]:
        config = make_config(offers)
        assert asyncio.run(submit(config))[0] == 202, offers
    # the staleness bound is the API's setting
    config = make_config({"cell-0": offer(age_s=16)}, offer_stale_s=30)
    assert asyncio.run(submit(config))[0] == 429


def test_the_offers_come_from_the_projection_consumer_that_runs_with_the_app():
    """Wired by default: the consumer among ``background`` folds CellOffer (which
    the scheduler sends to job-events too) into its cluster view."""
    assert any(d.topic == JOB_EVENTS.name for d in destinations(offer()))
    view = cluster.apply(None, offer())
    assert cluster.is_cluster_event(offer()) and view.offers["cell-0"] == offer()

    class Consumer:  # the part of ProjectionConsumer the API reads
        cluster = view

        async def run(self) -> None:
            await asyncio.Event().wait()

    config = make_config(None, background=(Consumer().run,))
    assert asyncio.run(submit(config))[0] == 429


def test_the_projection_consumer_folds_offers_from_job_events_and_the_api_reads_them():
    """The real chain: an offer record on job-events is folded (not
    dead-lettered) by the consumer that runs with the app, and the API reads it."""
    store = InMemoryViewStore()
    consumer = ProjectionConsumer(store, dead_letter_sender=MemoryProducer())
    asyncio.run(consumer.handle(records_for([offer()])))
    assert consumer.counters.dead_lettered == 0 and consumer.counters.applied == 1
    assert consumer.cluster.offers == {"cell-0": offer()}
    # the app finds the consumer among its background runs (not started here)
    offers = make_app(make_config(None, background=(consumer.run,)))[OFFERS]
    assert offers() == {"cell-0": offer()}
    assert asyncio.run(submit(make_config(offers())))[0] == 429


def test_the_cluster_fold_keeps_each_cells_newest_offer():
    old, new = offer(age_s=5), offer(age_s=1)
    view = cluster.apply(cluster.apply(None, new), old)
    assert view.offers == {"cell-0": new}, "an older offer never wins"
    assert cluster.apply(view, new) is view, "a duplicate is a no-op"


def test_openapi_lists_the_429_and_its_code():
    doc = openapi.build(make_config(None).limits)
    refused = doc["paths"]["/v1/jobs"]["post"]["responses"]["429"]
    assert "predicted_wait" in refused["description"] and "Retry-After" in refused["headers"]
    assert "predicted_wait" in openapi.ERROR_CODES


def flooded_offer() -> ev.CellOffer:
    """The node busy for 300 s more, and 40 jobs of 8 GPU-hours queued in the free
    tier by one tenant whose virtual time is the tier's least, so the fair order
    serves them from the start (``TierBacklog.fair_gpu_s``)."""
    from framespool.processors.core.drain import FAIR_STEPS_GPU_S

    flood = 40 * 8 * 3600.0
    base = offer(limit_s=1200, running_gpu_s=8 * 300.0)
    fair = (*(min(d, flood) for d in FAIR_STEPS_GPU_S), flood)
    free = ev.TierBacklog(tier="free", queued_gpu_s=flood, max_wait_s=1200, fair_gpu_s=fair)
    return replace(base, tiers=(*base.tiers[:2], free))


class Waiting(InMemoryViewStore):
    """A read model in which the tenant already has ``n`` jobs waiting and
    ``running`` holding GPUs."""

    def __init__(self, n: int, running: int = 0) -> None:
        super().__init__()
        self.n, self.running = n, running

    def queued_count(self, tenant: str) -> int:
        return self.n

    def running_count(self, tenant: str) -> int:
        return self.running


def test_another_tenants_flood_does_not_refuse_a_tenant_that_would_start_ahead_of_it():
    """By fair share a tenant with nothing waiting starts before the flood, so
    its wait is the running work's (300 s, under the 1,200 s limit): 202. The
    same tenant with 40 jobs of its own waiting is behind them and the flood:
    429, the wait named. (A cell before ``fair_gpu_s`` refuses both: the
    tier's whole backlog, test_core_knobs_admission.)"""
    body = BODY  # an 8-GPU free-tier job of the default estimate
    status, _, reply = asyncio.run(submit(make_config({"cell-0": flooded_offer()}), body))
    assert status == 202, reply
    config = make_config({"cell-0": flooded_offer()}, store=Waiting(40))
    status, _, reply = asyncio.run(submit(config, body))
    assert status == 429 and reply["error"]["code"] == "predicted_wait", reply
    assert config.producer.on(COMMANDS.name) == []
    # nothing waiting but 40 jobs running: it leads the flood by those, and is
    # served after as much of it
    config = make_config({"cell-0": flooded_offer()}, store=Waiting(0, running=40))
    status, _, reply = asyncio.run(submit(config, body))
    assert status == 429 and reply["error"]["code"] == "predicted_wait", reply


def test_a_tiny_estimate_does_not_shrink_the_tenants_own_backlog():
    """Issue #33, 5: with 40 jobs waiting, each claiming 1 ms, the tenant's own
    backlog weighed nothing and the limit was bypassed. Once the API has seen
    the model's jobs of this tenant run an hour, its estimate counts as an hour:
    429. Control: with nothing learned, the estimate stands (202)."""
    from framespool.projections.jobs import COMPLETED, JobView

    tiny = {**BODY, "estimate_s": 0.001}

    async def go(learned: int) -> int:
        config = make_config({"cell-0": flooded_offer()}, store=Waiting(40))
        async with TestClient(TestServer(make_app(config))) as client:
            for i in range(learned):  # what the projection publishes as jobs end
                config.hub.publish(
                    f"done{i}",
                    JobView(
                        job_id=f"done{i}",
                        tenant="acme",
                        model="demo",
                        model_version="1",
                        state=COMPLETED,
                        started_ms=1_000,
                        finished_ms=1_000 + 3_600_000,
                    ),
                )
            r = await client.post("/v1/jobs", json=tiny, headers=HEADERS)
            return r.status

    assert asyncio.run(go(learned=3)) == 429
    assert asyncio.run(go(learned=0)) == 202


def test_learned_run_times_are_the_tenants_own_else_a_vote_of_tenants():
    from framespool.producers.run_times import RunTimes
    from framespool.projections.jobs import COMPLETED, JobView

    def done(job: str, tenant: str, seconds: float, model: str = "demo") -> JobView:
        return JobView(
            job_id=job,
            tenant=tenant,
            model=model,
            model_version="1",
            state=COMPLETED,
            started_ms=1_000,
            finished_ms=1_000 + int(seconds * 1000),
        )

    times = RunTimes()
    for i in range(3):
        times(f"a{i}", done(f"a{i}", "a", 100))
    times("a0", done("a0", "a", 9_999))  # a job counts once
    assert times.floor_s("a", "demo@1") == 100
    assert times.floor_s("b", "demo@1") == 0  # one tenant's runs say nothing of b's
    for t, seconds in (("b", 200), ("c", 300)):
        for i in range(3):
            times(f"{t}{i}", done(f"{t}{i}", t, seconds))
    for i in range(50):  # mallory's flood of long runs is one vote
        times(f"m{i}", done(f"m{i}", "mallory", 86_400))
    assert times.floor_s("new", "demo@1") == 250  # median of 100, 200, 300, 86,400
    assert times.floor_s("new", "other@1") == 0
