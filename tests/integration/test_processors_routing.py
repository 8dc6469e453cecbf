"""Routing by predicted wait on a real broker: cells offer, admission routes a job to
the cell that can run its shape, and a cell whose agent died drains to the other."""

from __future__ import annotations

import pytest

from framespool.log import partition_for_key
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig, rendezvous
from framespool.schemas import events as ev
from tests.support.processors import (
    T0,
    in_process,
    produce,
    produce_to_cells,
    register,
    submit,
    tick,
    wait_for,
)

pytestmark = pytest.mark.integration

CELLS = ("cell-0", "cell-1")
CELL_CONFIG = CellConfig(
    status_interval_s=1, estimate_interval_s=0, heartbeat_timeout_s=3, drain_grace_s=3
)
NODES = {"cell-0": ("a0",), "cell-1": ("b0", "b1", "b2", "b3")}


def beat(node_id: str, now_ms: int) -> ev.NodeHeartbeat:
    return ev.NodeHeartbeat(
        event_id=f"hb:{node_id}:{now_ms}", ts_ms=now_ms, node_id=node_id, incarnation=1
    )


def seconds(start_s: int, end_s: int, dead: tuple[str, ...] = ()) -> dict[int, list]:
    """Heartbeats of the live nodes and a Tick per cell for each second of cell time."""
    out: dict[int, list] = {0: [], 1: []}
    for s in range(start_s, end_s):
        now = T0 + s * 1000
        for p, cell in enumerate(CELLS):
            out[p] += [beat(n, now) for n in NODES[cell] if n not in dead]
            out[p].append(tick(now, cell))
    return out


def test_a_big_job_goes_where_it_fits_and_a_dead_cells_queue_moves(
    kafka_bootstrap, fresh_topics, tmp_path
):
    t = fresh_topics
    admission = AdmissionConfig(cells=CELLS)
    # a tenant whose home cell is cell-0, so its job goes there while cell-0 is best
    tenant = next(f"t{i}" for i in range(100) if rendezvous(f"t{i}", CELLS) == "cell-0")

    def send(*commands: ev.SubmitJob) -> None:
        for c in commands:
            part = partition_for_key(c.spec.tenant, t.COMMANDS.partitions)
            produce(kafka_bootstrap, t.COMMANDS.name, part, c.spec.tenant, [c])

    def admitted_to(job_id: str, got) -> list[str]:
        return [e.cell for _, e in got if isinstance(e, ev.JobAdmitted) and e.spec.job_id == job_id]

    def kinds_of_small(got) -> list[str]:
        return [type(e).__name__ for _, e in got if getattr(e, "job_id", "") == "small"]

    def queued_after_reroute(got) -> bool:
        kinds = kinds_of_small(got)
        return "JobRerouted" in kinds and "JobQueued" in kinds[kinds.index("JobRerouted") + 1 :]

    with (
        in_process("admission", kafka_bootstrap, t, tmp_path, config=admission),
        in_process("scheduler", kafka_bootstrap, t, tmp_path, config=CELL_CONFIG),
    ):
        registrations = {
            p: [register(n, T0, cell) for n in NODES[cell]] for p, cell in enumerate(CELLS)
        }
        produce_to_cells(kafka_bootstrap, t.SCHEDULER.name, registrations)
        produce_to_cells(kafka_bootstrap, t.SCHEDULER.name, seconds(1, 4))
        wait_for(
            kafka_bootstrap,
            t.COMMANDS.name,
            lambda got: {e.cell for _, e in got if isinstance(e, ev.CellOffer)} == set(CELLS),
            timeout=30,
        )
        # 1. a 32-GPU job: only cell-1 (four 8-GPU nodes) can run it
        send(submit("big", "acme", T0 + 3000, gpus=32, gpus_per_node=8, estimate_s=600))
        got = wait_for(
            kafka_bootstrap, t.JOB_EVENTS.name, lambda got: admitted_to("big", got), timeout=30
        )
        assert admitted_to("big", got) == ["cell-1"]
        # 2. cell-1 is full now; an 8-GPU job goes to cell-0 (idle, and its tenant's home)
        produce_to_cells(kafka_bootstrap, t.SCHEDULER.name, seconds(4, 6))
        send(submit("small", tenant, T0 + 5000, gpus=8, gpus_per_node=8, estimate_s=60))
        got = wait_for(
            kafka_bootstrap, t.JOB_EVENTS.name, lambda got: admitted_to("small", got), timeout=30
        )
        assert admitted_to("small", got) == ["cell-0"]
        # 3. cell-0's agent dies: a0 goes DOWN after 3 s, its queue drains 3 s later;
        # cell-1 queues the job only after it read the second JobAdmitted, so the
        # wait is for that JobQueued, not for the admission alone
        produce_to_cells(kafka_bootstrap, t.SCHEDULER.name, seconds(6, 20, dead=("a0",)))
        got = wait_for(
            kafka_bootstrap,
            t.JOB_EVENTS.name,
            lambda got: len(admitted_to("small", got)) == 2 and queued_after_reroute(got),
            timeout=45,
        )
    assert admitted_to("small", got) == ["cell-0", "cell-1"]
    moved = [e for _, e in got if isinstance(e, ev.JobRerouted)]
    assert [(m.job_id, m.from_cell) for m in moved] == [("small", "cell-0")]
    assert "cell-0 has no UP nodes" in moved[0].reason
    assert not [e for _, e in got if isinstance(e, ev.JobRejected)]
    # on the job's key: queued in cell-0, rerouted, then queued again by cell-1
    kinds = kinds_of_small(got)
    assert kinds[kinds.index("JobRerouted") + 1 :].count("JobQueued") == 1
