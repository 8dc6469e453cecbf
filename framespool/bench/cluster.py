"""``framespool bench cluster``: what ``GET /v1/cluster`` costs the API at fleet scale.

A read model (rocksdict, as the API runs it) holds ``cells x nodes x gpus``
GPUs, each running a job of one of ``tenants`` tenants; the API app is served
on a loopback port (``producers.edge.serve``) with a stand-in for the
projection consumer that holds the committed cluster view in memory, as the
running API's does. One tenant then calls ``/v1/cluster`` (with the GPU map)
``calls`` times: the first call (every job's owner read), repeats within one
generation of the view, repeats that send the ``ETag`` back (304), and calls
after a cell's new status (a new generation, owners known). Each figure is
the client's wall time per call, medians over the calls, on one machine:
compare versions in the same run.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Any

import aiohttp

from framespool.broker import free_port
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, record_for
from framespool.producers.edge import serve
from framespool.projections.cluster import CellView, ClusterView
from framespool.projections.jobs import submitted_view
from framespool.projections.store.port import Batch
from framespool.projections.store.rocks import RocksViewStore
from framespool.schemas import events as ev


class HeldView:
    """Stands in for the API's projection consumer: it holds the committed
    cluster view, as ``ProjectionConsumer.cluster`` does (the bench and tests)."""

    def __init__(self, cluster: ClusterView) -> None:
        self.cluster = cluster

    async def run(self) -> None:
        await asyncio.Event().wait()


def _fleet(store: RocksViewStore, cells: int, nodes: int, gpus: int, tenants: int) -> ClusterView:
    batch = Batch()
    view_cells = {}
    n = 0
    for c in range(cells):
        node_list = []
        for i in range(nodes):
            statuses = []
            for g in range(gpus):
                job = f"job-{n}"
                spec = ev.JobSpec(job_id=job, tenant=f"t{n % tenants}", tier="free")
                batch.views[job] = submitted_view(spec, 1000)
                statuses.append(ev.GpuStatus(index=g, state="busy", job_id=job, run=1))
                n += 1
            node_list.append(
                ev.NodeStatus(
                    node_id=f"c{c}-n{i}", state="UP", gpu_type="H100", gpus=tuple(statuses)
                )
            )
        cell = CellView(f"cell-{c}", f"e{c}", 1000, tuple(node_list))
        view_cells[cell.cell] = cell
        batch.cells[cell.cell] = cell
    store.commit(batch)
    return ClusterView(cells=view_cells, updated_ms=1000)


def bench_cluster(cells: int, nodes: int, gpus: int, tenants: int, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="framespool-bench-cluster-") as tmp:
        store = RocksViewStore(tmp)
        try:
            view = _fleet(store, cells, nodes, gpus, tenants)
            return asyncio.run(_calls(store, view, tenants, calls))
        finally:
            store.close()


async def _calls(
    store: RocksViewStore, view: ClusterView, tenants: int, calls: int
) -> dict[str, Any]:
    projection = HeldView(view)
    key = "t1-key.bench"
    config = ApiConfig(
        auth=ApiKeys([record_for(key, "t1", "u")]),
        store=store,
        producer=MemoryProducer(),
        dashboard_dir=None,
        background=(projection.run,),
    )
    port = free_port()
    runner, _site = await serve(make_app(config), "127.0.0.1", port)
    url = f"http://127.0.0.1:{port}/v1/cluster"
    auth = {"Authorization": f"Bearer {key}"}
    out: dict[str, Any] = {"gpus": sum(len(n.gpus) for c in view.cells.values() for n in c.nodes)}
    try:
        async with aiohttp.ClientSession(headers=auth) as http:

            async def timed(headers: dict[str, str] | None = None) -> tuple[float, int, Any]:
                t = time.perf_counter()
                async with http.get(url, headers=headers) as r:
                    body = await r.read()
                    return time.perf_counter() - t, r.status, (len(body), r.headers.get("ETag"))

            first, status, (size, etag) = await timed()
            assert status == 200, status
            out["bytes"] = size
            out["first_ms"] = round(first * 1000, 2)
            repeats = [(await timed())[0] for _ in range(calls)]
            out["repeat_ms"] = round(statistics.median(repeats) * 1000, 2)
            revalidated = []
            for _ in range(calls):
                took, status, _ = await timed({"If-None-Match": etag or ""})
                assert status == 304, status
                revalidated.append(took)
            out["not_modified_ms"] = round(statistics.median(revalidated) * 1000, 2)
            fresh = []
            for i in range(calls):
                cells = dict(view.cells)
                cell = cells["cell-0"]
                cells["cell-0"] = replace(cell, event_id=f"new{i}", ts_ms=cell.ts_ms + i + 1)
                projection.cluster = replace(view, cells=cells)
                fresh.append((await timed())[0])
            out["new_generation_ms"] = round(statistics.median(fresh) * 1000, 2)
    finally:
        await runner.cleanup()
    out["calls"] = calls
    return out
