"""The cell's mutable state records: jobs, runs (attempts) and nodes.

A Job is kept apart from its Runs: each placement is a new Run with the next
``run`` number, the job's fencing epoch. Only the fold mutates these.
"""

from __future__ import annotations

from framespool.schemas.events import JobSpec, NodeSlice
from framespool.schemas.states import GpuState, JobState, NodeState, RunPhase

# Members bound once: an enum attribute lookup costs ~6x a global on the hot path.
_GPU_OK = GpuState.OK
_UP = NodeState.UP

RunKey = tuple[str, int]


class Job:
    __slots__ = (
        "spec",
        "state",
        "run",
        "tier",
        "tenant",
        "user",
        "checkpoint",
        "failures",
        "preemptions",
        "queued_ms",
        "submitted_ms",
        "first_start_ms",
        "reason",
        "shape",
        "cost",
        "wait_estimate_s",
        "checkpoint_progress",
        "fit",
        "bounds",
        "qclass",
        "wait_code",
    )

    def __init__(self, spec: JobSpec, tier: str, now_ms: int) -> None:
        self.spec = spec
        self.state = JobState.QUEUED
        self.run = 0
        self.tier = tier
        self.tenant = spec.tenant
        self.user = spec.user or spec.tenant
        self.checkpoint: str | None = None
        self.checkpoint_progress = 0.0
        self.failures: dict[str, int] = {}
        self.preemptions = 0
        self.queued_ms = now_ms
        self.submitted_ms = spec.submitted_ms or now_ms
        self.first_start_ms = -1
        self.reason = ""
        self.shape = (spec.gpus, spec.gpus_per_node, spec.estimate_s)
        self.cost = 0.0
        self.wait_estimate_s = -1.0
        # its shapes with the part of a search's key the spec fixes, built on
        # the first walk that tests it (``Starts.fit_shapes``)
        self.fit: tuple[tuple[int, int, float, tuple], ...] | None = None
        # its ``WalkProofs.bound_key``, built on first use (spec and config
        # never change, so neither does it)
        self.bounds: tuple[int, int, float, int, bool] | None = None
        # its class in ``QueueClasses`` (``WalkProofs.class_of``), built on first use
        self.qclass: tuple | None = None
        # the reason code it was last told while queued (``waiting.py``); a job
        # from an older snapshot has none: read with getattr
        self.wait_code = ""

    @property
    def job_id(self) -> str:
        return self.spec.job_id


class Run:
    __slots__ = (
        "job_id",
        "run",
        "placement",
        "gpus",
        "held",
        "phase",
        "assigned_ms",
        "started_ms",
        "last_report_ms",
        "estimate_s",
        "limit_ms",
        "charged",
        "exit_intent",
        "exit_by",
        "exit_deadline_ms",
        "stop_sent_ms",
        "step_rate",
        "slow_strikes",
        "model_version",
        "tenant",
        "tier",
        "user",
        "preemptible",
        "checkpointable",
        "cpus",
        "mem_gb",
        "gang",
        "saved_ms",
    )

    def __init__(
        self,
        job: Job,
        run: int,
        placement: tuple[NodeSlice, ...],
        estimate_s: float,
        now_ms: int,
        limit_ms: int,
        charged: float,
    ) -> None:
        self.job_id = job.job_id
        self.run = run
        self.placement = placement
        self.gpus = sum(len(s.gpus) for s in placement)
        self.held: dict[str, tuple[int, ...]] = {s.node_id: s.gpus for s in placement}
        self.phase = RunPhase.ASSIGNED
        self.assigned_ms = now_ms
        self.started_ms = now_ms
        self.last_report_ms = now_ms
        self.estimate_s = estimate_s
        self.limit_ms = limit_ms
        self.charged = charged
        self.exit_intent = ""  # while EXITING, a RunCause: PREEMPTED or why it moves
        self.exit_by = ""
        self.exit_deadline_ms = 0
        self.stop_sent_ms = 0
        self.step_rate = 0.0
        self.slow_strikes = 0
        self.model_version = f"{job.spec.model}@{job.spec.model_version}"
        self.tenant = job.tenant
        self.tier = job.tier
        self.user = job.user
        self.preemptible = job.spec.preemptible
        self.checkpointable = job.spec.checkpoint_interval_s > 0
        self.cpus = job.spec.cpus
        self.mem_gb = job.spec.mem_gb
        # A run on several nodes is a gang: per-member readiness, liveness and
        # checkpoints (``gangs.py``); a run on one node keeps the run-wide fields.
        self.gang = (
            Gang(tuple(s.node_id for s in placement), now_ms) if len(placement) > 1 else None
        )
        # when the work it would resume from was saved: its start (it resumes
        # from the job's checkpoint), then each checkpoint it writes; what a
        # stop without a checkpoint loses is the work since (rescue.py)
        self.saved_ms = now_ms

    @property
    def key(self) -> RunKey:
        return (self.job_id, self.run)

    def projected_end_ms(self, now_ms: int) -> int:
        """When the run is expected to free its GPUs: at its estimate; once it
        has outlived that, a slack of 10% of the estimate (at least 1 s) from
        now, never past its hard limit. A late run thus delays a reservation by
        about as much as it overruns, not by its whole limit at once."""
        end = self.static_end_ms()
        if end > now_ms:
            return end
        return max(now_ms + 1, min(self.limit_ms, now_ms + self.late_slack_ms()))

    def static_end_ms(self) -> int:
        """When the run ends if it keeps to its estimate."""
        return self.started_ms + int(self.estimate_s * 1000)

    def late_slack_ms(self) -> int:
        """How far past now a run that outlived its estimate is projected to end."""
        return max(1000, int(self.estimate_s * 100))


