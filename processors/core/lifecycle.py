"""Lifecycles as data: the legal transitions of jobs, runs and nodes, one table each.

Theory of operation
-------------------
**Jobs.** A job moves ``QUEUED -> ASSIGNED -> RUNNING <-> CHECKPOINTING`` and ends
``COMPLETED``, ``FAILED`` or ``CANCELLED``. Preemption, a lost node or a retry
take it back to ``QUEUED`` (the events say ``JobPreempted``/``JobRequeued``),
keeping its last checkpoint. The fold asks ``allowed`` (``Cell.refused``)
before it changes anything for a job; an action the table does not list is
refused with a recorded reason (a ``ReportIgnored``) and changes nothing.
``next_state`` then applies the checked transition.

**Runs** (``RUN_TRANSITIONS``): a run is placed ASSIGNED, starts RUNNING, may be
asked to checkpoint and leave (EXITING: a preemption, a move, an eviction) and
ends STOPPING, holding its GPUs until its nodes confirm. Every phase change goes
through ``next_phase``; the fold decides a run's change only after its job's
(which the job table refused or allowed), so a run change the table lacks is a
bug in the fold and raises ``IllegalTransition``.

**Nodes** (``NODE_TRANSITIONS``): UP takes work; DEGRADED (a straggler on
probation) takes none and comes back UP when its probation ends; DRAINING (a
failed GPU) takes none and moves its work off; DOWN (missed heartbeats, an
unconfirmed stop, a new incarnation) has lost its runs and is replaced by the
node's next registration, never revived. ``Cell.set_node_state`` asks
``node_allowed`` and refuses with a recorded reason (a ``ReportIgnored``) what
the table does not list, changing nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from framespool.schemas.states import TERMINAL_JOB_STATES, JobState, NodeState, RunPhase

TERMINAL = TERMINAL_JOB_STATES
ACTIVE = (JobState.ASSIGNED, JobState.RUNNING, JobState.CHECKPOINTING)

# (state, action) -> next state
TRANSITIONS: dict[tuple[JobState, str], JobState] = {
    (JobState.QUEUED, "assign"): JobState.ASSIGNED,
    (JobState.QUEUED, "cancel"): JobState.CANCELLED,
    (JobState.QUEUED, "fail"): JobState.FAILED,  # e.g. no longer placeable anywhere
    (JobState.QUEUED, "reroute"): JobState.QUEUED,  # leaves for another cell (drain.py)
    (JobState.ASSIGNED, "start"): JobState.RUNNING,
    (JobState.ASSIGNED, "complete"): JobState.COMPLETED,  # reports may arrive reordered
    (JobState.ASSIGNED, "fail"): JobState.FAILED,
    (JobState.ASSIGNED, "requeue"): JobState.QUEUED,
    (JobState.ASSIGNED, "cancel"): JobState.CANCELLED,
    (JobState.ASSIGNED, "checkpointed"): JobState.ASSIGNED,
    (JobState.RUNNING, "start"): JobState.RUNNING,  # duplicate RunStarted is harmless
    (JobState.RUNNING, "checkpoint"): JobState.CHECKPOINTING,
    (JobState.RUNNING, "checkpointed"): JobState.RUNNING,
    (JobState.RUNNING, "complete"): JobState.COMPLETED,
    (JobState.RUNNING, "fail"): JobState.FAILED,
    (JobState.RUNNING, "requeue"): JobState.QUEUED,
    (JobState.RUNNING, "cancel"): JobState.CANCELLED,
    (JobState.CHECKPOINTING, "start"): JobState.CHECKPOINTING,
    (JobState.CHECKPOINTING, "checkpoint"): JobState.CHECKPOINTING,
    (JobState.CHECKPOINTING, "checkpointed"): JobState.CHECKPOINTING,  # resolved by the caller
    (JobState.CHECKPOINTING, "complete"): JobState.COMPLETED,
    (JobState.CHECKPOINTING, "fail"): JobState.FAILED,
    (JobState.CHECKPOINTING, "requeue"): JobState.QUEUED,
    (JobState.CHECKPOINTING, "cancel"): JobState.CANCELLED,
}


def allowed(state: JobState, action: str) -> bool:
    """Whether the table lists ``action`` from ``state``: ask before changing anything."""
    return (state, action) in TRANSITIONS


def refusal(state: str, action: str) -> str:
    """The recorded reason for a transition the table does not allow."""
    return f"illegal transition: {action} while {state}"


class IllegalTransition(Exception):
    """A transition was applied without asking ``allowed`` first: a bug in the fold
    (every caller checks legality before it mutates anything)."""

    def __init__(self, job_id: str, state: str, action: str) -> None:
        super().__init__(f"job {job_id}: cannot {action} while {state}")
        self.reason = refusal(state, action)


def next_state(
    subject: str, state: Any, action: str, table: Mapping[tuple[Any, str], Any] = TRANSITIONS
) -> Any:
    """``state`` after ``action`` in ``table`` (the job table unless given);
    ``IllegalTransition`` naming ``subject`` if the table lacks the row."""
    try:
        return table[(state, action)]
    except KeyError:
        raise IllegalTransition(subject, state, action) from None


# (phase, action) -> next phase
RUN_TRANSITIONS: dict[tuple[RunPhase, str], RunPhase] = {
    (RunPhase.ASSIGNED, "start"): RunPhase.RUNNING,
    (RunPhase.ASSIGNED, "exit"): RunPhase.EXITING,
    (RunPhase.RUNNING, "exit"): RunPhase.EXITING,
    (RunPhase.ASSIGNED, "stop"): RunPhase.STOPPING,
    (RunPhase.RUNNING, "stop"): RunPhase.STOPPING,
    (RunPhase.EXITING, "stop"): RunPhase.STOPPING,
}


def next_phase(run_key: tuple[str, int], phase: RunPhase, action: str) -> RunPhase:
    """The run's phase after ``action``; ``IllegalTransition`` if the table lacks it."""
    return next_state(f"{run_key[0]} run {run_key[1]}", phase, action, RUN_TRANSITIONS)


# (state, new state) a node may change between; the same state is no change
NODE_TRANSITIONS: frozenset[tuple[NodeState, NodeState]] = frozenset(
    {
        (NodeState.UP, NodeState.DEGRADED),
        (NodeState.DEGRADED, NodeState.UP),
        (NodeState.UP, NodeState.DRAINING),
        (NodeState.DEGRADED, NodeState.DRAINING),
        (NodeState.UP, NodeState.DOWN),
        (NodeState.DEGRADED, NodeState.DOWN),
        (NodeState.DRAINING, NodeState.DOWN),
    }
)


def node_allowed(state: NodeState, new: NodeState) -> bool:
    """Whether a node may go from ``state`` to ``new``: ask before changing it."""
    return (state, new) in NODE_TRANSITIONS
