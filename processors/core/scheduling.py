"""The scheduling pass: fair order, gang placement, EASY backfill, preemption.

Theory of operation
-------------------
A pass runs on every Tick (and, cheaply, after an admission or registration
when GPUs are free):

1. Preemption claims first: a job whose victims have left takes their GPUs.
2. The reservation holder next: the first job in fair order that did not fit
   holds a reservation (the earliest time, from running runs' projected ends,
   at which its shape fits, and on which nodes) until it starts.
3. Then jobs in fair order (``fairshare.py``). A job that fits is placed
   atomically (one JobAssigned with its whole gang). A job that does not fit
   becomes the reservation holder if there is none, may trigger preemption,
   and the walk goes on: later jobs backfill only if they finish before the
   reservation's shadow time or use none of its nodes (EASY backfill), up to
   ``backfill_depth`` candidates.

A run that outlives its estimate delays the reservation (the shadow time moves
to its hard limit); it is never killed before that limit.

Cost model
----------
With n backlogged flows (tenants, users), q queued jobs, R running runs and
F nodes with free GPUs, every handler costs O(log n + log q) amortized plus,
for placement, O(F) per shape tried:

- config lookups (tier, tenant, retry budget) are dict reads, O(1);
- the fair-order walk takes each level's minimum from a heap, O(log n)
  amortized (``fairshare.py``);
- the unused guarantees that non-preemptible work may not borrow are a
  running total kept as GPUs are taken and given back, O(1) per check;
- a pass remembers the shapes (and node constraints) that found no nodes and
  does not search for them again: within a pass capacity only shrinks, so a
  shape that did not fit still does not (``NodeIndex.freed`` is in the key in
  case something is freed mid-pass). A pass tests at most ``backfill_depth``
  candidates after a block, so a Tick is O(depth * (log n + F)) however long
  the backlog;
- and it stops as soon as no candidate left can start, reserve or preempt
  (``nothing_fits``, bounds kept per enqueue/dequeue in O(log q),
  ``queuebounds.py``): in a backlogged cell whose few free GPUs fit no queued
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
  the same outputs;
- the reservation walks running runs' ends from a list kept sorted as runs
  start and release (``reservation.py``), consuming only as many as it needs;
  the late runs' ends are kept in their projected order as time passes them
  (``LateSlices``), so a walk projects only the ones it reads, and a
  reservation that keeps its nodes reads only those nodes' ends;
- a walk that placed, reserved and preempted nothing is not walked again while
  nothing it reads changed and no reservation's slack before its shadow time
  grew (``walk_signature``): a backlogged cell whose late runs move the shadow
  with every Tick skips about a third of its walks;
- per candidate that does not fit, a walk costs O(log n) for the fair order
  (a pass offset re-keys a flow's heap entry only when it surfaces,
  ``FairTree.offset``), dict lookups for the no-fit memo and the nodes
  reserved for others (``PassMemo``), and asks ``maybe_preempt`` only about
  jobs that may preempt.

The optimised structures decide exactly as the scans did;
``tests/unit/test_core_costmodel.py`` replays backlog workloads through both
and compares every output event.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, cast

from framespool.schemas import events as ev
from framespool.schemas.states import JobState, NodeState, RunPhase

from . import lifecycle as lc
from .fairshare import Flow, leaf_jobs
from .model import Job, Node, Run
from .placement import EndPacking, Placement
from .queuebounds import QueueBounds, QueueClasses, ShapeClass

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

QUICK_PASS_TESTS = 32
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
        (``Scheduling.class_may_start``, made once per class and remembered),
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


class Scheduling:
    # -- the pass -------------------------------------------------------------
    def schedule(self: Cell, full: bool) -> None:
        try:
            self._schedule(full)
        finally:
            self.flush_evictions()  # after the walk: its queues stay as it read them

    def _schedule(self: Cell, full: bool) -> None:
        if not self.queued_count:
            return
        if full:
            self.preemption_scan()
        if self.index.free_total == 0:
            return
        self.expire_claims()
        for job_id in list(self.claims):
            job = self.jobs.get(job_id)
            if job is not None and job.state == JobState.QUEUED:
                self.try_start(job, "preemption claim", claim_only=True)
        if self.reservation_job:
            holder = self.jobs.get(self.reservation_job)
            if holder is None or holder.state != JobState.QUEUED:
                self.clear_reservation()
            elif not self.try_start(holder, "reservation holder", holder=True) and full:
                self.reserve(holder)
        if full:
            self.refresh_reservations()
            self.defragment()
        signature = self.walk_signature(full)
        if signature is not None and _still_idle(signature, self.__dict__.get("_idle_walk")):
            return  # the same walk found nothing to do, and nothing it reads changed
        fair = self.fair
        outputs = len(self._out)
        fair.begin_pass()
        try:
            sensitive = self._walk(full)
        finally:
            fair.end_pass()
        idle = not sensitive and len(self._out) == outputs
        self._idle_walk = signature if idle and signature == self.walk_signature(full) else None

    def walk_signature(self: Cell, full: bool) -> tuple | None:
        """What a walk that places nothing depends on, besides time; None when
        time alone could change its outcome (a breaker may expire).

        A walk is skipped when the last one placed, reserved, preempted and
        emitted nothing, visited no job that may preempt (``preempt_sensitive``),
        and nothing it reads changed (``_still_idle``): no GPU freed or use
        given back (``index.freed``), no queue, charge or settlement change
        (``fair.version``), the same free GPUs, claims, and reservations (holders
        and nodes), each with no more slack before its shadow time than then.

        Time moves a job's estimated end (now + estimate) past a reservation's
        shadow time, which only takes nodes away from backfill; a shadow time
        moves too (a run past its estimate is projected a little past now,
        ``Run.projected_end_ms``), but a job may use a reservation's nodes only
        if it ends by the shadow time (``reserved_for_others``), so while the
        slack ``shadow - now`` does not grow no job gains a node and every job
        that did not fit still does not. Cost: O(reservations + claims)."""
        if self.breakers:
            return None
        now = self.now_ms
        more = self.more_reservations()
        return (
            (
                full,
                self.index.freed,
                self.index.free_total,
                self.fair.version,
                self.reservation_job,
                self.reservation_nodes,
                tuple((job_id, nodes) for job_id, (_, nodes) in more.items()),
                tuple(self.claims.items()),
            ),
            (self.reservation_shadow_ms - now, *(shadow - now for shadow, _ in more.values())),
        )

    def preempt_sensitive(self: Cell, job: Job) -> bool:
        """Whether ``maybe_preempt`` could act for this job at some later time;
        when not, it is a no-op for the job (its tier may not preempt and
        ``under_guarantee`` finds no guarantee, not even a default tenant's)."""
        return self.config.may_preempt(job.tier, job.tenant)

    def _walk(self: Cell, full: bool) -> bool:
        """Jobs in fair order until the GPUs or the candidate budget run out.
        Returns whether a job that may preempt was visited.

        Per candidate that does not fit: O(log n) for the fair order, the memo
        lookups of ``PassMemo``, and ``maybe_preempt`` only for a job that may
        preempt (for the others it is a no-op, ``preempt_sensitive``)."""
        sensitive = False
        fair = self.fair
        pick, offset, offset_picked = fair.pick, fair.offset, fair.offset_picked
        jobs, claims, index = self.jobs, self.claims, self.index
        cursors: dict[Flow, list] = {}  # leaf -> [its candidates (a snapshot), next one]
        more = self.more_reservations()  # one dict for the cell's life
        memo = PassMemo(more)
        budget = self.config.backfill_depth if full else QUICK_PASS_TESTS
        reservations = self.config.reservations
        caps = self.config.any_caps()
        after_block = 0
        recheck = True  # whether nothing_fits() may have changed its answer
        quiet = 0  # candidates in a row that failed on searches already made
        tested = known = 0  # candidates, and those a known blocked class failed
        while index.free_total > 0:
            if recheck:
                recheck = False
                if self.nothing_fits(full):
                    break  # the rest of the walk could change nothing (queuebounds.py)
            if quiet == QUIET_BEFORE_PROOF and memo.blocked is None and self.walk_may_stop(full):
                held = self.every_class_blocked(memo)
                self._count("walk_proofs_held" if held else "walk_proofs_failed")
                if held:
                    break  # no job left can start, reserve or preempt: as above
                if not caps:
                    # read the walk ahead up to its first candidate that may
                    # start, and take the ones before it at once
                    taken, counted = self.blocked_prefix(
                        memo, cursors, budget, budget - after_block
                    )
                    tested += counted
                    known += counted
                    after_block += counted
                    if after_block >= budget:
                        break  # the walk would end on them: nothing to take
                    for flow, _, cost in taken:  # what the walk does with each
                        cursor = cursors.get(flow)
                        if cursor is None:
                            cursor = cursors[flow] = [self.candidates(flow, budget), 0]
                        cursor[1] += 1
                        offset(flow, cost)
                        if cursor[1] == len(cursor[0]):
                            fair.exhaust(flow)
            leaf = pick()
            if leaf is None:
                break
            cursor = cursors.get(leaf)
            if cursor is None:
                cursor = cursors[leaf] = [self.candidates(leaf, budget), 0]
            ids, at = cursor  # never spent: a leaf is exhausted at its last candidate
            job_id = ids[at]
            cursor[1] = at + 1
            # the leaf's last candidate: nothing more of it in this pass, said now
            # rather than when the fair order next offers the leaf
            last = at + 1 == len(ids)
            job = jobs[job_id]
            if job_id == self.reservation_job or job_id in claims:
                offset_picked(leaf, job.cost)
                if last:
                    fair.exhaust(leaf)
                continue
            capped = caps and self.cap_hit(job)
            if capped:
                fair.exhaust(leaf if capped == "user" else cast(Flow, leaf.parent))
                continue
            tested += 1
            searched = len(memo.no_fit)
            # a class the last proof found blocked fails as try_start would,
            # without its searches (``PassMemo.class_blocked``), and nothing
            # else follows: since the proof no candidate may reserve or preempt
            # (``walk_may_stop``) and ``quiet`` is read again only after the
            # walk places or reserves, which resets it
            if memo.class_blocked(self, job):
                known += 1
                offset_picked(leaf, job.cost)
            elif not self.try_start(
                job, "backfill" if self.reservation_job else "fair-share order", memo=memo
            ):
                offset_picked(leaf, job.cost)
                quiet = quiet + 1 if len(memo.no_fit) == searched else 0
                if full:
                    if not self.reservation_job:
                        self.reserve(job)
                        recheck, quiet = True, 0
                        memo.reservations_changed()
                    elif len(more) + 1 < reservations:
                        self.reserve_more(job)
                        recheck, quiet = True, 0
                        memo.reservations_changed()
                if self.preempt_sensitive(job):  # memoised by the config
                    sensitive = True
                    self.maybe_preempt(job)
            else:
                recheck, quiet = True, 0
                memo.reservations_changed()  # a placement may have taken a reservation
            if last:
                fair.exhaust(leaf)
            if self.reservation_job or not full:
                after_block += 1
                if after_block >= budget:
                    break
        counters = self.counters  # what ``framespool simulate`` reports as ``walks``
        counters["walks"] = counters.get("walks", 0) + 1
        counters["walk_tests"] = counters.get("walk_tests", 0) + tested
        counters["walk_class_skips"] = counters.get("walk_class_skips", 0) + known
        return sensitive

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

    def preemption_scan(self: Cell) -> None:
        """With the cell full no placement is tried, so look at the heads of the
        flows that may preempt (tiers past SLA, organisations under their
        guarantee) directly."""
        tiers = [t.name for t in self.config.tiers if t.may_preempt or t.reserved_gpus]
        reserved = self.config.reserved_tenant_gpus
        for tier_name, tier_flow in self.fair.root.active.items():
            for org_name, org_flow in tier_flow.active.items():
                if tier_name not in tiers and org_name not in reserved:
                    continue
                for leaf in list(org_flow.active.values()):
                    head = next(iter(self.candidates(leaf, 1)), None)
                    if head is not None and head in self.jobs:
                        self.maybe_preempt(self.jobs[head])

    @staticmethod
    def untaken(cursors: dict[Flow, list], leaf: Flow, budget: int, limit: int) -> Sequence[str]:
        """The first ``limit`` of a leaf's candidates a walk has not taken yet:
        past its cursor (``[snapshot, next]``), or the first of the snapshot
        it would take (``candidates`` with the walk's ``budget``)."""
        cursor = cursors.get(leaf)
        if cursor is None:
            return Scheduling.candidates(leaf, min(budget, limit))
        ids, at = cursor
        return ids[at : at + limit]

    @staticmethod
    def candidates(leaf: Flow, limit: int) -> list[str]:
        """A snapshot of a backlogged leaf's first jobs in its order
        (``leaf_jobs``: requeued first, then by size key or arrival): the
        pass may place or drop jobs while it walks them. At least one, even when
        the pass's budget is spent (``limit`` <= 0): the walk still tries the job
        at the head of the fair order (without it, a spent budget left gang
        queues stalled for a day: ``test_sim_shapes``)."""
        return list(islice(leaf_jobs(leaf), max(1, limit)))

    def cap_hit(self: Cell, job: Job) -> str:
        """ "org" or "user" when the job's organisation or user is at a cap, else
        "". O(1); with no caps configured at all it returns at once, and a
        tenant with no caps (most) costs one config lookup."""
        if not self.config.any_caps():
            return ""
        tenant = self.config.tenant(job.tenant)
        if not tenant.capped():
            return ""
        org, user = self.use_of(job)
        gpus = job.shape[0]
        if (tenant.max_gpus and org.gpus + gpus > tenant.max_gpus) or (
            tenant.max_running and org.running >= tenant.max_running
        ):
            return "org"
        if (tenant.user_max_gpus and user.gpus + gpus > tenant.user_max_gpus) or (
            tenant.user_max_running and user.running >= tenant.user_max_running
        ):
            return "user"
        return ""

    # -- placing one job --------------------------------------------------------
    def try_start(
        self: Cell,
        job: Job,
        why: str,
        holder: bool = False,
        claim_only: bool = False,
        memo: PassMemo | None = None,
    ) -> bool:
        """Place ``job`` in the shape that finishes earliest, if any fits.
        ``memo``: the pass's memo of searches that found no nodes (and of the
        nodes reserved for others, ``PassMemo``), for a job that holds no claim
        and no reservation: a search whose ``fit_key`` found no nodes earlier in
        the pass is not made again. Per shape: O(1) for the key (its spec part
        cached on the job, ``fit_shapes``) and the memo lookups, plus the search
        when new."""
        if holder or claim_only:
            memo = None
        best: tuple[Placement, tuple[int, int, float]] | None = None
        spec = job.spec
        # outside a walk nothing is cached on the job (a refused start leaves the
        # state as it was)
        shapes = (
            self.fit_shapes(job)
            if memo is not None
            else tuple((g, p, e, ()) for g, p, e in self.shapes_of(job))
        )
        for gpus, per_node, estimate, fixed in shapes:
            if best is not None and estimate >= best[1][2]:
                continue
            if not spec.preemptible and not self.guarantees_allow(job, gpus):
                continue
            if memo is not None:
                placement = self.memo_search(job, gpus, per_node, estimate, fixed, memo)
            else:
                ok = self.node_filter(job, estimate, holder, claim_only)
                placement = self.index.find(gpus, per_node, spec.model, ok, self.by_end(estimate))
            if placement is not None:
                best = (placement, (gpus, per_node, estimate))
        if best is None:
            return False
        return self.commit(job, best[0], best[1], why)

    def by_end(self: Cell, estimate_s: float) -> EndPacking | None:
        """What ``index.find`` needs to place a job of ``estimate_s`` by its
        expected end (``CellConfig.pack_by_end_s``), or None when that is off.
        O(1); the search asks ``drain_ms`` per partly used node that fits."""
        grain_s = getattr(self.config, "pack_by_end_s", 0.0)
        if not grain_s:
            return None
        return (self.now_ms + int(estimate_s * 1000), max(1, int(grain_s * 1000)), self.drain_ms)

    def drain_ms(self: Cell, node: Node) -> int:
        """When the runs holding GPUs of ``node`` are expected to have left it:
        the latest of their projected ends (``Run.projected_end_ms``; a run
        already stopping, or none, counts as now). O(GPUs per node)."""
        now = self.now_ms
        latest = now
        runs = self.runs
        seen = None
        for key in node.owner:
            if key is None or key == seen:
                continue
            seen = key
            run = runs.get(key)
            if run is None or run.phase == RunPhase.STOPPING:
                continue
            end = run.projected_end_ms(now)
            if end > latest:
                latest = end
        return latest

    def fit_shapes(self: Cell, job: Job) -> tuple[tuple[int, int, float, tuple], ...]:
        """``shapes_of(job)``, each shape with the part of its ``fit_key`` the
        spec fixes: built once per job (its spec never changes), not per test."""
        try:
            fit = job.fit
        except AttributeError:  # a job from a snapshot taken before the cache
            fit = None
        if fit is None:
            spec = job.spec
            fixed = (spec.gpus, spec.gpus_per_node, spec.cpus, spec.mem_gb, spec.gpu_type)
            fit = job.fit = tuple((g, p, e, (g, p, *fixed)) for g, p, e in self.shapes_of(job))
        return fit

    def fit_key(
        self: Cell, fixed: tuple, spec: ev.JobSpec, reserved: tuple, estimate: float = 0.0
    ) -> tuple:
        """Everything ``index.find`` and ``node_filter`` decide by, for a job that
        holds no claim and no reservation: its shape and the spec's demands
        (``fixed``, from ``fit_shapes``), the model when a breaker may bar nodes,
        the nodes reserved for others (``reserved_for_others``), the claims and
        ``index.freed``: equal keys, equal answers (within a pass, where claims
        and the reservation only ever exclude more nodes)."""
        return (
            fixed,
            # a half-open breaker admits probes by tenant and estimate (breakers.py)
            (
                (f"{spec.model}@{spec.model_version}", spec.tenant, estimate <= self._probe_max_s())
                if self.breakers
                else ""
            ),
            reserved,
            len(self.claims),
            self.index.freed,
        )

    def node_filter(
        self: Cell,
        job: Job,
        estimate_s: float,
        holder: bool,
        claim_only: bool,
        reserved: tuple[str, ...] | None = None,
    ) -> Callable[[Node], bool]:
        """``reserved``: ``reserved_for_others`` for the job, when known."""
        spec = job.spec
        model_version = f"{spec.model}@{spec.model_version}"
        breakers = self.breakers
        claimed = self.claimed_nodes(job.job_id)
        own_claim = self.claims.get(job.job_id, ((), 0))[0]
        if reserved is None:
            reserved = self.reserved_for_others(job.job_id, estimate_s, holder)
        per_node_cpu = spec.cpus / max(1, -(-spec.gpus // spec.gpus_per_node))
        per_node_mem = spec.mem_gb / max(1, -(-spec.gpus // spec.gpus_per_node))

        def ok(node: Node) -> bool:
            node_id = node.node_id
            if claim_only and node_id not in own_claim:
                return False
            if node_id in claimed or node_id in reserved:
                return False
            if spec.gpu_type and node.gpu_type != spec.gpu_type:
                return False
            if breakers and self.breaker_bars(job, estimate_s, model_version, node):
                return False
            if node.cpus and node.cpus - node.cpus_used < per_node_cpu:
                return False
            if node.mem_gb and node.mem_gb - node.mem_used < per_node_mem:
                return False
            return True

        return ok

    def commit(
        self: Cell, job: Job, placement: Placement, shape: tuple[int, int, float], why: str
    ) -> bool:
        """Place ``job`` (False, with nothing changed, if the table refuses ``assign``)."""
        if self.refused(job, "assign"):
            return False
        gpus, per_node, estimate = shape
        self.dequeue(job)
        job.run += 1
        job.shape = shape
        job.state = lc.next_state(job.job_id, job.state, "assign")
        if job.first_start_ms < 0:
            job.first_start_ms = self.now_ms
            self.wait_bands.started(job.job_id, self.now_ms)
        charged = self.cost_of(job, gpus, estimate)
        limit_ms = self.now_ms + int(
            (estimate * self.config.overrun_factor + self.config.overrun_grace_s) * 1000
        )
        run = Run(job, job.run, placement.slices, estimate, self.now_ms, limit_ms, charged)
        self.plan_release(run)
        self.runs[run.key] = run
        self.shift_depth(run.tier, run.tenant, runs=1, held=sum(map(len, run.held.values())))
        if self.breakers:  # past a half-open breaker, this run is its probe
            self.note_placement(run)
        self.note_load(placement.slices, job.spec.model, gpus, estimate)  # before mark_warm
        nodes_needed = len(placement.slices)
        for piece in placement.slices:
            node = self.index.nodes[piece.node_id]
            for i in piece.gpus:
                node.owner[i] = run.key
            node.cpus_used += job.spec.cpus / nodes_needed
            node.mem_used += job.spec.mem_gb / nodes_needed
            self.index.mark_warm(node, piece.gpus, job.spec.model)
            self.index.refresh(node)
        org, user = self.use_of(job)
        self.shift_use(job.tenant, job.tier, gpus)
        org.gpus += gpus
        user.gpus += gpus
        org.running += 1
        user.running += 1
        self.tier_use[job.tier] = self.tier_use.get(job.tier, 0) + gpus
        self.fair.charge_start(self.leaf_of(job), charged)
        self.running_end_gpu_s += gpus * (self.now_ms / 1000 + estimate)
        self.running_gpus += gpus
        self.note_run_start(gpus, estimate)
        self.push_limit(run)
        self.assigned_unstarted[run.key] = None
        if job.job_id == self.reservation_job:
            self.clear_reservation()
        self.more_reservations().pop(job.job_id, None)
        self.claims.pop(job.job_id, None)
        reason = f"{why}; {placement.reason}"
        if job.spec.shapes:  # more shapes than the spec's own
            reason += f"; elastic shape {gpus} GPUs x {estimate:.0f}s finishes earliest"
        self.emit(
            ev.JobAssigned,
            job_id=job.job_id,
            run=run.run,
            placement=placement.slices,
            gpus=gpus,
            estimate_s=estimate,
            resume_from=job.checkpoint,
            reason=reason,
        )
        for piece in placement.slices:
            node = self.index.nodes[piece.node_id]
            self.emit(
                ev.StartRun,
                node_id=piece.node_id,
                incarnation=node.incarnation,
                run=run.run,
                spec=job.spec,
                gpus=piece.gpus,
                placement=placement.slices,
                estimate_s=estimate,
                resume_from=job.checkpoint,
            )
        return True

    # -- ending runs ------------------------------------------------------------
    def end_run(self: Cell, run: Run, confirmed: tuple[str, ...], reason: str) -> None:
        """The run is over for the scheduler: release the GPUs of nodes whose
        processes are known gone, and tell the others to stop (their GPUs stay
        held until they confirm)."""
        if run.phase != RunPhase.STOPPING:
            self.settle(run)
            run.phase = lc.next_phase(run.key, run.phase, "stop")
            run.stop_sent_ms = self.now_ms
            self.exiting.pop(run.key, None)
            self.assigned_unstarted.pop(run.key, None)
            self.stopping[run.key] = None
        for node_id in tuple(run.held):
            node = self.index.nodes[node_id]
            if node_id in confirmed or node.state == NodeState.DOWN:
                self.release_slice(run, node_id)
            else:
                self.instruct(ev.StopRun, node, run.job_id, run.run, reason)

    def settle(self: Cell, run: Run) -> None:
        """Correct the fair-share charge to the GPU-time really used, once."""
        if self.breaker_probes:
            self.settle_probe(run)
        used = run.gpus * max(0, self.now_ms - run.started_ms) / 1000
        self.fair.charge_end(self.leaf_of(run), run.charged, used)
        org, user = self.use_of(run)
        org.running -= 1
        user.running -= 1
        self.running_end_gpu_s -= run.gpus * (run.assigned_ms / 1000 + run.estimate_s)
        self.running_gpus -= run.gpus

    def release_slice(self: Cell, run: Run, node_id: str) -> None:
        gpus = run.held.pop(node_id, None)
        if gpus is None:
            return
        self.index.freed += 1  # use given back (even on a node that cannot take work)
        self.unplan_release(run, node_id, len(gpus))
        node = self.index.nodes[node_id]
        for i in gpus:
            if node.owner[i] == run.key:
                node.owner[i] = None
        share = max(1, len(run.placement))
        node.cpus_used = max(0.0, node.cpus_used - run.cpus / share)
        node.mem_used = max(0.0, node.mem_used - run.mem_gb / share)
        self.index.refresh(node)
        org, user = self.use_of(run)
        self.shift_use(run.tenant, run.tier, -len(gpus))
        self.shift_depth(run.tier, run.tenant, held=-len(gpus))
        org.gpus -= len(gpus)
        user.gpus -= len(gpus)
        self.tier_use[run.tier] -= len(gpus)
        if run.phase != RunPhase.STOPPING:
            self.settle(run)
            run.phase = lc.next_phase(run.key, run.phase, "stop")
            self.stopping[run.key] = None
        if not run.held:
            self.stopping.pop(run.key, None)
            self.exiting.pop(run.key, None)
            self.assigned_unstarted.pop(run.key, None)
            self.forget_rate(run)
            del self.runs[run.key]
            self.shift_depth(run.tier, run.tenant, runs=-1)


def _still_idle(signature: tuple, idle: tuple | None) -> bool:
    """Whether a walk with ``signature`` would do what the last, idle one did:
    the same state, and no reservation's slack grown (``walk_signature``)."""
    return (
        idle is not None
        and signature[0] == idle[0]
        and all(now <= then for now, then in zip(signature[1], idle[1]))
    )
