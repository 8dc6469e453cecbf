"""Starting promised work in time at a bounded cost: wait, checkpoint or evict.

Theory of operation
-------------------
A tier with ``start_within_s`` (interactive: 10 s) promises its jobs a start
within that long of their admission. A job of such a tier that does not fit
plans, on every pass from its first, how the GPUs it needs will be free by
its deadline (admission + ``start_within_s``, less ``RESCUE_MARGIN_S`` for the
round trip of the stop and the next pass), node by node, from what each run
holding GPUs there will do:

1. end by itself: its projected end comes before the deadline, or it is
   already leaving (asked to checkpoint: at its next checkpoint or its exit
   deadline; stopping: now). Free, nothing to do;
2. a graceful exit: a victim (``eligible_victim``: RUNNING, preemptible,
   checkpointable, of a less important tier, run long enough, preempted
   fewer than ``max_preemptions_per_job`` times) whose next checkpoint (its
   last one, ``Run.saved_ms``, plus its interval) comes before the deadline
   is asked to checkpoint now and leaves at that checkpoint: nothing lost;
3. a hard eviction: a victim whose last checkpoint is at most
   ``evict_max_lost_s`` old is stopped now without a checkpoint and resumes
   from that one; it loses its GPUs times the time since.

Per node the plan takes the runs it needs in that order (free, then
graceful by time, then hard by loss); of the nodes it takes the
``nodes_needed`` that lose least, then need fewest exits, then free
earliest. A plan whose nodes all free by themselves does nothing: the job
waits and the walk starts it when they do (the tier outranks everything in
the fair order as it returns from idle). Otherwise the victims are asked or
stopped, each counted against ``preemptions_per_minute``, and the job claims
the nodes (``claims``) so nothing else takes them. No plan meets the
deadline: the job waits up to its tier's ``sla_wait_s`` (a checkpoint comes
near, a run ends, a victim checkpoints and becomes cheap to stop), then takes
the plan that frees soonest whenever that is (graceful exits at any next
checkpoint, hard evictions still within ``evict_max_lost_s``); with none,
``maybe_preempt`` goes on as for a tier without the promise. Non-preemptible
runs are never victims, here or there.

Cost, per planning job per pass (only jobs of a promising tier that do not
fit, a few at a time): where its nodes free by themselves in time (the job
waits: most passes), the nodes whose runs end soonest, read off the cell's
sorted run ends until no other node could free sooner (``waiting_plans``);
otherwise O(nodes + runs), every schedulable node planned (``node_plan``).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable
from typing import TYPE_CHECKING

from framespool.schemas.causes import RunCause
from framespool.schemas.states import GpuState, RunPhase

from . import lifecycle as lc
from .model import Job, Node, Run

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell
    from .config import TierConfig

# Between a victim's exit and the job's start: the stop's confirmation and the
# next pass (a Tick: 1 s in production)
RESCUE_MARGIN_S = 1.5
LATE_MS = 1 << 62  # a deadline no run outlasts

FREE, GRACEFUL, HARD = 0, 1, 2
ACTIONS = ("free", "graceful checkpoint", "hard eviction")


class NodePlan:
    """How one node frees ``per_node`` GPUs: by ``ready_ms``, losing ``lost``
    GPU-seconds, with ``graceful`` runs asked to checkpoint and ``hard`` ones stopped."""

    __slots__ = ("node_id", "lost", "ready_ms", "graceful", "hard")

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.lost = 0.0
        self.ready_ms = 0
        self.graceful: list[Run] = []
        self.hard: list[Run] = []

    def rank(self) -> tuple[float, int, int, str]:
        return (self.lost, len(self.graceful) + len(self.hard), self.ready_ms, self.node_id)

    def soonest(self) -> tuple[int, float, int, str]:
        return (self.ready_ms, self.lost, len(self.graceful) + len(self.hard), self.node_id)


class Rescue:
    def rescue(self: Cell, job: Job, tier: TierConfig) -> bool:
        """Plan the start of a promising tier's job (module doc); True when it
        is handled (a plan acted on, or the job waits for one while its
        deadline is ahead), False once the deadline has passed with no plan."""
        deadline_ms = job.queued_ms + int((tier.start_within_s - RESCUE_MARGIN_S) * 1000)
        gpus, per_node, _ = job.shape
        need = (min(per_node, gpus), -(-gpus // per_node))
        plan = self.rescue_plan(job, tier, *need, deadline_ms)
        if plan is None:
            if self.now_ms - job.queued_ms < tier.sla_wait_s * 1000:
                job.reason = "waiting: no plan starts it in time yet"
                return True
            # late: the plan that frees soonest, whenever that is
            plan = self.rescue_plan(job, tier, *need, LATE_MS, late=True)
            if plan is None:
                return False
        victims = {r.key: r for p in plan for r in (*p.graceful, *p.hard)}
        if not victims:
            job.reason = "waiting: GPUs free by themselves in time"
            return True
        room = self.preemption_room()
        if len(victims) > room:
            job.reason = (
                f"waiting: preemption churn limit reached (needs {len(victims)} victims,"
                f" {room} of {self.config.preemptions_per_minute} a minute left)"
            )
            return self.now_ms < deadline_ms
        ready_ms = max(p.ready_ms for p in plan)
        self.claim_after_stop(
            job.job_id, tuple(p.node_id for p in plan), max(self.now_ms, ready_ms)
        )
        promise = f"{job.tier} job must start within {tier.start_within_s:.0f}s"
        hard = {r.key for p in plan for r in p.hard}
        for key, run in victims.items():
            if key in hard:
                lost_s = (self.now_ms - run.saved_ms) / 1000
                why = f"evicted by {job.job_id}: {promise}; {lost_s:.0f}s since its last checkpoint"
                done = self.evict(run, job.job_id, why)
            else:
                due_s = max(0, self.next_checkpoint_ms(run) - self.now_ms) / 1000
                why = f"preempted by {job.job_id}: {promise}; its checkpoint is due in {due_s:.0f}s"
                done = self.request_exit(run, RunCause.PREEMPTED, job.job_id, why)
            if done:
                self.preempt_times.append(self.now_ms)
        lost = sum(p.lost for p in plan)
        job.reason = (
            f"rescuing: {len(victims) - len(hard)} graceful, {len(hard)} evicted "
            f"({lost:.0f} GPU-s lost), ready in {max(0, ready_ms - self.now_ms) / 1000:.0f}s"
        )
        return True

    def rescue_plan(
        self: Cell,
        job: Job,
        tier: TierConfig,
        per_node: int,
        nodes_needed: int,
        deadline_ms: int,
        late: bool = False,
    ) -> list[NodePlan] | None:
        """The cheapest ``nodes_needed`` node plans ready by ``deadline_ms``
        (module doc), or with ``late`` the soonest ready; None when fewer
        nodes can be.

        Cost: without ``late``, first ``waiting_plans``: when ``nodes_needed``
        nodes free by themselves in time (the usual case: the job then waits),
        it reads only the nodes whose runs end soonest. Otherwise (victims
        are needed, no plan exists, or ``late``) every schedulable node is
        planned: O(nodes + runs) (``node_plan``)."""
        ok = self.node_filter(job, job.shape[2], holder=False, claim_only=False)
        if not late:
            waiting = self.waiting_plans(ok, per_node, tier.rank, nodes_needed, deadline_ms)
            if waiting is not None:
                return waiting
        plans = []
        for node in self.index.nodes.values():
            if node.schedulable and ok(node):
                plan = self.node_plan(node, per_node, tier.rank, deadline_ms, late)
                if plan is not None:
                    plans.append(plan)
        if len(plans) < nodes_needed:
            return None
        plans.sort(key=NodePlan.soonest if late else NodePlan.rank)
        return plans[:nodes_needed]

    def waiting_plans(
        self: Cell,
        ok: Callable[[Node], bool],
        per_node: int,
        rank: int,
        nodes_needed: int,
        deadline_ms: int,
    ) -> list[NodePlan] | None:
        """``rescue_plan``'s answer (without ``late``) when it needs no victim,
        read off the runs' ends instead of planning every node; None when
        fewer than ``nodes_needed`` nodes free by themselves by the deadline
        (the answer then needs victims or does not exist: the caller plans
        every node).

        A plan without victims ranks (0 lost, 0 exits, ready, node) and so
        before every plan with one; its ready time is that of one of its
        node's runs that end by themselves, at least the earliest of them.
        So the nodes are planned (``node_plan``, the very plans the plain
        search makes) in the order of a lower bound on that ready time:

        1. nodes with ``per_node`` free GPUs (ready now), off the free-count
           buckets;
        2. nodes holding a run that is stopping or exiting (its end is not
           its projected end);
        3. the rest as their runs' projected ends come (``releases``, in time
           order, each node once), until an end passes the deadline or the
           ``nodes_needed``-th best plan without victims is ready before it:
           no node not yet read can then free earlier.

        Cost: O(G + S + P * (GPUs + runs on a node)) for the G free-count
        buckets, the S release slices read and the P nodes planned: on the
        bench core backlog stream (2,000 nodes) 523 nodes planned for 169
        calls where every call planned all 2,000 before (docs/measuring.md)."""
        nodes, runs = self.index.nodes, self.runs
        planned: set[str] = set()
        best: list[tuple[int, str, NodePlan]] = []  # (ready, node, plan), best first

        def plan(node_id: str) -> None:
            if node_id in planned:
                return
            planned.add(node_id)
            node = nodes.get(node_id)
            if node is None or not node.schedulable or not ok(node):
                return
            found = self.node_plan(node, per_node, rank, deadline_ms)
            if found is not None and not found.graceful and not found.hard:
                insort(best, (found.ready_ms, node_id, found))
                del best[nodes_needed:]

        buckets = self.index.buckets
        for free in range(per_node, self.index.max_gpus + 1):
            for node_id in tuple(buckets.get(free, ())):
                plan(node_id)
        evicting: dict = self.__dict__.get("_evicting") or {}
        for keys in (self.stopping, self.exiting, evicting):
            for key in tuple(keys):
                run = runs.get(key)
                if run is not None:
                    for node_id in tuple(run.held):
                        plan(node_id)
        for end_ms, node_id, _, _ in self.releases():
            if end_ms > deadline_ms or (len(best) == nodes_needed and best[-1][0] < end_ms):
                break
            plan(node_id)
        if len(best) < nodes_needed:
            return None
        return [found for _, _, found in best]

    def node_plan(
        self: Cell, node: Node, per_node: int, rank: int, deadline_ms: int, late: bool = False
    ) -> NodePlan | None:
        """How ``node`` frees ``per_node`` GPUs by ``deadline_ms`` at least
        cost (``late``: soonest), or None.

        Cost: O(GPUs + runs on the node), and per run O(1): without ``late`` a
        run that ends by the deadline is waited for and the victim checks
        (``eligible_victim``, its tier, its next checkpoint) are not made for
        it, and the GPUs a run holds are counted only for a run with a way.
        A ``rescue_plan`` that needs victims (or ``late``) asks every
        schedulable node, so this is its whole cost then: on the bench core
        backlog stream (2,000 nodes) 22 % of the replay's profile before
        these shortcuts and before ``waiting_plans``. The plain version (every way
        built, then filtered) is the oracle of
        ``tests/unit/test_core_rescue.py``."""
        now = self.now_ms
        free = node.free_count()
        plan = NodePlan(node.node_id)
        if free >= per_node:
            plan.ready_ms = now
            return plan
        min_run_ms = int(self.config.min_run_before_preempt_s * 1000)
        max_lost_ms = int(getattr(self.config, "evict_max_lost_s", 0.0) * 1000)
        order = (lambda o: (o[2], o[0], o[1], o[3])) if late else (lambda o: o[:4])
        options: list[tuple[int, float, int, str, int, Run]] = []
        node_id, gpu_state = node.node_id, node.gpu_state
        for run in self.runs_on(node):
            # the run's cheapest way by ``order`` among those ready by the
            # deadline: (action, GPU-s lost, ready ms), in the order FREE,
            # GRACEFUL, HARD, the first of equal ones kept (as ``min`` does).
            # Without ``late`` the action leads the order, so a usable FREE
            # way is the run's and the victim checks are not made for it
            best: tuple[int, float, int] | None = None
            if run.phase == RunPhase.STOPPING:
                if now <= deadline_ms:
                    best = (FREE, 0.0, now)
            elif run.phase == RunPhase.EXITING:
                ready = min(run.exit_deadline_ms, self.next_checkpoint_ms(run))
                if ready <= deadline_ms:
                    best = (FREE, 0.0, ready)
            else:
                ready = run.projected_end_ms(now)
                if ready <= deadline_ms:
                    best = (FREE, 0.0, ready)
                if (late or best is None) and (
                    self.eligible_victim(run, node, min_run_ms)
                    and self.config.tier_of(run.tier).rank > rank
                ):
                    ways = [(GRACEFUL, 0.0, self.next_checkpoint_ms(run))]
                    if now - run.saved_ms <= max_lost_ms:
                        ways.append((HARD, run.gpus * (now - run.saved_ms) / 1000, now))
                    for way in ways:
                        if way[2] <= deadline_ms and (
                            best is None or order((*way, run.job_id)) < order((*best, run.job_id))
                        ):
                            best = way
            if best is not None:
                held = sum(1 for i in run.held[node_id] if gpu_state[i] == GpuState.OK)
                options.append((*best, run.job_id, held, run))
        options.sort(key=order)
        for action, lost, ready, _, held, run in options:
            if free >= per_node:
                break
            free += held
            plan.ready_ms = max(plan.ready_ms, ready)
            if action == GRACEFUL:
                plan.graceful.append(run)
            elif action == HARD:
                plan.hard.append(run)
                plan.lost += lost
        return plan if free >= per_node else None

    def next_checkpoint_ms(self: Cell, run: Run) -> int:
        """When the run is next expected to checkpoint: its last save plus its
        job's interval, a whole interval on from now once that has passed
        without one (the generator's phase is then unknown)."""
        job = self.jobs.get(run.job_id)
        interval = int(job.spec.checkpoint_interval_s * 1000) if job is not None else 0
        if interval <= 0:
            return run.exit_deadline_ms if run.phase == RunPhase.EXITING else self.now_ms + 10**12
        due = run.saved_ms + interval
        if due <= self.now_ms:
            due += ((self.now_ms - due) // interval + 1) * interval
        return due

    def evict(self: Cell, run: Run, by_job: str, reason: str) -> bool:
        """Stop ``run`` without a checkpoint for ``by_job`` (a hard eviction):
        its job is requeued to resume from its last checkpoint, with a
        ``JobPreempted`` that says why; False, with nothing changed, if the
        table refuses the requeue. The run leaves now (EXITING, its exit
        deadline now, so no other plan takes it again); the stop and the
        requeue are made when the pass ends (``flush_evictions``): a walk's
        queues and charges stay as it read them."""
        job = self.jobs[run.job_id]
        if self.refused(job, "requeue"):
            return False
        run.phase = lc.next_phase(run.key, run.phase, "exit")
        run.exit_intent = RunCause.PREEMPTED
        run.exit_by = by_job
        run.exit_deadline_ms = self.now_ms
        job.reason = reason
        evicting: dict = self.__dict__.setdefault("_evicting", {})
        evicting[run.key] = None
        return True

    def flush_evictions(self: Cell) -> None:
        """Stop and requeue the runs evicted during the pass (``evict``)."""
        evicting: dict | None = self.__dict__.get("_evicting")
        while evicting:
            key = next(iter(evicting))
            del evicting[key]
            run = self.runs.get(key)
            if run is not None and run.phase == RunPhase.EXITING:
                self.finish_exit(run)
