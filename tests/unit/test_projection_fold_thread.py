"""The projection folds off the API's event loop, on a store every part may share."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from framespool.log.memory import MemoryLog, MemoryProducer
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.jobs import JobView
from framespool.projections.serialized_store import SerializedStore
from framespool.projections.service import ProjectionService
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.schemas.topics import JOB_EVENTS
from tests.support.projections import lifecycle, records_for


class ThreadRecordingStore(InMemoryViewStore):
    """Notes the thread of every read and commit."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def get(self, job_id: str) -> JobView | None:
        self.threads.add(threading.get_ident())
        return super().get(job_id)

    def commit(self, batch: Batch, from_log: bool = True) -> None:
        self.threads.add(threading.get_ident())
        super().commit(batch, from_log)


def fold_threads(fold_thread: bool) -> tuple[set[int], int, JobView | None]:
    store = ThreadRecordingStore()
    consumer = ProjectionConsumer(
        store, dead_letter_sender=MemoryProducer(), fold_thread=fold_thread
    )

    async def scenario() -> int:
        await consumer.handle(records_for(lifecycle("j1")))
        return threading.get_ident()

    try:
        loop_thread = asyncio.run(scenario())
    finally:
        consumer.close()
    threads = set(store.threads)  # before this thread reads the result below
    return threads, loop_thread, store.get("j1")


def test_the_fold_and_the_commit_run_off_the_event_loop():
    threads, loop_thread, view = fold_threads(True)
    assert threads and loop_thread not in threads
    assert len(threads) == 1  # one fold thread: folds stay in order
    assert view is not None and view.state == "COMPLETED"


def test_control_without_the_fold_thread_the_loop_folds():
    threads, loop_thread, view = fold_threads(False)
    assert threads == {loop_thread}
    assert view is not None and view.state == "COMPLETED"


def test_the_service_folds_off_the_loop_on_a_serialized_store(tmp_path):
    service = ProjectionService.open(tmp_path, "unused:9092", MemoryProducer())
    try:
        assert isinstance(service.store, SerializedStore)
        assert service.consumer.store is service.store
        assert service.consumer._folder is not None
    finally:
        service.close()


class OverlapDetectingStore(InMemoryViewStore):
    """Counts calls that ran while another call was still inside the store."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = 0
        self.overlaps = 0

    def _enter(self) -> None:
        self.inside += 1
        if self.inside > 1:
            self.overlaps += 1
        time.sleep(0.0002)  # give the other threads the interpreter meanwhile
        self.inside -= 1

    def get(self, job_id: str) -> JobView | None:
        self._enter()
        return super().get(job_id)

    def commit(self, batch: Batch, from_log: bool = True) -> None:
        self._enter()
        super().commit(batch, from_log)


def hammer(store) -> None:
    def work(n: int) -> None:
        for i in range(60):
            store.get(f"j{n}-{i}")
            store.commit(Batch(offsets={("t", n): i}))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_a_serialized_store_runs_one_call_at_a_time():
    inner = OverlapDetectingStore()
    hammer(SerializedStore(inner))
    assert inner.overlaps == 0
    assert [inner.offset("t", n) for n in range(4)] == [59] * 4


def test_control_an_unserialized_store_is_entered_concurrently():
    inner = OverlapDetectingStore()
    hammer(inner)
    assert inner.overlaps > 0


def live(store: InMemoryViewStore, **kw) -> tuple[MemoryProducer, ProjectionConsumer]:
    """A projection consumer reading a memory log as ``run()`` does, and a writer to it."""
    log = MemoryLog()
    consumer = ProjectionConsumer(
        store,
        dead_letter_sender=MemoryProducer(),
        consumer_factory=log.consumer,
        fold_thread=True,
        **kw,
    )
    return MemoryProducer(log), consumer


async def write(writer: MemoryProducer, records) -> None:
    for rec in records:
        await writer.send(rec.topic, rec.key, rec.value, partition=rec.partition)


def test_the_polls_do_not_wait_for_the_default_executor_a_tenant_can_fill():
    """Whatever else runs on the loop's default executor (in the API process,
    blocking calls that a tenant's input can make hang) must not stop every
    tenant's fold."""
    store = InMemoryViewStore()
    writer, consumer = live(store, poll_timeout_s=0.05)
    hanging = threading.Event()

    async def scenario() -> str:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        lookups = [loop.run_in_executor(None, hanging.wait, 30) for _ in range(4)]
        run = asyncio.create_task(consumer.run())
        try:
            await write(writer, records_for(lifecycle("j1")))
            await consumer.wait_until(
                lambda: (v := store.get("j1")) is not None and v.terminal, timeout=10
            )
            return store.get("j1").state
        finally:
            hanging.set()
            run.cancel()
            await asyncio.gather(run, *lookups, return_exceptions=True)

    try:
        assert asyncio.run(scenario()) == "COMPLETED"
    finally:
        consumer.close()


