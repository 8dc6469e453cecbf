"""The contract's state vocabulary: job states, run phases, node and GPU states.

These values travel in events (``NodeStateChanged.state``, ``NodeStatus.state``,
``GpuStatus.state``) and in read models, so they live beside the schemas where the
core, the projections, the simulator and the chaos harness can all import them
(dependencies point downward: ``schemas`` <- core <- everything else). Each is a
``StrEnum`` whose values are the strings the log has always carried, so members
compare, hash, format and encode exactly like those strings.

Names differ where values differ: a job is ``JobState.RUNNING`` (``"RUNNING"``)
while its current attempt is ``RunPhase.RUNNING`` (``"running"``).
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """Where a job is in its lifecycle (the table is ``processors/core/lifecycle.py``)."""

    QUEUED = "QUEUED"
    ASSIGNED = "ASSIGNED"
    RUNNING = "RUNNING"
    CHECKPOINTING = "CHECKPOINTING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    REJECTED = "REJECTED"


TERMINAL_JOB_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED}
)


class RunPhase(StrEnum):
    """Where one attempt (run) of a job is, as the scheduler sees it."""

    ASSIGNED = "assigned"  # placed; StartRun sent, not yet reported running
    RUNNING = "running"
    EXITING = "exiting"  # asked to checkpoint before leaving (preempt / move)
    STOPPING = "stopping"  # StopRun sent; GPUs held until the node confirms


class NodeState(StrEnum):
    """A node's health as the scheduler sees it."""

    UP = "UP"
    DEGRADED = "DEGRADED"  # no new work; running work stays unless checkpointable
    DRAINING = "DRAINING"  # no new work; running work is checkpointed and moved
    DOWN = "DOWN"  # missed heartbeats or re-registered: its runs are lost


class GpuState(StrEnum):
    """One GPU's health (``processors/core/health.py`` decides it)."""

    OK = "ok"
    DEGRADED = "degraded"  # throttling or corrected ECC errors: no new work
    FAILED = "failed"  # uncorrectable ECC errors: sticky until the node re-registers


class GpuSlot(StrEnum):
    """What ``GpuStatus.state`` says about one GPU in a cell status: its health
    folded with whether it is held (``busy``/``free`` for a healthy GPU)."""

    BUSY = "busy"
    FREE = "free"
    DEGRADED = "degraded"
    FAILED = "failed"
    DOWN = "down"  # its node is DOWN
