"""``framespool bench pipeline``: the whole embedded stack, end to end.

Two measurements on a fresh embedded stack whose agents run the zero-work
``noop`` generator (in the agent's process, no shell), so the numbers are the
pipeline's (HTTP API -> commands -> admission -> scheduler -> agent ->
scheduler -> job-events), not generation's:

1. throughput: ``jobs`` submissions as fast as the API takes them (``concurrency``
   clients); ``jobs_per_s`` = jobs / (last JobCompleted - first submit);
2. latency: submissions at a fixed offered ``rate`` for ``seconds``;
   submit -> JobAssigned as seen by a consumer of job-events.

Job events are read by the bench's own consumer of the job-events topic, so
the figures include one consumer hop.

3. the latency budget per hop (:func:`hop_split`): after the latency phase the
   bench reads the log back and splits each latency-phase job's submit ->
   assigned into the hops it crossed, from the producer timestamps (CreateTime,
   ms) the records carry:

   ============  ==============================================================
   ``api``       client send -> SubmitJob on the commands topic (HTTP, validation)
   ``admission`` SubmitJob -> JobAdmitted on the scheduler topic (commands hop,
                 admission fold, produce)
   ``decision``  JobAdmitted -> JobAssigned on job-events (scheduler-topic hop,
                 the cell's fold, produce)
   ``delivery``  JobAssigned -> RunStarted on the scheduler topic (assignments
                 hop, the agent starts the run and reports it)
   ``observe``   JobAssigned -> the bench's consumer saw it (job-events hop)
   ============  ==============================================================

   All processes run on one machine and share its clock, so differences of
   their timestamps are meaningful to the millisecond.

4. the CPU each process used (:class:`CpuMeter`, from ``/proc``; % of one
   core, agents and scheduler instances summed per kind): while the stack
   idles (``cpu_idle_pct``: what the consumers' fetch waits cost at rest) and
   during the latency phase (``cpu_latency_pct``); and the CPU milliseconds
   each kind spent per job in the throughput phase (``cpu_ms_per_job``): the
   cost that bounds jobs/s on a machine of fixed cores, and steadier than
   jobs/s on a machine other work shares.

The bench's reader of job-events is a request-path reader
(``framespool.log.Role``): it stands for a client waiting for its decision.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framespool.broker import free_port
from framespool.stack import Stack, StackConfig

BODY = {"prompt": "bench", "model": "noop", "gpus": 1}


@dataclass
class PipelineResult:
    jobs_per_s: float
    jobs: int
    completed: int
    submit_to_assigned_ms: dict[str, float]
    submit_to_completed_ms: dict[str, float]
    offered_rate: float
    achieved_submit_rate: float
    nodes: int
    gpus: int
    agent_processes: int = 0
    failed: int = 0
    hops_ms: dict[str, dict[str, float]] | None = None
    cpu_idle_pct: dict[str, float] | None = None
    cpu_latency_pct: dict[str, float] | None = None
    cpu_ms_per_job: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class EventWatcher(threading.Thread):
    """Reads job-events and timestamps JobAssigned/JobCompleted per job."""

    def __init__(self, bootstrap: str, broker: str = "kafka") -> None:
        super().__init__(daemon=True)
        from framespool.log import LogConsumer, Role
        from framespool.schemas.topics import JOB_EVENTS

        # the stack's processes are tuned for their broker by the stack; this reader
        # in the bench's own process waits as a request-path reader on that broker
        wait = {"fetch.wait.max.ms": 3} if broker == "tansu" else {}
        self.consumer = LogConsumer(bootstrap, group_id=None, role=Role.REQUEST_PATH, **wait)
        self.consumer.assign(JOB_EVENTS.name, range(JOB_EVENTS.partitions), 0)
        self.assigned: dict[str, float] = {}
        self.assigned_wall: dict[str, float] = {}  # ms since the epoch, for hop_split
        self.completed: dict[str, float] = {}
        self.failed: dict[str, float] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        from framespool.schemas import codec
        from framespool.schemas.events import JobAssigned, JobCompleted, JobFailed, JobRejected

        while not self.stopping.is_set():
            for record in self.consumer.consume(500, timeout=0.05):
                now = time.perf_counter()
                try:
                    event = codec.decode(record.value)
                except codec.DecodeError:
                    continue
                if isinstance(event, JobAssigned):
                    self.assigned.setdefault(event.job_id, now)
                    self.assigned_wall.setdefault(event.job_id, time.time() * 1000)
                elif isinstance(event, JobCompleted):
                    self.completed.setdefault(event.job_id, now)
                elif isinstance(event, (JobFailed, JobRejected)):
                    self.failed.setdefault(event.job_id, now)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.consumer.close()


async def submit_many(
    url: str,
    key: str,
    count: int,
    rate: float,
    concurrency: int,
    sent: dict[str, float],
    sent_wall: dict[str, float] | None = None,
) -> None:
    import aiohttp

    headers = {"Authorization": f"Bearer {key}"}
    queue: asyncio.Queue[int] = asyncio.Queue()
    start = time.perf_counter()

    async def worker(session: aiohttp.ClientSession) -> None:
        while True:
            i = await queue.get()
            if i < 0:
                return
            if rate > 0:
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            t0, wall0 = time.perf_counter(), time.time() * 1000
            async with session.post(f"{url}/v1/jobs", json=BODY, headers=headers) as resp:
                doc = await resp.json()
                if resp.status >= 300:
                    raise RuntimeError(f"submit refused: HTTP {resp.status} {doc}")
            sent[doc["job_id"]] = t0
            if sent_wall is not None:
                sent_wall[doc["job_id"]] = wall0

    for i in range(count):
        queue.put_nowait(i)
    for _ in range(concurrency):
        queue.put_nowait(-1)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    q = (
        statistics.quantiles(ordered, n=100, method="inclusive")
        if len(ordered) > 1
        else [ordered[0]] * 99
    )
    return {"p50": round(q[49], 2), "p99": round(q[98], 2), "max": round(ordered[-1], 2)}


HOPS = ("api", "admission", "decision", "delivery", "observe")
IDLE_CPU_S = 3.0  # how long the idle stack's CPU is sampled


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used; None if it is gone
    or there is no ``/proc`` (then the bench reports no CPU figures)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_kind(name: str) -> str:
    """The row a process's CPU is summed into: ``agent-node-3`` -> ``agents``,
    ``scheduler-1`` -> ``scheduler``, anything else by its own name."""
    if name.startswith("agent"):
        return "agents"
    if name.startswith("scheduler"):
        return "scheduler"
    return name


class CpuMeter:
    """% of one core each kind of process used between :meth:`start` and :meth:`stop`.

    Cost: one read of ``/proc/<pid>/stat`` per process at each end; names that
    share a process share that one reading (read apart, a clock tick of 10 ms
    could fall between them and count for one name only).
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._start: dict[str, float | None] = {}
        self._t0 = 0.0
        self.elapsed_s = 0.0  # of the last start..stop

    def _read(self) -> dict[str, float | None]:
        by_pid = {pid: process_cpu_s(pid) for pid in set(self.pids.values())}
        return {name: by_pid[pid] for name, pid in self.pids.items()}

    def start(self) -> None:
        self._start = self._read()
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        now = self._read()
        elapsed = self.elapsed_s = max(1e-9, time.monotonic() - self._t0)
        out: dict[str, float] = {}
        for name in self.pids:
            before, after = self._start.get(name), now[name]
            if before is None or after is None:
                continue  # gone or restarted meanwhile: no figure rather than a wrong one
            kind = process_kind(name)
            out[kind] = out.get(kind, 0.0) + 100 * (after - before) / elapsed
        out = {k: round(v, 1) for k, v in sorted(out.items())}
        if out:
            out["total"] = round(sum(out.values()), 1)
        return out


