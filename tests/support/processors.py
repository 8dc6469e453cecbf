"""Helpers for the processor integration tests (this module holds no tests).

Processors run in-process (a thread each, :class:`InProcess`) or as
``python -m framespool.processors`` subprocesses (:class:`Subprocess`); both are always
stopped by their context managers. Short group timeouts (2000 ms session,
500 ms heartbeats) keep joins at ~1 s on the embedded broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from framespool.log import LogProducer, Record, read_all
from framespool.processors.admission import AdmissionFold
from framespool.processors.app import ProcessorRunner
from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.admission import AdmissionConfig
from framespool.processors.routing import encode_outputs
from framespool.processors.scheduler import SchedulerFold
from framespool.processors.snapshots import SnapshotStore, StatefulProcessor
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue

REPO = Path(__file__).resolve().parents[2]
SESSION_MS, HEARTBEAT_MS = 2000, 500
T0 = 1_800_000_000_000


class InProcess:
    """One processor instance on a thread of the test process."""

    def __init__(
        self,
        role: str,
        bootstrap: str,
        topics: Any,
        data_dir: Path,
        *,
        config: Any = None,
        instance: str = "",
        max_batch: int = 500,
        store: SnapshotStore | None = None,
        **processor_options: Any,  # StatefulProcessor's keywords (shared=, namespace=, ...)
    ) -> None:
        if role == "scheduler":
            fold: Any = SchedulerFold(config or CellConfig(), topics)
            topic, group = topics.SCHEDULER, catalogue.SCHEDULER_GROUP
        else:
            fold = AdmissionFold(config or AdmissionConfig(), topics)
            topic, group = topics.COMMANDS, catalogue.ADMISSION_GROUP
        self.store = store or SnapshotStore(data_dir / role, topic.name)
        processor_options.setdefault("instance", instance or "default")
        processor = StatefulProcessor(fold, self.store, topic.name, **processor_options)
        self.runner = ProcessorRunner(
            processor,
            bootstrap,
            f"{group}.{topics.suffix}",
            input_topic=topic,
            instance=instance,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            max_batch=max_batch,
        )
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"{role}-{instance}", daemon=True)

    def _run(self) -> None:
        try:
            self.runner.run(self.stop_event)
        except BaseException as exc:  # reported to the test through .error
            self.error = exc

    def start(self, wait_assigned: bool = True) -> InProcess:
        self.thread.start()
        if wait_assigned:
            assert self.runner.assigned.wait(15), "no partitions assigned within 15 s"
        return self

    def wait_dead(self, timeout: float = 15.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the processor did not stop"

    def stop(self, timeout: float = 15.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout)
        alive = self.thread.is_alive()
        if not alive:
            self.store.close()
        assert not alive, "the processor did not stop within its timeout"


@contextmanager
def in_process(*args: Any, **kwargs: Any):
    proc = InProcess(*args, **kwargs).start()
    try:
        yield proc
    finally:
        if proc.thread.is_alive():
            proc.stop()
        else:
            proc.store.close()


class Subprocess:
    """``python -m framespool.processors ROLE ...``; stderr goes to a file for the failure message."""

    def __init__(
        self, role: str, bootstrap: str, suffix: str, data_dir: Path, *extra: str, log_dir: Path
    ) -> None:
        self.log_path = log_dir / f"{role}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "framespool.processors",
                role,
                "--bootstrap",
                bootstrap,
                "--data-dir",
                str(data_dir),
                "--topic-suffix",
                suffix,
                "--session-timeout-ms",
                str(SESSION_MS),
                "--heartbeat-interval-ms",
                str(HEARTBEAT_MS),
                *extra,
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(
                f"no exit {timeout} s after SIGTERM:\n{self.log_text()[-3000:]}"
            ) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@contextmanager
def subprocess_processor(*args: Any, **kwargs: Any):
    proc = Subprocess(*args, **kwargs)
    try:
        yield proc
    finally:
        proc.close()


# --------------------------------------------------------------------------
# The log
# --------------------------------------------------------------------------
def produce(bootstrap: str, topic: str, partition: int, key: str, values: Iterable[Any]) -> None:
    """Events (encoded) or raw bytes, in order, to one partition; waits for delivery."""
    produce_to_cells(bootstrap, topic, {partition: list(values)}, key)


def produce_to_cells(
    bootstrap: str, topic: str, by_partition: dict[int, list[Any]], key: str | None = None
) -> None:
    """Like :func:`produce` for several partitions with one producer (a new producer's
    first delivery takes 0.5-1 s). The key defaults to the partition's cell id."""
    with LogProducer(bootstrap) as producer:
        for partition, values in by_partition.items():
            for value in values:
                raw = value if isinstance(value, (bytes, type(None))) else codec.encode(value)
                producer.produce(topic, key or f"cell-{partition}", raw, partition)
        producer.flush()


def decoded(records: Iterable[Record]) -> list[tuple[Record, Any]]:
    return [(r, codec.decode(r.value)) for r in records]


