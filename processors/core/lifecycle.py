"""Job lifecycle as data: the legal transitions, in one table.

Theory of operation
-------------------
A job moves ``QUEUED -> ASSIGNED -> RUNNING <-> CHECKPOINTING`` and ends
``COMPLETED``, ``FAILED`` or ``CANCELLED``. Preemption, a lost node or a retry
take it back to ``QUEUED`` (the events say ``JobPreempted``/``JobRequeued``),
keeping its last checkpoint. The fold asks ``allowed`` (``Cell.refused``)
before it changes anything for a job; an action the table does not list is
refused with a recorded reason (a ``ReportIgnored``) and changes nothing.
``next_state`` then applies the checked transition.
"""

from __future__ import annotations

from framespool.schemas.states import TERMINAL_JOB_STATES, JobState

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


def next_state(job_id: str, state: JobState, action: str) -> JobState:
    try:
        return TRANSITIONS[(state, action)]
    except KeyError:
        raise IllegalTransition(job_id, state, action) from None
