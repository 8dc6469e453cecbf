"""``framespool bench soak``: a steady load for minutes, to show that latency does
not grow with the log.

The embedded stack (agents running the zero-work ``noop`` generator) is offered a
steady ``rate`` of jobs for ``minutes``. Every job's submit -> assigned is taken
as the pipeline bench takes it (its ``JobAssigned`` read back from job-events),
and reported per minute (p50, p99, max) beside the number of records the log
holds by then (every topic's high watermarks summed; Kafka's ListOffsets is
right, so this is exact there). At the end, after a grace, the jobs never seen
assigned are counted: a stack whose reads slow down as its log grows (Tansu's
Fetch lists every stored batch) shows growing minutes and jobs left behind.
Then each minute's jobs are split into the hops they crossed
(``framespool.bench.pipeline.hop_split``, from the producer timestamps read
back from the log), so a minute whose tail grows names the process it grew in.

Cost: the stack's own (about 10 ms of CPU per job on 2 cores), one HTTP client
task per ``concurrency``, one job-events reader; the per-job maps hold
``rate * minutes * 60`` entries; the hop split reads three topics back once at
the end (about a minute per million records).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from framespool.bench.pipeline import (
    HOPS,
    EventWatcher,
    hop_split,
    log_stamps,
    percentiles,
    submit_many,
)
from framespool.broker import free_port
from framespool.stack import Stack, StackConfig

GRACE_S = 60.0  # after the last submission, for the last jobs to be assigned


class MinuteRow(TypedDict):
    """One minute of the soak (``per_minute`` in the report)."""

    minute: int
    submitted: int
    assigned: int
    submit_to_assigned_ms: dict[str, float]
    log_records: int
    hops_ms: dict[str, dict[str, float]]  # hop -> p50/p99/max (``hop_split``)


def log_records(bootstrap: str) -> int:
    """Records in every catalogue topic (high watermarks summed)."""
    from confluent_kafka import Consumer, TopicPartition

    from framespool.schemas.topics import ALL_TOPICS

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "framespool-soak-count"})
    try:
        total = 0
        for topic in ALL_TOPICS:
            for p in range(topic.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic.name, p), 10)
                total += max(0, high)
        return total
    finally:
        consumer.close()


def bench_soak(
    rate: float = 60.0,
    minutes: float = 8.0,
    nodes: int = 8,
    gpus_per_node: int = 8,
    concurrency: int = 16,
    broker: str = "kafka",
    data_dir: Path | None = None,
    say=lambda line: None,
) -> dict[str, Any]:
    workdir = Path(data_dir or tempfile.mkdtemp(prefix="framespool-soak-"))
    config_path = workdir / "soak-config.json"
    workdir.mkdir(parents=True, exist_ok=True)
    # (admission no longer rate-limits: the API's per-tier limits do, far above the offer)
    config_path.write_text('{"scheduler": {"status_interval_s": 5}}')
    stack = Stack(
        StackConfig(
            data_dir=workdir / "stack",
            port=free_port(),
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            nodes_per_agent=max(1, nodes // 2),
            processor_config=config_path,
            broker=broker,
            fresh=True,
        )
    )
    rows: list[MinuteRow] = []
    with stack:
        key = stack.tenant_keys[0]["api_key"]
        watcher = EventWatcher(stack.bootstrap_servers, broker)
        watcher.start()
        sent: dict[str, float] = {}
        sent_wall: dict[str, float] = {}
        minute_of: dict[str, int] = {}
        try:
            total_minutes = max(1, round(minutes))
            per_minute = int(rate * 60 * minutes / total_minutes)
            for m in range(total_minutes):
                batch: dict[str, float] = {}
                t0 = time.perf_counter()
                asyncio.run(
                    submit_many(stack.api_url, key, per_minute, rate, concurrency, batch, sent_wall)
                )
                sent.update(batch)
                minute_of.update({j: m for j in batch})
                # the minute's jobs, read once they had a few seconds to be assigned
                time.sleep(max(0.0, min(5.0, 60.0 - (time.perf_counter() - t0))))
                lat = [
                    1000 * (watcher.assigned[j] - t)
                    for j, t in batch.items()
                    if j in watcher.assigned
                ]
                row: MinuteRow = {
                    "minute": m + 1,
                    "submitted": len(batch),
                    "assigned": len(lat),
                    "submit_to_assigned_ms": percentiles(lat),
                    "log_records": log_records(stack.bootstrap_servers),
                    "hops_ms": {},
                }
                rows.append(row)
                q = row["submit_to_assigned_ms"]
                say(
                    f"soak: minute {m + 1}: {row['assigned']}/{row['submitted']} assigned, "
                    f"p50 {q['p50']} ms p99 {q['p99']} ms max {q['max']} ms, "
                    f"log {row['log_records']:,} records"
                )
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and any(j not in watcher.assigned for j in sent):
                time.sleep(0.5)
            unassigned = sorted(j for j in sent if j not in watcher.assigned)
            records = log_records(stack.bootstrap_servers)
            say("soak: reading the log back for the hop split")
            stamps = log_stamps(stack.bootstrap_servers, set(sent))
        finally:
            watcher.stop()
    # each minute again, now that every job had the grace to be assigned
    for row in rows:
        m = row["minute"] - 1
        lat = [
            1000 * (watcher.assigned[j] - t)
            for j, t in sent.items()
            if minute_of[j] == m and j in watcher.assigned
        ]
        row["assigned"] = len(lat)
        row["submit_to_assigned_ms"] = percentiles(lat)
        mine = {j: t for j, t in sent_wall.items() if minute_of[j] == m}
        row["hops_ms"] = hop_split(mine, stamps, watcher.assigned_wall)
    first, last = rows[0]["submit_to_assigned_ms"], rows[-1]["submit_to_assigned_ms"]
    return {
        "broker": broker,
        "rate": rate,
        "minutes": len(rows),
        "jobs": len(sent),
        "unassigned": len(unassigned),
        "unassigned_sample": unassigned[:10],
        "log_records": records,
        "per_minute": rows,
        "hops": list(HOPS),
        "last_over_first_p50": round(last["p50"] / first["p50"], 2) if first["p50"] else None,
        "last_over_first_p99": round(last["p99"] / first["p99"], 2) if first["p99"] else None,
    }