class Gang:
    """Per-member state of a multi-node run; a member's rank is its index in
    ``members`` (the placement's order, as the agents number themselves)."""

    __slots__ = ("members", "ready", "seen", "steps", "common_step")

    def __init__(self, members: tuple[str, ...], now_ms: int) -> None:
        self.members = members
        self.ready: dict[str, None] = {}  # members that hold their GPUs, in report order
        self.seen: dict[str, int] = dict.fromkeys(members, now_ms)  # last sign of the run there
        # member -> {step: (checkpoint uri, progress)} not yet below the common step
        self.steps: dict[str, dict[int, tuple[str, float]]] = {m: {} for m in members}
        self.common_step = -1  # the latest step every member checkpointed in this run

    def rank(self, node_id: str) -> int:
        return self.members.index(node_id)


class Node:
    __slots__ = (
        "node_id",
        "incarnation",
        "gpu_type",
        "rail",
        "total",
        "gpu_state",
        "owner",
        "warm",
        "state",
        "last_seen_ms",
        "cpus",
        "mem_gb",
        "cpus_used",
        "mem_used",
        "healthy_streak",
        "state_reason",
        "last_heartbeat_ts",
    )

    def __init__(
        self,
        node_id: str,
        incarnation: int,
        gpus: int,
        gpu_type: str,
        rail: str,
        cpus: float,
        mem_gb: float,
        now_ms: int,
    ) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.gpu_type = gpu_type
        self.rail = rail
        self.total = gpus
        self.gpu_state = [GpuState.OK] * gpus
        self.owner: list[RunKey | None] = [None] * gpus
        self.warm: list[str] = [""] * gpus
        self.healthy_streak = [0] * gpus
        self.state = NodeState.UP
        self.state_reason = ""
        self.last_seen_ms = now_ms
        self.last_heartbeat_ts = -1  # the reporter's ts_ms of the last heartbeat taken
        self.cpus = cpus
        self.mem_gb = mem_gb
        self.cpus_used = 0.0
        self.mem_used = 0.0

    def free_gpus(self) -> list[int]:
        return [
            i for i in range(self.total) if self.owner[i] is None and self.gpu_state[i] == _GPU_OK
        ]

    def free_count(self) -> int:
        return sum(
            1 for i in range(self.total) if self.owner[i] is None and self.gpu_state[i] == _GPU_OK
        )

    @property
    def schedulable(self) -> bool:
        return self.state == _UP


class HealthSeen:
    """A node's last full fold of GPU health samples (``NodeHandlers.apply_health``),
    so a heartbeat repeating them folds in O(1).

    ``samples``: the tuple folded; ``node``: the node it was folded into (a new
    incarnation is a new ``Node``); ``warm``: its warm models after the fold;
    ``settled``: every GPU's state was what its sample said, or FAILED;
    ``ok``: the GPUs that sampled OK; ``owed``: repeats skipped since, each owing
    those GPUs one healthy sample of streak (paid before the next full fold)."""

    __slots__ = ("samples", "node", "warm", "settled", "ok", "owed")

    def __init__(
        self, samples: tuple, node: Node, warm: list, settled: bool, ok: list[int]
    ) -> None:
        self.samples = samples
        self.node = node
        self.warm = warm
        self.settled = settled
        self.ok = ok
        self.owed = 0
