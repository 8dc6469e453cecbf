"""The in-memory fake of the view-store port: dicts and heaps instead of rocksdict
(API tests, embedded runs), with the port's semantics, retention included."""

from __future__ import annotations

import heapq
from dataclasses import asdict

from framespool.projections.cluster import Breaker, CellView, ClusterView
from framespool.projections.delivery_lanes import PENDING, Delivery
from framespool.projections.jobs import JobView
from framespool.projections.store.port import (
    HOLDING_STATES,
    QUEUED_STATES,
    Batch,
    Page,
    Retention,
    count_change,
    ended_ms,
    order_key,
)


class InMemoryViewStore:
    """The fake: same protocol, dicts instead of rocksdict (API tests, embedded runs)."""

    def __init__(self, retention: Retention = Retention()) -> None:
        self.retention = retention
        self._views: dict[str, JobView] = {}
        self._offsets: dict[tuple[str, int], int] = {}
        self._cells: dict[str, CellView] = {}
        self._breakers: dict[str, Breaker] = {}
        self._deliveries: dict[str, Delivery] = {}
        self._counts: dict[tuple[str, str], int] = {}
        # (ended ms, job id) heaps, global and per tenant; entries are checked when popped
        self._ended: list[tuple[int, str]] = []
        self._tenant_ended: dict[str, list[tuple[int, str]]] = {}
        self._done: list[tuple[int, str]] = []  # (done ms, delivery id)
        self._newest = 0

    def get(self, job_id: str) -> JobView | None:
        return self._views.get(job_id)

    def offset(self, topic: str, partition: int) -> int:
        return self._offsets.get((topic, partition), -1)

    def queued_count(self, tenant: str) -> int:
        return sum(self._counts.get((tenant, st), 0) for st in QUEUED_STATES)

    def running_count(self, tenant: str) -> int:
        return sum(self._counts.get((tenant, st), 0) for st in HOLDING_STATES)

    def view_count(self, tenant: str) -> int:
        return sum(n for (t, _), n in self._counts.items() if t == tenant)

    def list_jobs(
        self, tenant: str, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page:
        rows = sorted(
            (order_key(v), v)
            for v in self._views.values()
            if v.tenant == tenant and (state is None or v.state == state)
        )
        if cursor:
            rows = [r for r in rows if r[0] > cursor]
        page = [v for _, v in rows[:limit]]
        return Page(page, order_key(page[-1]) if len(rows) > limit and page else None)

    def load_cluster(self) -> ClusterView:
        updated = max(
            [c.ts_ms for c in self._cells.values()]
            + [b.ts_ms for b in self._breakers.values()]
            + [0]
        )
        return ClusterView(
            cells=dict(self._cells), breakers=dict(self._breakers), updated_ms=updated
        )

    def get_delivery(self, delivery_id: str) -> Delivery | None:
        d = self._deliveries.get(delivery_id)
        return None if d is None else Delivery(**asdict(d))

    def pending_deliveries(self) -> list[Delivery]:
        return sorted(
            (Delivery(**asdict(d)) for d in self._deliveries.values() if d.status == PENDING),
            key=lambda d: (d.created_ms, d.delivery_id),
        )

    def insert_if_absent(self, view: JobView) -> bool:
        if view.job_id in self._views:
            return False
        self.commit(Batch(views={view.job_id: view}), from_log=False)
        return True

    def commit(self, batch: Batch, from_log: bool = True) -> None:
        counts: dict[tuple[str, str], int] = {}
        for job_id, view in batch.views.items():
            old = self._views.get(job_id)
            count_change(counts, old, view)
            self._views[job_id] = view
            if view.terminal and (old is None or not old.terminal):
                entry = (ended_ms(view), job_id)
                heapq.heappush(self._ended, entry)
                heapq.heappush(self._tenant_ended.setdefault(view.tenant, []), entry)
            if from_log:
                self._newest = max(self._newest, view.updated_ms)
        self._cells.update(batch.cells)
        self._breakers.update(batch.breakers)
        for d in batch.deliveries:
            if d.delivery_id not in self._deliveries:
                self.put_delivery(d)
        for tp, off in batch.offsets.items():
            self._offsets[tp] = max(off, self._offsets.get(tp, -1))
        for key, delta in counts.items():
            self._counts[key] = self._counts.get(key, 0) + delta
        self._expire(batch)

    def _expire(self, batch: Batch) -> None:
        def live_entry(entry: tuple[int, str]) -> bool:
            view = self._views.get(entry[1])
            return view is not None and view.terminal and ended_ms(view) == entry[0]

        def drop(job_id: str) -> None:
            view = self._views.pop(job_id)
            count_change(self._counts, view, None)

        cutoff = self._newest - int(self.retention.finished_horizon_s * 1000)
        deferred = []
        while self._ended and self._ended[0][0] < cutoff:
            entry = heapq.heappop(self._ended)
            if entry[1] in batch.views and live_entry(entry):
                deferred.append(entry)  # written in this batch: it goes in a later one
            elif live_entry(entry):
                drop(entry[1])
        for entry in deferred:
            heapq.heappush(self._ended, entry)
        for tenant in sorted({v.tenant for v in batch.views.values()}):
            heap, kept = self._tenant_ended.get(tenant, []), []
            if len(heap) > 2 * self.view_count(tenant) + 64:  # drop entries expired by age
                heap[:] = [e for e in heap if live_entry(e)]
                heapq.heapify(heap)
            while heap and self.view_count(tenant) > self.retention.max_views_per_tenant:
                entry = heapq.heappop(heap)
                if live_entry(entry):
                    if entry[1] in batch.views:
                        kept.append(entry)
                    else:
                        drop(entry[1])
            for entry in kept:
                heapq.heappush(heap, entry)
        outbox_cutoff = self._newest - int(self.retention.outbox_horizon_s * 1000)
        while self._done and self._done[0][0] < outbox_cutoff:
            _, delivery_id = heapq.heappop(self._done)
            d = self._deliveries.get(delivery_id)
            if d is not None and d.status != PENDING:
                del self._deliveries[delivery_id]

    def put_delivery(self, delivery: Delivery) -> None:
        self._deliveries[delivery.delivery_id] = Delivery(**asdict(delivery))
        if delivery.status != PENDING:
            done = delivery.done_ms or delivery.created_ms
            heapq.heappush(self._done, (done, delivery.delivery_id))

    def close(self) -> None:
        pass
