"""A view store shared by the API's event loop and the projection's fold thread.

The projection folds and commits on a thread of its own (so that an HTTP
request never waits for a fold; ``framespool.projections.consumer``), while the
API writes provisional views (``insert_if_absent``) and the webhook dispatcher
writes deliveries on the event loop. A commit is read-modify-write (per-tenant
counts, index keys, "insert if absent"), so every call goes through one lock:
two writers never interleave, and a reader never walks a structure a writer is
changing (the in-memory store's dicts). Each call holds the lock only for its
own duration, so the loop waits at most one commit, never a whole fold.
"""

from __future__ import annotations

import threading
from typing import Any

from framespool.projections.cluster import ClusterView
from framespool.projections.delivery_lanes import Delivery
from framespool.projections.jobs import JobView
from framespool.projections.store.port import Batch, Page, ViewStore


class SerializedStore:
    """A :class:`ViewStore` whose calls run one at a time, from any thread.

    Cost: one uncontended lock acquisition per call (well under a microsecond);
    a caller waits at most for the one call in progress.
    """

    def __init__(self, inner: ViewStore) -> None:
        self.inner = inner
        self._lock = threading.RLock()

    def get(self, job_id: str) -> JobView | None:
        with self._lock:
            return self.inner.get(job_id)

    def insert_if_absent(self, view: JobView) -> bool:
        with self._lock:
            return self.inner.insert_if_absent(view)

    def offset(self, topic: str, partition: int) -> int:
        with self._lock:
            return self.inner.offset(topic, partition)

    def commit(self, batch: Batch) -> None:
        with self._lock:
            self.inner.commit(batch)

    def list_jobs(
        self, tenant: str, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page:
        with self._lock:
            return self.inner.list_jobs(tenant, state, limit, cursor)

    def load_cluster(self) -> ClusterView:
        with self._lock:
            return self.inner.load_cluster()

    def get_delivery(self, delivery_id: str) -> Delivery | None:
        with self._lock:
            return self.inner.get_delivery(delivery_id)

    def put_delivery(self, delivery: Delivery) -> None:
        with self._lock:
            self.inner.put_delivery(delivery)

    def pending_deliveries(self) -> list[Delivery]:
        with self._lock:
            return self.inner.pending_deliveries()

    def queued_count(self, tenant: str) -> int:
        with self._lock:
            return self.inner.queued_count(tenant)

    def running_count(self, tenant: str) -> int:
        with self._lock:
            return self.inner.running_count(tenant)

    def close(self) -> None:
        with self._lock:
            self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # anything beyond the protocol (e.g. ``view_count``) goes to the inner
        # store; a method found here is called under the lock
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return locked
