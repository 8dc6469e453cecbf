"""Where outputs go, and what becomes a dead letter (pure; no broker)."""

from __future__ import annotations

import pytest

from framespool.log import Record, partition_for_key
from framespool.processors.app import topics_with_suffix
from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.admission import CellCommand
from framespool.processors.routing import (
    RoutingError,
    cell_destination,
    decode_input,
    destinations,
    encode_outputs,
    route,
)
from framespool.processors.scheduler import SCHEDULER_INPUTS, SchedulerFold
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.deadletter import DeadLetterReason

SPEC = ev.JobSpec(job_id="job-1", tenant="acme")


def record(
    value, partition=0, offset=5, key=b"cell-0", topic=catalogue.SCHEDULER.name, headers=()
) -> Record:
    return Record(topic, partition, offset, key, value, tuple(headers))


def test_agent_commands_go_to_the_nodes_assignment_partition():
    start = ev.StartRun(
        event_id="e",
        ts_ms=0,
        node_id="node-17",
        incarnation=1,
        run=1,
        spec=SPEC,
        gpus=(0,),
        placement=(),
        estimate_s=1.0,
    )
    stop = ev.StopRun(event_id="e", ts_ms=0, node_id="node-17", incarnation=1, job_id="j", run=1)
    checkpoint = ev.CheckpointRun(
        event_id="e", ts_ms=0, node_id="node-17", incarnation=1, job_id="j", run=1
    )
    for output in (start, stop, checkpoint):
        d = route(output)
        assert (d.topic, d.key) == (catalogue.ASSIGNMENTS.name, "node-17")
        assert d.partition == partition_for_key("node-17", catalogue.ASSIGNMENTS.partitions)


@pytest.mark.parametrize(
    "output, key",
    [
        (
            ev.JobAssigned(
                event_id="e", ts_ms=0, job_id="job-9", run=1, placement=(), gpus=1, estimate_s=1.0
            ),
            "job-9",
        ),
        (ev.JobQueued(event_id="e", ts_ms=0, job_id="job-9", tenant="t", tier="free"), "job-9"),
        (ev.NodeStateChanged(event_id="e", ts_ms=0, node_id="n3", incarnation=1, state="UP"), "n3"),
        (ev.CellStatus(event_id="e", ts_ms=0, cell="cell-2"), "cell-2"),
        (ev.ReportIgnored(event_id="e", ts_ms=0, subject="job-9#2", reason="stale"), "job-9#2"),
        (
            ev.BreakerTripped(
                event_id="e", ts_ms=0, model_version="m:1", scope="node", key="n3", until_ms=5
            ),
            "n3",
        ),
    ],
)
def test_job_events_are_keyed_by_their_subject(output, key):
    d = route(output)
    assert (d.topic, d.key) == (catalogue.JOB_EVENTS.name, key)
    assert d.partition == partition_for_key(key, catalogue.JOB_EVENTS.partitions)


def test_job_admitted_goes_to_its_cell_and_to_job_events():
    admitted = ev.JobAdmitted(event_id="e", ts_ms=0, spec=SPEC, cell="cell-3")
    to_cell, to_events = destinations(admitted)
    assert (to_cell.topic, to_cell.key, to_cell.partition) == (
        catalogue.SCHEDULER.name,
        "cell-3",
        3,
    )
    assert (to_events.topic, to_events.key) == (catalogue.JOB_EVENTS.name, "job-1")
    with pytest.raises(RoutingError):
        route(admitted)  # not a cell output


def test_a_nodes_own_state_change_goes_to_job_events_and_its_assignment_partition():
    """The agent reads only its assignments partition: a DOWN must reach it there."""
    down = ev.NodeStateChanged(event_id="e", ts_ms=0, node_id="n3", incarnation=2, state="DOWN")
    assert [(d.topic, d.key, d.partition) for d in destinations(down)] == [
        (catalogue.JOB_EVENTS.name, "n3", partition_for_key("n3", catalogue.JOB_EVENTS.partitions)),
        (
            catalogue.ASSIGNMENTS.name,
            "n3",
            partition_for_key("n3", catalogue.ASSIGNMENTS.partitions),
        ),
    ]
    # one GPU's health is the cell's business, not the agent's
    gpu = ev.NodeStateChanged(
        event_id="e", ts_ms=0, node_id="n3", incarnation=2, state="DEGRADED", gpu=1
    )
    assert [d.topic for d in destinations(gpu)] == [catalogue.JOB_EVENTS.name]


def test_a_forwarded_cancel_goes_to_the_cells_partition_unwrapped():
    cancel = ev.CancelJob(event_id="p@1/0", ts_ms=0, job_id="job-1", tenant="acme")
    (d,) = destinations(CellCommand("cell-2", cancel))
    assert (d.topic, d.key, d.partition) == (catalogue.SCHEDULER.name, "cell-2", 2)
    (out,) = encode_outputs([CellCommand("cell-2", cancel)])
    assert codec.decode(out.value) == cancel


def test_a_cell_without_a_partition_is_a_routing_error():
    with pytest.raises(RoutingError, match="partition 9"):
        cell_destination("cell-9")
    with pytest.raises(RoutingError, match="cell-<n>"):
        cell_destination("eu-west")


