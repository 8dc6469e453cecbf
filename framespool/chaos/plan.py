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
(:func:`account`; takeovers and self-healing in :mod:`framespool.chaos.takeover`).

Chaos checks no log invariant itself: duplicate terminal events, double-booked
GPUs (scheduler view and node view) and GPUs still held at the end are what
:func:`framespool.processors.tools.verify.verify` found in the same log
(:func:`invariants`; docs/design.md#tools-that-reuse-the-core), so a drill and
``framespool verify`` can never disagree about what a run, a run's end or a
leak is. What is chaos's own is the fault plan's accounting: what it injected,
which submitted jobs never got a terminal event (lost), and the GPU-seconds
wasted per fault kind, measured from each lost run's last checkpoint and
compared with its checkpoint interval.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from framespool.schemas import events as ev
from framespool.schemas.causes import MOVES, RunCause
from framespool.schemas.topics import Topics

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


# ==================================================================================
# Malformed records (pure apart from fresh ids)
# ==================================================================================
@dataclass(frozen=True, slots=True)
class Malformed:
    topic: str
    key: bytes | None
    partition: int
    value: bytes
    kind: str


def malformed_records(topics: Topics, node: str, marker: str) -> list[Malformed]:
    """One undecodable record of each kind per consumed topic (the assignments one
    keyed for ``node``, whose agent reads it), plus misplaced valid events where a
    consumer can tell (wrong type, wrong cell). ``marker`` makes every value
    unique, so its dead letter can be found by value."""
    from framespool.log import partition_for_key
    from framespool.schemas import codec

    def undecodable(topic: str) -> list[tuple[str, bytes]]:
        tag = f"{marker}/{topic}".encode()
        valid = codec.encode(
            ev.Tick(event_id=f"chaos-{marker}-{topic}", ts_ms=0, cell="cell-0", now_ms=0)
        )
        return [
            ("bad_magic", b"chaos:" + tag),
            ("unknown_fingerprint", codec.MAGIC + b"\xfe" * 8 + tag),
            ("malformed_body", valid[: codec.HEADER_LEN] + b"\xff" * 12 + tag),
            ("truncated", valid[:-3]),
        ]

    out: list[Malformed] = []
    placements = [
        (topics.COMMANDS.name, b"acme", partition_for_key("acme", topics.COMMANDS.partitions)),
        (topics.SCHEDULER.name, b"cell-0", 0),
        (
            topics.ASSIGNMENTS.name,
            node.encode(),
            partition_for_key(node, topics.ASSIGNMENTS.partitions),
        ),
        (
            topics.JOB_EVENTS.name,
            b"chaos",
            partition_for_key("chaos", topics.JOB_EVENTS.partitions),
        ),
        (topics.PROGRESS.name, b"chaos", partition_for_key("chaos", topics.PROGRESS.partitions)),
    ]
    for topic, key, partition in placements:
        for kind, value in undecodable(topic):
            out.append(Malformed(topic, key, partition, value, kind))
    wrong_type = codec.encode(
        ev.Tick(event_id=f"chaos-{marker}-type", ts_ms=0, cell="cell-0", now_ms=0)
    )
    out.append(Malformed(topics.COMMANDS.name, b"acme", placements[0][2], wrong_type, "wrong_type"))
    out.append(
        Malformed(
            topics.ASSIGNMENTS.name,
            node.encode(),
            placements[2][2],
            codec.encode(
                ev.Tick(event_id=f"chaos-{marker}-atype", ts_ms=0, cell="cell-0", now_ms=0)
            ),
            "wrong_type",
        )
    )
    out.append(
        Malformed(
            topics.SCHEDULER.name,
            b"cell-0",
            0,
            codec.encode(
                ev.JobCompleted(event_id=f"chaos-{marker}-stype", ts_ms=0, job_id="chaos", run=1)
            ),
            "wrong_type",
        )
    )
    out.append(
        Malformed(
            topics.SCHEDULER.name,
            b"cell-0",
            0,
            codec.encode(
                ev.Tick(event_id=f"chaos-{marker}-cell", ts_ms=0, cell="cell-1", now_ms=1)
            ),
            "wrong_cell",
        )
    )
    return out


# ==================================================================================
# Accounting (pure functions over decoded events)
# ==================================================================================
TERMINAL_TYPES = (ev.JobCompleted, ev.JobFailed, ev.JobCancelled, ev.JobRejected)
AGENT_REPORTS = (
    ev.RunStarted,
    ev.RunCheckpointed,
    ev.RunCompleted,
    ev.RunFailed,
    ev.RunStopped,
    ev.NodeHeartbeat,
)
_POSITION = re.compile(r"^(?P<src>[^@]+)@(?P<offset>[0-9]+)/(?P<index>[0-9]+)$")


def position(event_id: str) -> tuple[str, int, int]:
    """``cell-0@123/4`` -> ("cell-0", 123, 4): the order the fold emitted it in."""
    m = _POSITION.match(event_id)
    if not m:
        return (event_id, -1, -1)
    return (m["src"], int(m["offset"]), int(m["index"]))


def unique(events: Iterable[Any]) -> list[Any]:
    """First occurrence of each event id (a replayed batch re-sends the same ids)."""
    seen: set[str] = set()
    out = []
    for e in events:
        if e.event_id not in seen:
            seen.add(e.event_id)
            out.append(e)
    return out


def cell_ordered(job_events: Iterable[Any]) -> list[Any]:
    """The cells' outputs, deduplicated, in the order the folds emitted them."""
    cell = [
        e
        for e in unique(job_events)
        if position(e.event_id)[1] >= 0 and position(e.event_id)[0].startswith("cell-")
    ]
    return sorted(cell, key=lambda e: position(e.event_id))


def terminal_summary(job_events: Iterable[Any], submitted: Iterable[str]) -> dict[str, Any]:
    submitted = list(dict.fromkeys(submitted))
    records: dict[str, list[Any]] = {}
    for e in job_events:
        if isinstance(e, TERMINAL_TYPES):
            records.setdefault(e.job_id, []).append(e)
    redelivered = 0
    final: dict[str, Any] = {}
    for job_id, evs in records.items():
        redelivered += len(evs) - len(dict.fromkeys(e.event_id for e in evs))
        final[job_id] = evs[0]
    by_type = Counter(type(final[j]).__name__ for j in submitted if j in final)
    failed = [final[j] for j in submitted if isinstance(final.get(j), ev.JobFailed)]
    return {
        "submitted": len(submitted),
        "completed": by_type.get("JobCompleted", 0),
        "failed": len(failed),
        "failed_by_class": dict(Counter(f.failure_class or "?" for f in failed)),
        "failed_reasons": {f.job_id: f"{f.failure_class}: {f.reason}"[:300] for f in failed},
        "cancelled": by_type.get("JobCancelled", 0),
        "rejected": by_type.get("JobRejected", 0),
        "lost": sum(1 for j in submitted if j not in final),
        "lost_jobs": [j for j in submitted if j not in final][:50],
        "redelivered_terminal_records": redelivered,
    }


def _run_ends(ordered: Sequence[Any]) -> dict[tuple[str, int], Any]:
    """The event that ended each run, for the scheduler."""
    ends: dict[tuple[str, int], Any] = {}
    for e in ordered:
        if (
            isinstance(e, (ev.JobRequeued, ev.JobCompleted, ev.JobFailed, ev.JobCancelled))
            and e.run > 0
        ):
            ends.setdefault((e.job_id, e.run), e)
    return ends


def placements(ordered: Sequence[Any]) -> dict[tuple[str, int], ev.JobAssigned]:
    return {(e.job_id, e.run): e for e in ordered if isinstance(e, ev.JobAssigned)}


GPU_CONFLICTS = ("double_booked", "double_started")  # verify's kinds about one GPU, two runs
INVARIANT_KEYS = (
    "duplicate_terminal_events",
    "duplicate_terminal_jobs",
    "double_booked_gpus",
    "double_booking",
    "leaked_gpus",
    "leaks",
    "final_cell_status",
)


def invariants(verdict: Any) -> dict[str, Any]:
    """The report's log invariants as verify judged them (``verdict``: its
    ``VerifyReport``; None when it could not run: then nothing is known and
    every key is None, which :func:`failures` counts as a failure).

    - duplicate terminal events: verify's ``duplicate_terminal`` violations;
    - double-booked GPUs: the (node, GPU)s of its ``double_booked`` (an
      assignment onto GPUs not yet released and confirmed) and
      ``double_started`` (two runs started on one GPU) violations;
    - leaked GPUs: every GPU a run still holds at the end of its re-fold of each
      cell (the drill ends only once every job is terminal and every GPU free).
    """
    if verdict is None:
        return dict.fromkeys(INVARIANT_KEYS)
    duplicates = [v for v in verdict.violations if v.kind == "duplicate_terminal"]
    jobs: dict[str, list[str]] = {}
    for v in duplicates:
        first = verdict.first_terminal.get(v.subject)
        jobs.setdefault(v.subject, [first.event_id] if first is not None else []).append(v.where)
    conflicts = [v for v in verdict.violations if v.kind in GPU_CONFLICTS]
    leaks = [
        {"cell": cell, **held}
        for cell, gpus in sorted(verdict.held_at_end.items())
        for held in gpus
    ]
    last = sorted(info["last_input"] for info in verdict.cells.values() if info.get("last_input"))
    return {
        "duplicate_terminal_events": len(duplicates),
        "duplicate_terminal_jobs": jobs,
        "double_booked_gpus": len({gpu for v in conflicts for gpu in v.gpus}),
        "double_booking": [v.to_dict() for v in conflicts[:20]],
        "leaked_gpus": len(leaks),
        "leaks": leaks[:50],
        "final_cell_status": ", ".join(last) or None,
    }


def reason_gist(reason: str) -> str:
    """A reason with its ids and numbers blanked, so that alike reasons count together."""
    gist = re.sub(r"node-[0-9]+", "node-N", reason.splitlines()[0] if reason else "")
    gist = re.sub(r"job_[0-9a-f]+", "JOB", gist)
    return re.sub(r"[0-9]+(\.[0-9]+)?", "N", gist)[:90]


def ignored_reports(ordered: Sequence[Any]) -> dict[str, int]:
    """ReportIgnored counted by the gist of their reasons."""
    return dict(
        Counter(
            reason_gist(e.reason) for e in ordered if isinstance(e, ev.ReportIgnored)
        ).most_common()
    )


# A checkpoint-and-move's cause -> the fault kind that cost the run.
MOVE_KINDS = {
    RunCause.GPU_ECC: ECC_GPU,
    RunCause.GPU_THROTTLED: THROTTLE_GPU,
    RunCause.STRAGGLER: "straggler",
    RunCause.NODE_DRAINING: "move",
}


def classify_run_end(
    end: Any,
    preempted: bool,
    role: str,
    wedged: bool,
    nodes: Sequence[str],
    fault_log: Sequence[Mapping[str, Any]],
) -> str:
    """Which fault kind cost a run, from the cause code of the event that ended it
    (``framespool.schemas.causes``) and the fault log."""
    cause = getattr(end, "cause", RunCause.UNRECORDED)
    if preempted or cause == RunCause.PREEMPTED:
        return "preemption"
    if isinstance(end, ev.JobCancelled):
        return "cancel"
    cls = getattr(end, "failure_class", "")
    if cause in MOVES:
        return MOVE_KINDS[cause]
    if cause == RunCause.HUNG and role == HANG:
        return HANG_GENERATOR
    if cause == RunCause.HUNG and wedged:
        return WEDGE_GENERATOR
    if cause == RunCause.GENERATOR_ERROR and role == CRASH:
        return CRASH_GENERATOR
    if cause == RunCause.TIMEOUT:
        return "timeout"
    # Anything else is blamed on the latest node fault on one of the run's nodes (a
    # stalled agent may also take a healthy generator for hung), if there is one.
    at = end.ts_ms
    hits = [
        f
        for f in fault_log
        if (f.get("node") in nodes or any(n in nodes for n in f.get("nodes", ())))
        and f["t_ms"] <= at + 1000
        and at - f["t_ms"] <= 120_000
        and f["kind"] in NODE_FAULTS + (EMPTY_CELL, "supervisor")
    ]
    if hits:
        return max(hits, key=lambda f: f["t_ms"])["kind"]
    return f"{cls or 'other'} (no injected fault)"


def wasted_by_fault(
    ordered: Sequence[Any],
    scheduler_events: Sequence[Any],
    specs: Mapping[str, ev.JobSpec],
    roles: Mapping[str, str],
    wedged: Iterable[str],
    fault_log: Sequence[Mapping[str, Any]],
    time_scale: float,
) -> dict[str, dict[str, Any]]:
    """GPU-seconds each fault kind wasted: for every run that did not complete, its
    GPUs x the time from its last durable point (last checkpoint, else its start)
    to the event that ended it; compared with the job's checkpoint interval."""
    placed = placements(ordered)
    ends = _run_ends(ordered)
    preempted = {(e.job_id, e.run) for e in ordered if isinstance(e, ev.JobPreempted)}
    wedged = set(wedged)
    started: dict[tuple[str, int], int] = {}
    checkpointed: dict[tuple[str, int], int] = {}
    for e in unique(scheduler_events):
        key = (getattr(e, "job_id", ""), getattr(e, "run", 0))
        if isinstance(e, ev.RunStarted):
            started[key] = min(started.get(key, e.ts_ms), e.ts_ms)
        elif isinstance(e, ev.RunCheckpointed):
            checkpointed[key] = max(checkpointed.get(key, e.ts_ms), e.ts_ms)
    rows: dict[str, dict[str, Any]] = {}
    for key, end in ends.items():
        if isinstance(end, ev.JobCompleted) or key not in placed:
            continue
        assigned = placed[key]
        start = started.get(key, assigned.ts_ms)
        durable = max(start, checkpointed.get(key, start))
        lost_s = max(0.0, (end.ts_ms - durable) / 1000)
        spec = specs.get(key[0])
        interval = (spec.checkpoint_interval_s / time_scale) if spec and time_scale > 0 else 0.0
        kind = classify_run_end(
            end,
            key in preempted,
            roles.get(key[0], NORMAL),
            key[0] in wedged,
            [p.node_id for p in assigned.placement],
            fault_log,
        )
        row = rows.setdefault(
            kind,
            {
                "runs": 0,
                "gpu_s": 0.0,
                "checkpointable_runs": 0,
                "intervals": [],
                "resumed_from_checkpoint": 0,
            },
        )
        row["runs"] += 1
        row["gpu_s"] += assigned.gpus * lost_s
        if isinstance(end, ev.JobRequeued) and end.resume_from:
            row["resumed_from_checkpoint"] += 1
        if interval > 0:
            row["checkpointable_runs"] += 1
            row["intervals"].append(lost_s / interval)
    out = {}
    for kind, row in sorted(rows.items()):
        iv = row.pop("intervals")
        out[kind] = {
            **row,
            "gpu_s": round(row["gpu_s"], 1),
            "gpu_s_per_run": round(row["gpu_s"] / row["runs"], 2),
            "lost_intervals_mean": round(sum(iv) / len(iv), 2) if iv else None,
            "lost_intervals_max": round(max(iv), 2) if iv else None,
        }
    return out


def dead_letter_check(injected: Sequence[Malformed], dead: Sequence[Any]) -> dict[str, Any]:
    """Every injected record must be in dead-letter, by value, with a reason header."""
    reasons: dict[bytes, str] = {}
    for rec in dead:
        reason = rec.header("reason")
        if rec.value is not None and reason:
            reasons.setdefault(rec.value, reason.decode(errors="replace"))
    missing = [{"topic": m.topic, "kind": m.kind} for m in injected if m.value not in reasons]
    got = Counter(reasons[m.value] for m in injected if m.value in reasons)
    return {
        "injected": len(injected),
        "dead_lettered": len(injected) - len(missing),
        "missing": missing,
        "reasons": dict(got),
        "by_topic": dict(Counter(m.topic for m in injected)),
    }


def drain_checks(
    job_events: Sequence[Any], fault_log: Sequence[Mapping[str, Any]], timing: Timing
) -> list[dict[str, Any]]:
    """Per ``empty_cell`` fault: the most jobs the emptied cell's ``CellStatus``
    showed queued inside its drain window (:meth:`Timing.drain_window_ms`: DOWN,
    with a whole grace left before the restart), and the ``JobRerouted`` out of
    it from the kill to a grace past the restart. ``expected``: some job was
    queued in the window, so at least one reroute must have happened (a fault
    whose restart is not in the log counts to the last event)."""
    events = unique(job_events)
    last_ms = max((e.ts_ms for e in events), default=0)
    rows = []
    for start in fault_log:
        if start["kind"] != EMPTY_CELL or start.get("op") != "crash" or not start["ok"]:
            continue
        end_ms = next(
            (
                e["t_ms"]
                for e in fault_log
                if e["fault_id"] == start["fault_id"] and e.get("op") == "restart"
            ),
            last_ms,
        )
        cell = start["target"]
        lo, hi = timing.drain_window_ms(start["t_ms"], end_ms)
        queued = [
            sum(q.queued for q in e.queues)
            for e in events
            if isinstance(e, ev.CellStatus) and e.cell == cell and lo <= e.ts_ms <= hi
        ]
        out = [
            e
            for e in events
            if isinstance(e, ev.JobRerouted)
            and e.from_cell == cell
            and start["t_ms"] <= e.ts_ms <= end_ms + int(timing.drain_grace_s * 1000)
        ]
        rows.append(
            {
                "fault_id": start["fault_id"],
                "cell": cell,
                "nodes": list(start.get("nodes", ())),
                "statuses_in_window": len(queued),
                "queued_max": max(queued, default=0),
                "rerouted": len(out),
                "rerouted_jobs": sorted({e.job_id for e in out})[:50],
                "expected": max(queued, default=0) > 0,
            }
        )
    return rows


def account(
    job_events: Sequence[Any],
    scheduler_events: Sequence[Any],
    dead: Sequence[Any],
    submitted: Sequence[str],
    roles: Mapping[str, str],
    injected: Sequence[Malformed],
    fault_log: Sequence[Mapping[str, Any]],
    wedged: Iterable[str],
    time_scale: float,
    *,
    verdict: Any,
    timing: Timing = Timing(),
) -> dict[str, Any]:
    """The run's report from what the log says (see the module docstring);
    ``verdict`` is verify's report on the same log (None: it could not run)."""
    ordered = cell_ordered(job_events)
    report = terminal_summary(job_events, submitted)
    report.update(invariants(verdict))
    expected = {j for j, r in roles.items() if r != NORMAL}
    report["failed_unexpected"] = {
        j: r for j, r in report["failed_reasons"].items() if j not in expected
    }
    report["failed_as_planned"] = sum(1 for j in report["failed_reasons"] if j in expected)
    specs = {e.spec.job_id: e.spec for e in unique(job_events) if isinstance(e, ev.JobAdmitted)}
    report["wasted_by_fault"] = wasted_by_fault(
        ordered, scheduler_events, specs, roles, wedged, fault_log, time_scale
    )
    report["resumed_runs"] = sum(
        1 for e in ordered if isinstance(e, ev.JobAssigned) and e.resume_from
    )
    report["reports_ignored"] = ignored_reports(ordered)
    report["dead_letter"] = dead_letter_check(injected, dead)
    report["reroutes"] = sum(1 for e in unique(job_events) if isinstance(e, ev.JobRerouted))
    report["drains"] = drain_checks(job_events, fault_log, timing)
    return report


def failures(report: Mapping[str, Any]) -> list[str]:
    """What makes a run fail, in words (empty: it passed)."""
    out = [
        f"{name} = {report[name]}"
        for name in ("lost", "duplicate_terminal_events", "leaked_gpus", "double_booked_gpus")
        if report.get(name)
    ]
    missing = report.get("dead_letter", {}).get("missing")
    if missing:
        out.append(f"{len(missing)} malformed record(s) never reached dead-letter")
    if report.get("submit_errors"):
        out.append(f"{len(report['submit_errors'])} job(s) could not be submitted")
    for row in report.get("drains", ()):
        if row["expected"] and not row["rerouted"]:
            out.append(
                f"no reroute: empty_cell #{row['fault_id']} left {row['queued_max']} job(s) "
                f"queued in {row['cell']} past the drain grace and none was rerouted"
            )
    verdict = report.get("verify") or {}
    if "verify" in report and verdict.get("ok") is None:
        out.append(
            f"verify could not run ({verdict.get('error', 'no verdict')}): the log invariants "
            "are unknown"
        )
    elif verdict.get("ok") is False:
        counts = ", ".join(f"{k} {n}" for k, n in sorted(verdict["violation_counts"].items()))
        out.append(f"verify: {counts}")
    return out


def format_report(report: Mapping[str, Any]) -> str:
    """The human summary ``framespool chaos`` prints."""
    r = report
    cfg = r.get("config", {})
    lines = [
        f"chaos seed {cfg.get('seed')}: {r['submitted']} jobs on {cfg.get('nodes')} nodes x "
        f"{cfg.get('gpus_per_node')} GPUs in {cfg.get('cells', 1)} cell(s), "
        f"{cfg.get('schedulers', 1)} scheduler instance(s), time scale {cfg.get('time_scale')}, "
        f"wall {r.get('wall_s', 0):.0f} s"
    ]
    by_class = ", ".join(f"{k} {v}" for k, v in sorted(r["failed_by_class"].items())) or "none"
    lines.append(
        f"  submitted {r['submitted']}  completed {r['completed']}  failed {r['failed']} "
        f"({by_class}; {r['failed_as_planned']} as planned)  cancelled {r['cancelled']}  "
        f"rejected {r['rejected']}"
    )
    lines.append(
        f"  lost {r['lost']}  duplicate terminal events {r['duplicate_terminal_events']}  "
        f"leaked GPUs {r['leaked_gpus']}  double-booked GPUs {r['double_booked_gpus']}"
    )
    for job_id, reason in list(r["failed_unexpected"].items())[:5]:
        lines.append(f"  unplanned failure {job_id}: {reason.splitlines()[0][:160]}")
    for job_id, reason in list(r["failed_reasons"].items())[:3]:
        if job_id not in r["failed_unexpected"]:
            lines.append(f"  planned failure {job_id}: {reason.splitlines()[0][:160]}")
    injected = ", ".join(f"{k} {v}" for k, v in sorted(r.get("faults_injected", {}).items()))
    lines.append(f"  faults injected: {injected}")
    if r.get("faults_skipped"):
        lines.append(f"  faults skipped: {r['faults_skipped']}")
    if r.get("supervisor_restarts"):
        lines.append(
            f"  agents restarted by the supervisor (node out of service without a "
            f"fault of ours): {r['supervisor_restarts']}"
        )
    dl = r["dead_letter"]
    lines.append(
        f"  malformed records dead-lettered {dl['dead_lettered']}/{dl['injected']} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(dl['reasons'].items()))})"
    )
    ignored = ", ".join(f"{k} {v}" for k, v in list(r["reports_ignored"].items())[:6])
    lines.append(f"  reports ignored: {ignored or 'none'}")
    lines.append(
        f"  runs resumed from a checkpoint: {r['resumed_runs']}; "
        f"terminal records redelivered with the same id: "
        f"{r['redelivered_terminal_records']}"
    )
    lines.append(
        "  wasted GPU-seconds by fault (from each lost run's last checkpoint to the event "
        "that ended it; lost time in checkpoint intervals):"
    )
    for kind, w in r["wasted_by_fault"].items():
        iv = (
            f"mean {w['lost_intervals_mean']} max {w['lost_intervals_max']} intervals over "
            f"{w['checkpointable_runs']} checkpointable"
            if w["lost_intervals_mean"] is not None
            else "no checkpointable runs"
        )
        lines.append(
            f"    {kind:<34} runs {w['runs']:>3}  {w['gpu_s']:>8.1f} GPU-s  "
            f"({w['gpu_s_per_run']} per run; {iv})"
        )
    if "takeovers" in r:
        lines.append(
            f"  scheduler takeovers {r['takeovers']}: partition revoked -> first decision of "
            f"the new owner max {r['takeover_s_max']} s (assigned -> decision max "
            f"{r.get('takeover_decide_s_max')} s; fault -> revoked max "
            f"{r.get('takeover_detect_s_max')} s; fault -> decision max "
            f"{r.get('takeover_from_fault_s_max')} s); unfinished "
            f"{len(r.get('takeovers_unfinished', ()))}"
        )
    lines.append(f"  jobs rerouted to another cell: {r.get('reroutes', 0)}")
    for row in r.get("drains", ()):
        lines.append(
            f"  empty_cell #{row['fault_id']} {row['cell']}: up to {row['queued_max']} job(s) "
            f"queued while it was empty, {row['rerouted']} rerouted"
        )
    for row in r.get("self_healing", ()):
        lines.append(
            f"  down_agent #{row['fault_id']} {row['node']}: declared DOWN "
            f"{row['declared_down']}, self-healed {row['self_healed']}"
            + (f" after {row['heal_s']} s" if row.get("heal_s") is not None else "")
        )
    verdict = r.get("verify")
    if verdict is not None:
        state = {True: "OK", False: "VIOLATED", None: f"could not run ({verdict.get('error')})"}
        lines.append(
            f"  framespool.processors.tools.verify: {state[verdict.get('ok')]}"
            + "".join(f"\n    {v}" for v in verdict.get("violation_counts", {}).items())
        )
    problems = failures(r)
    lines.append("  result: " + ("OK" if not problems else "FAILED: " + "; ".join(problems)))
    return "\n".join(lines)


SUMMARY_KEYS = (
    "submitted",
    "completed",
    "failed",
    "lost",
    "duplicate_terminal_events",
    "leaked_gpus",
    "double_booked_gpus",
    "takeovers",
    "takeover_s_max",
    "takeover_decide_s_max",
    "takeover_detect_s_max",
    "takeover_from_fault_s_max",
    "reroutes",
    "supervisor_restarts",
    "finished_before_timeout",
    "wall_s",
)


def summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The one-line JSON summary ``framespool chaos`` prints last: the figures a
    run is judged by, the shape it ran at, and each down_agent fault's healing."""
    cfg = report.get("config", {})
    out: dict[str, Any] = {k: cfg.get(k) for k in ("jobs", "seed", "nodes", "cells", "schedulers")}
    out.update({k: report.get(k) for k in SUMMARY_KEYS})
    out["self_healed"] = [row.get("self_healed") for row in report.get("self_healing", ())]
    out["verify_ok"] = (report.get("verify") or {}).get("ok")
    out["result"] = "OK" if not failures(report) else "FAILED"
    return out
