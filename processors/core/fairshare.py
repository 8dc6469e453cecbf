"""Hierarchical fair share in weighted GPU-time: tier -> organisation -> user.

Theory of operation
-------------------
Every flow (a tier, an organisation within a tier, a user within an
organisation) carries ``usage``: the GPU-seconds charged to it. Its virtual
time is ``usage / weight``. The next job to consider is found by walking down
from the root, at each level taking the backlogged child with the least
virtual time (ties by name), and then the user's oldest queued job (requeued
jobs first). This is start-time fair queueing with GPU-time as the cost.

- A run is charged ``gpus * estimate_s`` (times its dominant-resource factor)
  when it starts, and the difference to what it really used when it ends, so
  long-run shares are in true GPU-time.
- A flow that becomes backlogged after being idle has its settled usage
  (usage less the estimates charged for its still-running runs) raised to
  ``min(active siblings' settled virtual time) * weight - idle_credit``: idle
  time earns at most ``idle_credit`` GPU-seconds of head start, and the
  returning flow is not made to wait for refunds the others will get when
  their running work ends earlier than estimated.

Guarantee (tested in ``tests/unit/test_core_fairness.py``): while n
equal-weight flows stay backlogged, their charged usage never differs by more
than the largest single job cost C_max, however many jobs each one queues; so
each flow's GPU-time share over a window of length T is within
``C_max / (T * capacity)`` of 1/n.

Within a scheduling pass, a job that could not be placed is charged to a
pass-local offset so the walk moves on fairly to other flows (backfill
candidates) without changing real usage.

Cost model
----------
Each flow keeps its backlogged children in two lazy min-heaps: by
``(virtual time incl. pass offset, activation order)`` for the walk, and by
settled virtual time for the clamp on return. A change of a flow's usage or
offset pushes one fresh entry into its parent's heaps (O(log n)); superseded
entries are skipped when they surface, and a heap is rebuilt once it holds
more than twice its live entries plus a constant, so the stale ones cost
O(1) amortized each. ``pick`` is then O(depth * log n) amortized, where n is
the number of backlogged siblings; the scan it replaces was O(n) per level
per placement attempt. Ties go to the flow that became backlogged first,
exactly as the scan over the insertion-ordered ``active`` dict did.
``work_ahead`` visits every backlogged sibling (O(n) per level) on admission;
a publish of estimates, whose many calls see one unchanged tree, reads each
level off a ``LevelIndex`` in O(log n). Neither runs per placement attempt.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import cast


class Flow:
    __slots__ = (
        "name",
        "weight",
        "usage",
        "parent",
        "children",
        "active",
        "queue",
        "requeued",
        "queued",
        "backlog",
        "inflight",
        "offset",
        "seq",
        "stamp",
        "sstamp",
        "heap",
        "settled",
        "next_seq",
        "keys",
        "ordered",
    )

    def __init__(self, name: str, weight: float, parent: Flow | None) -> None:
        self.name = name
        self.weight = weight if weight > 0 else 1.0
        self.usage = 0.0
        self.parent = parent
        self.children: dict[str, Flow] = {}
        self.active: dict[str, Flow] = {}  # backlogged children, activation order kept
        self.queue: dict[str, None] = {}  # leaf only: job ids in arrival order
        self.requeued: dict[str, None] = {}  # leaf only: served before queue
        self.queued = 0  # jobs queued in this subtree
        self.backlog = 0.0  # their GPU-seconds (estimated)
        self.inflight = 0.0  # charged for runs not yet settled
        self.offset = 0.0  # pass-local charge (0 outside a pass)
        self.seq = 0  # activation order under the parent
        self.stamp = 0  # the live entry of this flow in parent.heap (0: none)
        self.sstamp = 0  # ... and in parent.settled
        # active children: (key, seq, stamp, flow); an entry is live iff its
        # stamp is the child's current one
        self.heap: list[tuple[float, int, int, Flow]] = []
        self.settled: list[tuple[float, int, int, Flow]] = []
        self.next_seq = 0
        # leaf only, when its queue is served by size (``push`` with a key):
        # job -> its key, and ``(key, job)`` sorted; None: arrival order
        self.keys: dict[str, float] | None = None
        self.ordered: list[tuple[float, str]] = []

    def vt(self) -> float:
        return self.usage / self.weight

    def settled_vt(self) -> float:
        return (self.usage - self.inflight) / self.weight

    def chain(self) -> Iterator[Flow]:
        flow: Flow | None = self
        while flow is not None and flow.parent is not None:
            yield flow
            flow = flow.parent


HEAP_SLACK = 32


class FairTree:
    def __init__(self, idle_credit_gpu_s: float = 0.0) -> None:
        self.root = Flow("", 1.0, None)
        self.idle_credit = idle_credit_gpu_s
        self.stamp = 0
        self.version = 0  # bumped by every queue, charge or settlement change
        # pass state: flows charged an offset, and flows exhausted (their heap
        # entries are dropped or left stale until the pass ends), in order; a
        # Flow hashes by identity, so a membership test is one C-level lookup
        self.touched: dict[Flow, None] = {}
        self.exhausted: dict[Flow, None] = {}

    # -- structure -----------------------------------------------------------
    def leaf(self, path: tuple[str, str, str], weights: tuple[float, float, float]) -> Flow:
        flow = self.root
        for name, weight in zip(path, weights):
            child = flow.children.get(name)
            if child is None:
                child = Flow(name, weight, flow)
                flow.children[name] = child
            flow = child
        return flow

    # -- queue membership ----------------------------------------------------
    def push(
        self,
        leaf: Flow,
        job_id: str,
        cost: float,
        requeued: bool = False,
        key: float | None = None,
    ) -> None:
        """Queue a job in its leaf: requeued jobs first, in arrival order; the
        others in arrival order, or by ``key`` (``leaf_jobs``) when given.
        O(log q) plus the sorted insert's memmove."""
        if requeued:
            leaf.requeued[job_id] = None
        else:
            leaf.queue[job_id] = None
            if key is not None:
                if leaf.keys is None:
                    leaf.keys = {}
                leaf.keys[job_id] = key
                insort(leaf.ordered, (key, job_id))
        self._adjust(leaf, +1, cost)

    @staticmethod
    def order_by(leaf: Flow, keys: dict[str, float] | None) -> None:
        """Serve ``leaf``'s (non-requeued) queue by ``keys`` from now on, one
        per queued job (None: in arrival order). For a leaf whose jobs were
        queued in the other mode (a snapshot from before keys, a changed
        knob) or whose keys moved (``Cell.rebase_time``). O(q log q)."""
        leaf.keys = keys
        leaf.ordered = sorted((k, j) for j, k in keys.items()) if keys is not None else []

    def remove(self, leaf: Flow, job_id: str, cost: float) -> bool:
        if job_id in leaf.requeued:
            del leaf.requeued[job_id]
        elif job_id in leaf.queue:
            del leaf.queue[job_id]
            keys = leaf.keys
            if keys is not None and job_id in keys:
                entry = (keys.pop(job_id), job_id)
                ordered = leaf.ordered
                del ordered[bisect_left(ordered, entry)]
        else:
            return False
        self._adjust(leaf, -1, -cost)
        return True

    def _adjust(self, leaf: Flow, delta: int, cost: float) -> None:
        self.version += 1
        for flow in leaf.chain():
            was_active = flow.queued > 0
            flow.queued += delta
            flow.backlog = flow.backlog + cost if flow.queued else 0.0
            parent = cast(Flow, flow.parent)  # chain() stops below the root
            if flow.queued > 0 and not was_active:
                self._clamp_on_return(flow)
                parent.active[flow.name] = flow
                parent.next_seq += 1
                flow.seq = parent.next_seq
                self._file(flow)
            elif flow.queued == 0 and was_active:
                del parent.active[flow.name]
                flow.stamp = flow.sstamp = 0

    def _clamp_on_return(self, flow: Flow) -> None:
        parent = cast(Flow, flow.parent)
        if not parent.active:
            return
        floor = self._top(parent.settled, "sstamp")[0] * flow.weight - self.idle_credit
        if flow.usage - flow.inflight < floor:
            flow.usage = floor + flow.inflight

    # -- the heaps -----------------------------------------------------------
    def _file(self, flow: Flow, settled: bool = True) -> None:
        """(Re-)file an active flow in its parent's heaps after its usage, inflight
        or offset changed; older entries of it become stale. ``settled=False``:
        only the offset changed, the settled order did not."""
        parent = cast(Flow, flow.parent)  # only the root has none, and it is never filed
        if settled:
            self._file_settled(flow, parent)
        if flow in self.exhausted:
            return  # re-filed when the pass ends
        self.stamp += 1
        flow.stamp = self.stamp
        heap = parent.heap
        heapq.heappush(heap, ((flow.usage + flow.offset) / flow.weight, flow.seq, self.stamp, flow))
        if len(heap) > 2 * len(parent.active) + HEAP_SLACK:
            self._rebuild(parent)

    def _file_settled(self, flow: Flow, parent: Flow) -> None:
        self.stamp += 1
        flow.sstamp = self.stamp
        settled = parent.settled
        heapq.heappush(
            settled, ((flow.usage - flow.inflight) / flow.weight, flow.seq, self.stamp, flow)
        )
        if len(settled) > 2 * len(parent.active) + HEAP_SLACK:
            self._rebuild_settled(parent)

    def _rebuild(self, parent: Flow) -> None:
        entries = []
        for flow in parent.active.values():
            if flow in self.exhausted:
                continue
            self.stamp += 1
            flow.stamp = self.stamp
            entries.append(((flow.usage + flow.offset) / flow.weight, flow.seq, self.stamp, flow))
        heapq.heapify(entries)
        parent.heap = entries

    def _rebuild_settled(self, parent: Flow) -> None:
        entries = []
        for flow in parent.active.values():
            self.stamp += 1
            flow.sstamp = self.stamp
            entries.append(((flow.usage - flow.inflight) / flow.weight, flow.seq, self.stamp, flow))
        heapq.heapify(entries)
        parent.settled = entries

    @staticmethod
    def _top(heap: list[tuple[float, int, int, Flow]], attr: str) -> tuple[float, int, int, Flow]:
        """The live minimum of a non-empty heap of active flows (stale entries dropped)."""
        while True:
            entry = heap[0]
            if getattr(entry[3], attr) == entry[2]:
                return entry
            heapq.heappop(heap)

    def _refile_chain(self, leaf: Flow) -> None:
        for flow in leaf.chain():
            if flow.queued:  # backlogged = in its parent's active set
                self._file(flow)

    # -- charging ------------------------------------------------------------
    def charge_start(self, leaf: Flow, gpu_seconds: float) -> None:
        """A run starts: charge its estimated cost now."""
        self.version += 1
        for flow in leaf.chain():
            flow.usage += gpu_seconds
            flow.inflight += gpu_seconds
        self._refile_chain(leaf)

    def charge_end(self, leaf: Flow, charged: float, used: float) -> None:
        """A run ended: replace its estimated charge by the GPU-time it used."""
        self.version += 1
        for flow in leaf.chain():
            flow.usage += used - charged
            flow.inflight -= charged
        self._refile_chain(leaf)

    # -- fair order ----------------------------------------------------------
    def begin_pass(self) -> None:
        self.end_pass()

    def end_pass(self) -> None:
        """Drop the pass's offsets and exhaustion; re-file what they moved."""
        touched, exhausted = self.touched, self.exhausted
        self.touched, self.exhausted = {}, {}
        for flow in touched:
            flow.offset = 0.0
        for flow in touched | exhausted:
            if flow.queued and flow.parent is not None:
                self._file(flow, settled=False)

    def exhaust(self, flow: Flow) -> None:
        """Nothing more of ``flow`` in this pass."""
        self.exhausted[flow] = None

    def pick(self) -> Flow | None:
        """The leaf to serve next, or None when every backlogged leaf is
        exhausted for this pass."""
        exhausted = self.exhausted
        heappop, heapreplace = heapq.heappop, heapq.heapreplace
        flow = self.root
        while flow.active:
            heap = flow.heap
            best = None
            while heap:
                entry = heap[0]
                child = entry[3]
                if child.stamp != entry[2]:
                    heappop(heap)
                elif child in exhausted:
                    heappop(heap)  # re-filed when the pass ends
                    child.stamp = 0
                else:
                    key = (child.usage + child.offset) / child.weight
                    if key != entry[0]:  # offset since it was filed (``offset``)
                        stamp = self.stamp = self.stamp + 1
                        child.stamp = stamp
                        heapreplace(heap, (key, child.seq, stamp, child))
                        continue
                    best = child
                    break
            if best is None:
                exhausted[flow] = None
                if flow.parent is None:
                    return None
                # the levels above chose this flow and nothing of theirs changed:
                # walking down from the root would arrive at its parent again
                flow = flow.parent
                continue
            flow = best
        return flow if flow is not self.root else None

    def upcoming(
        self,
        remaining: Callable[[Flow, int], Sequence[str]],
        cost: Callable[[str], float],
        limit: int,
    ) -> list[tuple[float, str, Flow]]:
        """The candidates, as ``(cost, job id, leaf)``, that ``pick`` would lead
        to next, at most ``limit`` (fewer when every flow runs out first), if
        the walk charged each one's ``cost`` to the pass (``offset``) and
        exhausted each leaf at the last of ``remaining(leaf, n)`` (its first
        ``n`` candidates not yet taken in this pass). Nothing changes.

        Each flow's picks, restricted to its subtree, depend only on its
        children's keys, so a flow's order is the merge of its children's by
        the key each child has at its pick, ``(usage + offset + costs of its
        earlier picks) / weight`` (ties by activation order), computed with
        the very float operations ``offset`` and ``pick`` use. Cost: O(q *
        depth * log q) for the q candidates the leaves offer (``limit`` at most
        each), plus O(1) per backlogged flow not exhausted; no heap is
        touched."""
        return self._upcoming(self.root, remaining, cost, limit)

    def _upcoming(
        self,
        flow: Flow,
        remaining: Callable[[Flow, int], Sequence[str]],
        cost: Callable[[str], float],
        limit: int,
    ) -> list[tuple[float, str, Flow]]:
        """``upcoming`` within ``flow`` (not a leaf). A flow with one child left
        has that child's order."""
        exhausted = self.exhausted
        orders = []
        for child in flow.active.values():
            if child in exhausted:
                continue
            if child.children:
                items = self._upcoming(child, remaining, cost, limit)
            else:
                items = [(cost(job_id), job_id, child) for job_id in remaining(child, limit)]
            if items:
                orders.append((child, items))
        if len(orders) == 1:
            return orders[0][1][:limit]
        merged: list[tuple[float, int, int, tuple[float, str, Flow]]] = []
        for child, items in orders:
            usage, weight, offset, seq = child.usage, child.weight, child.offset, child.seq
            for i, item in enumerate(items):
                merged.append(((usage + offset) / weight, seq, i, item))
                offset = offset + item[0]  # as ``offset`` adds it
        merged.sort()
        return [entry[3] for entry in merged[:limit]]

    def offset(self, leaf: Flow, gpu_seconds: float) -> None:
        """Charge a job that could not be placed to the pass only.

        The flows' heap entries are not re-filed here: an offset only raises a
        key, so an entry's key stays at most its flow's, and ``pick`` re-keys
        the entry in place (one ``heapreplace``) when it surfaces with a key
        below its flow's. The minimum it then returns is the true one: every
        other live entry's key is at least the surfaced one's and at most its
        own flow's. O(depth), where re-filing cost O(depth * log n) per offset
        and a stale pop per level in the next ``pick``."""
        touched = self.touched
        flow = leaf
        while flow.parent is not None:
            flow.offset = flow.offset + gpu_seconds
            touched[flow] = None
            flow = flow.parent

    def offset_picked(self, leaf: Flow, gpu_seconds: float) -> None:
        """``offset`` for the leaf ``pick`` has just returned, before anything
        else changed the heaps: each flow of its chain is then at the top of
        its parent's heap, so its entry is re-keyed there at once (one
        ``heapreplace`` a level, the very one ``pick`` would make when the
        entry next surfaced), and the next ``pick`` finds each top current
        instead of re-keying it first. An entry not at the top (not expected)
        is left to ``pick``, as ``offset`` leaves every entry. O(depth * log n),
        where ``offset`` plus the next ``pick``'s re-keying cost as much and
        one more look at each level's top."""
        touched = self.touched
        flow = leaf
        parent = flow.parent
        while parent is not None:
            offset = flow.offset = flow.offset + gpu_seconds
            touched[flow] = None
            heap = parent.heap
            if heap:
                top = heap[0]
                if top[3] is flow and top[2] == flow.stamp:
                    key = (flow.usage + offset) / flow.weight
                    if key != top[0]:
                        stamp = self.stamp = self.stamp + 1
                        flow.stamp = stamp
                        heapq.heapreplace(heap, (key, flow.seq, stamp, flow))
            flow = parent
            parent = flow.parent

    def work_ahead(
        self,
        leaf: Flow,
        own_ahead: float,
        below: list[float] | None = None,
        levels: dict[Flow, LevelIndex] | None = None,
    ) -> float:
        """GPU-seconds the fair order serves before a job with ``own_ahead``
        GPU-seconds queued before it in its own leaf: at each level, every
        backlogged sibling gets served up to the virtual time this flow reaches.
        ``below``, when given, receives the work ahead as it stands before each
        level's siblings are added (leaf level first), so its last entry is the
        work served ahead within the job's top-level flow (its tier).

        ``levels``: a cache of ``LevelIndex`` per parent for many calls between
        which no usage, backlog or membership changes (a publish of estimates):
        each level then costs O(log siblings) instead of O(siblings)."""
        total = own_ahead
        ahead = own_ahead
        for flow in leaf.chain():
            if below is not None:
                below.append(total)
            vt_end = flow.vt() + ahead / flow.weight
            parent = cast(Flow, flow.parent)
            if levels is not None:
                index = levels.get(parent)
                if index is None:
                    index = levels[parent] = LevelIndex(parent)
                served = index.served(vt_end)
                if flow.name in parent.active:  # not ahead of itself
                    lead = (vt_end - flow.vt()) * flow.weight
                    if lead > 0:
                        served -= min(flow.backlog, lead)
                total += max(0.0, served)
            else:
                for sibling in parent.active.values():
                    if sibling is flow:
                        continue
                    lead = (vt_end - sibling.vt()) * sibling.weight
                    if lead > 0:
                        total += min(sibling.backlog, lead)
            ahead = total
        return total