def test_topics_with_a_suffix_keep_partition_counts():
    topics = topics_with_suffix("abc")
    d = route(ev.CellStatus(event_id="e", ts_ms=0, cell="cell-0"), topics)
    assert d.topic == f"{catalogue.JOB_EVENTS.name}.abc"
    assert topics.SCHEDULER.partitions == catalogue.SCHEDULER.partitions


@pytest.mark.slow
def test_every_output_of_a_simulated_workload_has_a_route():
    from framespool.bench.core import record_tape

    tape, _, config = record_tape(8, 8, 4000, seed=3)
    cell = Cell(config, "cell-0")
    kinds = set()
    for i, event in enumerate(tape):
        for out in encode_outputs(cell.apply(event, f"cell-0@{i}")):
            kinds.add(type(out.event))
            assert out.partition is not None and out.key
    assert {ev.JobAssigned, ev.StartRun, ev.JobQueued, ev.JobCompleted} <= kinds


def test_undecodable_records_become_dead_letters_with_their_key_and_a_reason():
    event, dl = decode_input(
        record(b"garbage", key=b"k1", headers=[("h", b"v")]), SCHEDULER_INPUTS, "scheduler"
    )
    assert event is None
    assert (dl.topic, dl.key, dl.value, dl.partition) == (
        catalogue.DEAD_LETTER.name,
        b"k1",
        b"garbage",
        None,
    )
    headers = dict(dl.headers)
    assert headers["reason"] == b"bad_magic" and headers["h"] == b"v"
    assert (headers["source_partition"], headers["source_offset"]) == (b"0", b"5")
    assert headers["processor"] == b"scheduler"
    _, empty = decode_input(record(None), SCHEDULER_INPUTS, "scheduler")
    assert empty.reason == DeadLetterReason.NO_VALUE


def test_events_of_another_processor_are_dead_lettered():
    submit = ev.SubmitJob(event_id="s", ts_ms=0, spec=SPEC)
    event, dl = decode_input(record(codec.encode(submit)), SCHEDULER_INPUTS, "scheduler")
    assert event is None and dl.reason == DeadLetterReason.UNEXPECTED_TYPE
    assert b"SubmitJob is not an input of the scheduler" in dict(dl.headers)["detail"]


def test_scheduler_inputs_are_what_the_cell_handles():
    assert set(SCHEDULER_INPUTS) == set(Cell._HANDLERS)


def test_scheduler_fold_dead_letters_an_event_for_another_cell():
    fold = SchedulerFold(CellConfig())
    cell = fold.new_state(0)
    tick = ev.Tick(event_id="t", ts_ms=1, cell="cell-1", now_ms=1)
    (dl,) = fold.step(cell, record(codec.encode(tick)))
    assert dl.reason == DeadLetterReason.WRONG_PARTITION and dl.event is None
    assert cell.now_ms == 0  # not folded


def test_scheduler_fold_ids_come_from_the_input_position():
    fold = SchedulerFold(CellConfig())
    cell = fold.new_state(2)
    reg = ev.NodeRegistered(
        event_id="r", ts_ms=0, node_id="n1", incarnation=1, cell="cell-2", gpus=8
    )
    outs = fold.step(cell, record(codec.encode(reg), partition=2, offset=41, key=b"cell-2"))
    assert outs and all(o.event.event_id.startswith("cell-2@41/") for o in outs)


def test_an_output_event_is_one_log_line_naming_every_topic_it_went_to(caplog):
    """JobAdmitted goes to two topics: one INFO line (the per-job log line costs
    CPU per job), not one per record; a dead letter still gets its own line."""
    from framespool.processors.app import _log_outputs
    from framespool.processors.routing import dead_letter

    admitted = ev.JobAdmitted(event_id="adm", ts_ms=1, spec=SPEC, cell="cell-0")
    assigned = ev.JobAssigned(
        event_id="as", ts_ms=2, job_id="job-1", run=1, placement=(), gpus=1, estimate_s=1.0
    )
    bad = dead_letter(record(b"junk"), DeadLetterReason.BAD_MAGIC, "junk", "scheduler")
    outgoing = encode_outputs([admitted, assigned]) + [bad, bad]
    with caplog.at_level("INFO", logger="framespool.processors.app"):
        _log_outputs(outgoing)
    lines = [
        (r.levelname, getattr(r, "event_type", None), getattr(r, "topic", None))
        for r in caplog.records
    ]
    assert lines[:2] == [
        ("INFO", "JobAdmitted", f"{catalogue.SCHEDULER.name},{catalogue.JOB_EVENTS.name}"),
        ("INFO", "JobAssigned", catalogue.JOB_EVENTS.name),
    ]
    assert [r.levelname for r in caplog.records[2:]] == ["WARNING", "WARNING"]


def test_with_headers_keeps_every_field_and_appends():
    import dataclasses

    from framespool.processors.routing import Outgoing

    base = Outgoing("t", b"k", 3, b"v", (("a", b"1"),), event="e", reason="r")
    stamped = base.with_headers((("b", b"2"),))
    assert stamped == dataclasses.replace(base, headers=(("a", b"1"), ("b", b"2")))
    assert [f.name for f in dataclasses.fields(Outgoing)] == [
        "topic",
        "key",
        "partition",
        "value",
        "headers",
        "event",
        "reason",
    ], "a new Outgoing field must be passed on by with_headers"
