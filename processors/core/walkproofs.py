"""When the rest of a scheduling walk can change nothing, and what a walk
remembers between its candidates.

Theory of operation
-------------------
A walk (``scheduling.py``) tests queued jobs in fair order until the free GPUs
or its candidate budget run out. Once every reservation slot is taken (a
quick pass reserves nothing) and no queued job may preempt
(``walk_may_stop``), a candidate that cannot start changes nothing but the
pass's charges, so the walk may stop, with the very outcome of walking on, as
soon as it knows that no candidate left can start. It learns that in two
steps:

1. bounds over the queued jobs (``queuebounds.py``: their smallest per-node
   GPU needs and, per need, the fewest nodes, the shortest estimate and the
   tiers' ranks, kept by ``enqueue`` and ``dequeue``) against the free GPUs,
   claims and reservations (``nothing_fits``): cheap, but the bounds mix jobs;
2. once ``QUIET_BEFORE_PROOF`` candidates in a row failed on searches the
   pass had made, the exact version (``every_class_blocked``): one search per
   class of queued job (``QueueClasses``: tier and the spec's demands per
   shape) for its shortest estimate. A proof that fails still names the
   classes it found blocked: the walk's later candidates of those fail on a
   lookup (``PassMemo.class_blocked``), and the ones before the first that
   may start are read off the fair order and taken at once
   (``blocked_prefix``).

Every search a walk makes is keyed by ``fit_key`` (``starts.py``) in the
pass's ``PassMemo``: within a pass capacity only shrinks, so a key that found
no nodes still finds none (``NodeIndex.freed`` is in the key in case
something is freed mid-pass).

Cost model
----------
With q queued jobs, F nodes with free GPUs and n backlogged flows:

- a memo lookup (``no_fit``, the nodes reserved for others, a class known
  blocked) is a dict read, plus O(log reservations) for the shadow times;
- ``nothing_fits`` reads bounds kept per enqueue/dequeue in O(log q)
  (``queuebounds.py``): in a backlogged cell whose few free GPUs fit no queued
  shape, a pass costs O(gpus_per_node * reservations) instead of ``depth``
  failed candidates;
- the bounds mix jobs (one job's node count, another's short estimate), so
  once ``QUIET_BEFORE_PROOF`` candidates in a row failed on searches the pass
  had made, the walk asks for the exact version (``every_class_blocked``): the
  queued jobs kept by class (tier and the spec's demands per shape,
  ``QueueClasses``, O(shapes * log q) per enqueue or dequeue), one search per
  class for its shortest estimate and one per further holder, shared with the
  walk's memo; at most ``CLASS_PROOF_LIMIT`` classes, so a proof costs
  O(classes * (reservations + F)) at most once until the walk places or
  reserves. A proof that fails still names the classes it found blocked, and
  the walk's later candidates of those fail on a class lookup, O(1), with no
  search (``PassMemo.class_blocked``). On a fleet cell, ``framespool simulate
  --synthetic multitenant --jobs 10000 --nodes 125 --gpus-per-node 8
  --production-cadences --max-sim-s 21600`` (summary.json ``walks``), the
  proof held on 2,671 of 8,855 attempts; its walks test 1.15 M candidates
  (1.40 M without the proof, counted by the same walks instrumented), 0.86 M
  of them failed on a class lookup (``candidates_of_blocked_classes``);
- after a proof that failed, while the queue is no deeper than ``READ_DEPTH``
  times what the walk may still test, the candidates it would fail on next are read off
  the fair order at once (``FairTree.upcoming``: one sort per level, in C,
  O(q log q)) and taken together (``blocked_prefix``), where picking each
  cost O(depth * log n) in Python; the walk goes on from the first that may
  start, or stops on its budget. On that fleet cell's hour-3 window this
  took 10 % off the instructions (cachegrind, ``docs/measuring.md``), with
  the same outputs.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import TYPE_CHECKING

from framespool.schemas.states import JobState

from .fairshare import Flow
from .model import Job
from .placement import Placement
from .queuebounds import QueueBounds, QueueClasses, ShapeClass

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

# ``every_class_blocked`` is asked once this many candidates in a row failed on
# searches the pass had already made, and only over this many queued classes
QUIET_BEFORE_PROOF = 8
CLASS_PROOF_LIMIT = 64
# ``blocked_prefix`` reads the walk ahead only while the queue holds at most this
# many times the candidates it may still test: the read sorts every queued job.
# At 4 a fleet cell's hour 9 (~890 queued, a walk reaching ~200 of them) ran
# 10-15 % slower than walking (process time of that window's replay,
# docs/measuring.md, 3 runs each; the read sorted ~4 jobs per one it took)
READ_DEPTH = 2


class PassMemo:
    """What one walk remembers between its candidates.

    ``no_fit``: the ``fit_key`` of every search that found no nodes. ``reserved``:
    ``reserved_for_others`` by (tier, how many shadow times the job's end passes,
    the job if it holds a further reservation): a job's estimate counts only
    through ``end > shadow``, and nothing else changes the answer while the
    reservations and the clock stay as they are, so the walk calls
    ``reservations_changed`` whenever it places or reserves. A hit costs
    O(log reservations) where the computation looks up every holder's tier.

    ``blocked``: after a proof (``every_class_blocked``), whether each class
    of queued job (``QueueClasses``) the walk met since is unable to start,
    until the walk places or reserves: a candidate of such a class fails
    without a search (``class_blocked``). Nothing else in a walk gives GPUs
    back or claims nodes once a proof ran: it runs only while no queued job
    may preempt (``walk_may_stop``), so ``maybe_preempt`` acts for none."""

    __slots__ = ("no_fit", "reserved", "shadows", "more", "blocked")

    def __init__(self, more: dict[str, tuple[int, tuple[str, ...]]]) -> None:
        self.no_fit: dict[tuple, None] = {}
        self.reserved: dict[tuple, tuple[str, ...]] = {}
        self.shadows: list[int] | None = None
        self.more = more  # the cell's further reservations (the dict, kept as it changes)
        self.blocked: dict[tuple, bool] | None = None  # None: no proof since the last change

    def reservations_changed(self) -> None:
        self.reserved.clear()
        self.shadows = None
        self.blocked = None

    def class_blocked(self, cell: Cell, job: Job) -> bool:
        """Whether ``job``'s class cannot start, known since the walk's last
        proof: the search for the class's shortest estimate finds no nodes
        (``WalkProofs.class_may_start``, made once per class and remembered),
        and the job's own estimate is no shorter, so as many nodes or more are
        reserved against it; within a pass capacity only shrinks. False before
        a proof, after the walk placed or reserved (``reservations_changed``),
        and for a further holder, whose own reservation's nodes are not
        reserved against it. O(1), plus the class's search the first time."""
        blocked = self.blocked
        if blocked is None or job.job_id in self.more:
            return False
        key = cell.class_of(job)
        known = blocked.get(key)
        if known is None:
            cls = cell.queue_classes().classes.get(key)
            known = blocked[key] = cls is not None and not cell.class_may_start(cls, self)
        return known

    def reserved_for_others(self, cell: Cell, job: Job, estimate_s: float) -> tuple[str, ...]:
        more = self.more
        shadows = self.shadows
        if shadows is None:
            shadows = sorted(shadow for shadow, _ in more.values())
            if cell.reservation_job:
                insort(shadows, cell.reservation_shadow_ms)
            self.shadows = shadows
        end = cell.now_ms + estimate_s * 1000  # as reserved_for_others computes it
        key = (job.tier, bisect_left(shadows, end), job.job_id if job.job_id in more else "")
        nodes = self.reserved.get(key)
        if nodes is None:
            nodes = self.reserved[key] = cell.reserved_for_others(job.job_id, estimate_s, False)
        return nodes


