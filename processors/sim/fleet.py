"""The simulated world outside the cell: jobs as users see them, nodes, and the
processes (runs) the simulated agents run on their GPUs.

These records hold the *truth* the scheduler only learns through events: how
long a job really takes, which GPUs a process really occupies, which model's
weights are really warm on a GPU, and whether a node is really alive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framespool.schemas import events as ev

from .workload import TraceJob

if TYPE_CHECKING:  # pragma: no cover
    from .metrics import FlowStats

MASK64 = (1 << 64) - 1


def unit(seed: int, a: int, b: int) -> float:
    """A uniform draw in [0, 1) that depends only on its arguments (splitmix64),
    so a job's run fails or not alike under every policy."""
    x = (seed * 0x9E3779B97F4A7C15 + a * 0xBF58476D1CE4E5B9 + b * 0x94D049BB133111EB) & MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x / 18446744073709551616.0


def checkpoint_uri(job_id: str, run: int, done_s: float) -> str:
    """A checkpoint URI that encodes the work done, so a resumed run only has
    the remaining work left."""
    return f"sim://{job_id}/{run}/{done_s:.3f}"


def work_done_in(uri: str | None) -> float:
    if not uri or not uri.startswith("sim://"):
        return 0.0
    try:
        return float(uri.rsplit("/", 1)[1])
    except ValueError:
        return 0.0


class SimJob:
    """A job between submission and its terminal event."""

    __slots__ = (
        "trace",
        "job_id",
        "queued",
        "waiting",
        "runs",
        "first_start_ms",
        "open_run",
        "flow",
        "completed_run",
        "admitted",
        "est_p50",
        "est_p90",
        "refreshed",
    )

    def __init__(self, trace: TraceJob) -> None:
        self.trace = trace
        self.job_id = trace.job_id
        self.queued = False  # the cell holds it in a queue (per its events)
        self.waiting = False  # queued in the cell or in the shell's FIFO gate
        self.runs = 0
        self.first_start_ms = -1
        self.open_run: tuple[int, int, str] | None = None  # (run, start_ms, placement)
        self.flow: FlowStats | None = None  # of (tier, tenant): Recorder.submitted_job sets it
        self.completed_run = 0  # run whose RunCompleted the agent sent
        self.admitted = False
        self.est_p50 = self.est_p90 = -1.0  # the cell's wait band at admission (s)
        # the bands the cell published while the job was queued: (ms, P50, P90)
        self.refreshed: list[tuple[int, float, float]] | None = None


class SimRun:
    """One attempt's processes across its gang: they start, stop and die together."""

    __slots__ = (
        "job",
        "run",
        "key",
        "slices",
        "leader",
        "incarnations",
        "pending",
        "broken",
        "alive",
        "t0_ms",
        "work_start_ms",
        "end_ms",
        "done0",
        "fails",
        "gpus",
        "cold",
    )

    def __init__(self, job: SimJob, run: int, placement: tuple[ev.NodeSlice, ...]) -> None:
        self.job = job
        self.run = run
        self.key = (job.job_id, run)
        self.slices = tuple((s.node_id, s.gpus) for s in placement)
        self.leader = placement[0].node_id
        self.incarnations: dict[str, int] = {}
        self.pending = len(placement)  # StartRuns not yet received
        self.broken = False  # a node of the gang could not start it
        self.alive = False  # its processes hold GPUs now
        self.t0_ms = 0
        self.work_start_ms = 0  # after the cold start
        self.end_ms = 0
        self.done0 = 0.0  # work already done when it started (resume)
        self.fails = False
        self.gpus = sum(len(s.gpus) for s in placement)
        self.cold = False

    def done_s(self, now_ms: int) -> float:
        """Seconds of the job's work done by ``now_ms`` (checkpointable progress)."""
        if now_ms <= self.work_start_ms:
            return self.done0
        return min(self.job.trace.duration_s, self.done0 + (now_ms - self.work_start_ms) / 1000)


class SimNode:
    __slots__ = (
        "node_id",
        "index",
        "rail",
        "gpus",
        "incarnation",
        "alive",
        "owner",
        "warm",
        "runs",
        "health",
        "down_since_ms",
    )

    def __init__(self, node_id: str, index: int, rail: str, gpus: int) -> None:
        self.node_id = node_id
        self.index = index
        self.rail = rail
        self.gpus = gpus
        self.incarnation = 1
        self.alive = True
        self.owner: list[SimRun | None] = [None] * gpus
        self.warm: list[str] = [""] * gpus
        self.runs: dict[tuple[str, int], SimRun] = {}
        self.health: tuple[ev.GpuHealth, ...] | None = None  # rebuilt when warm changes
        self.down_since_ms = -1

    def health_samples(self, cache: dict) -> tuple[ev.GpuHealth, ...]:
        """Healthy GPUs advertising their warm model; objects are shared (immutable)."""
        if self.health is None:
            samples = []
            for i, model in enumerate(self.warm):
                sample = cache.get((i, model))
                if sample is None:
                    sample = cache[(i, model)] = ev.GpuHealth(
                        index=i, warm_models=(model,) if model else ()
                    )
                samples.append(sample)
            self.health = tuple(samples)
        return self.health
