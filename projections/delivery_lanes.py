"""Which webhook delivery to attempt next: a pure index, no IO (the dispatcher is the shell).

Theory of operation
-------------------
1. A job's deliveries go out one at a time in fold order (``seq``), so a
   receiver never sees COMPLETED before RUNNING: only each job's head is due.
2. Heads wait in one heap per tenant, keyed by due time (``next_attempt_ms``).
3. ``pick(now)`` takes tenants round-robin and skips a tenant that already has
   ``per_tenant`` attempts in flight: a tenant with a deep backlog or hung
   receivers waits on its own slots, never on another tenant's.
4. ``done(d)`` ends an attempt: a delivery still pending goes back at its new
   due time, a finished one makes way for the job's next.

Every operation costs O(log n) in one tenant's heads plus O(tenants), never a
scan of everything pending.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"  # a Delivery's status


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


class DeliveryLanes:
    """The dispatcher's index of pending deliveries (see the module docstring). Heap
    entries can go stale when a job's head changes; ``pick`` drops those lazily."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self.jobs: dict[str, list[Delivery]] = {}  # job -> pending, in fold order
        self.known: set[str] = set()  # delivery ids indexed
        self.due: dict[str, list[tuple[int, int, int, str, str]]] = {}  # tenant -> heap
        self.inflight_jobs: set[str] = set()
        self.inflight: dict[str, int] = {}  # tenant -> attempts in flight
        self.order: list[str] = []  # tenants, round-robin
        self.turn = 0

    def add(self, d: Delivery) -> None:
        if d.delivery_id in self.known or d.status != PENDING:
            return
        self.known.add(d.delivery_id)
        queue = self.jobs.setdefault(d.job_id, [])
        queue.append(d)
        queue.sort(key=lambda x: (x.seq, x.created_ms, x.delivery_id))
        if queue[0] is d and d.job_id not in self.inflight_jobs:
            self._push(d)

    def _push(self, d: Delivery) -> None:
        if d.tenant not in self.due:
            self.due[d.tenant] = []
            self.order.append(d.tenant)
        heapq.heappush(
            self.due[d.tenant], (d.next_attempt_ms, d.seq, d.created_ms, d.delivery_id, d.job_id)
        )

    def _head(self, tenant: str) -> tuple[int, int, int, str, str] | None:
        """The tenant's earliest due head, after dropping stale entries."""
        heap = self.due.get(tenant)
        while heap:
            entry = heap[0]
            queue = self.jobs.get(entry[4])
            if (
                queue
                and queue[0].delivery_id == entry[3]
                and queue[0].next_attempt_ms == entry[0]
                and entry[4] not in self.inflight_jobs
            ):
                return entry
            heapq.heappop(heap)
        return None

    def pick(self, now_ms: int) -> Delivery | None:
        """The next delivery to attempt now, or None; marks it in flight."""
        tenants = len(self.order)
        for i in range(tenants):
            tenant = self.order[(self.turn + i) % tenants]
            if self.inflight.get(tenant, 0) >= self.per_tenant:
                continue
            entry = self._head(tenant)
            if entry is None or entry[0] > now_ms:
                continue
            heapq.heappop(self.due[tenant])
            self.turn = (self.turn + i + 1) % tenants
            d = self.jobs[entry[4]][0]
            self.inflight_jobs.add(d.job_id)
            self.inflight[tenant] = self.inflight.get(tenant, 0) + 1
            return d
        self._forget_idle_tenants()
        return None

    def next_due_ms(self) -> int | None:
        """When a tenant with a free slot next has something due."""
        soonest = None
        for tenant in self.order:
            if self.inflight.get(tenant, 0) >= self.per_tenant:
                continue
            entry = self._head(tenant)
            if entry is not None and (soonest is None or entry[0] < soonest):
                soonest = entry[0]
        return soonest

    def done(self, d: Delivery) -> None:
        """An attempt ended with ``d`` (still pending: retry at its next_attempt_ms)."""
        self.inflight_jobs.discard(d.job_id)
        self.inflight[d.tenant] -= 1
        if not self.inflight[d.tenant]:
            del self.inflight[d.tenant]
        queue = self.jobs.get(d.job_id, [])
        if queue and queue[0].delivery_id == d.delivery_id:
            if d.status == PENDING:
                queue[0] = d
            else:
                queue.pop(0)
                self.known.discard(d.delivery_id)
        if queue:
            self._push(queue[0])
        else:
            self.jobs.pop(d.job_id, None)

    def _forget_idle_tenants(self) -> None:
        idle = [t for t in self.order if not self.due.get(t) and t not in self.inflight]
        if idle:
            for t in idle:
                self.due.pop(t, None)
            self.order = [t for t in self.order if t not in idle]
            self.turn = 0

    @property
    def pending(self) -> int:
        return len(self.known)