class LevelIndex:
    """The backlogged children of one flow, for ``served(x)``: the GPU-seconds
    they get while the fair order brings virtual time to ``x``,
    ``sum(min(backlog, (x - vt) * weight) for children with vt < x)``.

    A child contributes from its start ``vt`` linearly in ``x`` until its
    backlog is spent at ``vt + backlog / weight``, then its backlog, so with
    the starts and the ends sorted and prefix sums of ``weight`` and
    ``vt * weight`` (``+ backlog`` at the ends), ``served(x) = x * W(starts
    < x) - S(starts < x) - (x * W(ends <= x) - S'(ends <= x))``. Building is
    O(n log n), ``served`` O(log n). Valid while no child's usage, backlog or
    membership changes. Sums in another order than the scan's: equal to
    about 1e-12 relative."""

    __slots__ = ("starts", "start_w", "start_s", "ends", "end_w", "end_s")

    def __init__(self, parent: Flow) -> None:
        kids = [(f.vt(), f.weight, f.backlog) for f in parent.active.values()]
        by_start = sorted(kids)
        by_end = sorted(kids, key=lambda k: k[0] + k[2] / k[1])
        self.starts = [k[0] for k in by_start]
        self.ends = [k[0] + k[2] / k[1] for k in by_end]
        self.start_w = list(accumulate((k[1] for k in by_start), initial=0.0))
        self.start_s = list(accumulate((k[0] * k[1] for k in by_start), initial=0.0))
        self.end_w = list(accumulate((k[1] for k in by_end), initial=0.0))
        self.end_s = list(accumulate((k[0] * k[1] + k[2] for k in by_end), initial=0.0))

    def served(self, x: float) -> float:
        started = bisect_left(self.starts, x)
        spent = bisect_right(self.ends, x)
        return (x * self.start_w[started] - self.start_s[started]) - (
            x * self.end_w[spent] - self.end_s[spent]
        )


def leaf_jobs(leaf: Flow) -> Iterator[str]:
    """A leaf's queued jobs in the order it serves them: requeued ones first,
    then by key where jobs were pushed with one (``ordered``), else in arrival
    order. A job pushed without a key into a keyed leaf (a cell restored from
    a snapshot taken before keys) follows the keyed ones."""
    yield from leaf.requeued
    keys = leaf.keys
    if keys is None:
        yield from leaf.queue
        return
    for _, job_id in leaf.ordered:
        yield job_id
    if len(keys) < len(leaf.queue):
        for job_id in leaf.queue:
            if job_id not in keys:
                yield job_id
