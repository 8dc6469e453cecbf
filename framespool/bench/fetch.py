"""``framespool bench fetch``: what idle consumers cost the embedded broker.

Tansu holds every Fetch for its full ``fetch.wait.max.ms`` and answers only
then (docs/broker-notes.md, "Fetch wait"), so an idle consumer costs the broker
a Fetch per wait for as long as it reads; Kafka (the default, ``--broker``)
parks it, so there a wait of 500 ms costs about two requests a second. For each (fetch wait, partitions)
case this starts ``consumers`` :class:`~framespool.log.LogConsumer` readers
(request-path role: they never rest) of empty partitions, each polled in its
own thread, lets them settle, and reports the broker's CPU over ``seconds``
(% of one core, from ``/proc``, as ``bench pipeline`` reads it).

Cost: ``(settle_s + seconds)`` of wall time per case, plus one broker start.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from framespool.bench.pipeline import process_cpu_s
from framespool.broker import embedded
from framespool.log import LogConsumer, Role
from framespool.schemas.topics import Topic

TOPIC = Topic("framespool.bench-fetch", 8, "unused")


def _case(
    bootstrap: str,
    broker_pid: int,
    wait_ms: int,
    partitions: int,
    consumers: int,
    settle_s: float,
    seconds: float,
) -> float | None:
    stop = threading.Event()
    readers = []
    for _ in range(consumers):
        # no group (it assigns), LogConsumer's default role, named: the setting is librdkafka's
        reader = LogConsumer(
            bootstrap, group_id=None, role=Role.REQUEST_PATH, **{"fetch.wait.max.ms": wait_ms}
        )
        reader.assign(TOPIC.name, range(partitions), 0)
        readers.append(reader)

    def poll(reader: LogConsumer) -> None:
        while not stop.is_set():
            reader.consume(100, 0.1)

    threads = [threading.Thread(target=poll, args=(r,), daemon=True) for r in readers]
    for t in threads:
        t.start()
    try:
        time.sleep(settle_s)
        before, t0 = process_cpu_s(broker_pid), time.monotonic()
        time.sleep(seconds)
        after, elapsed = process_cpu_s(broker_pid), time.monotonic() - t0
    finally:
        stop.set()
        for t in threads:
            t.join()
        for reader in readers:
            reader.close()
    if before is None or after is None:
        return None  # no /proc here
    return round(100 * (after - before) / elapsed, 1)


def bench_fetch(
    waits_ms: list[int],
    partitions: list[int],
    consumers: int = 1,
    settle_s: float = 2.0,
    seconds: float = 8.0,
    broker_kind: str = "kafka",
) -> dict[str, Any]:
    """The broker's CPU (% of one core) per (wait, partitions) case, idle first."""
    if any(p < 1 or p > TOPIC.partitions for p in partitions):
        raise ValueError(f"partitions must be 1..{TOPIC.partitions}, got {partitions}")
    cases = []
    with embedded(broker_kind) as broker:
        broker.create_topics([TOPIC])
        pid = broker.pid
        assert pid is not None
        idle = _case(broker.bootstrap_servers, pid, 0, 1, 0, settle_s, seconds)
        for wait in waits_ms:
            for parts in partitions:
                cpu = _case(
                    broker.bootstrap_servers, pid, wait, parts, consumers, settle_s, seconds
                )
                cases.append(
                    {
                        "wait_ms": wait,
                        "partitions": parts,
                        "consumers": consumers,
                        "broker_cpu_pct": cpu,
                    }
                )
    return {"broker_idle_cpu_pct": idle, "seconds": seconds, "cases": cases}
