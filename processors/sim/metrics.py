"""What a simulation measures: utilization, waits, fairness, invariants, and the
per-job and per-run rows, streamed to CSV as they become final.

Theory of operation
-------------------
Everything time-weighted is integrated exactly, piecewise-constant between the
events that change it (no sampling error): busy GPUs, queued jobs, and per
(tier, tenant) flow the GPUs it holds and whether it is backlogged.

Fairness is measured against entitlement. While a flow (a tenant within a
tier) is backlogged (at least one job queued), it is entitled to a weighted
share of the GPUs that the backlogged flows of its tier hold together:
``entitled = w_f * integral(U_B / W_B)`` over its backlogged time, where
``U_B`` and ``W_B`` are the GPUs and the weight sum of the tier's backlogged
flows. One cumulative integral per tier makes this O(1) per change. A
tenant's ``fair_ratio`` is its GPU-time while backlogged over that
entitlement (1.0 = exactly its share), ``share_while_backlogged`` is the same
GPU-time over what its backlogged peers held together (1/n for n equal
weights), and ``jain_fairness`` is Jain's index over the tenants' fair ratios.
Metrics always use the job's original tenant and tier, whatever the policy
presented to the cell.

Preemption cost (``preemption_cost``): the GPU-time a preemption throws away,
charged to the tier of the job it made room for (``by_job_id``), in three
disjoint parts on the victim's timeline:

1. ``lost``: GPU-s from the victim's last checkpoint (or its start, cold start
   included, if it never checkpointed) to the exit request (``CheckpointRun``):
   work the resumed run must do again. Zero when the checkpoint answering the
   request is the one it resumes from.
2. ``grace``: GPU-s from the exit request (or the checkpoint that answered
   it, when that came later: the work up to it is saved) to the processes'
   stop (the checkpoint and stop grace; it is all of the wait when the
   generator cannot answer and the cell's grace runs out). A stop asked with
   no checkpoint (a hard eviction) is its own request: its cost is all
   ``lost``.
3. ``restart``: the cold start of the resumed run (GPUs x ``cold_start_s``),
   when it lands on GPUs whose warm model differs.

The total is also given as a share of the delivered GPU-s (busy GPU-time).
Cost: O(1) per agent event, one entry per job with a live run.
"""

from __future__ import annotations

import csv
import math
from array import array
from pathlib import Path
from typing import IO, Any

from framespool.schemas.states import JobState

from .fleet import SimJob
from .quality import WaitRow, calibration_table, noisy_neighbour_table
from .scorecard import light_heavy_table

MAX_SAMPLES = 4000
MAX_VIOLATION_EXAMPLES = 20

JOB_COLUMNS = (
    "job_id",
    "tenant",
    "tier",
    "gpus",
    "submit_s",
    "first_start_s",
    "end_s",
    "state",
    "runs",
    "est_wait_p50_s",
    "est_wait_p90_s",
)
RUN_COLUMNS = ("job_id", "run", "placement", "start_s", "end_s", "outcome")


class FlowStats:
    __slots__ = (
        "tier",
        "tenant",
        "weight",
        "gpus",
        "queued",
        "last_ms",
        "gpu_ms",
        "backlog_gpu_ms",
        "entitled_ms",
        "peer_gpu_ms",
        "c0",
        "d0",
        "tier_stats",
    )

    def __init__(self, tier: TierStats, tenant: str, weight: float) -> None:
        self.tier = tier.name
        self.tier_stats = tier
        self.tenant = tenant
        self.weight = weight
        self.gpus = 0
        self.queued = 0
        self.last_ms = 0
        self.gpu_ms = 0.0  # GPU-ms held, whole run
        self.backlog_gpu_ms = 0.0  # GPU-ms held while backlogged
        self.entitled_ms = 0.0  # GPU-ms it was entitled to while backlogged
        self.peer_gpu_ms = 0.0  # GPU-ms its tier's backlogged flows held meanwhile
        self.c0 = 0.0
        self.d0 = 0.0


class TierStats:
    __slots__ = ("name", "ub", "wb", "c", "d", "last_ms", "queued", "waits")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ub = 0  # GPUs held by backlogged flows
        self.wb = 0.0  # their weights
        self.c = 0.0  # integral of ub / wb dt
        self.d = 0.0  # integral of ub dt
        self.last_ms = 0
        self.queued = 0
        self.waits = array("d")

    def advance(self, now: int) -> None:
        dt = now - self.last_ms
        if dt > 0:
            if self.ub:
                self.c += self.ub / self.wb * dt
                self.d += self.ub * dt
            self.last_ms = now


