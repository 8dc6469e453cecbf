"""The admission processor's fold: commands-topic records through the admission core.

The commands topic is keyed by tenant; each partition has its own
``framespool.processors.core.admission.AdmissionState``. A record is decoded; one that
is not an admission input (``ADMISSION_INPUTS``: ``SubmitJob``/``CancelJob`` from
the API, ``CellOffer``/``JobRerouted`` from the cells' schedulers) is
dead-lettered; the rest go through ``AdmissionState.apply`` with the position
``admission-<p>@<offset>``. A ``JobAdmitted`` is produced twice, with one event
id: to its cell's partition of the scheduler topic and to job-events
(``framespool.processors.routing.destinations``); a turn delivers the cells' copies
only after the rest (``delivered_last``), so a job's partition holds its
``JobAdmitted`` before anything its cell says about it.
"""

from __future__ import annotations

import logging

from framespool.log import Record
from framespool.processors.core.admission import ADMISSION_INPUTS, AdmissionConfig, AdmissionState
from framespool.processors.routing import (
    Outgoing,
    cell_destination,
    dead_letter,
    decode_input,
    encode_outputs,
)
from framespool.processors.snapshots import same_config
from framespool.schemas import positions
from framespool.schemas import topics as catalogue
from framespool.schemas.topics import Topics

log = logging.getLogger(__name__)


def position(partition: int, offset: int) -> str:
    """The input position of a commands record: the prefix of its outputs' event ids."""
    return positions.input_position(positions.admission_source(partition), offset)


class AdmissionFold:
    name = "admission"

    def __init__(self, config: AdmissionConfig | None = None, topics: Topics = catalogue) -> None:
        self.config = config or AdmissionConfig()
        self.topics = topics
        # the cells' copies after job-events': framespool.processors.app.delivery_waves
        self.delivered_last = frozenset({topics.SCHEDULER.name})
        for cell in self.config.cells:  # fail at start-up, not on the first job
            cell_destination(cell, topics)

    def new_state(self, partition: int) -> AdmissionState:
        return AdmissionState(self.config)

    def adopt(self, state: AdmissionState, partition: int) -> AdmissionState:
        if not same_config(state.config, self.config):
            log.warning(
                "admission partition %d: the configuration differs from the snapshot's; "
                "the new one applies from the next command",
                partition,
                extra={"partition": partition},
            )
            state.config = self.config
        return state

    def step(self, state: AdmissionState, record: Record) -> list[Outgoing]:
        event, rejected = decode_input(record, ADMISSION_INPUTS, self.name, self.topics)
        if rejected is not None:
            return [rejected]
        return encode_outputs(
            state.apply(event, position(record.partition, record.offset)), self.topics
        )

    def dead_letter(self, record: Record, reason: str, detail: str) -> Outgoing:
        return dead_letter(record, reason, detail, self.name, self.topics)
