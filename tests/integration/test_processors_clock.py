"""The clock: one Tick per cell per round, keyed by cell, time never going backwards."""

from __future__ import annotations

import threading

import pytest

from framespool.log import LogProducer, read_all
from framespool.log.memory import MemoryProducer
from framespool.processors.clock import Clock, ticks
from framespool.schemas import codec
from framespool.schemas import events as ev


def test_a_round_has_one_tick_per_cell_with_a_deterministic_id():
    round_ = ticks(1_234, 3)
    assert [(p, t.cell, t.event_id, t.now_ms, t.ts_ms) for p, t in round_] == [
        (0, "cell-0", "clock:cell-0:1234", 1234, 1234),
        (1, "cell-1", "clock:cell-1:1234", 1234, 1234),
        (2, "cell-2", "clock:cell-2:1234", 1234, 1234),
    ]


def test_time_never_goes_backwards_even_if_the_wall_clock_does():
    wall = iter([100.0, 99.0, 100.5])
    clock = Clock(MemoryProducer(), interval_s=0.25, wall=lambda: next(wall))
    assert [clock.tick_once() for _ in range(3)] == [100_000, 100_000, 100_500]


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        Clock(MemoryProducer(), interval_s=0)


@pytest.mark.integration
def test_clock_ticks_every_cell_partition(kafka_bootstrap, fresh_topics):
    t = fresh_topics
    stop = threading.Event()
    with LogProducer(kafka_bootstrap) as producer:
        clock = Clock(producer, t, interval_s=0.05)
        thread = threading.Thread(target=clock.run, args=(stop,))
        thread.start()
        try:
            while clock.rounds < 3:
                stop.wait(0.02)
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()
    records = read_all(kafka_bootstrap, t.SCHEDULER.name)
    per_partition = {
        p: [r for r in records if r.partition == p] for p in range(t.SCHEDULER.partitions)
    }
    for p, recs in per_partition.items():
        assert len(recs) >= 3
        events = [codec.decode(r.value) for r in recs]
        assert all(r.key == f"cell-{p}".encode() for r in recs)
        assert all(isinstance(e, ev.Tick) and e.cell == f"cell-{p}" for e in events)
        assert all(e.event_id == f"clock:cell-{p}:{e.now_ms}" for e in events)
        assert [e.now_ms for e in events] == sorted(e.now_ms for e in events)