class WalkProofs:
    # -- may the walk stop? -----------------------------------------------------
    def nothing_fits(self: Cell, full: bool) -> bool:
        """Whether no candidate left in this pass can start, reserve or preempt,
        so the walk may stop with the very outcome of walking on (the three
        conditions of ``queuebounds.py``; a quick pass reserves nothing).
        Cost: O(gpus_per_node * (reservations + held nodes) + F)."""
        bounds = self.queue_bounds()
        if not bounds.size:
            return True
        if not self.walk_may_stop(full):
            return False
        # claimants are skipped, so no candidate may use a claimed node; a
        # reservation's nodes only jobs that end by its shadow time or outrank
        # its holder (``reserved_for_others``), and a further holder its own
        claimed = self.claimed_nodes("")
        reservations = self.reservation_list()
        held = dict(claimed)
        for _, _, nodes in reservations:
            held.update(dict.fromkeys(nodes))
        ranks = []
        for job_id, _, _ in reservations:
            holder = self.jobs.get(job_id)
            tier = self.config.tier(holder.tier) if holder is not None else None
            own = (
                self.bound_key(holder)[0]
                if job_id != self.reservation_job  # the first holder is no candidate
                and holder is not None
                and holder.state == JobState.QUEUED
                else 0
            )
            ranks.append((tier.rank if tier is not None else None, own))
        index = self.index
        for need in bounds.need:
            wanted = bounds.fewest_nodes(need)
            usable = index.count_free(need, wanted, held)
            for (_, shadow_ms, nodes), (rank, own) in zip(reservations, ranks):
                if usable >= wanted:
                    break
                if own == need or bounds.may_use(need, self.now_ms, shadow_ms, rank):
                    usable += sum(
                        1 for n in nodes if n not in claimed and index.bucket_of.get(n, 0) >= need
                    )
            if usable >= wanted:
                return False
        return True

    def walk_may_stop(self: Cell, full: bool) -> bool:
        """Conditions 1 and 2 of ``queuebounds.py``: every reservation slot is
        taken (a quick pass reserves nothing) and no queued job may preempt, so
        a candidate that cannot start changes nothing. O(1)."""
        if self.queue_bounds().sensitive:
            return False
        return not full or bool(
            self.reservation_job and len(self.more_reservations()) + 1 >= self.config.reservations
        )

    def reservation_list(self: Cell) -> list[tuple[str, int, tuple[str, ...]]]:
        """Every reservation as ``(holder, shadow ms, nodes)``, the first one first."""
        out = [(self.reservation_job, self.reservation_shadow_ms, self.reservation_nodes)]
        out.extend((j, shadow, nodes) for j, (shadow, nodes) in self.more_reservations().items())
        return out

    def queue_bounds(self: Cell) -> QueueBounds:
        """Bounds over the queued jobs (``queuebounds.py``), kept by ``enqueue`` and
        ``dequeue``; built from the queues on first use (or a cell restored from
        an older snapshot)."""
        bounds: QueueBounds | None = self.__dict__.get("_queue_bounds")
        if bounds is None:
            bounds = self._queue_bounds = QueueBounds()
            for job in self.queued_jobs():
                bounds.add(*self.bound_key(job))
        return bounds

    def queued_jobs(self: Cell) -> Iterator[Job]:
        """Every queued job, leaf by leaf (requeued ones first). O(q)."""
        for leaf in self.leaves.values():
            for source in (leaf.requeued, leaf.queue):
                for job_id in source:
                    yield self.jobs[job_id]

    def queue_classes(self: Cell) -> QueueClasses:
        """The queued jobs by class (``QueueClasses``): built from the queues
        when a walk first asks (O(q) once; a cell whose walks never need a
        proof, a lightly loaded one, keeps none), then kept by ``enqueue`` and
        ``dequeue``."""
        classes: QueueClasses | None = self.__dict__.get("_queue_classes")
        if classes is None:
            classes = self._queue_classes = QueueClasses()
            for job in self.queued_jobs():
                classes.add(*self.class_key(job))
        return classes

    def class_key(self: Cell, job: Job) -> tuple[tuple, str, tuple[float, ...]]:
        """``(class, job id, estimate per shape)`` for ``QueueClasses``."""
        fit = self.fit_shapes(job)
        return self.class_of(job), job.job_id, tuple(f[2] for f in fit)

    def class_of(self: Cell, job: Job) -> tuple:
        """The job's class in ``QueueClasses``: its tier and, per shape, the
        ``fit_key`` part the spec fixes. Fixed for the job's life, so built
        once and kept on the job: O(1) after the first call, O(shapes) for it."""
        try:
            key = job.qclass
        except AttributeError:  # a job from a snapshot taken before the cache
            key = None
        if key is None:
            key = job.qclass = (job.tier, tuple(f[3] for f in self.fit_shapes(job)))
        return key

    def every_class_blocked(self: Cell, memo: PassMemo) -> bool:
        """Whether no queued job that the walk would test can start on the GPUs
        free now, proven per class (``QueueClasses``): for each, one search for
        its shortest estimate with the nodes reserved against that estimate
        (the fewest any job of the class has) and the other filters of
        ``node_filter``, guarantees left out (they only bar more). The first
        reservation's holder and claimants are not tested by a walk; a further
        holder may use its own reservation's nodes, so each is searched on its
        own. Every search is a ``fit_key`` the walk shares through ``memo``.

        A proof that fails still leaves what it learned: from then on the
        walk's candidates of a class it found blocked fail without a search
        (``PassMemo.class_blocked``), and the classes it did not reach are
        searched once each as the walk meets them, until it places or
        reserves. Searching on past the first class that fits would name
        more classes at once, but each costs a new O(F) search, most for
        classes the walk never meets: +28 % instructions on the bench core
        backlog stream, where proofs rarely hold (cachegrind, 20,000 events,
        the recipe in ``docs/measuring.md``).

        Only with no breaker (which bar nodes per model) and at most
        ``CLASS_PROOF_LIMIT`` classes. Cost: O(classes * shapes) memo lookups
        plus one search per key not yet in the memo, O(F) each."""
        if self.breakers:
            return False
        classes = self.queue_classes().classes
        if len(classes) > CLASS_PROOF_LIMIT:
            return False
        blocked = memo.blocked = {}
        jobs, claims = self.jobs, self.claims
        for job_id in memo.more:
            job = jobs.get(job_id)
            if job is None or job.state != JobState.QUEUED or job_id in claims:
                continue
            for gpus, per_node, estimate, fixed in self.fit_shapes(job):
                if self.memo_search(job, gpus, per_node, estimate, fixed, memo):
                    return False
        for key, cls in classes.items():
            blocked[key] = not self.class_may_start(cls, memo)
            if not blocked[key]:
                return False
        return True

    def blocked_prefix(
        self: Cell, memo: PassMemo, cursors: dict[Flow, list], budget: int, left: int
    ) -> tuple[list[tuple[Flow, str, float]], int]:
        """After a proof that failed: the candidates the rest of the walk takes
        before the first that may start, as ``(leaf, job id, cost)`` in its
        order, and how many of them it counts against its budget (``left``
        more tests at most): each fails on a class the walk knows or finds
        blocked (``PassMemo.class_blocked``, searching a class met for the
        first time, as the walk would). Nothing where the queue is deeper than
        ``READ_DEPTH`` times what the walk may still test.

        Such a candidate changes nothing but the pass's charges: it is charged
        to the pass (``FairTree.offset``) and its leaf exhausted at its last,
        and it may not preempt or reserve (the proof runs only then,
        ``walk_may_stop``: a full walk holds the first reservation, so every
        candidate counts against the budget). So the walk takes them at once, read off the fair
        order (``FairTree.upcoming``: the order of a pass in which every
        candidate fails) where it picked them one by one, then goes on from
        the first that may start, or stops on its budget. Holders of the first
        reservation and claimants are taken uncounted, as the walk passes
        them; a further holder may start on its own nodes, so it ends the
        read. The caller leaves caps out (a capped candidate exhausts its flow
        uncounted).

        On a fleet cell (``framespool simulate --synthetic multitenant --jobs
        10000 --nodes 125 --gpus-per-node 8 --production-cadences``, 80,000
        events of hour 3, ~300-430 queued, replayed with its walks
        instrumented), 380 k of the 533 k candidates the walks tested came
        after a failed proof in 1,483 walks that then spent their whole budget
        and placed nothing.

        Cost: O(q * log q) for the q <= ``2 * (left + skipped)`` queued jobs
        (``FairTree.upcoming``, one sort per level, in C) plus O(1) per
        candidate read, where a walk costs O(depth * log n) per candidate in
        Python (``pick``). A deeper queue is walked: a read would sort jobs the
        walk never reaches (the bench core backlog's 5,000 queued jobs, of
        which a walk tests ~40 after a failed proof)."""
        jobs, claims, holder = self.jobs, self.claims, self.reservation_job
        limit = left + len(claims) + 1  # enough to count ``left`` past those passed over
        if self.queued_count > READ_DEPTH * limit:
            return [], 0  # the read would sort jobs the walk may never reach (READ_DEPTH)
        order = self.fair.upcoming(
            lambda leaf, n: self.untaken(cursors, leaf, budget, n),
            lambda job_id: jobs[job_id].cost,
            limit,
        )
        out: list[tuple[Flow, str, float]] = []
        counted = 0
        for cost, job_id, leaf in order:
            if job_id != holder and job_id not in claims:
                if memo.class_blocked(self, jobs[job_id]) is False:
                    break  # False for a further holder too
                counted += 1
            out.append((leaf, job_id, cost))
            if counted == left:
                break
        return out, counted

    def class_may_start(self: Cell, cls: ShapeClass, memo: PassMemo) -> bool:
        """Whether the search for the class's shortest estimate per shape finds
        nodes (``every_class_blocked``). A further holder or a claimant does not
        stand for its class (the walk tests the one on its own nodes and skips
        the other): a class of only those is not searched (False)."""
        claims = self.claims
        stands = next((j for j in cls.jobs if j not in memo.more and j not in claims), None)
        if stands is None:
            return False
        job = self.jobs.get(stands)
        if job is None:
            return True  # not expected: a queued job is in the table (not proven)
        return any(
            self.memo_search(job, gpus, per_node, shortest.min(), fixed, memo)
            for (gpus, per_node, _, fixed), shortest in zip(self.fit_shapes(job), cls.estimates)
        )

    def memo_search(
        self: Cell,
        job: Job,
        gpus: int,
        per_node: int,
        estimate: float,
        fixed: tuple,
        memo: PassMemo,
    ) -> Placement | None:
        """A walk's search for one shape of ``job`` (no claim or reservation of
        its own in play) with ``estimate``: None at once when the pass already
        searched its ``fit_key`` in vain, else the search, remembered in
        ``memo`` when it finds nothing."""
        reserved = memo.reserved_for_others(self, job, estimate)
        key = self.fit_key(fixed, job.spec, reserved, estimate)
        if key in memo.no_fit:
            return None
        ok = self.node_filter(job, estimate, False, False, reserved)
        placement = self.index.find(gpus, per_node, job.spec.model, ok, self.by_end(estimate))
        if placement is None:
            memo.no_fit[key] = None
        return placement

    def bound_key(self: Cell, job: Job) -> tuple[int, int, float, int, bool]:
        """What ``QueueBounds`` keeps of a queued job: its smallest per-node GPU
        need, node count and estimate over its shapes, its tier's rank, and
        whether it may preempt. Fixed for the job's life (its spec and the
        config never change), so built once and kept on the job: O(1) after
        the first call, O(shapes) for it."""
        try:
            key = job.bounds
        except AttributeError:  # a job from a snapshot taken before the cache
            key = None
        if key is None:
            shapes = self.shapes_of(job)
            tier = self.config.tier(job.tier)
            key = job.bounds = (
                min(min(gpus, per_node) for gpus, per_node, _ in shapes),
                min(-(-gpus // per_node) for gpus, per_node, _ in shapes),
                min(estimate for _, _, estimate in shapes),
                tier.rank if tier is not None else 0,
                self.preempt_sensitive(job),
            )
        return key
