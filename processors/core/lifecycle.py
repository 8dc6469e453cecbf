"""Job lifecycle as data: the legal transitions, in one table.

Theory of operation
-------------------
A job moves ``QUEUED -> ASSIGNED -> RUNNING <-> CHECKPOINTING`` and ends
``COMPLETED``, ``FAILED`` or ``CANCELLED``. Preemption, a lost node or a retry
take it back to ``QUEUED`` (the events say ``JobPreempted``/``JobRequeued``),
keeping its last checkpoint. The fold asks ``next_state`` before every change;
an action the table does not list is refused with a recorded reason and
changes nothing.
"""

from __future__ import annotations

QUEUED = "QUEUED"
ASSIGNED = "ASSIGNED"
RUNNING = "RUNNING"
CHECKPOINTING = "CHECKPOINTING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
REJECTED = "REJECTED"

TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, REJECTED})
ACTIVE = (ASSIGNED, RUNNING, CHECKPOINTING)

# (state, action) -> next state
TRANSITIONS: dict[tuple[str, str], str] = {
    (QUEUED, "assign"): ASSIGNED,
    (QUEUED, "cancel"): CANCELLED,
    (QUEUED, "fail"): FAILED,  # e.g. no longer placeable anywhere
    (ASSIGNED, "start"): RUNNING,
    (ASSIGNED, "complete"): COMPLETED,  # reports may arrive reordered
    (ASSIGNED, "fail"): FAILED,
    (ASSIGNED, "requeue"): QUEUED,
    (ASSIGNED, "cancel"): CANCELLED,
    (ASSIGNED, "checkpointed"): ASSIGNED,
    (RUNNING, "start"): RUNNING,  # duplicate RunStarted is harmless
    (RUNNING, "checkpoint"): CHECKPOINTING,
    (RUNNING, "checkpointed"): RUNNING,
    (RUNNING, "complete"): COMPLETED,
    (RUNNING, "fail"): FAILED,
    (RUNNING, "requeue"): QUEUED,
    (RUNNING, "cancel"): CANCELLED,
    (CHECKPOINTING, "start"): CHECKPOINTING,
    (CHECKPOINTING, "checkpoint"): CHECKPOINTING,
    (CHECKPOINTING, "checkpointed"): CHECKPOINTING,  # resolved by the caller
    (CHECKPOINTING, "complete"): COMPLETED,
    (CHECKPOINTING, "fail"): FAILED,
    (CHECKPOINTING, "requeue"): QUEUED,
    (CHECKPOINTING, "cancel"): CANCELLED,
}


class IllegalTransition(Exception):
    """The caller asked for a transition the table does not allow (a stale or
    out-of-order report, usually): refuse it and record why."""

    def __init__(self, job_id: str, state: str, action: str) -> None:
        super().__init__(f"job {job_id}: cannot {action} while {state}")
        self.reason = f"illegal transition: {action} while {state}"


def next_state(job_id: str, state: str, action: str) -> str:
    try:
        return TRANSITIONS[(state, action)]
    except KeyError:
        raise IllegalTransition(job_id, state, action) from None
