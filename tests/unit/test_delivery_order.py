"""Causes before effects across processes: a turn delivers the records to another
processor's input topic (a fold's ``delivered_last``) only after its other records
are acknowledged (``framespool.processors.app.delivery_waves``).

Without it, admission's two copies of a ``JobAdmitted`` race: the cell could read
its copy and say ``JobQueued`` before the job-events copy lands, and the job's
partition would then show the job queued before it was admitted (the projection
refuses the late ``JobAdmitted`` and loses the job's spec).
"""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from framespool.log import Record
from framespool.log.memory import MemoryLog
from framespool.processors.admission import AdmissionFold
from framespool.processors.app import ProcessorRunner, delivery_waves
from framespool.processors.core.admission import AdmissionConfig
from framespool.processors.routing import Outgoing
from framespool.processors.scheduler import SchedulerFold
from framespool.processors.snapshots import SnapshotStore, StatefulProcessor
from framespool.schemas import codec
from framespool.schemas import topics as catalogue
from framespool.schemas.topics import Topic
from tests.support.admission import submit
from tests.support.snapshots import Journal, JournalConsumer

TOPICS = ("a", "b", "c")


def _outgoing(topics: list[str]) -> list[Outgoing]:
    return [Outgoing(t, None, 0, str(i).encode()) for i, t in enumerate(topics)]


@given(st.lists(st.sampled_from(TOPICS), max_size=30), st.sets(st.sampled_from(TOPICS)))
def test_waves_put_the_late_topics_last_and_keep_every_record_in_order(topics, last):
    outgoing = _outgoing(topics)
    waves = delivery_waves(outgoing, frozenset(last))
    flat = [o for wave in waves for o in wave]
    assert sorted(flat, key=lambda o: int(o.value)) == outgoing  # nothing lost or doubled
    for side in (True, False):  # each side keeps its own order
        mine = [o for o in outgoing if (o.topic in last) is side]
        assert [o for o in flat if (o.topic in last) is side] == mine
    if len(waves) == 2:
        early, late = waves
        assert early and late
        assert all(o.topic not in last for o in early) and all(o.topic in last for o in late)
    else:  # one flush when a turn has records on only one side
        assert len(waves) == 1
        assert all(o.topic in last for o in outgoing) or not any(o.topic in last for o in outgoing)


def test_admission_sends_the_cells_copy_of_an_admission_after_the_job_events_copy():
    fold = AdmissionFold(AdmissionConfig(cells=("cell-0",)))
    record = Record(catalogue.COMMANDS.name, 0, 0, b"acme", codec.encode(submit("j1")))
    outputs = fold.step(fold.new_state(0), record)
    assert {o.topic for o in outputs} == {catalogue.JOB_EVENTS.name, catalogue.SCHEDULER.name}
    early, late = delivery_waves(outputs, fold.delivered_last)
    assert {o.topic for o in early} == {catalogue.JOB_EVENTS.name}
    assert {o.topic for o in late} == {catalogue.SCHEDULER.name}


def test_the_scheduler_sends_what_admission_reads_last():
    fold = SchedulerFold()
    assert fold.delivered_last == frozenset({catalogue.COMMANDS.name})


class TwoTopicFold:
    """One record to "first" and one to "then" per input; "then" is delivered last."""

    name = "two"
    delivered_last = frozenset({"then"})

    def new_state(self, partition: int) -> list:
        return []

    def adopt(self, state: list, partition: int) -> list:
        return state

    def step(self, state: list, record: Record) -> list[Outgoing]:
        state.append(record.value)
        return [
            Outgoing("then", record.key, None, b"then-" + record.value, event=1),
            Outgoing("first", record.key, None, b"first-" + record.value, event=1),
        ]

    def dead_letter(self, record: Record, reason: str, detail: str) -> Outgoing:
        raise AssertionError("no dead letters here")


class OrderProducer:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def produce(self, topic, key, value, partition=None, headers=None, on_delivery=None):
        self.journal.append(f"produce {value.decode()}")

    def flush(self, timeout=30.0):
        self.journal.append("flush")

    def close(self, timeout=30.0):
        pass


def test_a_turn_flushes_the_first_wave_before_it_produces_the_late_one(tmp_path):
    journal, stop = Journal(), threading.Event()
    store = SnapshotStore(tmp_path / "j", "in")
    log = MemoryLog([Topic("in", 1, "x"), Topic("first", 1, "x"), Topic("then", 1, "x")])
    polls = [[Record("in", 0, 0, b"k", b"x"), Record("in", 0, 1, b"k", b"y")]]
    consumer = JournalConsumer(log, journal, polls, stop, "g")
    runner = ProcessorRunner(
        StatefulProcessor(TwoTopicFold(), store, "in"),
        "fake:9092",
        "g",
        input_topic=Topic("in", 1, "x"),
        consumer_factory=lambda *args, **kwargs: consumer,
        producer_factory=lambda *args, **kwargs: OrderProducer(journal),
    )
    runner.run(stop)
    store.close()
    sent = [line for line in journal if line.startswith("produce") or line == "flush"]
    assert sent[:6] == [
        "produce first-x",
        "produce first-y",
        "flush",
        "produce then-x",
        "produce then-y",
        "flush",
    ], journal
