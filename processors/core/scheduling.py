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

The pass is four mixins of the Cell, one concern each:

- ``scheduling`` (here): the pass, its walk in fair order, the candidates a
  walk takes from a leaf, caps, and the scan for preemptors in a full cell;
- ``walkproofs``: when the rest of a walk can change nothing (bounds over
  the queue, then a proof per class of queued job), and what a walk
  remembers between its candidates (``PassMemo``);
- ``starts``: placing one job: the shape that finishes earliest, on nodes it
  may use;
- ``allocations``: a run's GPUs taken (``commit``) and given back
  (``end_run``, ``settle``, ``release_slice``).

Reservations and preemption are ``reservation.py``'s, a promised start
``rescue.py``'s.

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
  does not search for them again (``PassMemo``, ``walkproofs.py``). A pass
  tests at most ``backfill_depth`` candidates after a block, so a Tick is
  O(depth * (log n + F)) however long the backlog;
- and it stops as soon as no candidate left can start, reserve or preempt:
  on bounds kept per enqueue/dequeue (``nothing_fits``), then on a proof per
  class of queued job (``every_class_blocked``), whose failure still fails
  later candidates of blocked classes on a lookup and lets the walk take the
  candidates before the first that may start at once (``blocked_prefix``);
  ``walkproofs.py`` states those costs and what they were measured to save;
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

from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING, cast

from framespool.schemas.states import JobState

from .fairshare import Flow, leaf_jobs
from .model import Job
from .walkproofs import QUIET_BEFORE_PROOF, PassMemo

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

QUICK_PASS_TESTS = 32


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


def _still_idle(signature: tuple, idle: tuple | None) -> bool:
    """Whether a walk with ``signature`` would do what the last, idle one did:
    the same state, and no reservation's slack grown (``walk_signature``)."""
    return (
        idle is not None
        and signature[0] == idle[0]
        and all(now <= then for now, then in zip(signature[1], idle[1]))
    )
