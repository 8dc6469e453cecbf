"""Many instances, one cell: takeover from the shared snapshot on a log whose head is
gone, and a zombie instance fenced off (real broker, real S3 API / shared directory)."""

from __future__ import annotations

import os
import signal
import uuid
from functools import partial

import pytest

from framespool.log import LogConsumer, LogProducer, Record, create_topics, read_all
from framespool.processors.core import CellConfig
from framespool.processors.shared_snapshots import DirSharedSnapshots, S3SharedSnapshots
from framespool.schemas import codec
from framespool.schemas import topics as catalogue
from framespool.schemas.events import ProcessorConfigured
from framespool.schemas.fencing import EpochFence, read_fencing
from framespool.schemas.topics import Topic, TopicSet
from tests.support import waiting
from tests.support.processors import (
    cell_workload,
    expected_outputs,
    in_process,
    produce,
    subprocess_processor,
)

pytestmark = pytest.mark.integration

wait_until = partial(waiting.wait_until, every_s=0.1)

CONFIG = CellConfig()


def uninterrupted(inputs: list, topics) -> dict:
    """``{(topic, event id): (partition, value)}`` of folding ``inputs`` (offsets
    0..n-1 of partition 0) through a fresh cell, without a break."""
    records = [
        Record(topics.SCHEDULER.name, 0, i, b"cell-0", codec.encode(event))
        for i, event in enumerate(inputs)
    ]
    return expected_outputs(records, CONFIG, topics)


def outputs_with_headers(bootstrap: str, topics) -> list[tuple[str, str, int, bytes, tuple]]:
    out = []  # of the commands topic (the cells' offers) partition 0, as expected_outputs
    for topic, parts in (
        (topics.JOB_EVENTS.name, None),
        (topics.ASSIGNMENTS.name, None),
        (topics.COMMANDS.name, [0]),
    ):
        for r in read_all(bootstrap, topic, parts, timeout_s=10):
            event = codec.decode(r.value)
            if isinstance(event, ProcessorConfigured):
                continue  # written at each start, outside the fold (and its fencing)
            out.append((topic, event.event_id, r.partition, r.value, r.headers))
    return out


def input_offset(event_id: str) -> int:
    return int(event_id.split("@")[1].split("/")[0])


def test_topics_with_retention_are_created_on_the_broker(kafka_bootstrap):
    name = f"retention-{uuid.uuid4().hex[:8]}"
    topic = Topic(name, 2, "test", retention_ms=3_600_000, retention_bytes=1 << 30)
    assert topic.configs() == {
        "retention.ms": "3600000",
        "retention.bytes": "1073741824",
        "segment.ms": "86400000",  # segments roll daily, so retention frees a day at a time
    }
    assert create_topics(kafka_bootstrap, [topic]) == [name]
    assert create_topics(kafka_bootstrap, [topic]) == []
    with LogProducer(kafka_bootstrap) as producer:
        producer.produce(name, "k", b"v", 1)
        producer.flush()
    assert [r.value for r in read_all(kafka_bootstrap, name, [1])] == [b"v"]


def test_takeover_from_the_shared_snapshot_when_the_log_before_it_is_gone(
    kafka_bootstrap, fresh_topics, tmp_path, s3_endpoint, s3_bucket
):
    """Instance A folds the first half of a cell's log and stops; its snapshot is in S3.
    The log is then 'truncated': a fresh topic holds only the records after the
    snapshot's offset (at their original offsets; the ones before are poison that
    would be dead-lettered if read). Instance B takes over from the shared snapshot
    and decides exactly what an uninterrupted run decides."""
    first, inputs = fresh_topics, cell_workload(CONFIG)
    k = len(inputs) // 2
    shared = S3SharedSnapshots(s3_bucket, s3_endpoint, prefix="cells")
    produce(kafka_bootstrap, first.SCHEDULER.name, 0, "cell-0", inputs[:k])
    with in_process(
        "scheduler", kafka_bootstrap, first, tmp_path / "a", instance="a", shared=shared
    ) as a:
        wait_until(
            lambda: 0 in a.runner.processor.partitions and a.runner.processor.offset(0) == k - 1,
            20,
            "A never folded the first half",
        )
    snapshot, _ = shared.load(first.SCHEDULER.name, 0)  # published on shutdown
    assert (snapshot.offset, snapshot.instance, snapshot.epoch) == (k - 1, "a", 1)

    # the log after retention: offsets 0..k-1 hold nothing readable
    second = TopicSet.with_suffix(uuid.uuid4().hex[:10])
    create_topics(kafka_bootstrap, second.all)
    produce(kafka_bootstrap, second.SCHEDULER.name, 0, "cell-0", [b"gone"] * k + inputs[k:])
    with in_process(
        "scheduler",
        kafka_bootstrap,
        second,
        tmp_path / "b",
        instance="b",
        shared=shared,
        namespace=first.SCHEDULER.name,  # the snapshots of the topic it replaces
    ) as b:
        wanted = {
            key: value
            for key, value in uninterrupted(inputs, second).items()
            if input_offset(key[1]) >= k
        }
        assert wanted, "the second half should decide something"

        def complete():
            got = {
                (t, i): (p, v) for t, i, p, v, _ in outputs_with_headers(kafka_bootstrap, second)
            }
            return got if set(wanted) <= set(got) else None

        got = wait_until(complete, 30, "the new owner's decisions never all arrived")
        assert b.runner.processor.epoch(0) == 2
    assert got == wanted  # byte for byte, nothing before the snapshot re-decided
    assert read_all(kafka_bootstrap, second.DEAD_LETTER.name) == []  # no poison was read
    snapshot, _ = shared.load(first.SCHEDULER.name, 0)
    assert (snapshot.offset, snapshot.instance, snapshot.epoch) == (len(inputs) - 1, "b", 2)