def wait_for(
    bootstrap: str,
    topic: str,
    done: Callable[[list[tuple[Record, Any]]], bool],
    timeout: float = 15.0,
    raw: bool = False,
) -> list:
    """Re-read ``topic`` until ``done(records)`` holds; return the records."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_all(bootstrap, topic, timeout_s=10)
        got = records if raw else decoded(records)
        if done(got):
            return got
        if time.monotonic() > deadline:
            kinds = [type(e).__name__ for _, e in got] if not raw else len(got)
            raise AssertionError(f"{topic}: condition not met within {timeout} s; have {kinds}")
        time.sleep(0.1)


# --------------------------------------------------------------------------
# A deterministic cell workload and its uninterrupted outputs
# --------------------------------------------------------------------------
def tick(now_ms: int, cell: str = "cell-0") -> ev.Tick:
    return ev.Tick(event_id=f"tick:{cell}:{now_ms}", ts_ms=now_ms, cell=cell, now_ms=now_ms)


def register(node_id: str, now_ms: int, cell: str = "cell-0", gpus: int = 8) -> ev.NodeRegistered:
    return ev.NodeRegistered(
        event_id=f"reg:{node_id}",
        ts_ms=now_ms,
        node_id=node_id,
        incarnation=1,
        cell=cell,
        gpus=gpus,
    )


def submit(job_id: str, tenant: str = "acme", ts: int = T0, **spec) -> ev.SubmitJob:
    """A tenant's submit command (test_processors_pipeline.py and _routing.py had one each)."""
    return ev.SubmitJob(
        event_id=f"submit:{job_id}", ts_ms=ts, spec=ev.JobSpec(job_id=job_id, tenant=tenant, **spec)
    )


def admitted(
    job_id: str,
    now_ms: int,
    cell: str = "cell-0",
    gpus: int = 1,
    tenant: str = "acme",
    estimate_s: float = 3.0,
) -> ev.JobAdmitted:
    spec = ev.JobSpec(
        job_id=job_id, tenant=tenant, gpus=gpus, gpus_per_node=gpus, estimate_s=estimate_s
    )
    return ev.JobAdmitted(event_id=f"adm:{job_id}", ts_ms=now_ms, spec=spec, cell=cell)


def cell_workload(config: CellConfig, jobs: int = 14, steps: int = 30) -> list[Any]:
    """Inputs of one cell: two nodes, jobs arriving, agents that start, heartbeat and
    complete what they are told (played against a scratch cell), and Ticks."""
    scratch = Cell(config, "cell-0")
    inputs: list[Any] = []
    running: dict[tuple[str, int], tuple[str, int]] = {}  # (job, run) -> (node, end_ms)
    now = T0

    def feed(event: Any) -> None:
        inputs.append(event)
        pending = list(scratch.apply(event, f"gen@{len(inputs)}"))
        for out in pending:
            if isinstance(out, ev.StartRun):
                started = ev.RunStarted(
                    event_id=f"started:{out.spec.job_id}:{out.run}",
                    ts_ms=now,
                    job_id=out.spec.job_id,
                    run=out.run,
                    node_id=out.node_id,
                    incarnation=out.incarnation,
                )
                inputs.append(started)
                pending.extend(scratch.apply(started, f"gen@{len(inputs)}"))
                running[(out.spec.job_id, out.run)] = (out.node_id, now + 2500)

    feed(tick(now))
    feed(register("n1", now))
    feed(register("n2", now))
    for step in range(steps):
        now += 1000
        if step < jobs:
            feed(admitted(f"job-{step}", now, gpus=(1, 2, 4, 8)[step % 4]))
        feed(tick(now))
        for (job_id, run), (node, end) in list(running.items()):
            if end <= now:
                del running[(job_id, run)]
                feed(
                    ev.RunCompleted(
                        event_id=f"done:{job_id}:{run}",
                        ts_ms=now,
                        job_id=job_id,
                        run=run,
                        node_id=node,
                        incarnation=1,
                    )
                )
        if step % 3 == 0:
            for node in ("n1", "n2"):
                runs = tuple(
                    ev.RunReport(job_id=j, run=r, step_rate=1.0)
                    for (j, r), (n, _) in running.items()
                    if n == node
                )
                feed(
                    ev.NodeHeartbeat(
                        event_id=f"hb:{node}:{now}",
                        ts_ms=now,
                        node_id=node,
                        incarnation=1,
                        runs=runs,
                    )
                )
    return inputs


def expected_outputs(
    records: Iterable[Record], config: CellConfig, topics: Any
) -> dict[tuple[str, str], tuple[int, bytes]]:
    """``{(topic, event id): (partition, value)}`` of an uninterrupted fold of ``records``
    (one scheduler partition) through a fresh Cell. Of the commands topic only
    partition 0 counts: a cell's ``CellOffer`` goes to every partition, the same
    bytes each time (``test_routing``/``test_reroute_log`` check the fan-out)."""
    cells: dict[int, Cell] = {}
    expected = {}
    for r in records:
        cell = cells.setdefault(r.partition, Cell(config, f"cell-{r.partition}"))
        outputs = cell.apply(codec.decode(r.value), f"{cell.cell_id}@{r.offset}")
        for out in encode_outputs(outputs, topics):
            if out.topic == topics.COMMANDS.name and out.partition != 0:
                continue
            expected[(out.topic, out.event.event_id)] = (out.partition, out.value)
    return expected


def actual_outputs(bootstrap: str, topics: Any) -> list[tuple[str, str, int, bytes]]:
    """Every record the fold wrote on job-events and assignments, and on partition 0 of
    the commands topic (the cells' offers): (topic, event id, partition, value)."""
    out = []
    for topic, parts in (
        (topics.JOB_EVENTS.name, None),
        (topics.ASSIGNMENTS.name, None),
        (topics.COMMANDS.name, [0]),
    ):
        for r, event in decoded(read_all(bootstrap, topic, parts, timeout_s=10)):
            if isinstance(event, ev.ProcessorConfigured):
                continue  # written at each start, not by the fold (configured_at_start)
            out.append((topic, event.event_id, r.partition, r.value))
    return out


def configured_at_start(bootstrap: str, topics: Any) -> list[Any]:
    """The ``ProcessorConfigured`` records on job-events: one per processor start."""
    return [
        event
        for _r, event in decoded(read_all(bootstrap, topics.JOB_EVENTS.name, None, timeout_s=10))
        if isinstance(event, ev.ProcessorConfigured)
    ]
