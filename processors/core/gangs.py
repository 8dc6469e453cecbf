"""Gangs: a run on several nodes lives and dies as one.

Theory of operation
-------------------
A multi-node run carries a :class:`~.model.Gang` (its members in rank order).
Allocation was already all-or-nothing; these handlers keep the rest atomic:

1. **Start barrier.** Each member's ``StartRun`` only makes its agent take the
   GPUs and prepare. A member is ready when it reports ``RunStarted`` or a
   heartbeat lists the run. The run stays ``ASSIGNED`` (the job too) until
   every member is ready; then it turns ``RUNNING`` and every member gets
   ``BeginRun``, the "go" before which no agent starts its generator. A member
   that is not ready within the start lease fails the attempt as a whole
   (``lease_expired``, the start lease of ``nodes.expire_runs``).
2. **Liveness per member.** Each member's last sign of the run (a report or a
   heartbeat listing it) is kept apart; one member silent past the report
   lease ends the whole gang on the next ``Tick`` (``member_lost``), however
   busily the others report. Its GPUs everywhere are stopped and the job is
   requeued from its last common checkpoint.
3. **Per-rank checkpoints.** Every rank reports ``RunCheckpointed`` with its
   ``step``. The job's checkpoint is the latest step that every rank of the
   run checkpointed (rank 0's URI names it; each rank resumes from its own
   file of that step). Reports without a step (older agents) keep the
   run-wide rule: the newest checkpoint reported wins.

A run on one node has no Gang and none of this applies: its decisions, and so
the log of a cell without gangs, are what they were.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.causes import RunCause
from framespool.schemas.states import RunPhase

from . import lifecycle as lc
from .model import Job, Run

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

# Steps a member may be ahead of the others with; older uncommon ones are forgotten.
MAX_PENDING_STEPS = 64


class GangHandlers:
    def member_seen(self: Cell, run: Run, node_id: str) -> None:
        if run.gang is not None and node_id in run.gang.seen:
            run.gang.seen[node_id] = self.now_ms

    def member_ready(self: Cell, run: Run, node_id: str, job: Job | None) -> None:
        """``node_id`` holds its GPUs for ``run``; the last one to do so opens the
        barrier. ``job`` is the run's job if the run is its current attempt and
        the table allows ``start`` (the caller asked)."""
        gang = run.gang
        assert gang is not None
        self.member_seen(run, node_id)
        if run.phase != RunPhase.ASSIGNED or node_id not in gang.seen:
            return  # the barrier is behind it (a repeated report), or not a member
        gang.ready[node_id] = None
        if len(gang.ready) < len(gang.members):
            return
        if job is not None:
            job.state = lc.next_state(job.job_id, job.state, "start")
        run.last_report_ms = self.now_ms
        self.run_started(run)
        self.gang_runs[run.key] = None
        floor = self.__dict__.get("_gang_seen_floor")
        if floor is not None:  # keep it a lower bound of every running gang's reports
            self._gang_seen_floor = min(floor, *gang.seen.values())
        for node_id in gang.members:
            self.instruct(
                ev.BeginRun,
                self.index.nodes[node_id],
                run.job_id,
                run.run,
                f"start barrier passed: all {len(gang.members)} members hold their GPUs",
            )

    def expire_gang_members(self: Cell) -> None:
        """End every running gang one of whose members has been silent past the
        report lease (on Tick, so the decision is the log's, not a timer's).

        Cost: O(1) while ``_gang_seen_floor`` (a lower bound of every running
        gang member's last report: reports only move forward, and a gang that
        passes its barrier lowers it) is within the lease, which, with members
        reporting every heartbeat, is most Ticks; otherwise O(G * members) for G
        running gangs, one C-level ``min`` over the members' last reports each,
        and the bound taken afresh. Only a gang with a member silent that long
        (rare) is looked at member by member. (Entries of gangs that ended are
        dropped by the next full look, not at once: nothing else reads them.)"""
        if not self.gang_runs:
            return
        lease_ms = int(self.config.report_lease_s * 1000)
        oldest_ok = self.now_ms - lease_ms  # a member last seen before this is silent
        floor = self.__dict__.get("_gang_seen_floor")
        if floor is not None and floor >= oldest_ok:
            return  # every member of every running gang reported since oldest_ok
        floor = None
        for key in list(self.gang_runs):
            run = self.runs.get(key)
            if run is None or run.gang is None or run.phase == RunPhase.STOPPING:
                del self.gang_runs[key]
                continue
            gang = run.gang
            low = min(gang.seen.values())
            if low >= oldest_ok:
                floor = low if floor is None or low < floor else floor
                continue  # no member silent at all, held or not
            silent = [
                n for n in gang.members if n in run.held and self.now_ms - gang.seen[n] > lease_ms
            ]
            if not silent:
                floor = low if floor is None or low < floor else floor
                continue
            del self.gang_runs[key]
            node_id = silent[0]
            self.on_node_lost_run(
                run,
                f"gang member {node_id} (rank {gang.rank(node_id)} of {len(gang.members)}) "
                f"unreported for {(self.now_ms - gang.seen[node_id]) / 1000:.0f}s "
                f"(lease {self.config.report_lease_s:.0f}s): the whole gang is requeued",
                RunCause.MEMBER_LOST,
            )
        self._gang_seen_floor = floor

    def rank_checkpointed(self: Cell, run: Run, job: Job, event: ev.RunCheckpointed) -> bool:
        """Record one rank's checkpoint of ``event.step``; True if that step is now
        one every rank wrote (the job's checkpoint moved to it)."""
        gang = run.gang
        assert gang is not None
        steps = gang.steps.get(event.node_id)
        if steps is None:
            return False
        self.member_seen(run, event.node_id)
        if event.step <= gang.common_step:
            return False  # re-delivered, or older than what every rank already has
        steps[event.step] = (event.checkpoint_uri, event.progress)
        if any(event.step not in gang.steps[m] for m in gang.members):
            if len(steps) > MAX_PENDING_STEPS:
                del steps[min(steps)]
            return False
        gang.common_step = event.step
        uri, _ = gang.steps[gang.members[0]][event.step]
        progress = min(gang.steps[m][event.step][1] for m in gang.members)
        for m in gang.members:
            member_steps = gang.steps[m]
            for step in [s for s in member_steps if s < event.step]:
                del member_steps[step]
        if progress >= job.checkpoint_progress:
            job.checkpoint = uri
            job.checkpoint_progress = progress
        return True
