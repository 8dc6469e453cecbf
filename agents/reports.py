"""Build the events an agent reports, with the ids that make them dedupable.

Pure functions (ids and time are arguments). Lifecycle reports of a run get
deterministic ids — ``{node}:{job}:{run}:completed`` and the like — so a
report re-sent after a timeout or a crash is recognisably the same event and
the scheduler dedupes it. Heartbeats and progress are samples: any unique id.
"""

from __future__ import annotations

from collections.abc import Iterable

from framespool.schemas.events import (
    GpuHealth,
    NodeHeartbeat,
    NodeRegistered,
    RunCheckpointed,
    RunCompleted,
    RunFailed,
    RunProgress,
    RunReport,
    RunStarted,
    RunStopped,
)


def lifecycle_id(node_id: str, job_id: str, run: int, what: str) -> str:
    return f"{node_id}:{job_id}:{run}:{what}"


def registered(
    *,
    node_id: str,
    incarnation: int,
    cell: str,
    gpus: int,
    gpu_type: str,
    rail: str,
    cpus: float,
    mem_gb: float,
    ts_ms: int,
) -> NodeRegistered:
    return NodeRegistered(
        event_id=f"{node_id}:{incarnation}:registered",
        ts_ms=ts_ms,
        node_id=node_id,
        incarnation=incarnation,
        cell=cell,
        gpus=gpus,
        gpu_type=gpu_type,
        rail=rail,
        cpus=cpus,
        mem_gb=mem_gb,
    )


def heartbeat(
    *,
    event_id: str,
    node_id: str,
    incarnation: int,
    ts_ms: int,
    gpus: Iterable[GpuHealth],
    runs: Iterable[RunReport],
) -> NodeHeartbeat:
    return NodeHeartbeat(
        event_id=event_id,
        ts_ms=ts_ms,
        node_id=node_id,
        incarnation=incarnation,
        gpus=tuple(gpus),
        runs=tuple(runs),
    )


def started(node_id: str, incarnation: int, job_id: str, run: int, ts_ms: int) -> RunStarted:
    return RunStarted(
        event_id=lifecycle_id(node_id, job_id, run, "started"),
        ts_ms=ts_ms,
        job_id=job_id,
        run=run,
        node_id=node_id,
        incarnation=incarnation,
    )


def progress(
    *,
    event_id: str,
    node_id: str,
    job_id: str,
    run: int,
    ts_ms: int,
    progress: float,
    step: int,
    total_steps: int,
    message: str = "",
    phase: str = "",
) -> RunProgress:
    return RunProgress(
        event_id=event_id,
        ts_ms=ts_ms,
        job_id=job_id,
        run=run,
        node_id=node_id,
        progress=min(max(progress, 0.0), 1.0),
        step=step,
        total_steps=total_steps,
        message=message,
        phase=phase,
    )


def checkpointed(
    node_id: str,
    incarnation: int,
    job_id: str,
    run: int,
    ts_ms: int,
    uri: str,
    step: int,
    progress: float,
    size_bytes: int = 0,
) -> RunCheckpointed:
    return RunCheckpointed(
        event_id=lifecycle_id(node_id, job_id, run, f"checkpoint-{step}"),
        ts_ms=ts_ms,
        job_id=job_id,
        run=run,
        node_id=node_id,
        incarnation=incarnation,
        checkpoint_uri=uri,
        progress=progress,
        step=step,
        size_bytes=size_bytes,
    )


def completed(
    node_id: str,
    incarnation: int,
    job_id: str,
    run: int,
    ts_ms: int,
    uri: str,
    sha256: str,
    size_bytes: int,
) -> RunCompleted:
    return RunCompleted(
        event_id=lifecycle_id(node_id, job_id, run, "completed"),
        ts_ms=ts_ms,
        job_id=job_id,
        run=run,
        node_id=node_id,
        incarnation=incarnation,
        artifact_uri=uri,
        sha256=sha256,
        size_bytes=size_bytes,
    )


def failed(
    node_id: str,
    incarnation: int,
    job_id: str,
    run: int,
    ts_ms: int,
    failure_class: str,
    reason: str,
    exit_code: int = 0,
) -> RunFailed:
    return RunFailed(
        event_id=lifecycle_id(node_id, job_id, run, "failed"),
        ts_ms=ts_ms,
        job_id=job_id,
        run=run,
        node_id=node_id,
        incarnation=incarnation,
        failure_class=failure_class,
        reason=reason[:2000],
        exit_code=exit_code,
    )


def stopped(
    node_id: str, incarnation: int, job_id: str, run: int, ts_ms: int, reason: str
) -> RunStopped:
    return RunStopped(
        event_id=lifecycle_id(node_id, job_id, run, "stopped"),
        ts_ms=ts_ms,
        job_id=job_id,
        run=run,
        node_id=node_id,
        incarnation=incarnation,
        reason=reason,
    )
