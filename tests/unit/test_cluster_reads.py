"""``GET /v1/cluster`` at fleet scale (``framespool.producers.cluster_reads``): one
tenant polling the cluster map must not cost the API's event loop a store read
per GPU and a full render per call, and each tenant still sees only its own
jobs on the map."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from aiohttp.test_utils import TestClient, TestServer

from framespool.bench.cluster import HeldView
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, record_for
from framespool.producers.cluster_reads import ClusterReads
from framespool.producers.http import CLUSTER_READS
from framespool.projections.cluster import Breaker, CellView, ClusterView
from framespool.projections.jobs import submitted_view
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.schemas import events as ev

TENANTS = 50


def fleet(cells: int = 3, nodes: int = 20, gpus: int = 8) -> tuple[ClusterView, dict[str, str]]:
    """A cluster map with every GPU running a job of one of ``TENANTS`` tenants
    (gangs: a job holds a node's 8 GPUs); returns the view and job -> tenant."""
    owner: dict[str, str] = {}
    view_cells = {}
    for c in range(cells):
        node_list = []
        for n in range(nodes):
            job = f"job-{c}-{n}"
            owner[job] = f"t{(c * nodes + n) % TENANTS}"
            node_list.append(
                ev.NodeStatus(
                    node_id=f"c{c}-n{n}",
                    state="UP",
                    gpu_type="H100",
                    rail="r0",
                    gpus=tuple(
                        ev.GpuStatus(index=g, state="busy", job_id=job, run=1) for g in range(gpus)
                    ),
                )
            )
        view_cells[f"cell-{c}"] = CellView(f"cell-{c}", "e", 1000, tuple(node_list))
    return ClusterView(cells=view_cells, updated_ms=1000), owner


def jobs_named(doc: dict) -> set[str]:
    return {
        g["job_id"]
        for cell in doc["cells"]
        for node in cell["nodes"]
        for g in node["gpus"]
        if g["job_id"]
    }


def test_each_tenant_sees_its_own_jobs_and_whose_a_job_is_is_read_once():
    view, owner = fleet()
    reads = ClusterReads()
    lookups: list[str] = []

    def lookup(job_id: str) -> str | None:
        lookups.append(job_id)
        return owner.get(job_id)

    for tenant in ("t0", "t1", "t7"):
        doc = json.loads(reads.body(view, 2000, tenant, True, lookup)[0])
        assert jobs_named(doc) == {j for j, t in owner.items() if t == tenant}
        assert set(doc["queues"]["by_tenant"]) <= {tenant}
    # 60 jobs of 8 GPUs each: one store read per job, not per GPU, not per tenant
    assert sorted(lookups) == sorted(owner)


def test_a_repeat_is_served_from_the_generation_and_a_change_renders_anew():
    view, owner = fleet()
    reads = ClusterReads()
    first = reads.body(view, 2000, "t3", True, owner.get)
    for _ in range(100):  # one tenant polling in a loop
        assert reads.body(view, 2000, "t3", True, owner.get) is first
    assert reads.rendered == 1
    # an offer arriving replaces the view but keeps its cells: the same generation
    assert reads.body(replace(view, offers={"cell-0": None}), 2000, "t3", True, owner.get) is first
    # a cell's new status is a new generation: rendered again, and right
    cells = dict(view.cells)
    cells["cell-0"] = replace(cells["cell-0"], nodes=cells["cell-0"].nodes[:1], ts_ms=3000)
    changed = replace(view, cells=cells)
    doc = json.loads(reads.body(changed, 3000, "t3", True, owner.get)[0])
    assert reads.rendered == 2
    assert len(doc["cells"][0]["nodes"]) == 1


def test_a_breaker_that_expires_is_shown_inactive_without_a_new_event():
    view, owner = fleet(cells=1, nodes=1)
    breaker = Breaker("v1", "node", "c0-n0", until_ms=5000, reason="failures", ts_ms=1000)
    view = replace(view, breakers={"v1|node|c0-n0": breaker})
    reads = ClusterReads()
    before = json.loads(reads.body(view, 4000, "t0", False, owner.get)[0])
    after = json.loads(reads.body(view, 6000, "t0", False, owner.get)[0])
    assert [b["active"] for b in before["breakers"]] == [True]
    assert [b["active"] for b in after["breakers"]] == [False]


class CountingStore(InMemoryViewStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    def get(self, job_id):
        self.gets += 1
        return super().get(job_id)


def api_over(owner: dict[str, str], store, tenants, projection: HeldView) -> ApiConfig:
    """An API whose read model holds every job of ``owner`` and whose cluster
    view is ``projection``'s; each of ``tenants`` has the key ``<tenant>-key.s``."""
    batch = Batch()
    for job, tenant in owner.items():
        batch.views[job] = submitted_view(ev.JobSpec(job_id=job, tenant=tenant), 1000)
    store.commit(batch)
    return ApiConfig(
        auth=ApiKeys([record_for(f"{t}-key.s", t, "u") for t in tenants]),
        store=store,
        producer=MemoryProducer(),
        dashboard_dir=None,
        background=(projection.run,),
    )


def test_the_api_serves_the_cluster_from_memory_reading_each_jobs_owner_once():
    view, owner = fleet()
    store = CountingStore()
    config = api_over(owner, store, ("t0", "t1"), HeldView(view))

    async def main() -> list[dict]:
        app = make_app(config)
        async with TestClient(TestServer(app)) as client:
            docs = []
            for tenant in ("t0", "t1") * 10:
                r = await client.get(
                    "/v1/cluster", headers={"Authorization": f"Bearer {tenant}-key.s"}
                )
                assert r.status == 200 and r.content_type == "application/json"
                docs.append(await r.json())
            assert app[CLUSTER_READS].rendered == 2  # one per tenant, then repeats
            return docs

    docs = asyncio.run(main())
    assert jobs_named(docs[0]) == {j for j, t in owner.items() if t == "t0"}
    assert jobs_named(docs[1]) == {j for j, t in owner.items() if t == "t1"}
    assert store.gets <= len(owner) + 4  # the keys' own reads aside: once per job


def test_a_poll_that_sends_the_etag_back_gets_304_until_the_map_changes():
    view, owner = fleet()
    projection = HeldView(view)
    config = api_over(owner, InMemoryViewStore(), ("t0",), projection)
    auth = {"Authorization": "Bearer t0-key.s"}

    async def main() -> None:
        async with TestClient(TestServer(make_app(config))) as client:
            first = await client.get("/v1/cluster", headers=auth)
            etag = first.headers["ETag"]
            assert first.status == 200 and first.headers["Cache-Control"] == "no-cache"
            again = await client.get("/v1/cluster", headers={**auth, "If-None-Match": etag})
            assert again.status == 304 and await again.read() == b""
            # other tenants' documents and the no-detail one have tags of their own
            brief = await client.get(
                "/v1/cluster?detail=0", headers={**auth, "If-None-Match": etag}
            )
            assert brief.status == 200
            # a cell's new status: the old tag no longer matches
            cells = dict(view.cells)
            cells["cell-0"] = replace(cells["cell-0"], nodes=cells["cell-0"].nodes[:1], ts_ms=3000)
            projection.cluster = replace(view, cells=cells)
            changed = await client.get("/v1/cluster", headers={**auth, "If-None-Match": etag})
            assert changed.status == 200 and changed.headers["ETag"] != etag
            assert len((await changed.json())["cells"][0]["nodes"]) == 1

    asyncio.run(main())


def test_bench_cluster_reports_each_kind_of_call(capsys):
    """``framespool bench cluster`` on a tiny fleet: the API served on a port,
    one tenant's calls of each kind (the bench asserts 200s and 304s itself)."""
    from framespool import cli

    assert cli.main(["bench", "cluster", "--cells", "2", "--nodes", "3", "--calls", "3"]) == 0
    out = capsys.readouterr().out
    assert "48 GPUs" in out and "(304)" in out and "after a cell's new status" in out
    assert cli.main(["bench", "cluster", "--calls", "0"]) != 0


def test_owners_of_jobs_gone_from_the_map_are_forgotten_once_they_pile_up():
    """Jobs come and go; the owners kept stay within twice the jobs on the map
    plus a slack, however many generations pass."""
    from framespool.producers.cluster_reads import PRUNE_SLACK

    reads = ClusterReads()
    for generation in range(120):  # 120 x 20 distinct jobs pass through the map
        view, owner = fleet(cells=1, nodes=20)
        cells = {
            name: replace(
                cell,
                nodes=tuple(
                    replace(
                        node,
                        gpus=tuple(
                            replace(g, job_id=f"{g.job_id}-g{generation}") for g in node.gpus
                        ),
                    )
                    for node in cell.nodes
                ),
            )
            for name, cell in view.cells.items()
        }
        moved = replace(view, cells=cells)
        reads.body(moved, 2000, "t0", True, lambda job, o=owner: o.get(job.rsplit("-g", 1)[0]))
        assert len(reads._tenant_of) <= 2 * PRUNE_SLACK + 2 * 20