def hop_split(
    sent_ms: dict[str, float],
    stamps: dict[str, dict[str, float]],
    observed_ms: dict[str, float],
) -> dict[str, dict[str, float]]:
    """p50/p99/max per hop (module docstring) over the jobs of ``sent_ms``.

    ``stamps[kind][job_id]`` is the producer timestamp (ms) of the job's first
    record of that kind: ``submit``, ``admitted``, ``assigned``, ``started``.
    A job missing a stamp contributes to the hops it has both ends of.
    Cost: O(jobs) plus the sort in :func:`percentiles`.
    """
    ends = {
        "api": (sent_ms, stamps.get("submit", {})),
        "admission": (stamps.get("submit", {}), stamps.get("admitted", {})),
        "decision": (stamps.get("admitted", {}), stamps.get("assigned", {})),
        "delivery": (stamps.get("assigned", {}), stamps.get("started", {})),
        "observe": (stamps.get("assigned", {}), observed_ms),
    }
    out = {}
    for hop in HOPS:
        start, end = ends[hop]
        # clocks are shared but ms-truncated: a hop can read as -1 ms, never less
        out[hop] = percentiles(
            [max(0.0, end[j] - start[j]) for j in sent_ms if j in start and j in end]
        )
    return out


def log_stamps(bootstrap: str, job_ids: set[str]) -> dict[str, dict[str, float]]:
    """The producer timestamps of each job's first SubmitJob, JobAdmitted,
    JobAssigned and RunStarted, read back from the log (commands, scheduler and
    job-events topics, from offset 0 to their high watermarks)."""
    from framespool.log import read_all
    from framespool.schemas import codec
    from framespool.schemas import events as ev
    from framespool.schemas.topics import COMMANDS, JOB_EVENTS, SCHEDULER

    stamps: dict[str, dict[str, float]] = {
        k: {} for k in ("submit", "admitted", "assigned", "started")
    }
    kinds = {
        ev.SubmitJob: "submit",
        ev.JobAdmitted: "admitted",
        ev.JobAssigned: "assigned",
        ev.RunStarted: "started",
    }
    for topic in (COMMANDS, SCHEDULER, JOB_EVENTS):
        for record in read_all(bootstrap, topic.name):
            if record.value is None or record.timestamp_ms is None:
                continue
            try:
                event = codec.decode(record.value)
            except codec.DecodeError:
                continue
            kind = kinds.get(type(event))
            if kind is None:
                continue
            job_id = event.spec.job_id if kind in ("submit", "admitted") else event.job_id
            if job_id in job_ids:
                stamps[kind].setdefault(job_id, float(record.timestamp_ms))
    return stamps


