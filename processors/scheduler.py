"""The scheduler processor's fold: scheduler-topic records through a cell's core.

Partition p of the scheduler topic is cell ``cell-<p>``; its state is a
``framespool.processors.core.Cell``. A record is decoded; one that is not an input of the
cell (undecodable, another event type, or an event that names another cell)
is dead-lettered; the rest go through ``Cell.apply`` with the position
``cell-<p>@<offset>``, so output event ids are ``cell-<p>@<offset>/<i>``, and
the outputs are routed by :func:`framespool.processors.routing.destinations`:
job events and agent commands, and the cell's ``CellOffer`` (to every commands
partition) and ``JobRerouted`` (to job-events and the tenant's commands
partition), which admission folds.
"""

from __future__ import annotations

import logging

from framespool.log import Record
from framespool.processors.core import Cell, CellConfig
from framespool.processors.routing import (
    Outgoing,
    dead_letter,
    decode_input,
    encode_outputs,
)
from framespool.processors.snapshots import same_config
from framespool.schemas import events as ev
from framespool.schemas import positions
from framespool.schemas import topics as catalogue
from framespool.schemas.deadletter import DeadLetterReason
from framespool.schemas.topics import Topics, cell_of_partition

log = logging.getLogger(__name__)

# What a cell folds (the keys of the core's dispatch table); anything else is dead-lettered.
SCHEDULER_INPUTS: tuple[type, ...] = (
    ev.Tick,
    ev.JobAdmitted,
    ev.CancelJob,
    ev.NodeRegistered,
    ev.NodeHeartbeat,
    ev.RunStarted,
    ev.RunCheckpointed,
    ev.RunCompleted,
    ev.RunFailed,
    ev.RunStopped,
)


def position(cell: str, offset: int) -> str:
    """The input position of a scheduler record: the prefix of its outputs' event ids."""
    return positions.input_position(cell, offset)


class SchedulerFold:
    name = "scheduler"

    def __init__(self, config: CellConfig | None = None, topics: Topics = catalogue) -> None:
        self.config = config or CellConfig()
        self.topics = topics
        # offers and reroutes to admission after the rest (JobRerouted reaches
        # job-events before admission can admit the job elsewhere):
        # framespool.processors.app.delivery_waves
        self.delivered_last = frozenset({topics.COMMANDS.name})

    def new_state(self, partition: int) -> Cell:
        return Cell(self.config, cell_of_partition(partition))

    def adopt(self, cell: Cell, partition: int) -> Cell:
        """A cell loaded from a snapshot runs under the configured policy from now on."""
        if not same_config(cell.config, self.config):
            log.warning(
                "%s: the configuration differs from the snapshot's; the new one applies "
                "from the next input",
                cell.cell_id,
                extra={"cell": cell.cell_id},
            )
            cell.config = self.config
        return cell

    def step(self, cell: Cell, record: Record) -> list[Outgoing]:
        event, rejected = decode_input(record, SCHEDULER_INPUTS, self.name, self.topics)
        if rejected is not None:
            return [rejected]
        claimed = getattr(event, "cell", "")
        if claimed and claimed != cell.cell_id:
            return [
                self.dead_letter(
                    record,
                    DeadLetterReason.WRONG_PARTITION,
                    f"{type(event).__name__} for {claimed!r} arrived on "
                    f"partition {record.partition}, which is {cell.cell_id!r}",
                )
            ]
        return encode_outputs(cell.apply(event, position(cell.cell_id, record.offset)), self.topics)

    def dead_letter(self, record: Record, reason: str, detail: str) -> Outgoing:
        return dead_letter(record, reason, detail, self.name, self.topics)
