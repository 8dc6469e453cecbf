"""Reservations for blocked gangs, and preemption with claims.

Theory of operation
-------------------
- EASY reservation: one job per cell holds it. Its shadow time is the earliest
  moment its shape fits, found by walking running runs' projected ends
  (estimate, or hard limit once overrun) in time order. The ends are kept in
  a list sorted as runs are placed and release nodes (O(log R) search, O(R)
  memmove), not re-sorted per Tick; the walk is lazy, so a reservation that
  fits early reads only the first few. A run's static end (start + estimate)
  moves when it reports its start (``started_ms`` becomes now): its slices
  are re-filed then (``refile_release``, once per run), so a walk reads the
  slices after now straight off the list. Runs already past their estimate
  are projected ``now + slack`` (or at their hard limit): kept in ``LateSlices``
  in slack order, each added once as time passes its end, so a walk projects
  only the few it reads. A reservation that keeps its nodes (sticky) walks
  only those nodes' slices (``releases_on``), not the cell's list up to its
  last node's end.
- Conservative backfill: up to ``reservations - 1`` further blocked jobs
  (in fair order) hold reservations too, each on nodes no earlier one holds,
  so none delays another. A job may use a reservation's nodes only if it ends
  before that reservation's shadow time. They are placed again at the start
  of every full pass (the first promoted when the reservation is free); each
  costs one lazy walk of the release list, so a full pass does at most
  ``reservations`` walks. Why: with one reservation, a tenant of gangs got
  ~0.82 of its fair share against a tenant of 1-GPU jobs (the cell drained
  for one gang at a time; test_core_fairness.py).
- Preemption: a blocked job of a tier that promises a start
  (``start_within_s``) plans it first (``rescue.py``: wait, graceful
  checkpoint or hard eviction, whichever meets its deadline at least cost).
  Otherwise, a blocked job may preempt when (a) its tier may preempt and it
  has waited past the tier's SLA target (for a promising tier: and its
  deadline passed with no plan), or (b) its organisation or tier is
  under its guaranteed (reserved) GPUs and others borrow them. Victims are
  RUNNING, preemptible, checkpointable runs of strictly less important tiers
  (case a) or of borrowers over their own guarantee (case b), that have run at
  least ``min_run_before_preempt_s`` and were preempted fewer than
  ``max_preemptions_per_job`` times; never anything else. The victims are
  asked to checkpoint; the preemptor holds a claim on their nodes so nobody
  else takes the freed GPUs. At most ``preemptions_per_minute`` victims a minute.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.causes import RunCause
from framespool.schemas.states import GpuState, JobState, RunPhase
from framespool.schemas.waits import WaitCode

from .model import Job, Node, Run, RunKey

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell


class Reservations:
    # -- EASY reservation -------------------------------------------------------
    def reserve(self: Cell, job: Job) -> None:
        # A reservation keeps its nodes while they stay usable: backfill was only
        # allowed around those nodes, so moving it would let backfill delay it.
        sticky: tuple[str, ...] = ()
        if self.reservation_job == job.job_id and all(
            self.index.nodes[n].schedulable for n in self.reservation_nodes
        ):
            sticky = self.reservation_nodes
        best: tuple[int, tuple[str, ...], float] | None = None
        was = job.shape[0]
        for gpus, per_node, estimate in self.shapes_of(job):
            base = self.node_filter(job, estimate, holder=True, claim_only=False)
            ok = (lambda node, base=base: node.node_id in sticky and base(node)) if sticky else base
            if sticky and job.shape != (gpus, per_node, estimate):
                continue
            # a sticky reservation counts only its own nodes' releases
            releases = self.releases_on(sticky) if sticky else self.releases()
            fit = self.index.earliest_fit(min(per_node, gpus), -(-gpus // per_node), releases, ok)
            if fit is None:
                continue
            start_ms, nodes = fit
            finish = max(start_ms, self.now_ms) + estimate * 1000
            if best is None or finish < best[2]:
                best = (max(start_ms, self.now_ms), nodes, finish)
                job.shape = (gpus, per_node, estimate)
        if job.shape[0] != was:  # the queued job is counted at its shape's GPUs
            self.shift_depth(job.tier, job.tenant, queued_gpus=job.shape[0] - was)
        if best is None:
            if sticky:
                self.clear_reservation()
                return self.reserve(job)
            job.reason = "waiting: no healthy nodes can ever fit this shape right now"
            return
        self.more_reservations().pop(job.job_id, None)
        changed = self.reservation_job != job.job_id or self.reservation_nodes != best[1]
        self.reservation_job = job.job_id
        self.reservation_shadow_ms = best[0]
        self.reservation_nodes = best[1]
        if changed:
            wait = (best[0] - self.now_ms) / 1000
            job.reason = (
                f"reservation: holds {len(best[1])} node(s) from "
                f"t+{wait:.0f}s; others backfill around it"
            )
            job.wait_code = WaitCode.RESERVATION_HOLDER
            self.emit(
                ev.JobWaitEstimated,
                job_id=job.job_id,
                wait_estimate_s=round(wait, 3),
                position=1,  # first of those the fair order has not started
                reason=self.holder_words(best[0], len(best[1])),
                reason_code=WaitCode.RESERVATION_HOLDER,
            )

    # -- the release list -------------------------------------------------------
    def release_list(self: Cell) -> list[tuple[int, str, int, RunKey]]:
        """``(static end ms, node, gpus, run)`` per held slice, sorted, each
        filed at its run's current static end (``refile_release`` keeps it so)."""
        ends = self.__dict__.get("_release_ends")
        if ends is None:  # first use (or a cell restored from an older snapshot,
            # whose ``_release_list`` may hold slices filed before their run started)
            self.__dict__.pop("_release_list", None)
            self.__dict__.pop("_release_filed", None)
            ends = []
            filed = {}
            for run in self.runs.values():
                end = run.static_end_ms()
                for node_id, gpus in run.held.items():
                    ends.append((end, node_id, len(gpus), run.key))
                    filed[(run.key, node_id)] = end
            ends.sort()
            self._release_ends = ends
            self._release_ends_filed = filed  # (run, node) -> the end it is filed under
            self.__dict__.pop("_late_slices", None)  # kept of the list it replaces
        return ends

    def plan_release(self: Cell, run: Run) -> None:
        """A run was placed (call before it joins ``self.runs``)."""
        ends = self.release_list()
        filed = self._release_ends_filed
        end = run.static_end_ms()
        late = self.late_slices(ends)
        for node_id, gpus in run.held.items():
            insort(ends, (end, node_id, len(gpus), run.key))
            filed[(run.key, node_id)] = end
            if end <= late.at:
                late.add(run, node_id, len(gpus))

    def unplan_release(self: Cell, run: Run, node_id: str, gpus: int) -> None:
        """The run gave back ``node_id`` (``gpus`` GPUs there; the caller has
        already taken it out of ``run.held``, so a list built by this very call
        does not hold it)."""
        ends = self.release_list()
        late = self.late_slices(ends)  # first use: built while the list still holds the slice
        key = run.key
        end = self._release_ends_filed.pop((key, node_id), None)
        if end is not None:
            del ends[bisect_left(ends, (end, node_id, gpus, key))]
            if end <= late.at:
                late.drop(key, node_id, gpus)

    def refile_release(self: Cell, run: Run) -> None:
        """The run's static end moved (it reported its start, so ``started_ms``
        is now): file its slices again at the new end. O(slices * (log R + R))
        (a bisect and a memmove each), once per run start, so that ``releases``
        reads the list as it stands instead of checking every slice it passes."""
        ends = self.release_list()
        filed = self._release_ends_filed
        late = self.late_slices(ends)
        end = run.static_end_ms()
        key = run.key
        for node_id, gpus in run.held.items():
            old = filed.get((key, node_id))
            if old is None or old == end:
                continue
            del ends[bisect_left(ends, (old, node_id, len(gpus), key))]
            insort(ends, (end, node_id, len(gpus), key))
            filed[(key, node_id)] = end
            if old <= late.at:
                late.drop(key, node_id, len(gpus))
            if end <= late.at:
                late.add(run, node_id, len(gpus))

    def releases(self: Cell) -> Iterator[tuple[int, str, int, RunKey]]:
        """Held slices ``(projected end, node, gpus, run)`` in time order, as
        ``run.projected_end_ms(now)`` would sort them, produced lazily.

        Every slice is filed at its run's static end (``refile_release``), so
        the slices filed after now are read straight off the list (C-speed
        iteration, no per-slice check). The late ones (filed at or before now)
        are kept in ``LateSlices`` (each added once, as time passes its end),
        read in their projected order without projecting them all: a walk
        reads ~30 slices where a pass used to project every late one (a few
        hundred in a backlog) for it. Cost: O(N log L + N * L) to add the N
        slices that became late since the last read (a bisect and a memmove
        each), O(log L + k log k) for the k capped at their limit, and O(1)
        per slice read."""
        ends = self.release_list()
        now = self.now_ms
        late = self.late_slices(ends)
        if now < late.at:  # time went back (a rebuilt cell's first reads): afresh
            del self._late_slices
            late = self.late_slices(ends)
        i = bisect_left(ends, (now + 1,))
        if now > late.at:
            runs = self.runs
            for _, node, gpus, key in islice(ends, bisect_left(ends, (late.at + 1,)), i):
                late.add(runs[key], node, gpus)
            late.at = now
        if not late.by_slack:
            return islice(ends, i, None)
        return _merged(late.ordered(now, self.runs), ends, i)

    def late_slices(self: Cell, ends: list[tuple[int, str, int, RunKey]]) -> LateSlices:
        """The slices filed at or before ``late.at`` (``releases``); built from
        ``ends`` on first use (a new cell, a rebuilt release list, or a cell
        restored from a snapshot taken before they were kept)."""
        late: LateSlices | None = self.__dict__.get("_late_slices")
        if late is None:
            late = self._late_slices = LateSlices(self.now_ms)
            runs = self.runs
            for _, node, gpus, key in islice(ends, 0, bisect_left(ends, (late.at + 1,))):
                late.add(runs[key], node, gpus)
        return late

    def releases_on(self: Cell, node_ids: tuple[str, ...]) -> list[tuple[int, str, int, RunKey]]:
        """``releases()`` of the slices on ``node_ids`` only, in the same order
        (the same tuples, so the same ties), for a walk whose filter admits no
        other node: a sticky reservation's, which otherwise reads the whole list
        up to its last node's end (most of it, each pass). Found through the
        nodes' GPU owners and the filed ends: O(G + S log S) for the G GPUs of
        the nodes and their S slices, not O(R + L log L) for the cell's."""
        self.release_list()  # filed, and built if a restored cell has none yet
        filed = self._release_ends_filed
        nodes, runs, now = self.index.nodes, self.runs, self.now_ms
        out = []
        for node_id in node_ids:
            node = nodes.get(node_id)
            if node is None:
                continue
            for key in dict.fromkeys(node.owner):
                if key is None:
                    continue
                end = filed.get((key, node_id))
                if end is None:
                    continue
                run = runs[key]
                if end <= now:  # late: projected as ``releases`` projects it
                    end = run.projected_end_ms(now)
                out.append((end, node_id, len(run.held[node_id]), key))
        out.sort()
        return out

    def clear_reservation(self: Cell) -> None:
        self.reservation_job = ""
        self.reservation_nodes = ()
        self.reservation_shadow_ms = 0

    # -- further reservations (conservative backfill) ---------------------------
    def more_reservations(self: Cell) -> dict[str, tuple[int, tuple[str, ...]]]:
        """Blocked jobs after the first that hold a reservation:
        ``job -> (shadow ms, nodes)``, in the order they were made."""
        more: dict[str, tuple[int, tuple[str, ...]]] | None = self.__dict__.get(
            "_more_reservations"
        )
        if more is None:  # first use (or a cell restored from an older snapshot)
            more = {}
            self._more_reservations = more
        return more

    def reserve_more(self: Cell, job: Job) -> None:
        """Give ``job`` one of the ``reservations - 1`` further reservations, on
        nodes no earlier reservation holds (so none delays another), at the
        earliest time its shape fits there. Costs one walk of the release list."""
        more = self.more_reservations()
        if (
            job.job_id == self.reservation_job
            or job.job_id in more
            or len(more) + 1 >= self.config.reservations
        ):
            return
        taken = set(self.reservation_nodes)
        for _, nodes in more.values():
            taken.update(nodes)
        best: tuple[int, tuple[str, ...], float] | None = None
        for gpus, per_node, estimate in self.shapes_of(job):
            base = self.node_filter(job, estimate, holder=True, claim_only=False)

            def untaken(node: Node, base: Callable[[Node], bool] = base) -> bool:
                return node.node_id not in taken and base(node)

            fit = self.index.earliest_fit(
                min(per_node, gpus), -(-gpus // per_node), self.releases(), untaken
            )
            if fit is None:
                continue
            start_ms = max(fit[0], self.now_ms)
            finish = start_ms + estimate * 1000
            if best is None or finish < best[2]:
                best = (start_ms, fit[1], finish)
        if best is not None:
            more[job.job_id] = (best[0], best[1])

    def refresh_reservations(self: Cell) -> None:
        """Start of a full pass: drop further reservations whose job left the
        queue, promote the first to the reservation when that is free, and
        place the rest again (in order) on the GPUs as they are now."""
        more = self.more_reservations()
        if not more:
            return
        jobs = [
            self.jobs[j] for j in more if j in self.jobs and self.jobs[j].state == JobState.QUEUED
        ]
        more.clear()
        for job in jobs:
            if not self.reservation_job:
                self.reserve(job)
            else:
                self.reserve_more(job)

    def reserved_for_others(self: Cell, job_id: str, estimate_s: float, holder: bool) -> tuple:
        """Nodes a job of ``estimate_s`` may not use now: those of every
        reservation but its own whose shadow time it would run past."""
        if holder:  # the first reservation goes before all the others
            return ()
        end = self.now_ms + estimate_s * 1000
        reserved: tuple[str, ...] = ()
        # a reservation binds only jobs of its holder's tier or a less
        # important one: interactive work is not held back for batch gangs
        job = self.jobs.get(job_id)
        tier = self.config.tier(job.tier) if job is not None else None
        rank = tier.rank if tier is not None else 0
        if self.reservation_job and end > self.reservation_shadow_ms:
            first = self.jobs.get(self.reservation_job)
            first_tier = self.config.tier(first.tier) if first is not None else None
            if first_tier is None or first_tier.rank <= rank:
                reserved = self.reservation_nodes
        more = self.__dict__.get("_more_reservations")
        if more:
            for other, (shadow_ms, nodes) in more.items():
                if other == job_id or end <= shadow_ms:
                    continue
                holder_job = self.jobs.get(other)
                holder_tier = self.config.tier(holder_job.tier) if holder_job else None
                if holder_tier is None or holder_tier.rank <= rank:
                    reserved += nodes
        return reserved

    # -- claims ---------------------------------------------------------------
    def claimed_nodes(self: Cell, except_job: str) -> dict[str, None]:
        if not self.claims:
            return {}
        nodes: dict[str, None] = {}
        for job_id, (claim_nodes, _) in self.claims.items():
            if job_id != except_job:
                for node_id in claim_nodes:
                    nodes[node_id] = None
        return nodes

    def expire_claims(self: Cell) -> None:
        for job_id in [j for j, (_, until) in self.claims.items() if until <= self.now_ms]:
            del self.claims[job_id]

    # -- preemption -------------------------------------------------------------
    def maybe_preempt(self: Cell, job: Job) -> None:
        if job.job_id in self.claims:
            return
        tier = self.config.tier_of(job.tier)
        promised = getattr(tier, "start_within_s", 0.0)  # a tier pickled before the field
        if tier.may_preempt and promised > 0 and self.rescue(job, tier):
            return  # planned, or waiting for a plan while its promise holds (rescue.py)
        victim_ok = None
        why = ""
        waited_s = (self.now_ms - job.queued_ms) / 1000
        if tier.may_preempt and waited_s >= tier.sla_wait_s:
            why = (
                f"{job.tier} job waited {waited_s:.0f}s past its SLA target {tier.sla_wait_s:.0f}s"
            )
            victim_ok = lambda run: self.config.tier_of(run.tier).rank > tier.rank
        elif self.under_guarantee(job):
            why = f"reclaiming reserved capacity of {job.tenant}/{job.tier}"
            victim_ok = lambda run: self.is_borrower(run, job)
        if victim_ok is None:
            return
        room = self.preemption_room()
        if room <= 0:
            job.reason = "waiting: preemption churn limit reached"
            return
        gpus, per_node, _ = job.shape
        plan = self.plan_victims(min(per_node, gpus), -(-gpus // per_node), victim_ok)
        if plan is None:
            return
        if len(plan[1]) > room:
            job.reason = (
                f"waiting: preemption churn limit reached (needs {len(plan[1])} victims,"
                f" {room} of {self.config.preemptions_per_minute} a minute left)"
            )
            return
        nodes, victims = plan
        self.claim_after_stop(job.job_id, nodes, self.now_ms)
        for run in victims:
            reason = f"preempted by {job.job_id}: {why}"
            if self.request_exit(run, RunCause.PREEMPTED, job.job_id, reason):
                self.preempt_times.append(self.now_ms)
        job.reason = f"preempting {len(victims)} run(s): {why}"

    def preemption_room(self: Cell) -> int:
        """How many more runs may be preempted this minute
        (``CellConfig.preemptions_per_minute``); forgets preemptions older than a
        minute. O(preemptions of the last minute)."""
        window = self.now_ms - 60_000
        self.preempt_times = [t for t in self.preempt_times if t > window]
        return self.config.preemptions_per_minute - len(self.preempt_times)

    def claim_after_stop(self: Cell, job_id: str, nodes: tuple[str, ...], from_ms: int) -> None:
        """``job_id`` claims ``nodes`` until the runs leaving them have had their
        checkpoint grace and stop lease, counted from ``from_ms``."""
        grace_ms = int((self.config.checkpoint_grace_s + self.config.stop_lease_s) * 1000)
        self.claims[job_id] = (nodes, from_ms + grace_ms)

    def defragment(self: Cell) -> None:
        """Move small runs off a node that they would otherwise hold for at
        least ``defrag_after_s`` (``CellConfig.defrag_after_s``), so a
        reservation's holder starts there now: the first holder in
        reservation order of a single-node shape that fits no node now, one
        move per pass. Its own reservation then serves the next blocked job
        at its shadow time, while the node's free GPUs work from now on
        instead of idling behind the small runs (genai: after arrivals stop,
        only whole-node jobs queue and 200-290 GPUs idle on nodes with one
        or two long small runs; the 16 reservations all free within minutes).

        A node qualifies when every run on it is an eligible victim
        (``eligible_victim``: preemptible, checkpointable, run long enough,
        preempted fewer than the limit) of the holder's tier or a less
        important one, on that node alone, projected to hold it that long,
        and each fits now (by GPU count) on another node's free GPUs that no
        claim or reservation holds (counted down as they are promised, so
        the moved runs start again at once on GPUs that idle); the node that
        moves fewest GPUs wins. Its victims are asked to checkpoint
        (``PREEMPTED``: counted against ``preemptions_per_minute`` and each
        job's preemptions) and the holder claims the node, as a preemptor does.

        Cost: O(reservations + G) while no single-node holder is blocked;
        else O(N * G) over the N nodes and G GPUs per node, once per full pass."""
        after_s = getattr(self.config, "defrag_after_s", 0.0)
        if not after_s or not self.reservation_job:
            return
        largest = self.index.largest_free()
        for holder_id, _, _ in self.reservation_list():
            holder = self.jobs.get(holder_id)
            if holder is None or holder.state != JobState.QUEUED or holder_id in self.claims:
                continue
            gpus, per_node, _ = holder.shape
            if gpus <= per_node and gpus > largest:
                break
        else:
            return
        room = self.preemption_room()
        if room <= 0:
            return
        held = self.claimed_nodes("")
        for _, _, nodes in self.reservation_list():
            held.update(dict.fromkeys(nodes))
        # free GPUs that idle now, node by node, outside claims and reservations
        spare = {
            node_id: free
            for node_id, free in self.index.bucket_of.items()
            if node_id not in held and free < gpus
        }
        min_run_ms = int(self.config.min_run_before_preempt_s * 1000)
        rank = self.config.tier_of(holder.tier).rank  # a victim of its tier or a less important one
        until = self.now_ms + int(after_s * 1000)  # a victim that would hold its node this long
        best: tuple[int, str, list[Run]] | None = None
        for node in self.index.nodes.values():
            node_id = node.node_id
            if not node.schedulable or node_id in held:
                continue
            runs = self.runs_on(node)
            usable = sum(1 for i in range(node.total) if node.gpu_state[i] == GpuState.OK)
            if usable < gpus or not runs:
                continue
            moved = sum(len(r.held[node_id]) for r in runs)
            if moved != node.total - node.owner.count(None) or len(runs) > room:
                continue  # a GPU held by no run of the table: not ours to free
            if best is not None and moved >= best[0]:
                continue
            if not all(
                len(r.held) == 1
                and self.config.tier_of(r.tier).rank >= rank
                and self.eligible_victim(r, node, min_run_ms)
                and r.projected_end_ms(self.now_ms) >= until
                for r in runs
            ):
                continue
            left = dict(spare)
            left.pop(node_id, None)
            if all(_take(left, r.gpus) for r in sorted(runs, key=lambda r: -r.gpus)):
                best = (moved, node_id, runs)
        if best is None:
            return
        _, node_id, victims = best
        self.claim_after_stop(holder_id, (node_id,), self.now_ms)
        why = f"moved for {holder_id}, which waits for a whole node"
        for run in victims:
            if self.request_exit(
                run, RunCause.PREEMPTED, holder_id, f"preempted by {holder_id}: {why}"
            ):
                self.preempt_times.append(self.now_ms)
        holder.reason = f"defragmenting: {len(victims)} run(s) move off {node_id}"

    def plan_victims(
        self: Cell, per_node: int, nodes_needed: int, victim_ok
    ) -> tuple[tuple[str, ...], list[Run]] | None:
        min_run_ms = int(self.config.min_run_before_preempt_s * 1000)
        options: list[tuple[int, str, list[Run]]] = []
        for node in self.index.nodes.values():
            if not node.schedulable:
                continue
            free = node.free_count()
            if free >= per_node:
                options.append((0, node.node_id, []))
                continue
            candidates = [
                run
                for run in self.runs_on(node)
                if self.eligible_victim(run, node, min_run_ms) and victim_ok(run)
            ]
            candidates.sort(key=lambda r: (-self.config.tier_of(r.tier).rank, -r.started_ms))
            chosen: list[Run] = []
            for run in candidates:
                if free >= per_node:
                    break
                chosen.append(run)
                free += sum(1 for i in run.held[node.node_id] if node.gpu_state[i] == GpuState.OK)
            if free >= per_node:
                options.append((sum(r.gpus for r in chosen), node.node_id, chosen))
        if len(options) < nodes_needed:
            return None
        options.sort(key=lambda o: (o[0], o[1]))
        picked = options[:nodes_needed]
        if all(cost == 0 for cost, _, _ in picked):
            return None  # it fits without preemption; placement will find it
        victims: dict = {}
        for _, _, runs in picked:
            for run in runs:
                victims[run.key] = run
        return tuple(node_id for _, node_id, _ in picked), list(victims.values())

    def eligible_victim(self: Cell, run: Run, node: Node, min_run_ms: int) -> bool:
        job = self.jobs.get(run.job_id)
        return (
            run.phase == RunPhase.RUNNING
            and run.preemptible
            and run.checkpointable
            and self.now_ms - run.started_ms >= min_run_ms
            and job is not None
            and job.run == run.run
            and job.preemptions < self.config.max_preemptions_per_job
        )

    def under_guarantee(self: Cell, job: Job) -> bool:
        tenant = self.config.tenant(job.tenant)
        org, _ = self.use_of(job)
        if tenant.reserved_gpus and org.gpus + job.shape[0] <= tenant.reserved_gpus:
            return True
        tier = self.config.tier_of(job.tier)
        return bool(
            tier.reserved_gpus
            and self.tier_use.get(job.tier, 0) + job.shape[0] <= tier.reserved_gpus
        )

    def is_borrower(self: Cell, run: Run, claimant: Job) -> bool:
        """A run that uses GPUs beyond its own organisation's and tier's guarantee."""
        if run.tenant == claimant.tenant and run.tier == claimant.tier:
            return False
        org, _ = self.use_of(run)
        return (
            org.gpus > self.config.tenant(run.tenant).reserved_gpus
            and self.tier_use.get(run.tier, 0) > self.config.tier_of(run.tier).reserved_gpus
        )

    def guarantees_allow(self: Cell, job: Job, gpus: int) -> bool:
        """Non-preemptible work may not borrow other entities' idle guarantees:
        it could never be reclaimed. O(1): the unused total is kept as use changes."""
        config = self.config
        if not config.reserved_tenant_gpus and not config.reserved_tier_gpus:
            return self.index.free_total >= gpus  # no guarantee anywhere: none unused
        unused = self.unused_guarantees()
        amounts = config.reserved_tenant_gpus.get(job.tenant)
        if amounts:
            org = self.org_use.get(job.tenant)
            unused -= _unused(amounts, org.gpus if org else 0)
        amounts = config.reserved_tier_gpus.get(job.tier)
        if amounts:
            unused -= _unused(amounts, self.tier_use.get(job.tier, 0))
        return self.index.free_total - unused >= gpus

    def unused_guarantees(self: Cell) -> int:
        """GPUs guaranteed to organisations and tiers that they do not use now."""
        total = self.__dict__.get("_unused_guarantees")
        if total is None:  # first use (or a cell restored from an older snapshot)
            total = 0
            for name, amounts in self.config.reserved_tenant_gpus.items():
                org = self.org_use.get(name)
                total += _unused(amounts, org.gpus if org else 0)
            for name, amounts in self.config.reserved_tier_gpus.items():
                total += _unused(amounts, self.tier_use.get(name, 0))
            self._unused_guarantees = total
        return total

    def shift_use(self: Cell, tenant: str, tier: str, delta: int) -> None:
        """``tenant``/``tier`` are about to take (delta > 0) or give back GPUs:
        keep the unused-guarantee total in step. Call before changing the use."""
        config = self.config
        amounts = config.reserved_tenant_gpus.get(tenant)
        tier_amounts = config.reserved_tier_gpus.get(tier)
        if not amounts and not tier_amounts:
            return
        total = self.unused_guarantees()
        if amounts:
            org = self.org_use.get(tenant)
            used = org.gpus if org else 0
            total += _unused(amounts, used + delta) - _unused(amounts, used)
        if tier_amounts:
            used = self.tier_use.get(tier, 0)
            total += _unused(tier_amounts, used + delta) - _unused(tier_amounts, used)
        self._unused_guarantees = total


def _merged(
    late: Iterator[tuple[int, str, int, RunKey]], ends: list[tuple[int, str, int, RunKey]], i: int
) -> Iterator[tuple[int, str, int, RunKey]]:
    """The late slices merged into ``ends[i:]``, both sorted; a late one first on a tie."""
    head = next(late, None)
    for entry in islice(ends, i, None):
        while head is not None and head <= entry:
            yield head
            head = next(late, None)
        yield entry
    if head is not None:
        yield head
        yield from late


class LateSlices:
    """The held slices filed at or before ``at`` (their runs past their
    estimate by then), in the order ``Run.projected_end_ms`` gives them at any
    later now: a late slice is projected ``now + slack`` (slack = 10 % of its
    estimate, at least 1 s), so their order by slack is their order at every
    now, except the few capped at their run's hard limit (``limit - slack <=
    now``), found by a bisect of ``by_cap`` and put in place.

    ``by_slack``: ``(slack, node, gpus, run)`` sorted; ``by_cap``: ``(limit -
    slack, node, gpus, run)`` sorted; ``filed``: ``(run, node) -> (slack, limit -
    slack)``, what each is filed under.
    add/drop: O(log L) search plus O(L) memmove."""

    __slots__ = ("at", "by_slack", "by_cap", "filed")

    def __init__(self, at: int) -> None:
        self.at = at
        self.by_slack: list[tuple[int, str, int, RunKey]] = []
        self.by_cap: list[tuple[int, str, int, RunKey]] = []
        self.filed: dict[tuple[RunKey, str], tuple[int, int]] = {}

    def __getstate__(self) -> tuple:
        return (self.at, self.by_slack, self.by_cap, self.filed)

    def __setstate__(self, state: tuple) -> None:
        self.at, self.by_slack, self.by_cap, self.filed = state

    def add(self, run: Run, node: str, gpus: int) -> None:
        slack = run.late_slack_ms()
        cap = run.limit_ms - slack
        key = run.key
        self.filed[(key, node)] = (slack, cap)
        insort(self.by_slack, (slack, node, gpus, key))
        insort(self.by_cap, (cap, node, gpus, key))

    def drop(self, key: RunKey, node: str, gpus: int) -> None:
        slack, cap = self.filed.pop((key, node))
        del self.by_slack[bisect_left(self.by_slack, (slack, node, gpus, key))]
        del self.by_cap[bisect_left(self.by_cap, (cap, node, gpus, key))]

    def ordered(self, now: int, runs: dict) -> Iterator[tuple[int, str, int, RunKey]]:
        """Every slice ``(projected end at now, node, gpus, run)`` in order, lazily."""
        cut = bisect_left(self.by_cap, (now + 1,))
        if not cut:
            return ((now + slack, node, gpus, key) for slack, node, gpus, key in self.by_slack)
        soon = now + 1
        capped = sorted(
            (max(soon, runs[key].limit_ms), node, gpus, key)
            for _, node, gpus, key in islice(self.by_cap, cut)
        )
        skip = {(key, node) for _, node, _, key in capped}
        rest = (
            (now + slack, node, gpus, key)
            for slack, node, gpus, key in self.by_slack
            if (key, node) not in skip
        )
        return heapq.merge(capped, rest)


def _take(spare: dict[str, int], gpus: int) -> bool:
    """Promise ``gpus`` GPUs of one node in ``spare`` (the fullest that fits,
    then node order), counting them down; False when none has that many."""
    fits = [(free, node_id) for node_id, free in spare.items() if free >= gpus]
    if not fits:
        return False
    free, node_id = min(fits)
    spare[node_id] = free - gpus
    return True


def _unused(amounts: tuple[int, ...], used: int) -> int:
    return sum(max(0, r - used) for r in amounts)
