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
"""

from __future__ import annotations

from collections.abc import Iterator


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
    )

    def __init__(self, name: str, weight: float, parent: Flow | None) -> None:
        self.name = name
        self.weight = weight if weight > 0 else 1.0
        self.usage = 0.0
        self.parent = parent
        self.children: dict[str, Flow] = {}
        self.active: dict[str, Flow] = {}  # backlogged children, name order kept
        self.queue: dict[str, None] = {}  # leaf only: job ids in arrival order
        self.requeued: dict[str, None] = {}  # leaf only: served before queue
        self.queued = 0  # jobs queued in this subtree
        self.backlog = 0.0  # their GPU-seconds (estimated)
        self.inflight = 0.0  # charged for runs not yet settled

    def vt(self) -> float:
        return self.usage / self.weight

    def settled_vt(self) -> float:
        return (self.usage - self.inflight) / self.weight

    def chain(self) -> Iterator[Flow]:
        flow: Flow | None = self
        while flow is not None and flow.parent is not None:
            yield flow
            flow = flow.parent


class FairTree:
    def __init__(self, idle_credit_gpu_s: float = 0.0) -> None:
        self.root = Flow("", 1.0, None)
        self.idle_credit = idle_credit_gpu_s

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
    def push(self, leaf: Flow, job_id: str, cost: float, requeued: bool = False) -> None:
        (leaf.requeued if requeued else leaf.queue)[job_id] = None
        self._adjust(leaf, +1, cost)

    def remove(self, leaf: Flow, job_id: str, cost: float) -> bool:
        if job_id in leaf.requeued:
            del leaf.requeued[job_id]
        elif job_id in leaf.queue:
            del leaf.queue[job_id]
        else:
            return False
        self._adjust(leaf, -1, -cost)
        return True

    def _adjust(self, leaf: Flow, delta: int, cost: float) -> None:
        for flow in leaf.chain():
            was_active = flow.queued > 0
            flow.queued += delta
            flow.backlog = flow.backlog + cost if flow.queued else 0.0
            parent = flow.parent
            if flow.queued > 0 and not was_active:
                self._clamp_on_return(flow)
                parent.active[flow.name] = flow
            elif flow.queued == 0 and was_active:
                del parent.active[flow.name]

    def _clamp_on_return(self, flow: Flow) -> None:
        siblings = flow.parent.active
        if not siblings:
            return
        floor = min(s.settled_vt() for s in siblings.values()) * flow.weight - self.idle_credit
        if flow.usage - flow.inflight < floor:
            flow.usage = floor + flow.inflight

    # -- charging ------------------------------------------------------------
    def charge_start(self, leaf: Flow, gpu_seconds: float) -> None:
        """A run starts: charge its estimated cost now."""
        for flow in leaf.chain():
            flow.usage += gpu_seconds
            flow.inflight += gpu_seconds

    def charge_end(self, leaf: Flow, charged: float, used: float) -> None:
        """A run ended: replace its estimated charge by the GPU-time it used."""
        for flow in leaf.chain():
            flow.usage += used - charged
            flow.inflight -= charged

    # -- fair order ----------------------------------------------------------
    def pick(self, offsets: dict[int, float], exhausted: set[int]) -> Flow | None:
        """The leaf to serve next, or None when every backlogged leaf is
        exhausted for this pass. ``offsets``/``exhausted`` are keyed by id(flow)."""
        flow = self.root
        while flow.active:
            best = None
            best_vt = 0.0
            for child in flow.active.values():
                if id(child) in exhausted:
                    continue
                vt = (child.usage + offsets.get(id(child), 0.0)) / child.weight
                if best is None or vt < best_vt:
                    best, best_vt = child, vt
            if best is None:
                exhausted.add(id(flow))
                if flow.parent is None:
                    return None
                flow = self.root
                continue
            flow = best
        return flow if flow is not self.root else None

    def work_ahead(self, leaf: Flow, own_ahead: float) -> float:
        """GPU-seconds the fair order serves before a job with ``own_ahead``
        GPU-seconds queued before it in its own leaf: at each level, every
        backlogged sibling gets served up to the virtual time this flow reaches."""
        total = own_ahead
        ahead = own_ahead
        for flow in leaf.chain():
            vt_end = flow.vt() + ahead / flow.weight
            for sibling in flow.parent.active.values():
                if sibling is flow:
                    continue
                lead = (vt_end - sibling.vt()) * sibling.weight
                if lead > 0:
                    total += min(sibling.backlog, lead)
            ahead = total
        return total

    @staticmethod
    def offset(offsets: dict[int, float], leaf: Flow, gpu_seconds: float) -> None:
        for flow in leaf.chain():
            offsets[id(flow)] = offsets.get(id(flow), 0.0) + gpu_seconds