class Recorder:
    def __init__(
        self, out_dir: Path | None, capacity_gpus: int, tenant_weights: dict[str, float]
    ) -> None:
        self.capacity = capacity_gpus
        self.available = capacity_gpus
        self.weights = tenant_weights
        self.tiers: dict[str, TierStats] = {}
        self.flows: dict[tuple[str, str], FlowStats] = {}
        self.busy = 0
        self.queued = 0
        self.last_ms = 0
        self.first_submit_ms = -1
        self.end_ms = 0
        self.busy_ms = 0.0
        self.available_ms = 0.0
        self.backlog_ms = 0.0
        self.busy_backlog_ms = 0.0
        self.waits = array("d")
        self.states: dict[str, int] = {}
        self.submitted = 0
        self.terminal = bytearray()  # per job index: terminal events seen
        self.violations = 0
        self.violations_by_kind: dict[str, int] = {}
        self.examples: list[str] = []
        self.counters: dict[str, float] = {}
        self.goodput_gpu_ms = 0.0
        self.wait_rows: list[WaitRow] = []  # started jobs, for the quality tables
        self.refresh_rows: list[WaitRow] = []  # refreshed bands, against the wait left
        # preemption cost (module doc), per job: its live run's latest save and exit request
        self.saved_ms: dict[str, tuple[int, int]] = {}  # job -> (run, last checkpoint or start)
        self.exit_ms: dict[str, tuple[int, int]] = {}  # job -> (run, first exit request)
        self.halted: dict[str, tuple[int, float, float]] = {}  # job -> (run, lost, grace) GPU-ms
        self.preempt_pending: dict[str, tuple[int, str]] = {}  # job -> (run, tier): not yet halted
        self.resume_tier: dict[str, str] = {}  # job -> preempting tier, until it runs again
        self.preempt_cost: dict[str, list[float]] = {}  # tier -> [lost, grace, restart] GPU-ms
        self.preempt_victims: dict[str, int] = {}  # tier -> runs it preempted
        self.tenant_jobs: dict[str, int] = {}
        self.tenant_gpu_s: dict[str, float] = {}
        # time series for the report (decimated to stay under MAX_SAMPLES)
        self.sample_ms = 0
        self.samples_t: list[float] = []
        self.samples_busy: list[int] = []
        self.samples_queued: dict[str, list[int]] = {}
        self.samples_tenant: dict[str, list[int]] = {}
        self._files: list[IO[str]] = []
        self.jobs_csv = self.runs_csv = None
        if out_dir is not None:
            self.jobs_csv = self._writer(out_dir / "jobs.csv", JOB_COLUMNS)
            self.runs_csv = self._writer(out_dir / "runs.csv", RUN_COLUMNS)

    def _writer(self, path: Path, header: tuple[str, ...]) -> Any:
        handle = path.open("w", newline="", buffering=1 << 20)
        self._files.append(handle)
        writer = csv.writer(handle)
        writer.writerow(header)
        return writer

    def close(self) -> None:
        for handle in self._files:
            handle.close()
        self._files = []

    def count(self, name: str, amount: float = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    def violation(self, kind: str, message: str) -> None:
        self.violations += 1
        self.violations_by_kind[kind] = self.violations_by_kind.get(kind, 0) + 1
        if len(self.examples) < MAX_VIOLATION_EXAMPLES:
            self.examples.append(f"{kind}: {message}")

    # -- integration -----------------------------------------------------------
    def advance(self, now: int) -> None:
        dt = now - self.last_ms
        if dt > 0:
            self.busy_ms += self.busy * dt
            self.available_ms += self.available * dt
            if self.queued:
                self.backlog_ms += dt
                self.busy_backlog_ms += self.busy * dt
            self.last_ms = now

    def flow_of(self, job: SimJob) -> FlowStats:
        trace = job.trace
        flow = self.flows.get((trace.tier, trace.tenant))
        if flow is None:
            tier = self.tiers.get(trace.tier)
            if tier is None:
                tier = self.tiers[trace.tier] = TierStats(trace.tier)
                tier.last_ms = self.last_ms
            flow = self.flows[(trace.tier, trace.tenant)] = FlowStats(
                tier, trace.tenant, self.weights.get(trace.tenant, 1.0)
            )
            flow.last_ms = self.last_ms
        job.flow = flow
        return flow

    @staticmethod
    def _flush(flow: FlowStats, now: int) -> None:
        dt = now - flow.last_ms
        if dt > 0:
            if flow.gpus:
                flow.gpu_ms += flow.gpus * dt
                if flow.queued:
                    flow.backlog_gpu_ms += flow.gpus * dt
            flow.last_ms = now

    # -- job and GPU changes ----------------------------------------------------
    def submitted_job(self, job: SimJob, now: int) -> None:
        self.submitted += 1
        if self.first_submit_ms < 0:
            self.first_submit_ms = now
        idx = job.trace.idx
        if idx >= len(self.terminal):
            self.terminal.extend(bytes(idx + 1 - len(self.terminal)))
        self.flow_of(job)
        trace = job.trace
        self.tenant_jobs[trace.tenant] = self.tenant_jobs.get(trace.tenant, 0) + 1
        self.tenant_gpu_s[trace.tenant] = (
            self.tenant_gpu_s.get(trace.tenant, 0.0) + trace.gpus * trace.duration_s
        )

    def queue_change(self, job: SimJob, delta: int, now: int) -> None:
        self.advance(now)
        self.queued += delta
        flow = job.flow
        assert flow is not None  # submitted_job set it
        tier = flow.tier_stats
        tier.advance(now)
        self._flush(flow, now)
        tier.queued += delta
        was = flow.queued
        flow.queued += delta
        if was == 0 and flow.queued > 0:  # becomes backlogged
            flow.c0 = tier.c
            flow.d0 = tier.d
            tier.ub += flow.gpus
            tier.wb += flow.weight
        elif was > 0 and flow.queued == 0:  # stops being backlogged
            flow.entitled_ms += flow.weight * (tier.c - flow.c0)
            flow.peer_gpu_ms += tier.d - flow.d0
            tier.ub -= flow.gpus
            tier.wb -= flow.weight

    def gpus_change(self, job: SimJob, delta: int, now: int) -> None:
        self.advance(now)
        self.busy += delta
        flow = job.flow
        assert flow is not None  # submitted_job set it
        tier = flow.tier_stats
        tier.advance(now)
        self._flush(flow, now)
        flow.gpus += delta
        if flow.queued:
            tier.ub += delta

    def capacity_change(self, delta: int, now: int) -> None:
        self.advance(now)
        self.available += delta

    def started(self, job: SimJob, now: int) -> None:
        wait = (now - job.trace.submit_ms) / 1000
        self.waits.append(wait)
        flow = job.flow
        assert flow is not None  # submitted_job set it
        flow.tier_stats.waits.append(wait)
        trace = job.trace
        self.wait_rows.append(
            WaitRow(
                trace.tier,
                trace.tenant,
                wait,
                job.est_p50,
                job.est_p90,
                trace.gpus * trace.duration_s,
            )
        )
        if job.refreshed:
            for at_ms, p50, p90 in job.refreshed:
                left = (now - at_ms) / 1000
                self.refresh_rows.append(WaitRow(trace.tier, trace.tenant, left, p50, p90))
            job.refreshed = None

    def terminal_event(self, job_idx: int, job_id: str) -> bool:
        """Count a terminal event; False (and a violation) when it is not the first."""
        if job_idx >= len(self.terminal):
            self.violation("terminal_for_unknown_job", f"{job_id} ended but was never submitted")
            return False
        seen = self.terminal[job_idx]
        self.terminal[job_idx] = min(255, seen + 1)
        if seen:
            self.violation(
                "second_terminal_event", f"{job_id} got a terminal event {seen + 1} times"
            )
            return False
        return True

    def finished(self, job: SimJob, state: str, now: int) -> None:
        self._forget_runs(job.job_id)
        self.states[state] = self.states.get(state, 0) + 1
        self.end_ms = max(self.end_ms, now)
        if state == JobState.COMPLETED:
            self.goodput_gpu_ms += job.trace.gpus * job.trace.duration_s * 1000
        if self.jobs_csv is not None:
            trace = job.trace
            self.jobs_csv.writerow(
                (
                    job.job_id,
                    trace.tenant,
                    trace.tier,
                    trace.gpus,
                    _s(trace.submit_ms),
                    _s(job.first_start_ms) if job.first_start_ms >= 0 else "",
                    _s(now),
                    state,
                    job.runs,
                    f"{job.est_p50:.3f}" if job.est_p50 >= 0 else "",
                    f"{job.est_p90:.3f}" if job.est_p90 >= 0 else "",
                )
            )

    def run_closed(
        self, job_id: str, run: int, start_ms: int, placement: str, end_ms: int, outcome: str
    ) -> None:
        self.count("runs")
        self.count("outcome:" + outcome)
        if self.runs_csv is not None:
            self.runs_csv.writerow((job_id, run, placement, _s(start_ms), _s(end_ms), outcome))

    # -- preemption cost (module doc) -------------------------------------------------
    def run_launched(self, job_id: str, run: int, gpus: int, now: int, cold_s: float) -> None:
        """A run's processes started (``cold_s``: its cold start, 0 if warm)."""
        self.saved_ms[job_id] = (run, now)
        self.exit_ms.pop(job_id, None)
        self.halted.pop(job_id, None)
        self.preempt_pending.pop(job_id, None)
        tier = self.resume_tier.pop(job_id, None)
        if tier is not None and cold_s > 0:
            self._preempt_row(tier)[2] += gpus * cold_s * 1000

    def run_saved(self, job_id: str, run: int, now: int) -> None:
        """The run wrote a checkpoint its resumed run would start from."""
        self.saved_ms[job_id] = (run, now)

    def exit_requested(self, job_id: str, run: int, now: int) -> None:
        """The cell asked the run to checkpoint and leave (the first ask counts)."""
        if self.exit_ms.get(job_id, (-1, 0))[0] != run:
            self.exit_ms[job_id] = (run, now)

    def run_halted(self, job_id: str, run: int, gpus: int, now: int) -> None:
        """The run's processes stopped; its unproductive tail is kept if it was asked to exit."""
        asked = self.exit_ms.pop(job_id, None)
        saved = self.saved_ms.pop(job_id, None)
        if asked is None or asked[0] != run:
            return
        request = min(asked[1], now)
        since = saved[1] if saved is not None and saved[0] == run else request
        lost = gpus * max(0, request - since)
        grace = gpus * (now - max(request, min(since, now)))
        self.halted[job_id] = (run, float(lost), float(grace))
        pending = self.preempt_pending.pop(job_id, None)
        if pending is not None and pending[0] == run:
            self._charge(job_id, pending[1])

    def preempted(self, job_id: str, run: int, tier: str) -> None:
        """The cell says the run was preempted for a job of ``tier``."""
        halted = self.halted.get(job_id)
        if halted is not None and halted[0] == run:
            self._charge(job_id, tier)
        else:
            self.preempt_pending[job_id] = (run, tier)

    def _charge(self, job_id: str, tier: str) -> None:
        _, lost, grace = self.halted.pop(job_id)
        row = self._preempt_row(tier)
        row[0] += lost
        row[1] += grace
        self.preempt_victims[tier] = self.preempt_victims.get(tier, 0) + 1
        self.resume_tier[job_id] = tier

    def _preempt_row(self, tier: str) -> list[float]:
        row = self.preempt_cost.get(tier)
        if row is None:
            row = self.preempt_cost[tier] = [0.0, 0.0, 0.0]
        return row

    def _forget_runs(self, job_id: str) -> None:
        for table in (self.saved_ms, self.exit_ms, self.halted, self.preempt_pending):
            table.pop(job_id, None)
        self.resume_tier.pop(job_id, None)

    def preemption_cost(self) -> dict[str, Any]:
        """GPU-s lost to preemption, per preempting tier and in all (module doc)."""

        def row(parts: list[float], victims: int) -> dict[str, Any]:
            total = sum(parts)
            return {
                "victims": victims,
                "lost_gpu_s": round(parts[0] / 1000, 1),
                "grace_gpu_s": round(parts[1] / 1000, 1),
                "restart_gpu_s": round(parts[2] / 1000, 1),
                "gpu_s": round(total / 1000, 1),
                "share_of_delivered": round(total / self.busy_ms, 6) if self.busy_ms else None,
            }

        all_parts = [sum(r[i] for r in self.preempt_cost.values()) for i in range(3)]
        table = {
            tier: row(self.preempt_cost[tier], self.preempt_victims.get(tier, 0))
            for tier in sorted(self.preempt_cost)
        }
        table["all"] = row(all_parts, sum(self.preempt_victims.values()))
        return table

    # -- time series ----------------------------------------------------------------
    def sample(self, now: int) -> None:
        self.samples_t.append(now / 1000)
        self.samples_busy.append(self.busy)
        n = len(self.samples_t)
        for name, tier in self.tiers.items():
            series = self.samples_queued.get(name)
            if series is None:
                series = self.samples_queued[name] = [0] * (n - 1)
            series.append(tier.queued)
        per_tenant: dict[str, int] = {}
        for flow in self.flows.values():
            per_tenant[flow.tenant] = per_tenant.get(flow.tenant, 0) + flow.gpus
        for name, gpus in per_tenant.items():
            series = self.samples_tenant.get(name)
            if series is None:
                series = self.samples_tenant[name] = [0] * (n - 1)
            series.append(gpus)
        if n >= MAX_SAMPLES:
            self._decimate()

    def _decimate(self) -> None:
        self.sample_ms *= 2
        self.samples_t = self.samples_t[::2]
        self.samples_busy = self.samples_busy[::2]
        for table in (self.samples_queued, self.samples_tenant):
            for name in table:
                table[name] = table[name][::2]

    # -- the end ------------------------------------------------------------------
    def finish(self, now: int) -> None:
        """Close every open integral at ``now``."""
        self.advance(now)
        for flow in self.flows.values():
            tier = flow.tier_stats
            tier.advance(now)
            self._flush(flow, now)
            if flow.queued:
                flow.entitled_ms += flow.weight * (tier.c - flow.c0)
                flow.peer_gpu_ms += tier.d - flow.d0
                flow.c0, flow.d0 = tier.c, tier.d

    def summary(self) -> dict[str, Any]:
        start = max(0, self.first_submit_ms)
        makespan_ms = max(0, self.end_ms - start)
        capacity_ms = self.capacity * makespan_ms
        tenants: dict[str, dict[str, float | None]] = {}
        totals: dict[str, list[float]] = {}
        for flow in self.flows.values():
            row = totals.setdefault(flow.tenant, [0.0, 0.0, 0.0, 0.0])
            row[0] += flow.gpu_ms
            row[1] += flow.backlog_gpu_ms
            row[2] += flow.entitled_ms
            row[3] += flow.peer_gpu_ms
        all_gpu_ms = sum(r[0] for r in totals.values()) or 1.0
        ratios = []
        for name in sorted(totals):
            gpu_ms, backlog_ms, entitled_ms, peer_ms = totals[name]
            ratio = backlog_ms / entitled_ms if entitled_ms > 0 else None
            if ratio is not None:
                ratios.append(ratio)
            tenants[name] = {
                "weight": self.weights.get(name, 1.0),
                "gpu_s": round(gpu_ms / 1000, 1),
                "share": round(gpu_ms / all_gpu_ms, 4),
                "share_while_backlogged": round(backlog_ms / peer_ms, 4) if peer_ms > 0 else None,
                "fair_ratio": round(ratio, 4) if ratio is not None else None,
                "backlog_gpu_s": round(backlog_ms / 1000, 1),
            }
        jain = (
            sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios))
            if ratios and any(ratios)
            else None
        )
        return {
            "makespan_s": round(makespan_ms / 1000, 3),
            "gpu_utilization": round(self.busy_ms / capacity_ms, 4) if capacity_ms else 0.0,
            "gpu_utilization_of_available": round(self.busy_ms / self.available_ms, 4)
            if self.available_ms
            else 0.0,
            "utilization_under_backlog": round(
                self.busy_backlog_ms / (self.capacity * self.backlog_ms), 4
            )
            if self.backlog_ms
            else None,
            "backlog_s": round(self.backlog_ms / 1000, 3),
            "goodput_utilization": round(self.goodput_gpu_ms / capacity_ms, 4)
            if capacity_ms
            else 0.0,
            "wait_s": quantiles(self.waits),
            "wait_s_by_tier": {name: quantiles(t.waits) for name, t in sorted(self.tiers.items())},
            "jain_fairness": round(jain, 4) if jain is not None else None,
            "wait_calibration": calibration_table(self.wait_rows),
            "wait_calibration_refreshed": calibration_table(self.refresh_rows),
            "noisy_neighbour": noisy_neighbour_table(
                self.wait_rows, self.tenant_jobs, self.tenant_gpu_s
            ),
            "light_heavy": light_heavy_table(self.wait_rows),
            "tenants": tenants,
            "preemption_cost": self.preemption_cost(),
        }


def _s(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def quantiles(values: array) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    ordered = sorted(values)
    n = len(ordered)

    def q(p: float) -> float:
        # nearest-rank on the sorted values (no interpolation surprises)
        return round(ordered[min(n - 1, max(0, math.ceil(p * n) - 1))], 3)

    return {
        "n": n,
        "p50": q(0.5),
        "p90": q(0.9),
        "p99": q(0.99),
        "max": round(ordered[-1], 3),
        "mean": round(sum(ordered) / n, 3),
    }
