"""Why a queued job has not started: machine-readable codes for the log.

The scheduler core puts one of these in the ``reason_code`` field of
``JobQueued`` and ``JobWaitEstimated``, beside the words it puts in ``reason``
(``processors/core/waiting.py`` decides both). Readers (the API's job view, its
event stream, ``framespool status``, the dashboard) branch on the code, never
on the wording. The words name only the job's own tenant, user, model and
numbers, and counts of the cell: never another tenant or its jobs.

| code                 | the job waits because                                          |
|----------------------|----------------------------------------------------------------|
| ``fair_share``       | jobs of higher fair order come first (``position - 1`` of them) |
| ``gpus``             | it is next, and its GPUs (of its type) are not free yet         |
| ``quota``            | its organisation or user holds its GPU quota                    |
| ``concurrency_cap``  | its organisation or user runs as many jobs as its cap allows    |
| ``reservation``      | free GPUs are reserved for a job ahead of it (a gang) it may not delay |
| ``reservation_holder`` | it holds the reservation: it starts when its nodes free       |
| ``breaker``          | a failure breaker is open for its model on its GPU type         |
| ``reserved_capacity`` | the free GPUs are guaranteed to another tier or organisation   |
| ``preempting``       | lower-tier runs are checkpointing to make room for it           |
| ``preemption_limit`` | it may preempt, but the cell's preemption churn limit holds it  |
| ``no_fit``           | no healthy node of the cell can fit its shape now               |
| ``""``               | not recorded: written before codes existed                      |
"""

from __future__ import annotations

from enum import StrEnum


class WaitCode(StrEnum):
    FAIR_SHARE = "fair_share"
    GPUS = "gpus"
    QUOTA = "quota"
    CONCURRENCY_CAP = "concurrency_cap"
    RESERVATION = "reservation"
    RESERVATION_HOLDER = "reservation_holder"
    BREAKER = "breaker"
    RESERVED_CAPACITY = "reserved_capacity"
    PREEMPTING = "preempting"
    PREEMPTION_LIMIT = "preemption_limit"
    NO_FIT = "no_fit"
