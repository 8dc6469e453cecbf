"""Bounds over the whole queue, so a scheduling pass can stop once nothing left can start.

Theory of operation
-------------------
In a backlogged cell most full passes place nothing: the few free GPUs sit on
nodes held for a reservation or are too few for any queued shape, and the walk
tests ``backfill_depth`` candidates that all fail. A failed candidate changes
nothing that outlives the pass (its fair-share offset and the no-fit memo are
pass-local) unless it takes a reservation or may preempt. So once

1. every reservation slot is taken (``reserve``/``reserve_more`` are no-ops),
2. no queued job may preempt (``preempt_sensitive``: ``maybe_preempt`` is a
   no-op for every candidate), and
3. for no queued job do as many free nodes it may use as its shapes need at
   fewest have as many free GPUs as its shapes need per node at least (so
   ``index.find`` fails for every shape of every candidate),

the rest of the walk cannot change the cell or emit anything, and stopping it
is exact: the same outputs, the same state. For 3 the queued jobs are kept by
their smallest per-node GPU need over their shapes (``min(gpus,
gpus_per_node)``, at most ``gpus_per_node`` distinct values) and, per need,
the fewest nodes and the smallest estimate over their shapes (lazy min-heaps
of distinct values) and their tiers' ranks: a job may use a reservation's nodes only if it ends
before the shadow time or its tier outranks the holder's
(``reserved_for_others``), so per reservation it is enough to ask, for each
need its free nodes meet, whether the shortest such job ends in time or the
most important one outranks.

Cost: O(log q) per enqueue or dequeue (the estimate heap; the counters are
O(1)); a query is O(distinct needs) per reservation. A pass asks only at its
start and after a placement or reservation, where the walk it cuts short
costs O(backfill_depth * (log n + F)).
"""

from __future__ import annotations

import heapq


class MinCounts:
    """A multiset of floats with its minimum: counts plus a lazy heap of the
    distinct values, rebuilt when stale values outnumber live ones."""

    __slots__ = ("counts", "heap")

    def __init__(self) -> None:
        self.counts: dict[float, int] = {}
        self.heap: list[float] = []

    def add(self, value: float) -> None:
        count = self.counts.get(value, 0)
        self.counts[value] = count + 1
        if not count:
            if len(self.heap) >= 2 * len(self.counts) + 32:
                self.heap = sorted(self.counts)  # a sorted list is a heap
            else:
                heapq.heappush(self.heap, value)

    def remove(self, value: float) -> None:
        _drop(self.counts, value)

    def min(self) -> float:
        heap, live = self.heap, self.counts
        while heap and heap[0] not in live:
            heapq.heappop(heap)
        return heap[0]


class QueueBounds:
    __slots__ = ("need", "nodes", "estimate", "rank", "sensitive", "size")

    def __init__(self) -> None:
        self.need: dict[int, int] = {}  # smallest per-node need -> queued jobs
        self.nodes: dict[int, MinCounts] = {}  # need -> fewest nodes over shapes
        self.estimate: dict[int, MinCounts] = {}  # need -> smallest estimates
        self.rank: dict[int, dict[int, int]] = {}  # need -> tier rank -> queued jobs
        self.sensitive = 0  # queued jobs that may preempt
        self.size = 0

    def add(self, need: int, nodes: int, estimate_s: float, rank: int, sensitive: bool) -> None:
        self.size += 1
        self.need[need] = self.need.get(need, 0) + 1
        if need not in self.estimate:
            self.estimate[need] = MinCounts()
            self.nodes[need] = MinCounts()
        self.estimate[need].add(estimate_s)
        self.nodes[need].add(nodes)
        ranks = self.rank.setdefault(need, {})
        ranks[rank] = ranks.get(rank, 0) + 1
        self.sensitive += sensitive

    def remove(self, need: int, nodes: int, estimate_s: float, rank: int, sensitive: bool) -> None:
        self.size -= 1
        _drop(self.need, need)
        self.estimate[need].remove(estimate_s)
        self.nodes[need].remove(nodes)
        _drop(self.rank[need], rank)
        self.sensitive -= sensitive

    def min_need(self) -> int:
        return min(self.need) if self.need else 0

    def fewest_nodes(self, need: int) -> int:
        return int(self.nodes[need].min())

    def may_use(self, need: int, now_ms: int, shadow_ms: int, holder_rank: int | None) -> bool:
        """Whether some queued job of this smallest per-node ``need`` may use a
        reservation's nodes: it ends by the shadow time (the very comparison
        ``reserved_for_others`` makes) or its tier outranks the holder's
        (``holder_rank`` None: no tier does)."""
        if not now_ms + self.estimate[need].min() * 1000 > shadow_ms:
            return True
        return holder_rank is not None and min(self.rank[need]) < holder_rank


def _drop(counts: dict, key: object) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


class ShapeClass:
    """The queued jobs of one ``QueueClasses`` key: their ids (in queue order of
    arrival, any one stands for the rest) and, per shape, their smallest
    estimate."""

    __slots__ = ("jobs", "estimates")

    def __init__(self, shapes: int) -> None:
        self.jobs: dict[str, None] = {}
        self.estimates = [MinCounts() for _ in range(shapes)]


class QueueClasses:
    """The queued jobs by what decides whether one can start on the GPUs free
    now: its tier (which reservations bind it) and, per shape, the spec's
    demands (``Starts.fit_shapes``). Within a class only the estimate
    differs, and a longer estimate runs past more shadow times, so more nodes
    are reserved against it (``reserved_for_others``): a search for the class's
    shortest job that finds no nodes proves that no job of the class fits
    (``WalkProofs.every_class_blocked``). O(shapes * log q) per add or remove."""

    __slots__ = ("classes",)

    def __init__(self) -> None:
        self.classes: dict[tuple, ShapeClass] = {}

    def add(self, key: tuple, job_id: str, estimates: tuple[float, ...]) -> None:
        cls = self.classes.get(key)
        if cls is None:
            cls = self.classes[key] = ShapeClass(len(estimates))
        cls.jobs[job_id] = None
        for counts, estimate in zip(cls.estimates, estimates):
            counts.add(estimate)

    def remove(self, key: tuple, job_id: str, estimates: tuple[float, ...]) -> None:
        cls = self.classes[key]
        del cls.jobs[job_id]
        if not cls.jobs:
            del self.classes[key]
            return
        for counts, estimate in zip(cls.estimates, estimates):
            counts.remove(estimate)
