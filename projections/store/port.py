"""The view-store port: what the projection's fold and the API ask of the store of
job views, cluster cells, the webhook outbox and input offsets, plus the values
that cross it.

Two implementations: ``framespool.projections.store.rocks`` (rocksdict, one
directory per projection process) and ``framespool.projections.store.memory``
(the in-memory fake: API tests, embedded runs). ``tests/unit/test_projection_store.py``
and ``tests/unit/test_projection_retention.py`` run their suites against both.

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

Bounded storage (:class:`Retention`). The store counts each tenant's views per
state (the API's submit-time queue cap reads ``queued_count``) and, in the
same batch:

5. deletes terminal views ``finished_horizon_s`` after they ended (default
   7 days), oldest first. "Now" is the newest event time the store has seen
   from the log (never the wall clock, nor the API's provisional views),
   so a replay of the same log expires the same views;
6. deletes a tenant's oldest terminal views beyond ``max_views_per_tenant``
   (default 100,000; live views are never deleted: the queue cap bounds them);
7. deletes delivered or failed webhook outbox records ``outbox_horizon_s``
   after they were done (default 1 day); pending ones stay until done.

A job id past the horizon is unknown again: a GET answers 404, and a
submission with its Idempotency-Key is a new job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from framespool.projections.cluster import Breaker, CellView, ClusterView
from framespool.projections.delivery_lanes import Delivery
from framespool.projections.jobs import (
    ASSIGNED,
    CHECKPOINTING,
    QUEUED,
    RUNNING,
    SUBMITTED,
    JobView,
)

MAX_MS = 10**13 - 1  # the largest time (ms) a 13-digit key holds
QUEUED_STATES = (SUBMITTED, QUEUED)  # what the submit-time queue cap counts
HOLDING_STATES = (ASSIGNED, RUNNING, CHECKPOINTING)  # jobs holding GPUs (the edge's own place)


@dataclass(frozen=True)
class Retention:
    """How long the store keeps what no one will ask for again (see the module doc)."""

    finished_horizon_s: float = 7 * 86400.0
    max_views_per_tenant: int = 100_000
    outbox_horizon_s: float = 86400.0

    def __post_init__(self) -> None:
        if self.finished_horizon_s <= 0 or self.outbox_horizon_s <= 0:
            raise ValueError("retention horizons must be positive")
        if self.max_views_per_tenant < 1:
            raise ValueError("max_views_per_tenant must be at least 1")


def ended_ms(view: JobView) -> int:
    """When a terminal view ended, on the same clock as the store's "now" (the
    view's last update: its terminal event, or a later one it recorded)."""
    return view.updated_ms


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
    def queued_count(self, tenant: str) -> int: ...
    def running_count(self, tenant: str) -> int: ...
    def close(self) -> None: ...


def order_key(view: JobView) -> str:
    """Newest first, then job id: the listing order and the cursor."""
    return f"{MAX_MS - max(0, min(view.created_ms, MAX_MS)):013d}/{view.job_id}"


def count_change(
    counts: dict[tuple[str, str], int], old: JobView | None, new: JobView | None
) -> None:
    """Per (tenant, state) view counts: ``old`` leaves its state, ``new`` enters its."""
    if old is not None and new is not None and (old.tenant, old.state) == (new.tenant, new.state):
        return
    if old is not None:
        counts[(old.tenant, old.state)] = counts.get((old.tenant, old.state), 0) - 1
    if new is not None:
        counts[(new.tenant, new.state)] = counts.get((new.tenant, new.state), 0) + 1
