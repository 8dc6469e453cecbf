"""Sample event streams for the tests (moved from projections/testing.py).

``lifecycle`` writes the job-events and progress a well-behaved scheduler and
agent would produce for one job. The fake log producer is
``framespool.log.memory.MemoryProducer``.
"""

from __future__ import annotations

from typing import Any

from framespool.log import Record, partition_for_key
from framespool.projections.jobs import job_id_of
from framespool.schemas import codec
from framespool.schemas.causes import RunCause
from framespool.schemas.events import (
    CellStatus,
    GpuStatus,
    JobAdmitted,
    JobAssigned,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobQueued,
    JobRejected,
    JobRequeued,
    JobSpec,
    JobWaitEstimated,
    NodeSlice,
    NodeStatus,
    QueueDepth,
    RunCheckpointed,
    RunCompleted,
    RunProgress,
)
from framespool.schemas.states import GpuSlot, JobState, NodeState
from framespool.schemas.topics import JOB_EVENTS, PROGRESS


def spec(job_id: str, tenant: str = "acme", **kw: Any) -> JobSpec:
    defaults: dict[str, Any] = dict(
        user="alice",
        tier="free",
        model="demo",
        prompt="a red fox",
        params={"resolution": "640x360"},
        gpus=1,
        gpus_per_node=1,
        submitted_ms=1_000,
    )
    defaults.update(kw)
    return JobSpec(job_id=job_id, tenant=tenant, **defaults)


def lifecycle(
    job_id: str,
    tenant: str = "acme",
    *,
    ts0: int = 1_000,
    runs: int = 1,
    progress_steps: int = 3,
    outcome: str = JobState.COMPLETED,
    stale_progress: bool = True,
    callback_url: str | None = None,
    node: str = "node-1",
) -> list[Any]:
    """One job's events in log order; event ids are ``<job_id>:<n>``."""
    out: list[Any] = []

    def eid() -> str:
        return f"{job_id}:{len(out)}"

    def ts() -> int:
        return ts0 + 10 * len(out)

    if outcome == JobState.REJECTED:
        return [
            JobRejected(
                event_id=eid(),
                ts_ms=ts(),
                job_id=job_id,
                tenant=tenant,
                reason="quota",
                detail="max queued jobs (100) reached",
            )
        ]
    out.append(
        JobAdmitted(
            event_id=eid(),
            ts_ms=ts(),
            cell="cell-0",
            spec=spec(job_id, tenant, callback_url=callback_url, submitted_ms=ts0),
        )
    )
    out.append(
        JobQueued(
            event_id=eid(),
            ts_ms=ts(),
            job_id=job_id,
            tenant=tenant,
            tier="free",
            wait_estimate_s=30.0,
            position=2,
            reason="fair-share order",
        )
    )
    out.append(
        JobWaitEstimated(
            event_id=eid(), ts_ms=ts(), job_id=job_id, wait_estimate_s=12.0, position=1
        )
    )
    for run in range(1, runs + 1):
        out.append(
            JobAssigned(
                event_id=eid(),
                ts_ms=ts(),
                job_id=job_id,
                run=run,
                gpus=1,
                estimate_s=60.0,
                reason="fair-share order",
                placement=(NodeSlice(node_id=node, gpus=(0,)),),
                resume_from=f"ckpt-{run - 1}" if run > 1 else None,
            )
        )
        if stale_progress and run > 1:
            out.append(
                RunProgress(
                    event_id=eid(),
                    ts_ms=ts(),
                    job_id=job_id,
                    run=run - 1,
                    node_id=node,
                    progress=0.9,
                    step=9,
                    total_steps=10,
                )
            )
        for step in range(1, progress_steps + 1):
            out.append(
                RunProgress(
                    event_id=eid(),
                    ts_ms=ts(),
                    job_id=job_id,
                    run=run,
                    node_id=node,
                    progress=step / (progress_steps + 1),
                    step=step,
                    total_steps=progress_steps + 1,
                )
            )
        if run < runs:
            out.append(
                JobPreempted(
                    event_id=eid(),
                    ts_ms=ts(),
                    job_id=job_id,
                    run=run,
                    reason="interactive job past its SLA",
                    by_job_id="job-x",
                )
            )
            out.append(
                JobRequeued(
                    event_id=eid(),
                    ts_ms=ts(),
                    job_id=job_id,
                    run=run,
                    reason="preempted",
                    resume_from=f"ckpt-{run}",
                    retries_left=3,
                    cause=RunCause.PREEMPTED,
                )
            )
    if outcome == JobState.COMPLETED:
        out.append(
            JobCompleted(
                event_id=eid(),
                ts_ms=ts(),
                job_id=job_id,
                run=runs,
                artifact_uri=f"local://jobs/{job_id}/runs/{runs}/output/video.mp4",
                gpu_seconds=42.0,
            )
        )
    elif outcome == JobState.FAILED:
        out.append(
            JobFailed(
                event_id=eid(),
                ts_ms=ts(),
                job_id=job_id,
                run=runs,
                reason="generator exited 1",
                failure_class="crash",
                cause=RunCause.RUN_FAILED,
            )
        )
    elif outcome == JobState.CANCELLED:
        out.append(
            JobCancelled(
                event_id=eid(), ts_ms=ts(), job_id=job_id, run=runs, reason="cancelled by alice"
            )
        )
    return out


