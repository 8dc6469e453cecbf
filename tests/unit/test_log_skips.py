"""A LogConsumer re-reads records the broker skipped (framespool.log.kafka, theory of
operation 7): Tansu sometimes answers a Fetch with the batch after the one asked for."""

from __future__ import annotations

import pytest

from framespool.log import kafka


class Msg:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._tp, self._offset = (topic, partition), offset

    def error(self):
        return None

    def topic(self) -> str:
        return self._tp[0]

    def partition(self) -> int:
        return self._tp[1]

    def offset(self) -> int:
        return self._offset

    def key(self):
        return None

    def value(self) -> bytes:
        return b"v"

    def headers(self):
        return None

    def timestamp(self):
        return (1, 1_000)


class SkippingBroker:
    """A consumer over a log of ``size`` records per partition whose next Fetch
    from each offset in ``skip_from`` returns the records after ``skip`` more."""

    def __init__(self, settings: dict) -> None:
        self.pos: dict[tuple[str, int], int] = {}
        self.size = 0
        self.skips: dict[tuple[str, int, int], int] = {}  # (t, p, from) -> records skipped, once
        self.seeks: list[tuple[str, int, int]] = []

    def assign(self, parts) -> None:
        self.pos = {(tp.topic, tp.partition): tp.offset for tp in parts}

    def _fetch(self, n: int) -> list[Msg]:
        out = []
        for (t, p), at in self.pos.items():
            skipped = self.skips.pop((t, p, at), 0)
            at += skipped
            while at < self.size and len(out) < n:
                out.append(Msg(t, p, at))
                at += 1
            self.pos[(t, p)] = at
        return out

    def poll(self, timeout: float = 0):
        got = self._fetch(1)
        return got[0] if got else None

    def consume(self, n: int, timeout: float = 0):
        return self._fetch(n)

    def seek(self, tp) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))
        self.pos[(tp.topic, tp.partition)] = tp.offset

    def close(self) -> None:
        pass


@pytest.fixture
def broker(monkeypatch):
    made: list[SkippingBroker] = []

    def factory(settings: dict) -> SkippingBroker:
        made.append(SkippingBroker(settings))
        return made[-1]

    monkeypatch.setattr(kafka.consumer, "Consumer", factory)
    return made


def read(consumer: kafka.LogConsumer, rounds: int = 20, batch: int = 4) -> list[int]:
    out: list[int] = []
    for _ in range(rounds):
        out += [r.offset for r in consumer.consume(batch, 0)]
    return out


def test_records_the_broker_skipped_are_read_again_in_order(broker):
    consumer = kafka.LogConsumer("b:1")
    fake = broker[0]
    fake.size = 12
    consumer.assign("t", [0], 0)
    fake.skips[("t", 0, 4)] = 5  # the Fetch from 4 answers from 9
    assert read(consumer) == list(range(12))
    assert fake.seeks == [("t", 0, 4)] and consumer.refetches == 1


def test_a_skip_on_the_first_fetch_after_the_assignment_is_read_again(broker):
    consumer = kafka.LogConsumer("b:1")
    fake = broker[0]
    fake.size = 6
    consumer.assign("t", [0, 1], {0: 2, 1: 0})
    fake.skips[("t", 0, 2)] = 2
    got = [(r.partition, r.offset) for _ in range(10) for r in consumer.consume(3, 0)]
    assert [o for p, o in got if p == 0] == [2, 3, 4, 5]
    assert [o for p, o in got if p == 1] == list(range(6))


def test_a_gap_that_stays_is_read_past_after_the_refetches(broker):
    consumer = kafka.LogConsumer("b:1")
    fake = broker[0]
    fake.size = 10
    consumer.assign("t", [0], 0)

    def always_skips(tp) -> None:  # a real gap: the records are gone
        fake.seeks.append((tp.topic, tp.partition, tp.offset))
        fake.pos[(tp.topic, tp.partition)] = tp.offset
        fake.skips[(tp.topic, tp.partition, tp.offset)] = 3

    fake.seek = always_skips
    fake.skips[("t", 0, 4)] = 3
    assert read(consumer) == [0, 1, 2, 3, 7, 8, 9]
    assert len(fake.seeks) == kafka.consumer.SKIP_REFETCHES


def test_poll_reads_skipped_records_again_too(broker):
    consumer = kafka.LogConsumer("b:1")
    fake = broker[0]
    fake.size = 5
    consumer.assign("t", [0], 0)
    fake.skips[("t", 0, 1)] = 2
    got = [r.offset for r in (consumer.poll(0) for _ in range(10)) if r is not None]
    assert got == [0, 1, 2, 3, 4]