class StuckStore(InMemoryViewStore):
    """A store whose commits hang until released (a stuck fold or disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck = threading.Event()
        self.released = threading.Event()

    def commit(self, batch: Batch, from_log: bool = True) -> None:
        if self.stuck.is_set():
            self.released.wait(30)
        super().commit(batch, from_log)


def test_a_partition_the_projection_stops_folding_is_counted_behind_and_warned_once(
    monkeypatch, caplog
):
    from framespool.projections import consumer as projection

    monkeypatch.setattr(projection, "LAG_CHECK_S", 0.02)
    monkeypatch.setattr(projection, "STALL_WARN_S", 0.2)
    store = StuckStore()
    writer, consumer = live(store, topics=(JOB_EVENTS.name,), poll_timeout_s=0.02)
    events = [e for e in lifecycle("j1") if type(e).__name__ != "RunProgress"]

    async def until(predicate, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "not within the timeout"
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        run = asyncio.create_task(consumer.run())
        try:
            first, rest = records_for(events[:2]), records_for(events)[2:]
            await write(writer, first)
            await until(lambda: store.get("j1") is not None)
            await until(lambda: consumer.behind.get(JOB_EVENTS.name) == 0)
            store.stuck.set()
            await write(writer, rest)
            # behind by what its consumer fetched before the fold stuck (1 to 3)
            await until(lambda: consumer.behind.get(JOB_EVENTS.name, 0) > 0, 5)
            await until(lambda: "has folded nothing" in caplog.text, 5)
            await asyncio.sleep(0.3)  # warned once per stall, not per check
            assert caplog.text.count("has folded nothing") == 1
            store.released.set()
            await until(lambda: consumer.behind.get(JOB_EVENTS.name) == 0)
            await until(lambda: f"caught up on {JOB_EVENTS.name}" in caplog.text)
            assert store.get("j1").state == "COMPLETED"
        finally:
            store.released.set()
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)

    caplog.set_level("INFO", logger="framespool.projections.consumer")
    try:
        asyncio.run(scenario())
    finally:
        consumer.close()


def test_the_lag_watch_never_stalls_the_event_loop(monkeypatch):
    """librdkafka's cached watermark read waits while another thread polls the same
    consumer; the watch must wait on a thread of its own, not on the loop (where it
    held every API request for up to the poll's timeout once a check)."""
    from framespool.projections import consumer as projection

    monkeypatch.setattr(projection, "LAG_CHECK_S", 0.02)
    store = InMemoryViewStore()
    log = MemoryLog()

    def slow_consumer():
        c = log.consumer()
        c.high_watermark = lambda topic, p: time.sleep(0.3) or None  # as while a poll runs
        return c

    consumer = ProjectionConsumer(
        store,
        dead_letter_sender=MemoryProducer(),
        consumer_factory=slow_consumer,
        fold_thread=True,
        topics=(JOB_EVENTS.name,),
        poll_timeout_s=0.02,
    )

    async def scenario() -> float:
        run = asyncio.create_task(consumer.run())
        worst, last = 0.0, time.monotonic()
        try:
            end = last + 1.0
            while time.monotonic() < end:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                worst, last = max(worst, now - last), now
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        return worst

    try:
        assert asyncio.run(scenario()) < 0.15
    finally:
        consumer.close()
