"""The tools' one IO step: read the topics and the processors' committed positions.

Order matters, because the log keeps growing while it is read:

1. the scheduler's and admission's committed offsets (an input below them had
   every output delivered before the commit, so a missing output there is real);
2. the scheduler (and commands) topics, each to the high watermark a Fetch saw;
3. job-events and assignments, last, so they hold at least every output of the
   committed inputs read in 2. Outputs of later inputs may be there too: the
   tools recognise them by their event ids and leave them out.
"""

from __future__ import annotations

from collections.abc import Iterable

from framespool.log import LogConsumer, LogError, read_all
from framespool.processors.tools.history import LogContents
from framespool.schemas import topics as catalogue
from framespool.schemas.topics import Topics


def committed_positions(
    bootstrap: str, group: str, topic: str, partitions: int, timeout_s: float = 10.0
) -> dict[int, int]:
    """The group's committed next offsets of ``topic`` (0 where none). Reading them
    joins nothing: the group's members are not disturbed."""
    with LogConsumer(bootstrap, group) as consumer:
        found = consumer.committed(topic, range(partitions), timeout=timeout_s)
    return {p: off or 0 for p, off in found.items()}


def read_log(
    bootstrap: str,
    topics: Topics = catalogue,
    *,
    cells: Iterable[int] | None = None,
    commands: bool = True,
    group_suffix: str = "",
    timeout_s: float = 30.0,
) -> LogContents:
    """Everything the tools need, in the order of the module docstring.

    ``cells``: scheduler partitions to read (all when None). ``group_suffix``
    names the processors' groups as ``python -m framespool.processors --topic-suffix`` does.
    """
    suffix = f".{group_suffix}" if group_suffix else ""
    parts = sorted(cells) if cells is not None else None
    try:
        committed = {
            "scheduler": committed_positions(
                bootstrap,
                catalogue.SCHEDULER_GROUP + suffix,
                topics.SCHEDULER.name,
                topics.SCHEDULER.partitions,
            ),
            "admission": committed_positions(
                bootstrap,
                catalogue.ADMISSION_GROUP + suffix,
                topics.COMMANDS.name,
                topics.COMMANDS.partitions,
            ),
        }
    except LogError:
        committed = {}  # unknown: every input counts as possibly in flight
    scheduler = read_all(bootstrap, topics.SCHEDULER.name, parts, timeout_s=timeout_s)
    command_records = (
        read_all(bootstrap, topics.COMMANDS.name, timeout_s=timeout_s) if commands else []
    )
    job_events = read_all(bootstrap, topics.JOB_EVENTS.name, timeout_s=timeout_s)
    assignments = read_all(bootstrap, topics.ASSIGNMENTS.name, timeout_s=timeout_s)
    return LogContents(
        scheduler=scheduler,
        job_events=job_events,
        assignments=assignments,
        commands=command_records,
        committed=committed,
        topics=topics,
    )
