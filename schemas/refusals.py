"""Why a fold refused an input: machine-readable codes for ``ReportIgnored``.

The admission and scheduler cores record every input they refuse as a
``ReportIgnored`` whose ``code`` is one of these, beside the words they keep in
``reason`` for audit. Readers (the chaos drill's accounting, the job view, the
history tools) group and branch on the code, never on the wording.

| code                   | the input was refused because                                   |
|------------------------|-----------------------------------------------------------------|
| ``unknown_input``      | the fold has no handler for its type                            |
| ``malformed``          | a required field is missing (``spec.job_id``, ``spec.tenant``)  |
| ``duplicate``          | the job, or its idempotency key, was already decided or known   |
| ``wrong_tenant``       | it names a job that belongs to another tenant                   |
| ``unknown_job``        | it names a job the fold does not hold (never seen, or finished) |
| ``not_here``           | the job was rejected at admission or rerouted to another cell   |
| ``stale_reroute``      | the job already left the cell the reroute names                 |
| ``stale_run``          | the run is unknown, released, ended, or not the job's current   |
| ``not_holder``         | the reporting node does not hold the run                        |
| ``stale_incarnation``  | the node has restarted (or is DOWN) since the report's incarnation |
| ``unregistered_node``  | the node never registered with this cell                        |
| ``stale_heartbeat``    | a heartbeat not newer than the last one taken                   |
| ``illegal_transition`` | the job's lifecycle table does not allow it in the job's state  |
| ``""``                 | not recorded: written before codes existed                      |
"""

from __future__ import annotations

from enum import StrEnum


class IgnoreCode(StrEnum):
    UNKNOWN_INPUT = "unknown_input"
    MALFORMED = "malformed"
    DUPLICATE = "duplicate"
    WRONG_TENANT = "wrong_tenant"
    UNKNOWN_JOB = "unknown_job"
    NOT_HERE = "not_here"
    STALE_REROUTE = "stale_reroute"
    STALE_RUN = "stale_run"
    NOT_HOLDER = "not_holder"
    STALE_INCARNATION = "stale_incarnation"
    UNREGISTERED_NODE = "unregistered_node"
    STALE_HEARTBEAT = "stale_heartbeat"
    ILLEGAL_TRANSITION = "illegal_transition"
    UNRECORDED = ""