def wait_for(
    watch: dict[str, float], ids, timeout_s: float, failed: dict[str, float] | None = None
) -> None:
    """Until every job is in ``watch`` (or ended in ``failed``), or the timeout."""
    failed = failed if failed is not None else {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(i in watch or i in failed for i in ids):
        time.sleep(0.05)


def bench_pipeline(
    jobs: int = 2000,
    rate: float = 200.0,
    seconds: float = 10.0,
    concurrency: int = 32,
    nodes: int = 8,
    gpus_per_node: int = 8,
    data_dir: Path | None = None,
    nodes_per_agent: int = 1,
    broker: str = "kafka",
) -> PipelineResult:
    workdir = Path(data_dir or tempfile.mkdtemp(prefix="framespool-bench-"))
    config_path = workdir / "bench-config.json"
    workdir.mkdir(parents=True, exist_ok=True)
    config_path.write_text(
        json.dumps(
            {"admission": {"rate": {"rate_per_s": 0}}, "scheduler": {"status_interval_s": 5}}
        )
    )
    stack = Stack(
        StackConfig(
            data_dir=workdir / "stack",
            port=free_port(),
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            nodes_per_agent=nodes_per_agent,
            processor_config=config_path,
            broker=broker,
        )
    )
    with stack:
        key = stack.tenant_keys[0]["api_key"]
        watcher = EventWatcher(stack.bootstrap_servers, broker)
        watcher.start()
        try:
            # warm-up: the first submissions pay for connection and producer setup
            warm: dict[str, float] = {}
            asyncio.run(submit_many(stack.api_url, key, 20, 0, 4, warm))
            wait_for(watcher.completed, warm, 60, watcher.failed)
            pids = {p.name: p.popen.pid for p in stack.processes}
            if stack.broker_pid is not None:
                pids["broker"] = stack.broker_pid
            pids["bench"] = os.getpid()
            meter = CpuMeter(pids)
            # 4. the idle stack's CPU: mostly the consumers' fetches
            meter.start()
            time.sleep(IDLE_CPU_S)
            cpu_idle = meter.stop()
            # 1. throughput
            sent: dict[str, float] = {}
            t0 = time.perf_counter()
            meter.start()
            asyncio.run(submit_many(stack.api_url, key, jobs, 0, concurrency, sent))
            wait_for(watcher.completed, sent, 300, watcher.failed)
            cpu_throughput = meter.stop()
            cpu_ms_per_job = {
                k: round(10 * pct * meter.elapsed_s / max(1, jobs), 3)
                for k, pct in cpu_throughput.items()
            }
            done = [watcher.completed[j] for j in sent if j in watcher.completed]
            elapsed = (max(done) - t0) if done else float("inf")
            # 2. latency at a fixed offered rate
            lat: dict[str, float] = {}
            lat_wall: dict[str, float] = {}
            n = int(rate * seconds)
            s0 = time.perf_counter()
            meter.start()
            asyncio.run(submit_many(stack.api_url, key, n, rate, concurrency, lat, lat_wall))
            submit_elapsed = time.perf_counter() - s0
            wait_for(watcher.assigned, lat, 120, watcher.failed)
            wait_for(watcher.completed, lat, 120, watcher.failed)
            cpu_latency = meter.stop()
            # 3. the per-hop split of the latency phase, from the log's timestamps
            stamps = log_stamps(stack.bootstrap_servers, set(lat_wall))
        finally:
            watcher.stop()
    assigned = [1000 * (watcher.assigned[j] - t) for j, t in lat.items() if j in watcher.assigned]
    completed = [
        1000 * (watcher.completed[j] - t) for j, t in lat.items() if j in watcher.completed
    ]
    return PipelineResult(
        jobs_per_s=round(len(done) / elapsed, 1) if done else 0.0,
        jobs=jobs,
        completed=len(done),
        submit_to_assigned_ms=percentiles(assigned),
        submit_to_completed_ms=percentiles(completed),
        offered_rate=rate,
        achieved_submit_rate=round(n / submit_elapsed, 1),
        nodes=nodes,
        gpus=nodes * gpus_per_node,
        agent_processes=-(-nodes // max(1, nodes_per_agent)),
        failed=len(watcher.failed),
        hops_ms=hop_split(lat_wall, stamps, watcher.assigned_wall),
        cpu_idle_pct=cpu_idle or None,
        cpu_latency_pct=cpu_latency or None,
        cpu_ms_per_job=cpu_ms_per_job or None,
    )
