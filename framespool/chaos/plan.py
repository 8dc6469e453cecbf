"""``framespool chaos``: a seeded workload on the embedded stack while faults are injected.

Theory of operation
-------------------
Everything random is drawn up front from the seed, as data:

1. :func:`build_workload` plans the jobs (arrival time, tenant, GPU shape,
   length, checkpoint interval, preemptible or not). A few jobs are made to
   fail on purpose through their ``params``: ``fail_at_step`` (the generator
   crashes every time: the job must end FAILED once its ``generator_error``
   budget is spent) and ``hang_at_step`` (it hangs every time: ``hung``).
   Each crashing job gets its own ``model_version`` so that its failures trip
   no breaker for anyone else's work.
2. :func:`build_schedule` plans the faults, a tuple of :class:`Fault`, and
   :func:`actions_of` expands them into timed :class:`Action` steps (a pause
   is SIGSTOP, SIGCONT and a restart; a ``down_agent`` is SIGSTOP past the
   heartbeat lease, SIGCONT and a ``heal_check``, never a restart: the agent
   must re-register by itself). Node faults go to distinct nodes, at most
   ``MAX_IMPAIRED_NODES`` nodes are impaired at once, and a cell keeps two
   whole nodes so its 16-GPU gangs stay placeable. Scheduler faults (an
   instance killed, or paused past its session timeout and resumed: a zombie)
   hit one instance at a time, so another takes its cells over. With several
   cells, one ``empty_cell`` fault kills every agent of one cell and their
   generators for longer than the heartbeat lease plus the drain grace (and a
   takeover's pause), then restarts them: its queued jobs (those waiting, and
   the runs it lost) must be rerouted to the other cells (``JobRerouted``) and
   complete there. No other node fault of that cell overlaps it; no scheduler
   fault is under way when it starts, and the drill aims one that starts
   during it at an instance that does not own that cell. On a durable broker,
   ``kill_broker`` SIGKILLs the broker itself and restarts it on the same log
   after a second or three (every client must ride it out: nothing
   acknowledged may be lost); it never overlaps a scheduler fault or an
   emptied cell, so each fault's consequence stays its own.

The driver (:class:`framespool.chaos.drill.ChaosRun`, the imperative shell) starts a
:class:`~framespool.stack.Stack`,
submits the jobs through the HTTP API at their times, carries out the actions
at theirs, and restarts (as an operator would) an agent whose node went DOWN,
DEGRADED or DRAINING without a fault of ours. It stops when every submitted
job has a terminal event and every action has run (or at the timeout), waits
for the GPUs to be released and the malformed records to be dead-lettered,
then reads ``job-events``, the scheduler topic (every cell's partition) and
``dead-letter`` from offset 0 and computes the report with pure functions
(:func:`framespool.chaos.accounting.account`; takeovers and self-healing in
:mod:`framespool.chaos.takeover`).

Chaos checks no log invariant itself: duplicate terminal events, double-booked
GPUs (scheduler view and node view) and GPUs still held at the end are what
:func:`framespool.processors.tools.verify.verify` found in the same log
(:func:`framespool.chaos.accounting.invariants`; docs/design.md#tools-that-reuse-the-core), so a drill and
``framespool verify`` can never disagree about what a run, a run's end or a
leak is. What is chaos's own is the fault plan's accounting: what it injected,
which submitted jobs never got a terminal event (lost), and the GPU-seconds
wasted per fault kind, measured from each lost run's last checkpoint and
compared with its checkpoint interval.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# -- fault kinds ------------------------------------------------------------------
KILL_AGENT = "kill_agent"  # SIGKILL agent + its generators, restart later
PAUSE_AGENT = "pause_agent"  # SIGSTOP past the heartbeat timeout, SIGCONT, restart
KILL_SCHEDULER = "kill_scheduler"  # SIGKILL one scheduler instance (others take over), restart
PAUSE_SCHEDULER = "pause_scheduler"  # SIGSTOP one instance past its session timeout, SIGCONT
DOWN_AGENT = "down_agent"  # SIGSTOP an agent until it is DOWN, SIGCONT: it must heal itself
DUPLICATE_REPORTS = "duplicate_reports"  # re-produce recent agent reports, shuffled
MALFORMED_RECORDS = "malformed_records"  # undecodable / misplaced records on every topic
ECC_GPU = "ecc_gpu"  # uncorrectable ECC on one GPU; repaired + restart later
THROTTLE_GPU = "throttle_gpu"  # thermal throttling on one GPU for a while
WEDGE_GENERATOR = "wedge_generator"  # SIGSTOP one running generator once (a one-off hang)
CRASH_GENERATOR = "crash_generator"  # a job whose generator crashes every time (params)
HANG_GENERATOR = "hang_generator"  # a job whose generator hangs every time (params)
EMPTY_CELL = "empty_cell"  # SIGKILL every agent of one cell past the drain grace, restart
KILL_BROKER = "kill_broker"  # SIGKILL the (durable) broker, restart it on the same log

NODE_FAULTS = (KILL_AGENT, PAUSE_AGENT, ECC_GPU, DOWN_AGENT)
PROCESS_FAULTS = (KILL_AGENT, PAUSE_AGENT, DOWN_AGENT)  # may move to a busier node of the cell
SCHEDULER_FAULTS = (KILL_SCHEDULER, PAUSE_SCHEDULER)
MAX_IMPAIRED_NODES = 2  # at once in the whole stack; per cell, all but two whole nodes
EMPTY_CELL_SETTLE_S = 10.0  # after an emptied cell's restart, before the next node fault

NORMAL, CRASH, HANG = "normal", "crash", "hang"
SECONDS_PER_STEP = 2.0  # job seconds per demo-generator step
SHAPES = ((1, 1, 35), (2, 2, 25), (4, 4, 20), (8, 8, 13), (16, 8, 7))  # gpus, per node, weight
WALL_S = ((2, 5), (3, 5), (4, 4), (5, 3), (6, 3), (8, 2), (10, 2), (14, 1))  # seconds, weight
# Checkpoint intervals in wall seconds (the spec's are job seconds: x time scale). Not
# shorter: the agent's first SIGUSR1 can beat the generator's handler (default action:
# terminate) on a loaded machine, and each such death is a generator_error towards breakers.
CHECKPOINT_WALL_S = (1.5, 2.0, 3.0)


@dataclass(frozen=True, slots=True)
class Timing:
    """Lease and fault durations, in wall seconds (the scheduler gets the same leases)."""

    heartbeat_timeout_s: float = 6.0
    zombie_s: float = 4.0  # a resumed (paused) agent runs as a zombie this long
    repair_s: float = 10.0  # an ECC-failed GPU is replaced after this long
    throttle_s: float = 6.0
    scheduler_down_s: tuple[float, float] = (1.0, 3.0)  # with a single instance
    session_timeout_s: float = 6.0  # the processors' consumer-group session timeout
    rebalance_s: float = 3.0  # the group's rebalance after it (about 3 s on Tansu)
    heal_s: float = 15.0  # a resumed DOWN agent has this long to re-register by itself
    drain_grace_s: float = 12.0  # with several cells: a queued job no UP node can run leaves

    def scheduler_config(self) -> dict:
        hb = self.heartbeat_timeout_s
        return {
            "heartbeat_timeout_s": hb,
            "start_lease_s": 4 * hb,
            "report_lease_s": 2 * hb,
            "stop_lease_s": 4 * hb,
            "checkpoint_grace_s": 2 * hb,
            "status_interval_s": 1.0,
            "estimate_interval_s": 5.0,
        }

    def empty_cell_s(self) -> float:
        """How long an ``empty_cell`` fault keeps its agents dead: the lease (the
        nodes go DOWN), the drain grace (the queued jobs leave) and a margin that
        also covers a takeover of the cell (a rebalance after a scheduler fault)."""
        return self.heartbeat_timeout_s + self.drain_grace_s + 16.0

    def drain_window_ms(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        """The part of an ``empty_cell`` fault (killed at ``start_ms``, restarted at
        ``end_ms``) in which a job queued in the cell must leave before the agents
        come back: its nodes are DOWN by then, and a whole grace (plus a drain
        check, every grace/8) is left before the restart."""
        return (
            start_ms + int((self.heartbeat_timeout_s + 3.0) * 1000),
            end_ms - int((self.drain_grace_s + 2.0) * 1000),
        )


# ==================================================================================
# The plan (pure)
# ==================================================================================
@dataclass(frozen=True, slots=True)
class JobPlan:
    index: int
    at_s: float
    tenant: int
    role: str
    body: Mapping[str, Any]
    wall_s: float


def _weighted(rng: random.Random, table: Sequence[tuple]) -> tuple:
    return rng.choices(table, weights=[row[-1] for row in table])[0]


def submit_span_s(jobs: int) -> float:
    return max(15.0, 0.3 * jobs)


def build_workload(seed: int, jobs: int, time_scale: float) -> tuple[JobPlan, ...]:
    """The jobs to submit, in arrival order; a function of its arguments only."""
    rng = random.Random(f"workload/{seed}")
    specials = max(1, jobs // 100) if jobs >= 4 else 0
    roles = [CRASH] * specials + [HANG] * specials + [NORMAL] * (jobs - 2 * specials)
    rng.shuffle(roles)
    arrivals = sorted(rng.uniform(0, submit_span_s(jobs)) for _ in range(jobs))
    plans = []
    for i, (role, at) in enumerate(zip(roles, arrivals)):
        gpus, per_node, _ = _weighted(rng, SHAPES)
        wall, _ = _weighted(rng, WALL_S)
        steps = max(4, round(wall * time_scale / SECONDS_PER_STEP))
        checkpoint = 0.0 if rng.random() < 0.15 else rng.choice(CHECKPOINT_WALL_S) * time_scale
        params: dict[str, Any] = {
            "steps": steps,
            "seconds_per_step": SECONDS_PER_STEP,
            "duration_s": 1,
            "fps": 4,
            "resolution": "64x64",
            "seed": i,
        }
        body: dict[str, Any] = {
            "prompt": f"chaos {seed}/{i}",
            "model": "demo",
            "gpus": gpus,
            "gpus_per_node": per_node,
            "estimate_s": float(wall + 2),
            "checkpoint_interval_s": checkpoint,
            "preemptible": rng.random() < 0.3,
        }
        if role == CRASH:
            params["fail_at_step"] = 2
            body["model_version"] = f"chaos-crash-{i}"  # its breaker trips for it alone
        elif role == HANG:
            params["hang_at_step"] = 2
        body["params"] = params
        plans.append(JobPlan(i, round(at, 3), rng.randrange(3), role, body, float(wall)))
    return tuple(plans)


def expected_span_s(plans: Sequence[JobPlan], capacity_gpus: int) -> float:
    """Rough run length: the submission window, or the GPU-time at 60% utilisation."""
    if not plans:
        return 0.0
    gpu_s = sum(p.body["gpus"] * (p.wall_s + 1.0) for p in plans)
    return max(plans[-1].at_s + 5.0, gpu_s / max(1.0, 0.6 * capacity_gpus))


@dataclass(frozen=True, slots=True)
class Fault:
    fault_id: int
    kind: str
    at_s: float
    target: str = ""  # node id, "scheduler", or "" (picked when injected)
    gpu: int = -1
    duration_s: float = 0.0
    count: int = 0  # records to duplicate


@dataclass(frozen=True, slots=True)
class Action:
    at_s: float
    fault_id: int
    kind: str
    op: str  # crash, restart, pause, resume, ecc, unecc, throttle, unthrottle,
    target: str = ""  # duplicate, malformed, wedge
    gpu: int = -1
    count: int = 0
    final: bool = True  # the fault's last step: its node is no longer held
    step: int = 0  # order among the fault's steps

    @property
    def sort_key(self) -> tuple:
        return (self.at_s, self.fault_id, self.step)


def fault_counts(
    jobs: int, schedulers: int = 1, cells: int = 1, durable_broker: bool = False
) -> dict[str, int]:
    """How many faults of each kind a run of ``jobs`` gets (pausing the only
    scheduler instance would show no takeover: that kind needs two; emptying
    the only cell would leave its jobs nowhere to go: that kind needs two cells;
    killing a broker that keeps its log in memory would lose it: that kind
    needs a durable one)."""
    return {
        KILL_BROKER: max(1, jobs // 300) if durable_broker else 0,
        EMPTY_CELL: 1 if cells > 1 else 0,
        DOWN_AGENT: max(1, jobs // 250),
        PAUSE_SCHEDULER: max(1, jobs // 250) if schedulers > 1 else 0,
        KILL_AGENT: max(1, jobs // 150),
        PAUSE_AGENT: max(1, jobs // 250),
        ECC_GPU: 1,
        THROTTLE_GPU: max(1, jobs // 250),
        KILL_SCHEDULER: max(1, jobs // 250),
        DUPLICATE_REPORTS: max(2, jobs // 50),
        MALFORMED_RECORDS: max(1, jobs // 100),
        WEDGE_GENERATOR: max(1, jobs // 100),
    }


def pick_node(planned: str, busy: Mapping[str, tuple[int, int]]) -> str:
    """The node an agent fault hits when it is injected: the planned one, unless
    another eligible node of its cell (``busy``: node -> (generators of
    checkpointing jobs, generators), the planned node included) runs more, so
    that the fault costs work and a run resumes from its checkpoint. Ties keep
    the planned node, then the lowest name."""
    if not busy:
        return planned
    best = max(sorted(busy), key=lambda n: busy[n])
    return best if busy[best] > busy.get(planned, (0, 0)) else planned


def node_fault_length_s(kind: str, duration_s: float, timing: Timing) -> float:
    """How long a node fault keeps its node out of service, registration included."""
    extra = {PAUSE_AGENT: timing.zombie_s, DOWN_AGENT: timing.heal_s}.get(kind, 0.0)
    return duration_s + extra + 3.0


def impaired_per_cell(nodes: int, cells: int) -> int:
    """How many of a cell's nodes may be out at once: a 16-GPU gang needs two
    whole nodes of one cell (node ``i`` is in cell ``i mod cells``)."""
    return max(1, min(MAX_IMPAIRED_NODES, nodes // max(1, cells) - 2))


def build_schedule(
    seed: int,
    jobs: int,
    nodes: int,
    gpus_per_node: int,
    window_s: float,
    timing: Timing = Timing(),
    cells: int = 1,
    schedulers: int = 1,
    durable_broker: bool = False,
) -> tuple[Fault, ...]:
    """The faults of a run, by start time; a function of its arguments only.
    Scheduler faults hit one instance at a time: ``scheduler-0`` when it is the
    only one; with several, ``scheduler`` (the drill picks, when it injects the
    fault, an instance that owns a cell then, since the group's assignor may
    leave an instance with no cell at all), down past the session timeout so
    that another instance takes its cells over."""
    rng = random.Random(f"faults/{seed}")
    node_ids = [f"node-{i}" for i in range(nodes)]
    cell_of = {f"node-{i}": i % max(1, cells) for i in range(nodes)}
    per_cell = impaired_per_cell(nodes, cells)
    rng.shuffle(node_ids)
    start, end = 2.0, max(4.0, window_s)
    faults: list[Fault] = []
    counts = fault_counts(jobs, schedulers, cells, durable_broker)
    node_kinds = [k for k in NODE_FAULTS for _ in range(counts[k])]
    rng.shuffle(node_kinds)
    times = sorted(rng.uniform(start, end) for _ in node_kinds)
    impaired: list[tuple[float, float, str]] = []  # (from, free again at, node)
    # An emptied cell holds all its nodes: no node fault of that cell overlaps it, nor
    # starts before its agents have re-registered; the other cells' faults go on (their
    # limits are their own, so they stay placeable for its rerouted jobs).
    emptied: list[tuple[float, float, int]] = []  # (from, free again at, cell)
    for _ in range(counts[EMPTY_CELL]):
        at = round(rng.uniform(start + 0.25 * (end - start), start + 0.6 * (end - start)), 3)
        duration = timing.empty_cell_s()
        cell = rng.randrange(cells)
        emptied.append((at, at + duration + EMPTY_CELL_SETTLE_S, cell))
        faults.append(Fault(0, EMPTY_CELL, at, f"cell-{cell}", duration_s=round(duration, 3)))
    for n, (kind, at) in enumerate(zip(node_kinds, times)):
        node = node_ids[n % len(node_ids)]
        if kind == KILL_AGENT:
            duration = rng.uniform(1.0, 2 * timing.heartbeat_timeout_s)
        elif kind in (PAUSE_AGENT, DOWN_AGENT):
            duration = timing.heartbeat_timeout_s + rng.uniform(2.0, 4.0)
        else:
            duration = timing.repair_s
        length = node_fault_length_s(kind, duration, timing)
        while True:  # a fault pushed later may overlap one planned after it, so compare spans
            overlap = [(s, e, nd) for s, e, nd in impaired if s < at + length and at < e]
            blocked = [
                e for s, e, c in emptied if s < at + length and at < e and c == cell_of[node]
            ]
            if blocked:  # to a node of another cell (same time), else after the restart
                others = [nd for nd in node_ids if cell_of[nd] != cell_of[node]]
                if others:
                    node = others[n % len(others)]
                else:
                    at = max(blocked) + 0.5
                continue
            if (
                len(overlap) < MAX_IMPAIRED_NODES
                and all(nd != node for *_, nd in overlap)
                and sum(1 for *_, nd in overlap if cell_of[nd] == cell_of[node]) < per_cell
            ):
                break
            at = min(e for _, e, _ in overlap) + 0.5
        impaired.append((at, at + length, node))
        faults.append(
            Fault(0, kind, round(at, 3), node, rng.randrange(gpus_per_node), round(duration, 3))
        )
    scheduler_free_at = 0.0  # one instance impaired at a time: another takes over
    for kind in (
        THROTTLE_GPU,
        KILL_SCHEDULER,
        PAUSE_SCHEDULER,
        DUPLICATE_REPORTS,
        MALFORMED_RECORDS,
        WEDGE_GENERATOR,
    ):
        for _ in range(counts[kind]):
            at = round(rng.uniform(start, end), 3)
            if kind == THROTTLE_GPU:
                faults.append(
                    Fault(
                        0,
                        kind,
                        at,
                        rng.choice(node_ids),
                        rng.randrange(gpus_per_node),
                        timing.throttle_s,
                    )
                )
            elif kind in SCHEDULER_FAULTS:
                # with another instance, out until it surely took the cells over (a
                # zombie resumed sooner just rejoins and gets its cells back)
                moved_s = timing.session_timeout_s + timing.rebalance_s
                if schedulers > 1:
                    duration = moved_s + rng.uniform(2.0, 4.0)
                else:
                    duration = rng.uniform(*timing.scheduler_down_s)
                target = "scheduler" if schedulers > 1 else "scheduler-0"
                at = max(at, scheduler_free_at)
                for e_from, _, _ in emptied:  # its cell has an owner when it is emptied
                    if at < e_from < at + duration + moved_s + 2.0:
                        at = e_from + 0.5  # and the drill aims this at another instance
                at = round(at, 3)
                scheduler_free_at = at + duration + moved_s + 2.0
                faults.append(Fault(0, kind, at, target, duration_s=round(duration, 3)))
            elif kind == DUPLICATE_REPORTS:
                faults.append(Fault(0, kind, at, count=rng.randint(10, 30)))
            else:
                faults.append(Fault(0, kind, at))
    faults += broker_faults(seed, counts[KILL_BROKER], start, end, faults, timing)
    faults.sort(key=lambda f: (f.at_s, f.kind))
    return tuple(
        Fault(i + 1, f.kind, f.at_s, f.target, f.gpu, f.duration_s, f.count)
        for i, f in enumerate(faults)
    )


def broker_faults(
    seed: int,
    count: int,
    start: float,
    end: float,
    planned: Sequence[Fault],
    timing: Timing,
) -> list[Fault]:
    """``count`` broker kills, drawn from their own stream of the seed (the other
    faults of a seed stay as they were), each moved past any scheduler fault or
    emptied cell it would overlap (with the rebalance that follows it)."""
    rng = random.Random(f"broker-faults/{seed}")
    busy = [
        (f.at_s, f.at_s + f.duration_s + timing.session_timeout_s + timing.rebalance_s + 2.0)
        for f in planned
        if f.kind in SCHEDULER_FAULTS or f.kind == EMPTY_CELL
    ]
    out: list[Fault] = []
    for _ in range(count):
        at = rng.uniform(start, end)
        duration = rng.uniform(1.0, 3.0)
        # the broker's own restart (a few seconds) and the clients' reconnection
        length = duration + timing.session_timeout_s + timing.rebalance_s
        while True:
            overlap = [e for s, e in busy if s < at + length and at < e]
            if not overlap:
                break
            at = max(overlap) + 0.5
        busy.append((at, at + length))
        out.append(Fault(0, KILL_BROKER, round(at, 3), "broker", duration_s=round(duration, 3)))
    return out


def actions_of(faults: Iterable[Fault], timing: Timing = Timing()) -> list[Action]:
    """Each fault's timed steps, all faults interleaved by time."""
    out: list[Action] = []
    for f in faults:
        steps = iter(range(10))
        a = lambda dt, op, final=True: Action(
            round(f.at_s + dt, 3),
            f.fault_id,
            f.kind,
            op,
            f.target,
            f.gpu,
            f.count,
            final,
            next(steps),
        )
        if f.kind == KILL_AGENT:
            out += [a(0, "crash", False), a(f.duration_s, "restart")]
        elif f.kind == PAUSE_AGENT:
            out += [
                a(0, "pause", False),
                a(f.duration_s, "resume", False),
                a(f.duration_s + timing.zombie_s, "restart"),
            ]
        elif f.kind == ECC_GPU:
            out += [a(0, "ecc", False), a(f.duration_s, "unecc", False), a(f.duration_s, "restart")]
        elif f.kind == THROTTLE_GPU:
            out += [a(0, "throttle", False), a(f.duration_s, "unthrottle")]
        elif f.kind == KILL_SCHEDULER:
            out += [a(0, "crash", False), a(f.duration_s, "restart")]
        elif f.kind == PAUSE_SCHEDULER:
            out += [a(0, "pause", False), a(f.duration_s, "resume")]
        elif f.kind == DOWN_AGENT:  # no restart: the agent must re-register by itself
            out += [
                a(0, "pause", False),
                a(f.duration_s, "resume", False),
                a(f.duration_s + timing.heal_s, "heal_check"),
            ]
        elif f.kind in (EMPTY_CELL, KILL_BROKER):
            out += [a(0, "crash", False), a(f.duration_s, "restart")]
        elif f.kind == DUPLICATE_REPORTS:
            out.append(a(0, "duplicate"))
        elif f.kind == MALFORMED_RECORDS:
            out.append(a(0, "malformed"))
        elif f.kind == WEDGE_GENERATOR:
            out.append(a(0, "wedge"))
    return sorted(out, key=lambda x: x.sort_key)
