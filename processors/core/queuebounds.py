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
3. no free node a candidate may use has as many free GPUs as the smallest
   per-node need of any queued job (so ``index.find`` fails for every shape),

the rest of the walk cannot change the cell or emit anything, and stopping it
is exact: the same outputs, the same state. The bounds this needs are kept
here as jobs enter and leave the queue:

- ``need``: queued jobs by their smallest per-node GPU need over their shapes
  (``min(gpus, gpus_per_node)``; at most ``gpus_per_node`` distinct values);
- ``estimate``: the smallest estimate over their shapes (a lazy min-heap of
  the distinct values, rebuilt when stale keys outnumber live ones), for
  whether the first reservation binds every candidate (``reserved_for_others``:
  a job binds to it when it would run past the shadow time);
- ``rank``: queued jobs by tier rank (a more important tier is not bound);
- ``sensitive``: how many queued jobs may preempt.

Cost: O(log q) per enqueue or dequeue (the estimate heap; the other counters
are O(1)), O(distinct needs + distinct ranks) per query. A pass asks only at
its start and after a placement or reservation, so the check adds
O(gpus_per_node + barred nodes) per such step, where the walk it cuts short
costs O(backfill_depth * (log n + F)).
"""

from __future__ import annotations

import heapq


class QueueBounds:
    __slots__ = ("need", "estimate", "estimate_heap", "rank", "sensitive", "size")

    def __init__(self) -> None:
        self.need: dict[int, int] = {}  # smallest per-node need -> queued jobs
        self.estimate: dict[float, int] = {}  # smallest estimate -> queued jobs
        self.estimate_heap: list[float] = []  # keys of ``estimate`` (stale ones at 0)
        self.rank: dict[int, int] = {}  # tier rank -> queued jobs
        self.sensitive = 0  # queued jobs that may preempt
        self.size = 0

    def add(self, need: int, estimate_s: float, rank: int, sensitive: bool) -> None:
        self.size += 1
        self.need[need] = self.need.get(need, 0) + 1
        count = self.estimate.get(estimate_s, 0)
        self.estimate[estimate_s] = count + 1
        if not count:
            heap = self.estimate_heap
            if len(heap) >= 2 * len(self.estimate) + 32:  # mostly stale keys: rebuild
                self.estimate_heap = sorted(self.estimate)  # a sorted list is a heap
            else:
                heapq.heappush(heap, estimate_s)
        self.rank[rank] = self.rank.get(rank, 0) + 1
        self.sensitive += sensitive

    def remove(self, need: int, estimate_s: float, rank: int, sensitive: bool) -> None:
        self.size -= 1
        _drop(self.need, need)
        _drop(self.estimate, estimate_s)
        _drop(self.rank, rank)
        self.sensitive -= sensitive

    def min_need(self) -> int:
        return min(self.need) if self.need else 0

    def min_rank(self) -> int:
        return min(self.rank) if self.rank else 0

    def min_estimate(self) -> float:
        heap, live = self.estimate_heap, self.estimate
        while heap and heap[0] not in live:
            heapq.heappop(heap)
        return heap[0] if heap else 0.0


def _drop(counts: dict, key: object) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
