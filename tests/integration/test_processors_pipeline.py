"""Admission and scheduler processors on a real broker: what goes in, what comes out."""

from __future__ import annotations

import statistics
import time

import pytest

from framespool.log import LogConsumer, LogProducer, partition_for_key, read_all
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig
from framespool.schemas import codec
from framespool.schemas import events as ev
from tests.support.processors import (
    T0,
    admitted,
    decoded,
    in_process,
    produce,
    produce_to_cells,
    register,
    submit,
    tick,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_admission_admits_to_job_events_and_the_cells_partition(
    kafka_bootstrap, fresh_topics, tmp_path
):
    t = fresh_topics
    config = AdmissionConfig(cells=("cell-0", "cell-1", "cell-2"))
    commands = t.COMMANDS
    with in_process("admission", kafka_bootstrap, t, tmp_path, config=config):
        produce(
            kafka_bootstrap,
            commands.name,
            partition_for_key("acme", commands.partitions),
            "acme",
            [
                submit("job-a"),
                submit("job-b"),
                submit("job-a"),
                ev.CancelJob(event_id="c1", ts_ms=T0, job_id="job-b", tenant="acme"),
            ],
        )
        events = wait_for(kafka_bootstrap, t.JOB_EVENTS.name, lambda got: len(got) >= 3)
        to_cells = wait_for(kafka_bootstrap, t.SCHEDULER.name, lambda got: len(got) >= 3)
    kinds = sorted((type(e).__name__, getattr(e, "subject", "")) for _, e in events)
    assert kinds == [("JobAdmitted", ""), ("JobAdmitted", ""), ("ReportIgnored", "job-a")]
    by_job = {e.spec.job_id: (r, e) for r, e in events if isinstance(e, ev.JobAdmitted)}
    for r, e in to_cells:
        if isinstance(e, ev.JobAdmitted):
            job_record, job_event = by_job[e.spec.job_id]
            assert e == job_event  # one event, one id, two topics
            assert r.partition == int(e.cell.split("-")[1]) and r.key == e.cell.encode()
            assert job_record.key == e.spec.job_id.encode()
    (forwarded,) = [(r, e) for r, e in to_cells if isinstance(e, ev.CancelJob)]
    assert forwarded[1].job_id == "job-b"
    assert forwarded[0].partition == int(by_job["job-b"][1].cell.split("-")[1])


def test_scheduler_assigns_and_tells_the_node(kafka_bootstrap, fresh_topics, tmp_path):
    t = fresh_topics
    with in_process("scheduler", kafka_bootstrap, t, tmp_path):
        produce(
            kafka_bootstrap,
            t.SCHEDULER.name,
            0,
            "cell-0",
            [tick(T0), register("node-a", T0), admitted("job-1", T0, gpus=4), tick(T0 + 250)],
        )
        events = wait_for(
            kafka_bootstrap,
            t.JOB_EVENTS.name,
            lambda got: any(isinstance(e, ev.JobAssigned) for _, e in got),
        )
        node_records = wait_for(
            kafka_bootstrap,
            t.ASSIGNMENTS.name,
            lambda got: any(isinstance(e, ev.StartRun) for _, e in got),
        )
    (assigned,) = [e for _, e in events if isinstance(e, ev.JobAssigned)]
    assert assigned.job_id == "job-1" and assigned.placement[0].node_id == "node-a"
    # the node's own state (UP on registering) reaches its agent there too, first
    states = [(r, e) for r, e in node_records if isinstance(e, ev.NodeStateChanged)]
    assert [(e.node_id, e.state, r.key) for r, e in states] == [("node-a", "UP", b"node-a")]
    starts = [(r, e) for r, e in node_records if not isinstance(e, ev.NodeStateChanged)]
    ((record, start),) = starts
    assert isinstance(start, ev.StartRun) and start.spec.job_id == "job-1"
    assert record.key == b"node-a"
    assert record.partition == partition_for_key("node-a", t.ASSIGNMENTS.partitions)
    assert start.event_id.startswith("cell-0@2/")  # the JobAdmitted's position


def test_garbage_goes_to_dead_letter_and_later_records_are_processed(
    kafka_bootstrap, fresh_topics, tmp_path
):
    t = fresh_topics
    with in_process("scheduler", kafka_bootstrap, t, tmp_path):
        produce(
            kafka_bootstrap,
            t.SCHEDULER.name,
            0,
            "cell-0",
            [
                tick(T0),
                b"\x00not avro at all",
                submit("wrong-topic"),
                tick(T0, cell="cell-3"),
                register("node-z", T0),
            ],
        )
        letters = wait_for(kafka_bootstrap, t.DEAD_LETTER.name, lambda got: len(got) >= 3, raw=True)
        events = wait_for(
            kafka_bootstrap,
            t.JOB_EVENTS.name,
            lambda got: any(
                isinstance(e, ev.NodeStateChanged) and e.node_id == "node-z" for _, e in got
            ),
        )
    reasons = [(r.header("reason"), r.header("source_offset"), r.key) for r in letters]
    assert reasons == [
        (b"bad_magic", b"1", b"cell-0"),
        (b"unexpected_type", b"2", b"cell-0"),
        (b"wrong_partition", b"3", b"cell-0"),
    ]
    assert letters[0].value == b"\x00not avro at all"
    assert all(r.header("processor") == b"scheduler" for r in letters)
    assert [e.event_id for _, e in events if isinstance(e, ev.NodeStateChanged)] == ["cell-0@4/0"]


def test_two_instances_share_the_cells_and_take_over(kafka_bootstrap, fresh_topics, tmp_path):
    """Cells split across two instances; when one leaves, the other resumes its cells from
    the committed offsets without re-sending what was already sent."""
    t = fresh_topics
    cells = range(t.SCHEDULER.partitions)
    a = in_process("scheduler", kafka_bootstrap, t, tmp_path / "a", instance="a")
    b = in_process("scheduler", kafka_bootstrap, t, tmp_path / "b", instance="b")
    with a as pa, b as pb:
        deadline = time.monotonic() + 15
        while True:
            mine, theirs = pa.runner.processor.partitions, pb.runner.processor.partitions
            if mine and theirs and sorted(mine + theirs) == list(cells):
                break
            assert time.monotonic() < deadline, f"the cells were never split: {mine} {theirs}"
            time.sleep(0.1)
        produce_to_cells(
            kafka_bootstrap,
            t.SCHEDULER.name,
            {p: [tick(T0, f"cell-{p}"), register(f"node-{p}", T0, f"cell-{p}")] for p in cells},
        )
        wait_for(
            kafka_bootstrap,
            t.JOB_EVENTS.name,
            lambda got: sum(isinstance(e, ev.NodeStateChanged) for _, e in got) >= len(cells),
        )
        pa.stop()
        produce_to_cells(
            kafka_bootstrap,
            t.SCHEDULER.name,
            {p: [admitted(f"job-{p}", T0, f"cell-{p}", gpus=2)] for p in cells},
        )
        events = wait_for(
            kafka_bootstrap,
            t.JOB_EVENTS.name,
            lambda got: sum(isinstance(e, ev.JobAssigned) for _, e in got) >= len(cells),
        )
        assert pb.runner.processor.partitions == list(cells)
    ids = [e.event_id for _, e in events]
    assert len(ids) == len(set(ids)), "outputs were re-sent after the takeover"
    assigned = {
        e.job_id: e.placement[0].node_id for _, e in events if isinstance(e, ev.JobAssigned)
    }
    assert assigned == {f"job-{p}": f"node-{p}" for p in cells}


def test_submit_to_assigned_latency(kafka_bootstrap, fresh_topics, tmp_path):
    t = fresh_topics
    config = AdmissionConfig()
    key_partition = partition_for_key("acme", t.COMMANDS.partitions)
    with (
        in_process("admission", kafka_bootstrap, t, tmp_path, config=config),
        in_process("scheduler", kafka_bootstrap, t, tmp_path, config=CellConfig()),
    ):
        produce(kafka_bootstrap, t.SCHEDULER.name, 0, "cell-0", [tick(T0), register("n1", T0)])
        latencies = []
        with LogProducer(kafka_bootstrap) as producer, LogConsumer(kafka_bootstrap) as consumer:
            consumer.assign(t.JOB_EVENTS.name, range(t.JOB_EVENTS.partitions), 0)
            for i in range(12):
                job = f"lat-{i}"
                started = time.monotonic()
                producer.produce(
                    t.COMMANDS.name,
                    "acme",
                    codec.encode(submit(job, gpus=8, gpus_per_node=8)),
                    key_partition,
                )
                producer.flush()
                assigned = None
                while assigned is None and time.monotonic() - started < 10:
                    for _, e in decoded(consumer.consume(100, 0.5)):
                        if isinstance(e, ev.JobAssigned) and e.job_id == job:
                            assigned = e
                assert assigned is not None, f"{job} not assigned within 10 s"
                latencies.append((time.monotonic() - started) * 1000)
                producer.produce(
                    t.SCHEDULER.name,
                    "cell-0",
                    codec.encode(
                        ev.RunCompleted(
                            event_id=f"done:{job}",
                            ts_ms=T0,
                            job_id=job,
                            run=assigned.run,
                            node_id="n1",
                            incarnation=1,
                        )
                    ),
                    0,
                )
                producer.flush()
    median = statistics.median(latencies[2:])  # the first include producer warm-up
    print(
        f"submit->assigned through admission+scheduler: median {median:.1f} ms, "
        f"max {max(latencies[2:]):.1f} ms"
    )
    assert median < 250, latencies


def test_records_read_back_are_what_the_helpers_wrote(kafka_bootstrap, fresh_topics):
    """Guards the helpers: produce() writes in order to the given partition."""
    produce(kafka_bootstrap, fresh_topics.SCHEDULER.name, 2, "cell-2", [tick(T0, "cell-2"), b"x"])
    records = read_all(kafka_bootstrap, fresh_topics.SCHEDULER.name, [2])
    assert [r.offset for r in records] == [0, 1] and records[1].value == b"x"