def cell_status(
    cell: str = "cell-0",
    ts_ms: int = 5_000,
    *,
    nodes: int = 2,
    gpus: int = 8,
    busy: int = 3,
    event_id: str | None = None,
) -> CellStatus:
    """A cell with ``busy`` busy GPUs on its first node and the rest free."""
    node_list = []
    for n in range(nodes):
        states = [GpuSlot.BUSY if n == 0 and g < busy else GpuSlot.FREE for g in range(gpus)]
        node_list.append(
            NodeStatus(
                node_id=f"{cell}-node-{n}",
                state=NodeState.UP,
                gpu_type="H100",
                rail="rail-0",
                gpus=tuple(
                    GpuStatus(
                        index=g,
                        state=s,
                        job_id="job-1" if s == GpuSlot.BUSY else "",
                        run=1 if s == GpuSlot.BUSY else 0,
                    )
                    for g, s in enumerate(states)
                ),
            )
        )
    queues = (
        QueueDepth(tier="free", tenant="acme", queued=4, queued_gpus=4, running_gpus=busy),
        QueueDepth(tier="paid", tenant="globex", queued=1, queued_gpus=8, running_gpus=0),
    )
    return CellStatus(
        event_id=event_id or f"{cell}:status:{ts_ms}",
        ts_ms=ts_ms,
        cell=cell,
        nodes=tuple(node_list),
        queues=queues,
    )


def key_of(event: Any) -> str:
    """The record key its writer uses: the job id for job events (and the agents'
    reports of stored objects), else the cell."""
    if isinstance(event, (RunCheckpointed, RunCompleted)):
        return event.job_id
    return job_id_of(event) or event.cell


def records_for(
    events: list[Any], job_events: str = JOB_EVENTS.name, progress: str = PROGRESS.name
) -> list[Record]:
    """Encoded records where the real writers put them: progress or job-events, keyed by job."""
    next_offset: dict[tuple[str, int], int] = {}
    out = []
    for e in events:
        reported = isinstance(e, (RunProgress, RunCheckpointed, RunCompleted))
        topic = progress if reported else job_events
        partitions = PROGRESS.partitions if topic == progress else JOB_EVENTS.partitions
        key = key_of(e)
        p = partition_for_key(key, partitions)
        off = next_offset.get((topic, p), 0)
        next_offset[(topic, p)] = off + 1
        out.append(Record(topic, p, off, key.encode(), codec.encode(e)))
    return out
