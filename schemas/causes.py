"""Why a run ended or was interrupted: machine-readable codes for the log.

The scheduler core puts one of these in the ``cause`` field of ``JobRequeued`` and
``JobFailed`` (the events that end a run other than by completion or
cancellation), next to the human-readable ``reason`` it keeps for audit. Readers
(the simulator's run outcomes, the chaos harness's fault attribution, dashboards)
branch on the code, never on the wording of the reason.

| code                | the run ended because                                          | retry class     |
|---------------------|----------------------------------------------------------------|-----------------|
| ``generator_error`` | the agent reported the generator failed                        | generator_error |
| ``hung``            | the agent reported the generator stopped making progress       | hung            |
| ``run_failed``      | the agent reported another failure class (see failure_class)   | (the agent's)   |
| ``timeout``         | it ran past its hard time limit                                | timeout         |
| ``lease_expired``   | it never started, or went unreported, within its lease         | lease_expired   |
| ``node_down``       | its node missed heartbeats or never confirmed a stop           | node_lost       |
| ``node_reregistered`` | its node came back as a new incarnation                      | node_lost       |
| ``agent_stopped``   | the agent stopped it unasked (e.g. shutting down)              | node_lost       |
| ``member_lost``     | one node of its gang went unreported within the report lease   | node_lost       |
| ``preempted``       | more important work took its GPUs (checkpoint, then requeue)   | (not charged)   |
| ``gpu_ecc``         | moved off a GPU with ECC errors (or a node draining for one)   | (not charged)   |
| ``gpu_throttled``   | moved off a thermally or clock-throttled GPU                   | (not charged)   |
| ``straggler``       | moved off a node where it ran far below its model's median     | (not charged)   |
| ``node_draining``   | moved off a node draining for another reason                   | (not charged)   |
| ``completed``, ``cancelled`` | the run's job completed / was cancelled (their own events) |       |
| ``""``              | not recorded: the event was written before causes existed      |                 |

The retry class is the bucket a failure is charged to (``CellConfig.retries``);
moves and preemptions are not failures and charge nothing.
"""

from __future__ import annotations

from enum import StrEnum


class RunCause(StrEnum):
    GENERATOR_ERROR = "generator_error"
    HUNG = "hung"
    RUN_FAILED = "run_failed"
    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    NODE_DOWN = "node_down"
    NODE_REREGISTERED = "node_reregistered"
    AGENT_STOPPED = "agent_stopped"
    MEMBER_LOST = "member_lost"
    PREEMPTED = "preempted"
    GPU_ECC = "gpu_ecc"
    GPU_THROTTLED = "gpu_throttled"
    STRAGGLER = "straggler"
    NODE_DRAINING = "node_draining"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    UNRECORDED = ""


# Checkpoint-and-move off bad hardware: the run is interrupted, not failed.
MOVES = frozenset(
    {RunCause.GPU_ECC, RunCause.GPU_THROTTLED, RunCause.STRAGGLER, RunCause.NODE_DRAINING}
)

# The retry budget a failure cause is charged to (``RUN_FAILED`` uses the agent's class).
NODE_LOST = "node_lost"
RETRY_CLASS: dict[RunCause, str] = {
    RunCause.GENERATOR_ERROR: "generator_error",
    RunCause.HUNG: "hung",
    RunCause.TIMEOUT: "timeout",
    RunCause.LEASE_EXPIRED: "lease_expired",
    RunCause.NODE_DOWN: NODE_LOST,
    RunCause.NODE_REREGISTERED: NODE_LOST,
    RunCause.AGENT_STOPPED: NODE_LOST,
    RunCause.MEMBER_LOST: NODE_LOST,
}


def of_failure_class(failure_class: str) -> RunCause:
    """The cause for a failure an agent reported with ``failure_class``."""
    if failure_class == RunCause.GENERATOR_ERROR:
        return RunCause.GENERATOR_ERROR
    if failure_class == RunCause.HUNG:
        return RunCause.HUNG
    return RunCause.RUN_FAILED
