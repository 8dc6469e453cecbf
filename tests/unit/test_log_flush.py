"""LogProducer.flush waits for the poll thread's delivery reports, never in
librdkafka's blocking flush (which sleeps in 10 ms slices while another thread
serves the reports: >= 10 ms per processor batch)."""

from __future__ import annotations

import threading

import pytest

from framespool.log import LogError, kafka


class FakeProducer:
    """librdkafka's surface as LogProducer uses it; poll() delivers what is queued."""

    def __init__(self, settings: dict) -> None:
        self.lock = threading.Lock()
        self.queued: list = []
        self.blocking_flushes: list[float] = []
        self.fail_next = False

    def produce(self, topic, value=None, key=None, partition=-1, headers=None, on_delivery=None):
        with self.lock:
            self.queued.append((topic, key, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        with self.lock:
            ready, self.queued = self.queued, []
        for topic, key, callback in ready:
            callback(None, FakeMessage(topic, key))
        if not ready:
            threading.Event().wait(min(timeout, 0.001))
        return len(ready)

    def flush(self, timeout: float = 0) -> int:
        if timeout > 0:
            self.blocking_flushes.append(timeout)
        return len(self)

    def __len__(self) -> int:
        with self.lock:
            return len(self.queued)

    def purge(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeMessage:
    def __init__(self, topic, key) -> None:
        self._topic, self._key = topic, key

    def topic(self):
        return self._topic

    def key(self):
        return self._key

    def partition(self):
        return 0

    def offset(self):
        return 0


@pytest.fixture
def producer(monkeypatch):
    made: list[FakeProducer] = []

    def factory(settings):
        made.append(FakeProducer(settings))
        return made[-1]

    monkeypatch.setattr(kafka.producer, "Producer", factory)
    p = kafka.LogProducer("b:1")
    yield p, made[0]
    p.close()


def test_flush_returns_once_the_poll_thread_delivered_without_a_blocking_flush(producer):
    log_producer, fake = producer
    for i in range(50):
        log_producer.produce("t", f"k{i}", b"v")
    log_producer.flush(timeout=30)
    assert len(fake) == 0
    assert fake.blocking_flushes == []  # never librdkafka's 10 ms slices


def test_flush_still_raises_a_failed_delivery(producer):
    log_producer, fake = producer
    original = fake.poll

    def failing_poll(timeout: float = 0) -> int:
        with fake.lock:
            ready, fake.queued = fake.queued, []
        for topic, key, callback in ready:
            callback(
                kafka.producer.KafkaError(kafka.producer.KafkaError._MSG_TIMED_OUT),
                FakeMessage(topic, key),
            )
        return len(ready) or original(timeout)

    fake.poll = failing_poll
    log_producer.produce("t", "k", b"v")
    with pytest.raises(LogError, match="t"):
        log_producer.flush(timeout=30)
