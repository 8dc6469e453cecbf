"""The clock: the only source of time for the cells' folds (docs/design.md#the-log).

Every ``interval_s`` it appends ``Tick(now_ms=<wall clock>)`` to every
partition of the scheduler topic (partition p is cell ``cell-<p>``), keyed by
the cell id, with the event id ``clock:<cell>:<now_ms>``. ``now_ms`` never goes
backwards, even if the wall clock does. Several clocks may run: the cells
ignore a Tick older than their time, and the event ids of equal Ticks agree.
A round that cannot be delivered is logged and the clock keeps going (its
Ticks still arrive, late, once the broker answers; a late Tick is harmless).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from framespool.log import LogError, LogProducer
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.topics import Topics, cell_of_partition

log = logging.getLogger(__name__)


def ticks(now_ms: int, partitions: int) -> list[tuple[int, ev.Tick]]:
    """The Ticks of one round: ``(partition, Tick)`` for every cell."""
    out = []
    for p in range(partitions):
        cell = cell_of_partition(p)
        out.append(
            (p, ev.Tick(event_id=f"clock:{cell}:{now_ms}", ts_ms=now_ms, cell=cell, now_ms=now_ms))
        )
    return out


class Clock:
    def __init__(
        self,
        producer: LogProducer,
        topics: Topics = catalogue,
        interval_s: float = 0.25,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s} must be positive")
        self.producer = producer
        self.topic = topics.SCHEDULER
        self.interval_s = interval_s
        self._wall = wall
        self.last_ms = 0
        self.rounds = 0

    def tick_once(self) -> int:
        """Send one round of Ticks and wait for them; return its ``now_ms``."""
        now_ms = max(self.last_ms, int(self._wall() * 1000))
        self.last_ms = now_ms
        for partition, tick in ticks(now_ms, self.topic.partitions):
            self.producer.produce(self.topic.name, tick.cell, codec.encode(tick), partition)
        self.producer.flush(max(1.0, 4 * self.interval_s))
        self.rounds += 1
        return now_ms

    def run(self, stop: threading.Event) -> None:
        """Tick every ``interval_s`` (on a fixed schedule, not drifting) until ``stop``."""
        log.info(
            "clock: %d cells of %s every %g s",
            self.topic.partitions,
            self.topic.name,
            self.interval_s,
        )
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.tick_once()
            except LogError as exc:
                log.warning("clock: a round of Ticks was not confirmed: %s", exc)
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow broker): skip the missed rounds
                next_at = time.monotonic()
                delay = 0
            stop.wait(delay)
