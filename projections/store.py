"""The projection store: job views, cluster cells, webhook outbox and input offsets.

Theory of operation
-------------------
The consumer folds a poll's worth of records, then hands the store one
``Batch``. ``commit`` writes, in ONE rocksdict ``WriteBatch``:

1. every changed job view, and its tenant and (tenant, state) index keys
   (stale index keys of the previous state are deleted in the same batch);
2. every changed cluster cell and breaker;
3. new webhook deliveries (the outbox), unless a delivery with that id exists;
4. the input offset per (topic, partition) the batch reflects (only forward).

So after a crash the views and the offsets agree, and the consumer resumes at
``offset + 1``: input at or below the stored offset is a no-op. The tenant index
orders jobs newest first (``inverted created_ms / job_id``); that suffix is
also the listing cursor.

``InMemoryViewStore`` is the fake that implements the same ``ViewStore``
protocol; one test suite runs against both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from rocksdict import Options, Rdict, WriteBatch

from framespool.projections.cluster import Breaker, CellView, ClusterView
from framespool.projections.jobs import JobView
from framespool.projections.serde import (
    breaker_from_dict,
    breaker_to_dict,
    cell_from_dict,
    cell_to_dict,
    view_from_dict,
    view_to_dict,
)

_MAX_MS = 10**13 - 1
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


@dataclass
class Delivery:
    """One webhook POST to make; ``delivery_id`` is the event id (idempotency key)."""

    delivery_id: str
    job_id: str
    tenant: str
    url: str
    body: str
    status: str = PENDING
    attempts: int = 0
    next_attempt_ms: int = 0
    last_error: str = ""
    created_ms: int = 0
    done_ms: int = 0
    seq: int = 0  # the job view's seq after the event: per-job delivery order


@dataclass
class Batch:
    """What one commit writes atomically."""

    views: dict[str, JobView] = field(default_factory=dict)
    cells: dict[str, CellView] = field(default_factory=dict)
    breakers: dict[str, Breaker] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def advance(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        self.offsets[key] = max(offset, self.offsets.get(key, -1))


@dataclass(frozen=True)
class Page:
    jobs: list[JobView]
    next_cursor: str | None


class ViewStore(Protocol):
    def get(self, job_id: str) -> JobView | None: ...
    def insert_if_absent(self, view: JobView) -> bool: ...
    def offset(self, topic: str, partition: int) -> int: ...
    def commit(self, batch: Batch) -> None: ...
    def list_jobs(
        self, tenant: str, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page: ...
    def load_cluster(self) -> ClusterView: ...
    def get_delivery(self, delivery_id: str) -> Delivery | None: ...
    def put_delivery(self, delivery: Delivery) -> None: ...
    def pending_deliveries(self) -> list[Delivery]: ...
    def close(self) -> None: ...


def order_key(view: JobView) -> str:
    """Newest first, then job id: the listing order and the cursor."""
    return f"{_MAX_MS - max(0, min(view.created_ms, _MAX_MS)):013d}/{view.job_id}"


def _dumps(doc) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


class RocksViewStore:
    """The rocksdict adapter; one ``Rdict`` directory per projection process."""

    def __init__(self, path: str) -> None:
        self._db = Rdict(str(path), options=Options(raw_mode=True))

    # -- keys ---------------------------------------------------------------
    @staticmethod
    def _job_key(job_id: str) -> bytes:
        return b"j/" + job_id.encode()

    @staticmethod
    def _tenant_prefix(tenant: str, state: str | None) -> bytes:
        if state is None:
            return b"t/" + tenant.encode() + b"\x00"
        return b"s/" + tenant.encode() + b"\x00" + state.encode() + b"\x00"

    def _index_keys(self, v: JobView) -> list[bytes]:
        suffix = order_key(v).encode()
        return [
            self._tenant_prefix(v.tenant, None) + suffix,
            self._tenant_prefix(v.tenant, v.state) + suffix,
        ]

    @staticmethod
    def _offset_key(topic: str, partition: int) -> bytes:
        return b"o/" + topic.encode() + b"\x00" + str(partition).encode()

    # -- reads --------------------------------------------------------------
    def get(self, job_id: str) -> JobView | None:
        raw = self._db.get(self._job_key(job_id))
        return None if raw is None else view_from_dict(json.loads(raw))

    def offset(self, topic: str, partition: int) -> int:
        raw = self._db.get(self._offset_key(topic, partition))
        return -1 if raw is None else int(raw)

    def list_jobs(
        self, tenant: str, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page:
        prefix = self._tenant_prefix(tenant, state)
        start = prefix + cursor.encode() if cursor else prefix
        jobs: list[JobView] = []
        for key, _ in self._db.items(from_key=start):
            if not key.startswith(prefix):
                break
            if cursor and key == start:
                continue
            view = self.get(key[len(prefix) :].decode().split("/", 1)[1])
            if view is not None:
                jobs.append(view)
            if len(jobs) > limit:
                break
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return Page(jobs, order_key(jobs[-1]) if more and jobs else None)

    def load_cluster(self) -> ClusterView:
        cells = {c.cell: c for c in (cell_from_dict(json.loads(v)) for _, v in self._scan(b"c/"))}
        breakers = {k.decode()[2:]: breaker_from_dict(json.loads(v)) for k, v in self._scan(b"b/")}
        updated = max(
            [c.ts_ms for c in cells.values()] + [b.ts_ms for b in breakers.values()] + [0]
        )
        return ClusterView(cells=cells, breakers=breakers, updated_ms=updated)

    def get_delivery(self, delivery_id: str) -> Delivery | None:
        raw = self._db.get(b"d/" + delivery_id.encode())
        return None if raw is None else Delivery(**json.loads(raw))

    def pending_deliveries(self) -> list[Delivery]:
        out = [self.get_delivery(k[2:].decode()) for k, _ in self._scan(b"p/")]
        return sorted(
            (d for d in out if d is not None), key=lambda d: (d.created_ms, d.delivery_id)
        )

    def _scan(self, prefix: bytes) -> Iterable[tuple[bytes, bytes]]:
        for key, value in self._db.items(from_key=prefix):
            if not key.startswith(prefix):
                break
            yield key, value

    # -- writes -------------------------------------------------------------
    def insert_if_absent(self, view: JobView) -> bool:
        if self._db.get(self._job_key(view.job_id)) is not None:
            return False
        self.commit(Batch(views={view.job_id: view}))
        return True

    def commit(self, batch: Batch) -> None:
        wb = WriteBatch(raw_mode=True)
        for job_id, view in batch.views.items():
            old = self.get(job_id)
            new_keys = self._index_keys(view)
            for key in self._index_keys(old) if old is not None else ():
                if key not in new_keys:
                    wb.delete(key)
            for key in new_keys:
                wb.put(key, b"")
            wb.put(self._job_key(job_id), _dumps(view_to_dict(view)))
        for cell in batch.cells.values():
            wb.put(b"c/" + cell.cell.encode(), _dumps(cell_to_dict(cell)))
        for key, breaker in batch.breakers.items():
            wb.put(b"b/" + key.encode(), _dumps(breaker_to_dict(breaker)))
        for d in batch.deliveries:
            if self._db.get(b"d/" + d.delivery_id.encode()) is None:
                self._delivery_into(wb, d)
        for (topic, partition), off in batch.offsets.items():
            if off > self.offset(topic, partition):
                wb.put(self._offset_key(topic, partition), str(off).encode())
        self._db.write(wb)

    def put_delivery(self, delivery: Delivery) -> None:
        wb = WriteBatch(raw_mode=True)
        self._delivery_into(wb, delivery)
        self._db.write(wb)

    @staticmethod
    def _delivery_into(wb: WriteBatch, d: Delivery) -> None:
        wb.put(b"d/" + d.delivery_id.encode(), _dumps(asdict(d)))
        if d.status == PENDING:
            wb.put(b"p/" + d.delivery_id.encode(), b"")
        else:
            wb.delete(b"p/" + d.delivery_id.encode())

    def close(self) -> None:
        self._db.close()


class InMemoryViewStore:
    """The fake: same protocol, dicts instead of rocksdict (API tests, embedded runs)."""

    def __init__(self) -> None:
        self._views: dict[str, JobView] = {}
        self._offsets: dict[tuple[str, int], int] = {}
        self._cells: dict[str, CellView] = {}
        self._breakers: dict[str, Breaker] = {}
        self._deliveries: dict[str, Delivery] = {}

    def get(self, job_id: str) -> JobView | None:
        return self._views.get(job_id)

    def offset(self, topic: str, partition: int) -> int:
        return self._offsets.get((topic, partition), -1)

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
        self._views[view.job_id] = view
        return True

    def commit(self, batch: Batch) -> None:
        self._views.update(batch.views)
        self._cells.update(batch.cells)
        self._breakers.update(batch.breakers)
        for d in batch.deliveries:
            self._deliveries.setdefault(d.delivery_id, Delivery(**asdict(d)))
        for key, off in batch.offsets.items():
            self._offsets[key] = max(off, self._offsets.get(key, -1))

    def put_delivery(self, delivery: Delivery) -> None:
        self._deliveries[delivery.delivery_id] = Delivery(**asdict(delivery))

    def close(self) -> None:
        pass
