"""Python event types: one frozen dataclass per ``schemas/avro/<Name>.avsc``.

Theory of operation
-------------------
The ``.avsc`` files are the wire contract; these classes mirror them field for
field (``tests/unit/test_schema_contract.py`` proves it). Commands are
imperative (``SubmitJob``), events past tense (``JobAssigned``). Every top-level
record starts with ``event_id`` and ``ts_ms``; fencing fields are ``run`` (the
job's attempt number) and ``incarnation`` (the node registration number).

Collections are tuples so that events stay hashable and immutable; the codec
converts Avro arrays to tuples on decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field


# --------------------------------------------------------------------------
# Nested records
# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """One way to run a job: total GPUs, GPUs per node and the run time it needs."""

    gpus: int
    gpus_per_node: int
    estimate_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What a user asked for; immutable for the job's life."""

    job_id: str
    tenant: str
    user: str = ""
    tier: str = "free"
    model: str = "demo"
    model_version: str = "1"
    prompt: str = ""
    params: dict[str, str] = field(default_factory=dict)
    gpus: int = 1
    gpus_per_node: int = 1
    estimate_s: float = 60.0
    shapes: tuple[Shape, ...] = ()
    preemptible: bool = False
    checkpoint_interval_s: float = 0.0
    cpus: float = 0.0
    mem_gb: float = 0.0
    gpu_type: str = ""
    callback_url: str | None = None
    submitted_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSlice:
    """The GPUs of one node that a run holds."""

    node_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuHealth:
    """One GPU's health sample, as an agent reads it (NVML or simulated)."""

    index: int
    temperature_c: float = 40.0
    sm_clock_mhz: int = 1980
    max_sm_clock_mhz: int = 1980
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    utilization: float = 0.0
    warm_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """A run a node says it is running, with its speed."""

    job_id: str
    run: int
    step_rate: float = 0.0
    progress: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuStatus:
    """One GPU as the scheduler sees it: free, busy, degraded, failed or down."""

    index: int
    state: str
    job_id: str = ""
    run: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    node_id: str
    state: str
    gpu_type: str = ""
    rail: str = ""
    gpus: tuple[GpuStatus, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDepth:
    """Queued jobs and GPUs in use for one (tier, tenant)."""

    tier: str
    tenant: str
    queued: int = 0
    queued_gpus: int = 0
    running_gpus: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGroup:
    """UP nodes of one GPU type with the same number of healthy GPUs."""

    gpus: int
    nodes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuOffer:
    """What a cell can run on one GPU type (a part of ``CellOffer``)."""

    gpu_type: str
    healthy_gpus: int = 0
    free_gpus: int = 0
    largest_job: int = 0  # GPUs of the largest job its UP nodes could ever host
    groups: tuple[NodeGroup, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TierBacklog:
    """GPU-seconds queued that a new job of ``tier`` waits behind (its tier and
    every more important one)."""

    tier: str
    queued_gpu_s: float = 0.0
    max_wait_s: float = 0.0  # the tier's predicted-wait limit here (0 = none)
    # this tier's own backlog as the fair order serves it, by the progress of a
    # flow starting at the tier's least virtual time (``offers.FAIR_STEPS_GPU_S``),
    # then the whole own backlog; () when none is queued, the tier has no limit,
    # or from an older cell
    fair_gpu_s: tuple[float, ...] = ()


# --------------------------------------------------------------------------
# Commands (written from outside into the log)
# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitJob:
    event_id: str
    ts_ms: int
    spec: JobSpec
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelJob:
    event_id: str
    ts_ms: int
    job_id: str
    tenant: str
    reason: str = "cancelled by user"


# --------------------------------------------------------------------------
# Admission and scheduler decisions (job-events, and the cell topic)
# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class JobAdmitted:
    event_id: str
    ts_ms: int
    spec: JobSpec
    cell: str = ""
    run: int = 0  # runs it had in cells that gave it up: this cell numbers from run + 1
    resume_from: str | None = None  # a rerouted job's last checkpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRejected:
    event_id: str
    ts_ms: int
    job_id: str
    tenant: str
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobQueued:
    event_id: str
    ts_ms: int
    job_id: str
    tenant: str
    tier: str
    wait_estimate_s: float = -1.0
    position: int = 0
    reason: str = ""
    wait_p50_s: float = -1.0  # calibrated wait quantiles (s); -1 = unknown
    wait_p90_s: float = -1.0
    reason_code: str = ""  # why it waits (framespool.schemas.waits.WaitCode)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobAssigned:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    placement: tuple[NodeSlice, ...]
    gpus: int
    estimate_s: float
    resume_from: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPreempted:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    reason: str
    by_job_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRequeued:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    reason: str
    resume_from: str | None = None
    retries_left: int = 0
    cause: str = ""  # a RunCause code (framespool.schemas.causes)
    failure_class: str = ""  # the retry class charged; "" for a move or preemption


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCancelled:
    event_id: str
    ts_ms: int
    job_id: str
    run: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCompleted:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    artifact_uri: str = ""
    gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFailed:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    reason: str
    failure_class: str = ""
    cause: str = ""  # a RunCause code (framespool.schemas.causes)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobWaitEstimated:
    """A queued job's refreshed wait estimate and fair-order position."""

    event_id: str
    ts_ms: int
    job_id: str
    wait_estimate_s: float
    position: int
    reason: str = ""
    wait_p50_s: float = -1.0  # calibrated wait quantiles (s); -1 = unknown
    wait_p90_s: float = -1.0
    reason_code: str = ""  # why it waits (framespool.schemas.waits.WaitCode)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportIgnored:
    """A report the fold refused (stale run, stale incarnation, illegal transition)."""

    event_id: str
    ts_ms: int
    subject: str
    reason: str
    source_event_id: str = ""
    code: str = ""  # why, as a code (framespool.schemas.refusals.IgnoreCode)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStateChanged:
    """A node (gpu == -1) or one of its GPUs changed health state."""

    event_id: str
    ts_ms: int
    node_id: str
    incarnation: int
    state: str
    gpu: int = -1
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerTripped:
    """Failure containment: stop placing a model version on a GPU type or node."""

    event_id: str
    ts_ms: int
    model_version: str
    scope: str
    key: str
    until_ms: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CellStatus:
    """Periodic summary of a cell for read models: GPU map and queue depths."""

    event_id: str
    ts_ms: int
    cell: str
    nodes: tuple[NodeStatus, ...] = ()
    queues: tuple[QueueDepth, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CellOffer:
    """A cell's periodic offer to admission, sent to every commands partition:
    the shapes it can run and the work a new job would wait behind."""

    event_id: str
    ts_ms: int
    cell: str
    capacity_gpus: int = 0
    free_gpus: int = 0
    running_gpu_s: float = 0.0
    gpu_types: tuple[GpuOffer, ...] = ()
    tiers: tuple[TierBacklog, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessorConfigured:
    """The configuration a processor instance folds with (``document``: the JSON of
    its config file's sections, keys sorted; ``sha256`` of that text), written to
    job-events keyed by ``processor`` when it starts, so that replay and audit
    never have to guess it."""

    event_id: str
    ts_ms: int
    processor: str
    instance: str
    document: str
    sha256: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRerouted:
    """A cell gave up a queued job it cannot run; admission routes it again."""

    event_id: str
    ts_ms: int
    job_id: str
    tenant: str
    from_cell: str
    reason: str
    spec: JobSpec
    run: int = 0
    resume_from: str | None = None


# --------------------------------------------------------------------------
# Instructions to agents (assignments topic, keyed by node id)
# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class StartRun:
    event_id: str
    ts_ms: int
    node_id: str
    incarnation: int
    run: int
    spec: JobSpec
    gpus: tuple[int, ...]
    placement: tuple[NodeSlice, ...]
    estimate_s: float
    resume_from: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StopRun:
    event_id: str
    ts_ms: int
    node_id: str
    incarnation: int
    job_id: str
    run: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class BeginRun:
    """The gang's start barrier is passed: every member holds its GPUs; compute."""

    event_id: str
    ts_ms: int
    node_id: str
    incarnation: int
    job_id: str
    run: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRun:
    event_id: str
    ts_ms: int
    node_id: str
    incarnation: int
    job_id: str
    run: int
    reason: str = ""


# --------------------------------------------------------------------------
# Agent reports (cell topic) and progress (progress topic)
# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRegistered:
    event_id: str
    ts_ms: int
    node_id: str
    incarnation: int
    cell: str
    gpus: int
    gpu_type: str = "H100"
    rail: str = "rail-0"
    cpus: float = 0.0
    mem_gb: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeHeartbeat:
    event_id: str
    ts_ms: int
    node_id: str
    incarnation: int
    gpus: tuple[GpuHealth, ...] = ()
    runs: tuple[RunReport, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    node_id: str
    incarnation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunProgress:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    node_id: str
    progress: float
    step: int = 0
    total_steps: int = 0
    message: str = ""
    phase: str = ""  # CHECKPOINTING while a checkpoint is being written; "" otherwise


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCheckpointed:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    node_id: str
    incarnation: int
    checkpoint_uri: str
    progress: float = 0.0
    step: int = -1  # -1: unknown (an older writer); in a gang, per rank (node_id)
    size_bytes: int = 0  # the stored object's size (storage accounting); 0 unknown


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompleted:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    node_id: str
    incarnation: int
    artifact_uri: str = ""
    sha256: str = ""
    size_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailed:
    event_id: str
    ts_ms: int
    job_id: str
    run: int
    node_id: str
    incarnation: int
    failure_class: str
    reason: str = ""
    exit_code: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStopped:
    """The agent confirms a run's processes are gone and its GPUs are free."""

    event_id: str
    ts_ms: int
    job_id: str
    run: int
    node_id: str
    incarnation: int
    reason: str = ""


# --------------------------------------------------------------------------
# Time
# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """The only source of time for a cell's fold."""

    event_id: str
    ts_ms: int
    cell: str
    now_ms: int


NESTED_TYPES = (
    Shape,
    JobSpec,
    NodeSlice,
    GpuHealth,
    RunReport,
    GpuStatus,
    NodeStatus,
    QueueDepth,
    NodeGroup,
    GpuOffer,
    TierBacklog,
)

EVENT_TYPES = (
    SubmitJob,
    CancelJob,
    JobAdmitted,
    JobRejected,
    JobQueued,
    JobAssigned,
    JobPreempted,
    JobRequeued,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobWaitEstimated,
    ReportIgnored,
    NodeStateChanged,
    BreakerTripped,
    CellStatus,
    CellOffer,
    JobRerouted,
    ProcessorConfigured,
    StartRun,
    StopRun,
    CheckpointRun,
    BeginRun,
    NodeRegistered,
    NodeHeartbeat,
    RunStarted,
    RunProgress,
    RunCheckpointed,
    RunCompleted,
    RunFailed,
    RunStopped,
    Tick,
)

EVENT_BY_NAME = {cls.__name__: cls for cls in EVENT_TYPES}

# Events that end a job; exactly one of them per job in job-events.
TERMINAL_EVENTS = (JobCompleted, JobFailed, JobCancelled, JobRejected)

# Events that end a run (``run`` > 0) of a placed job: its outcome, a requeue or a
# preemption (a preempted run's JobRequeued, when one follows, ends it again).
RUN_ENDS = (JobCompleted, JobFailed, JobCancelled, JobRequeued, JobPreempted)