def test_a_paused_instance_is_fenced_off_after_another_took_over(
    kafka_bootstrap, fresh_topics, tmp_path
):
    """A owns the cell and is SIGSTOPped with state it has not published; B takes
    over and decides the rest; SIGCONT A: its snapshot is refused, and it produces
    nothing for the inputs B decided; the outputs that count equal an
    uninterrupted run's."""
    t, inputs = fresh_topics, cell_workload(CONFIG)
    half = len(inputs) // 2
    shared_dir = tmp_path / "shared"
    shared = DirSharedSnapshots(shared_dir)
    ns = t.SCHEDULER.name
    group = f"{catalogue.SCHEDULER_GROUP}.{t.suffix}"

    def args(name: str, *extra: str):
        return (
            "scheduler",
            kafka_bootstrap,
            t.suffix,
            tmp_path / name,
            "--instance",
            name,
            "--shared-snapshots",
            str(shared_dir),
            *extra,
        )

    def committed() -> int:
        with LogConsumer(kafka_bootstrap, group) as c:
            return c.committed(ns, [0])[0] or 0

    # A publishes only on revoke/shutdown, so it is paused with unpublished state
    with subprocess_processor(*args("a", "--publish-interval", "3600"), log_dir=tmp_path) as a:
        wait_until(lambda: shared.owner(ns, 0).instance == "a", 20, "A never claimed", a.log_text)
        produce(kafka_bootstrap, ns, 0, "cell-0", inputs[:half])
        wait_until(
            lambda: committed() == half, 20, "A never got through the first half", a.log_text
        )
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            with subprocess_processor(*args("b"), log_dir=tmp_path) as b:
                wait_until(
                    lambda: shared.owner(ns, 0).instance == "b", 30, "B never took over", b.log_text
                )
                produce(kafka_bootstrap, ns, 0, "cell-0", inputs[half:])
                wait_until(lambda: committed() == len(inputs), 30, "B never finished", b.log_text)
                os.kill(a.proc.pid, signal.SIGCONT)  # the zombie wakes up beside B
                wait_until(
                    lambda: "fenced off partition 0" in a.log_text(),
                    30,
                    "A was not fenced",
                    a.log_text,
                )
                assert a.terminate() == 0, a.log_text()[-3000:]
                assert b.terminate() == 0, b.log_text()[-3000:]
        finally:
            if a.proc.poll() is None:
                os.kill(a.proc.pid, signal.SIGCONT)
    # fenced by the refused snapshot of its revoke, or (if it fetched B's inputs
    # before it noticed the rebalance) by the ownership check before folding them
    fenced = [line for line in a.log_text().splitlines() if "fenced off partition 0" in line]
    assert len(fenced) == 1 and "my owner epoch 1, 'b' claimed epoch 2" in fenced[0]
    assert "was refused" in fenced[0] or "ownership check" in fenced[0]
    snapshot, _ = shared.load(ns, 0)
    assert (snapshot.instance, snapshot.epoch, snapshot.offset) == ("b", 2, len(inputs) - 1)

    fence, counted = EpochFence(), {}
    for topic, event_id, partition, value, headers in outputs_with_headers(kafka_bootstrap, t):
        _position, epoch = read_fencing(headers)
        # A decided only before it was paused, B only after it took over
        assert epoch == (1 if input_offset(event_id) < half else 2), (event_id, epoch)
        if fence.admit(headers):
            counted[(topic, event_id)] = (partition, value)
    assert counted == uninterrupted(inputs, t)


def test_the_takeover_bench_decides_like_an_uninterrupted_run(kafka_bootstrap, tmp_path):
    from framespool.bench.takeover import bench_takeover

    result = bench_takeover(
        records=3000,
        suffix=300,
        nodes=4,
        bootstrap=kafka_bootstrap,
        shared_location=str(tmp_path / "shared"),
    )
    assert result["decisions_match"] and result["decisions"] > 0
    assert result["snapshot_offset"] == 2699 and result["snapshot_bytes"] > 0
    assert result["takeover_s"] >= 0  # a figure for the report, not a limit
