"""The discrete-event loop that drives the real cell with a virtual clock.

Theory of operation
-------------------
A heap of ``(time_ms, seq, kind, payload)`` orders everything; ``seq`` makes
equal times first-in first-out, so a run is deterministic for a seed. Kinds:

1. ``SUBMIT``: a job of the workload arrives and is admitted to the cell
   (``JobAdmitted``); the workload stream is read one job ahead.
2. ``TICK``: every ``tick_s`` of virtual time the cell gets ``Tick(now)``, the
   only clock it has; leases, reservations and the full pass run there.
3. ``HEARTBEAT``: every ``heartbeat_s`` per node (phases spread evenly) the
   node's agent lists its runs and its GPUs' warm models.
4. ``DELIVER``: an agent's answer to a command (``RunStarted``,
   ``RunCheckpointed``, ``RunStopped``), delivered after the output batch
   that caused it, never inside it.
5. ``RUN_END`` and ``CHECKPOINT``: a run's processes finish (``RunCompleted``
   or, if this attempt is doomed, ``RunFailed``) or checkpoint.
6. ``NODE_FAIL`` / ``NODE_REPAIR``: a node dies with its processes and comes
   back later with a higher incarnation (``NodeRegistered``).
7. ``SAMPLE``: the time series for the report.

The cell's outputs are routed like the stream shell routes them: agent
commands to the simulated node agents, job events to the metrics. The
simulator decides nothing the scheduler decides; its own rules are the
physics: run times, cold starts, failures.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import Any

from framespool.processors.core import Cell, CellConfig
from framespool.schemas import events as ev
from framespool.schemas.states import JobState

from .agents import Agents
from .edge import SubmitEdge
from .fleet import SimJob, SimNode, SimRun
from .jobevents import JobEvents
from .kinds import (
    CELL,
    CHECKPOINT,
    DELIVER,
    HEARTBEAT,
    NODE_FAIL,
    NODE_REPAIR,
    RUN_END,
    SAMPLE,
    SUBMIT,
    TICK,
)
from .metrics import Recorder
from .policies import Policy
from .scorecard import scorecard
from .workload import TraceJob, Workload

# ``--production-cadences``: what a production cell folds besides the jobs.
# Ticks every second, a heartbeat per node every PRODUCTION_HEARTBEAT_S (the
# cell's default leases, 10 s node / 15 s report, need one every few seconds;
# 10 s is the slowest the fleet runs with), CellStatus every 5 s and wait
# estimates every 30 s (the CellConfig defaults).
PRODUCTION_TICK_S = 1.0
PRODUCTION_HEARTBEAT_S = 10.0


@dataclass(frozen=True)
class SimOptions:
    nodes: int = 250
    gpus_per_node: int = 8
    nodes_per_rail: int = 32
    gpu_type: str = "H100"
    tick_s: float = 1.0
    heartbeat_s: float = 30.0
    cold_start_s: float = 20.0
    node_failures_per_hour: float = 0.0
    repair_s: float = 900.0
    estimates: bool = False
    seed: int = 1
    max_sim_s: float = 0.0  # 0 = until drained (or stalled)
    stall_s: float = 86_400.0  # stop when nothing ran and nothing started this long

    @property
    def capacity_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def job_spec(trace: TraceJob, policy: Policy) -> ev.JobSpec:
    """The spec a trace job is submitted with, its tenant and tier as ``policy``
    maps them (the cell's and a fleet's admission see the same spec)."""
    tenant, tier = policy.route(trace.tenant, trace.tier)
    return ev.JobSpec(
        job_id=trace.job_id,
        tenant=tenant,
        tier=tier,
        model=trace.model,
        model_version=trace.model_version,
        gpus=trace.gpus,
        gpus_per_node=trace.gpus_per_node,
        estimate_s=trace.estimate_s,
        preemptible=trace.preemptible,
        checkpoint_interval_s=trace.checkpoint_s,
        submitted_ms=trace.submit_ms,
    )


def cell_config(base: CellConfig, opts: SimOptions) -> CellConfig:
    """Leases scaled to the heartbeat period; the fleet's model-load time is
    the simulated cold start (an operator configures it, as here); read-model
    outputs off unless asked."""
    config = replace(
        base,
        heartbeat_timeout_s=3.5 * opts.heartbeat_s,
        report_lease_s=2.5 * opts.heartbeat_s,
        model_load_s=opts.cold_start_s,
    )
    if not opts.estimates:
        config = replace(config, status_interval_s=0.0, estimate_interval_s=0.0)
    return config


class CoreCrash(Exception):
    """The core raised while folding an input: a core bug. The run stops and is reported."""

    def __init__(self, event: Any, now_ms: int, error: Exception) -> None:
        super().__init__(
            f"core raised {type(error).__name__}: {error} on "
            f"{type(event).__name__} {getattr(event, 'event_id', '?')} "
            f"at t={now_ms / 1000:.3f}s"
        )
        self.event = event
        self.error = error


class Simulation(Agents, JobEvents):
    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        opts: SimOptions,
        base_config: CellConfig,
        out_dir: Path | None = None,
        progress: Callable[[float, str], None] | None = None,
        tape: list | None = None,
        max_events: int = 0,
        config: CellConfig | None = None,
    ) -> None:
        """``config``: the cell's configuration when the caller already made it
        (``cell_config`` of the policy's); a fleet makes it once for all its
        cells, since configuring costs O(tenants) (778 k for a 5 M-job day)."""
        self.workload = workload
        self.policy = policy
        self.opts = opts
        if config is None:
            config = cell_config(policy.configure(base_config, workload.tenants), opts)
        self.config = config
        self.cell = Cell(self.config, CELL)
        self.edge = SubmitEdge(self.config)  # the API's predicted-wait refusal, at submit
        self.recorder = Recorder(out_dir, opts.capacity_gpus, workload.tenants)
        self.progress = progress
        self.tape = tape  # when a list: every input event, for benchmarks
        self.tape_counts: list[int] = []  # and how many outputs each produced
        self.max_events = max_events
        self.heap: list[tuple[int, int, int, Any]] = []
        self.seq = 0
        self.now = 0
        self.events = 0
        self.outputs = 0
        self.core_s = 0.0
        self.jobs: dict[str, SimJob] = {}
        self.runs: dict[tuple[str, int], SimRun] = {}
        self.pending: deque[SimJob] = deque()  # the FIFO gate's line
        self.core_queued = 0
        self.stream: Iterator[TraceJob] = iter(())
        self.submissions_done = False
        self.next_job: TraceJob | None = None  # read from the stream, not yet submitted
        # ``max_sim_s``: jobs submitted after it are never simulated, so the
        # stream is read no further than its first such job (nor kept)
        self.horizon_ms = int(opts.max_sim_s * 1000) if opts.max_sim_s > 0 else None
        self.past_horizon = False  # the stream goes on after the horizon
        self.read = 0  # jobs read from the stream at or before the horizon
        self.stop_reason = ""
        self.crash: CoreCrash | None = None
        self.wall0 = perf_counter()  # when the run began (progress reports)
        self.last_progress_ms = 0
        self.tick_ms = max(1, int(opts.tick_s * 1000))
        self.heartbeat_ms = max(1, int(opts.heartbeat_s * 1000))
        self.cold_ms = int(opts.cold_start_s * 1000)
        self.health_cache: dict = {}
        self.failure_rng = random.Random(opts.seed * 7919 + 17)
        self.failure_rate_per_ms = opts.node_failures_per_hour / 3_600_000
        self.nodes = [
            SimNode(f"n{i:05d}", i, f"rail-{i // max(1, opts.nodes_per_rail)}", opts.gpus_per_node)
            for i in range(opts.nodes)
        ]
        self.node_by_id = {n.node_id: n for n in self.nodes}
        self.on_output: dict[type, Callable[[Any], None]] = {
            ev.JobQueued: self._queued,
            ev.JobWaitEstimated: self._estimated,
            ev.JobRejected: self._rejected,
            ev.JobAssigned: self._assigned,
            ev.StartRun: self._start_run,
            ev.StopRun: self._stop_run,
            ev.CheckpointRun: self._checkpoint_run,
            ev.JobPreempted: self._preempted,
            ev.JobRequeued: self._requeued,
            ev.JobCompleted: self._completed,
            ev.JobFailed: self._failed,
            ev.JobCancelled: self._cancelled,
            ev.ReportIgnored: self._ignored,
            ev.NodeStateChanged: self._node_state,
            ev.BreakerTripped: self._breaker,
        }

    # -- plumbing ------------------------------------------------------------------
    def push(self, t: int, kind: int, payload: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))

    def feed(self, event: Any) -> None:
        """Apply one input to the cell and route its outputs."""
        self.events += 1
        t0 = perf_counter()
        try:
            out = self.cell.apply(event, f"sim:{self.events}")
        except Exception as exc:
            raise CoreCrash(event, self.now, exc) from exc
        self.core_s += perf_counter() - t0
        if self.tape is not None:
            self.tape.append(event)
            self.tape_counts.append(len(out))
        self.outputs += len(out)
        handlers = self.on_output
        for o in out:
            handler = handlers.get(type(o))
            if handler is not None:
                handler(o)
        if self.pending and self.core_queued == 0:
            self._admit_next()

    def deliver(self, event: Any) -> None:
        self.push(self.now, DELIVER, event)

    def eid(self) -> str:
        return f"in:{self.seq}:{self.events}"

    # -- the loop ------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        wall0 = perf_counter()
        self.wall0 = wall0
        self.begin()
        self.advance()
        if not self.stop_reason:
            self.stop_reason = "event heap empty"
        return self._finish(perf_counter() - wall0)

    def begin(self) -> None:
        """Register the nodes and queue the first heartbeats, Tick, sample and
        submission: the state at virtual time 0, before any event is folded."""
        try:
            self._begin()
        except CoreCrash as crash:
            self._crashed(crash)

    def advance(self, until_ms: int | None = None) -> None:
        """Fold the events due at or before ``until_ms`` (every one when None),
        in heap order, until the run stops; a core crash stops it (reported)."""
        try:
            self._advance(until_ms)
        except CoreCrash as crash:
            self._crashed(crash)

    def _crashed(self, crash: CoreCrash) -> None:
        self.stop_reason = str(crash)
        self.recorder.violation("core_exception", str(crash))
        self.crash = crash

    def _begin(self) -> None:
        opts = self.opts
        for node in self.nodes:
            self.feed(
                ev.NodeRegistered(
                    event_id=f"reg:{node.node_id}:1",
                    ts_ms=0,
                    node_id=node.node_id,
                    incarnation=1,
                    cell=CELL,
                    gpus=node.gpus,
                    gpu_type=opts.gpu_type,
                    rail=node.rail,
                )
            )
            self.push((node.index * self.heartbeat_ms) // max(1, len(self.nodes)), HEARTBEAT, node)
            if self.failure_rate_per_ms > 0:
                self.push(self._next_failure(0), NODE_FAIL, node)
        self.stream = iter(self.workload.jobs())
        self._next_submission()
        self.push(0, TICK)
        # a few hundred samples at least; the recorder halves the rate as needed
        self.recorder.sample_ms = max(self.tick_ms, 60_000)
        self.push(0, SAMPLE)

    def _advance(self, until_ms: int | None) -> None:
        opts = self.opts
        hard_stop = self.horizon_ms
        stall_ms = int(opts.stall_s * 1000)
        heap = self.heap
        pop = heapq.heappop
        loops = 0
        wall0 = self.wall0
        while heap and not self.stop_reason:
            if until_ms is not None and heap[0][0] > until_ms:
                return
            t, _, kind, payload = pop(heap)
            if hard_stop is not None and t > hard_stop:
                self.stop_reason = f"hard stop at {opts.max_sim_s:.0f}s of virtual time"
                break
            self.now = t
            if kind == DELIVER:
                self.feed(payload)
            elif kind == HEARTBEAT:
                self._heartbeat(payload)
            elif kind == TICK:
                self.feed(ev.Tick(event_id=f"tick:{t}", ts_ms=t, cell=CELL, now_ms=t))
                self.push(t + self.tick_ms, TICK)
                if not self.runs and self.jobs and t - self.last_progress_ms > stall_ms:
                    self.stop_reason = (
                        f"stalled: nothing ran or started for {opts.stall_s:.0f}s "
                        f"of virtual time with {len(self.jobs)} jobs left"
                    )
            elif kind == RUN_END:
                self._run_end(payload)
            elif kind == CHECKPOINT:
                self._checkpoint_due(payload)
            elif kind == SUBMIT:
                self._submit(payload)
            elif kind == SAMPLE:
                self.recorder.sample(t)
                self.push(t + self.recorder.sample_ms, SAMPLE)
            elif kind == NODE_FAIL:
                self._node_fail(payload)
            elif kind == NODE_REPAIR:
                self._node_repair(payload)
            if self.submissions_done and not self.jobs and not self.pending:
                self.stop_reason = "drained"
            loops += 1
            if loops & 0x3FFF == 0:
                if self.progress is not None:
                    self._report_progress(wall0)
                if self.max_events and self.events >= self.max_events:
                    self.stop_reason = f"event limit {self.max_events}"

    def _report_progress(self, wall0: float) -> None:
        progress = self.progress
        if progress is None:
            return
        total = max(1, self.workload.total)
        done = self.recorder.states
        ended = sum(done.values())
        elapsed = perf_counter() - wall0
        progress(
            ended / total,
            f"{self.policy.name}: {ended:,}/{total:,} jobs ended, "
            f"t={self.now / 3_600_000:.1f}h virtual, "
            f"{self.events / max(elapsed, 1e-9):,.0f} events/s",
        )

    # -- submissions -------------------------------------------------------------------
    def _next_submission(self) -> None:
        """Read the stream one job ahead; stop reading at the horizon (a job
        after it would never be submitted: the hard stop comes first)."""
        job = next(self.stream, None)
        horizon = self.horizon_ms
        if job is not None and horizon is not None and job.submit_ms > horizon:
            job = None
            self.past_horizon = True
        elif job is None and self.workload.cut:
            self.past_horizon = True  # a cell's share, cut at the horizon
        self.next_job = job
        if job is not None:
            self.read += 1
            self.push(max(job.submit_ms, self.now), SUBMIT, job)
        elif not self.past_horizon:
            self.submissions_done = True

    def _submit(self, trace: TraceJob) -> None:
        self.next_job = None
        job = self._arrive(trace)
        self._next_submission()
        self._enter(job)

    def receive(self, trace: TraceJob, now_ms: int, rejected: ev.JobRejected | None = None) -> None:
        """A job routed here from outside at ``now_ms`` (no earlier than any event
        folded): a fleet's admission sent it (the cell's own stream is empty), or
        ``rejected`` it for the cell's books. The caller advances the cell past it."""
        self.now = max(self.now, now_ms)
        self.read += 1
        job = self._arrive(trace)
        if rejected is not None:
            self._rejected(rejected)
        else:
            self._enter(job)

    def _arrive(self, trace: TraceJob) -> SimJob:
        job = SimJob(trace)
        if job.job_id in self.jobs:
            self.recorder.violation("duplicate_job", f"{job.job_id} submitted twice")
        self.jobs[job.job_id] = job
        self.recorder.submitted_job(job, self.now)
        return job

    def _enter(self, job: SimJob) -> None:
        if self.policy.gate:
            self.pending.append(job)
            self._wait(job)
            if self.core_queued == 0:
                self._admit_next()
        else:
            self._admit(job)

    def _admit_next(self) -> None:
        # The FIFO gate: one job at a time, only while the cell holds none queued.
        while self.pending and self.core_queued == 0:
            self._admit(self.pending.popleft())

    def _admit(self, job: SimJob) -> None:
        job.admitted = True
        spec = job_spec(job.trace, self.policy)
        refused = self.edge.refusal(self.cell, spec, self.now)
        if refused is not None:  # the API's 429: it never reaches the cell
            self._rejected(self.edge.rejection(spec, refused, self.now))
            return
        self.feed(
            ev.JobAdmitted(event_id=f"adm:{job.job_id}", ts_ms=self.now, spec=spec, cell=CELL)
        )

    # -- the end -------------------------------------------------------------------------
    def finish(self, wall_s: float) -> dict[str, Any]:
        """The run's summary once ``advance`` has stopped (a fleet's cells)."""
        return self._finish(wall_s)

    def _finish(self, wall_s: float) -> dict[str, Any]:
        """Close the books: every job the cell still holds, and every job never
        submitted, is written with a non-terminal state and counted as a violation.
        Jobs after the horizon (``max_sim_s``) are outside the run: neither read
        nor written; ``jobs_inside_horizon`` counts the others."""
        rec = self.recorder
        drained = self.stop_reason == "drained"
        end = rec.end_ms if drained else self.now
        rec.end_ms = max(rec.end_ms, end)
        for job in list(self.jobs.values()):
            if job.open_run is not None:
                run, start, placement = job.open_run
                rec.run_closed(job.job_id, run, start, placement, end, "unfinished")
            rec.violation(
                "not_terminal",
                f"{job.job_id} has no terminal state at the end ({self.stop_reason})",
            )
            rec.finished(job, "UNFINISHED" if job.admitted else "NOT_ADMITTED", end)
        unsubmitted = [self.next_job] if self.next_job is not None else []
        rest: Iterator[TraceJob] = iter(()) if self.past_horizon else self.stream
        if self.horizon_ms is not None:
            horizon = self.horizon_ms
            rest = itertools.takewhile(lambda trace: trace.submit_ms <= horizon, rest)
        for trace in itertools.chain(unsubmitted, rest):
            if trace is not self.next_job:
                self.read += 1
            job = SimJob(trace)
            rec.violation("not_terminal", f"{job.job_id} was never submitted ({self.stop_reason})")
            rec.finished(job, "NOT_SUBMITTED", end)
        rec.finish(end)
        rec.close()
        counters = rec.counters
        states = rec.states
        warm = int(counters.get("warm_starts", 0))
        cold = int(counters.get("cold_starts", 0))
        summary: dict[str, Any] = {
            "policy": self.policy.name,
            "policy_description": self.policy.description,
            "workload": self.workload.name,
            "workload_description": self.workload.description,
            "cluster": {
                "nodes": self.opts.nodes,
                "gpus_per_node": self.opts.gpus_per_node,
                "gpus": self.opts.capacity_gpus,
                "nodes_per_rail": self.opts.nodes_per_rail,
            },
            "jobs_submitted": rec.submitted,
            "jobs_in_workload": self.workload.total,
            "jobs_inside_horizon": self.read,
            # a cell's cut share does not know how many of its jobs come after
            "jobs_past_horizon": None
            if self.workload.cut
            else max(0, self.workload.total - self.read),
            "jobs_completed": states.get(JobState.COMPLETED, 0),
            "jobs_failed": states.get(JobState.FAILED, 0),
            "jobs_rejected": states.get(JobState.REJECTED, 0),
            "jobs_cancelled": states.get(JobState.CANCELLED, 0),
            "jobs_unfinished": sum(
                v for k, v in states.items() if k in ("UNFINISHED", "NOT_ADMITTED", "NOT_SUBMITTED")
            ),
            "stop_reason": self.stop_reason,
        }
        summary.update(rec.summary())
        summary.update(
            {
                "runs": int(counters.get("runs", 0)),
                "requeues": int(counters.get("requeues", 0)),
                "preemptions": int(counters.get("preemptions", 0)),
                "checkpoints": int(counters.get("checkpoints", 0)),
                "node_failures": int(counters.get("node_failures", 0)),
                "breakers_tripped": int(counters.get("breakers_tripped", 0)),
                "cold_starts": cold,
                "cold_starts_avoided": warm,
                "warm_start_ratio": round(warm / (warm + cold), 4) if warm + cold else None,
                "cold_start_gpu_s": round(counters.get("cold_start_gpu_s", 0.0), 1),
                "run_outcomes": {
                    k.split(":", 1)[1]: int(v)
                    for k, v in sorted(counters.items())
                    if k.startswith("outcome:")
                },
                "rejections": {
                    k.split(":", 1)[1]: int(v)
                    for k, v in sorted(counters.items())
                    if k.startswith("rejected:")
                },
                "ignored_reports": int(counters.get("ignored_reports", 0)),
                # the scheduling walks: candidates tested (those of a class a
                # proof found blocked without a search), and the classes' proofs
                # that stopped a walk (held) or let it go on (counted by the walk,
                # core/scheduling.py; the proofs are core/walkproofs.py's)
                "walks": {
                    name: int(self.cell.counters.get(key, 0))
                    for name, key in (
                        ("walks", "walks"),
                        ("candidates_tested", "walk_tests"),
                        ("candidates_of_blocked_classes", "walk_class_skips"),
                        ("proofs_held", "walk_proofs_held"),
                        ("proofs_failed", "walk_proofs_failed"),
                    )
                },
                "invariant_violations": rec.violations,
                "violations_by_kind": dict(sorted(rec.violations_by_kind.items())),
                "violation_examples": rec.examples,
                "events": self.events,
                "core_outputs": self.outputs,
                "virtual_s": round(self.now / 1000, 3),
                "wall_s": round(wall_s, 3),
                "core_s": round(self.core_s, 3),
                "events_per_s": round(self.events / wall_s) if wall_s > 0 else None,
                # how much faster than real time the core alone folds this cell
                "headroom": round(self.now / 1000 / self.core_s, 1) if self.core_s > 0 else None,
                "notes": list(self.workload.notes),
            }
        )
        summary["scorecard"] = scorecard(summary)
        if self.policy.gate:
            summary["notes"].append(
                "fifo is emulated by an admission gate in the simulator "
                "(the core has no strict-order switch)"
            )
        return summary
