"""A fleet whose jobs the admission core routes: ``simulate --cells N`` (``--routing admission``).

Theory of operation
-------------------
Production admission routes a job by the cells' ``CellOffer`` events (lowest
predicted wait among fresh hosts, tenant stickiness, quota homes; rendezvous of
the job id only with no offer: ``framespool.processors.core.admission``, item 3).
A routing decision depends on every cell's state at the job's submit time, so
the cells cannot be folded apart: here they advance together in virtual time.

1. One ``AdmissionState`` (the real fold) knows the cells by name, the tiers,
   and the tenants whose quotas bind them to a home cell, as the stack's config
   file derives them (``config_file.quota_bound``).
2. Each cell is a ``Simulation`` of ``nodes / N`` nodes whose own stream is
   empty; the fleet reads the workload's stream once, in submit order.
3. Before anything happens at virtual time ``t``, every cell folds its events
   due at or before ``t`` (``Simulation.advance``), cells in name order.
4. Every offer interval (``CellConfig.status_interval_s`` of the base
   configuration, 5 s by default: the cadence the cells publish at), from time
   0, each cell's offer (``Cell.offer_fields``, built between inputs: it
   changes nothing) is folded by admission, cells in name order, stamped with
   that time, as the cells' schedulers send theirs to every commands partition.
5. A job at its submit time ``t`` (after the offers due at or before ``t``):
   a. the edge (the API) refuses it when its tier has a wait limit and even
      the best host's predicted wait exceeds it (``offers.wait_refusal``, on
      admission's offers, what admission routed since them, and the tenant's
      jobs in every cell); the job is booked ``REJECTED`` (``predicted_wait``)
      in the best host's records and reaches no cell;
   b. otherwise admission folds its ``SubmitJob``: ``JobAdmitted`` names the
      cell, which gets the job at ``t`` (``Simulation.receive``); a
      ``JobRejected`` (``no_cell_can_run``) is booked in the records of the
      cell the job id's rendezvous names.
6. After the last job (the stream's end or the horizon) nothing reaches
   admission any more, so each cell folds the rest of its run alone. (The
   simulated cells keep the core's default ``drain_grace_s`` of 0, so none
   gives a queued job up: there is no ``JobRerouted`` to route again, and the
   summary's ``rerouted`` is admission's count, 0. Simulating the drain would
   take moving a job's books between cells' recorders: not done.)

The run is deterministic: the stream, the order of 3-5 and every fold are.

Cost model: the fleet's fold is the sum of the cells' (one process, so no
parallel speed-up: ``--routing hash`` is the mode for that), plus per offer
interval N offers, each O(n * G) to build for n nodes of G GPUs and O(T + G)
to fold, plus per job one advance of each cell (O(N) when nothing is due) and
one admission decision, O(N * (T + G + s)) for T tiers and s shapes. Memory:
every cell's jobs in flight, and admission's decisions of the last
``idempotency_horizon_s`` (10 minutes of submissions).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from time import perf_counter
from typing import Any

from framespool.processors.config_file import quota_bound
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import (
    NO_CELL_CAN_RUN,
    AdmissionConfig,
    AdmissionState,
    rendezvous,
)
from framespool.processors.core.offers import Own, WaitRefusal, live_offers, wait_refusal
from framespool.schemas import events as ev

from .edge import DEFAULT_INTERVAL_S
from .engine import SimOptions, Simulation, job_spec
from .policies import Policy
from .workload import TraceJob, Workload


def admission_config(names: tuple[str, ...], config: CellConfig) -> AdmissionConfig:
    """Admission for cells ``names`` that all run ``config``, as the stack's
    config file makes it (``config_file.admission_config``)."""
    return AdmissionConfig(
        cells=names,
        tiers=tuple(t.name for t in config.tiers),
        quota_tenants=tuple(t.name for t in config.tenants if quota_bound(t)),
        quota_default=quota_bound(config.default_tenant),
    )


def _no_stream(workload: Workload, cell: str) -> Workload:
    """A cell's workload: the fleet's tenants, no stream of its own (the fleet
    hands it its jobs), cut so the cell waits for them instead of draining."""
    return Workload(
        name=workload.name,
        total=0,
        tenants=workload.tenants,
        jobs=lambda: iter(()),
        node_failures_per_hour=workload.node_failures_per_hour,
        description=f"{workload.description}; the jobs admission routed to {cell}",
        notes=list(workload.notes),
        cut=True,
    )


class AdmittedFleet:
    """Cells advanced together in virtual time, each job routed by admission."""

    def __init__(
        self,
        cells: dict[str, Simulation],
        admission: AdmissionState,
        policy: Policy,
        offer_interval_s: float = DEFAULT_INTERVAL_S,
        tape: list[Any] | None = None,
        progress: Callable[[float, str], None] | None = None,
    ) -> None:
        """``tape``: when a list, every input admission folds, in order (tests);
        ``progress(fraction, text)`` every 1,024 jobs routed."""
        self.progress = progress
        self.cells = cells
        self.names = tuple(cells)
        self.admission = admission
        self.policy = policy
        self.every_ms = max(1, int(offer_interval_s * 1000))
        self.next_offer_ms = 0
        self.tape = tape
        self.commands = 0
        self.admitted: Counter[str] = Counter()  # cell -> jobs admission sent there
        self.refused = 0  # the edge's predicted-wait refusals
        self.rejected = 0  # admission's no_cell_can_run
        tiers = next(iter(cells.values())).config.tiers
        self.limited = any(t.max_predicted_wait_s > 0 for t in tiers)
        for cell in cells.values():
            cell.edge.active = False  # the fleet's edge refuses, on every cell's offer

    def run(self, jobs: Iterable[TraceJob], horizon_ms: int | None, total: int = 0) -> None:
        """Fold the fleet: every job of ``jobs`` at or before ``horizon_ms`` routed
        at its submit time, then each cell to its end (theory of operation 3-6);
        ``total``: the jobs in ``jobs``, for progress."""
        for cell in self.cells.values():
            cell.begin()
        past = False
        for n, trace in enumerate(jobs, 1):
            if horizon_ms is not None and trace.submit_ms > horizon_ms:
                past = True
                break
            self.advance(trace.submit_ms)
            self.submit(trace)
            if self.progress is not None and n & 0x3FF == 0:
                done = trace.submit_ms / horizon_ms if horizon_ms else n / max(1, total)
                self.progress(
                    done,
                    f"admission: {n:,} jobs routed, t={trace.submit_ms / 3_600_000:.2f}h virtual",
                )
        if not past:
            for cell in self.cells.values():
                cell.past_horizon = False
                cell.submissions_done = True
        for cell in self.cells.values():
            cell.advance()
            if not cell.stop_reason:
                cell.stop_reason = "event heap empty"

    def advance(self, t_ms: int) -> None:
        """Every cell to ``t_ms``, with admission folding the offers due on the way."""
        while self.next_offer_ms <= t_ms:
            at = self.next_offer_ms
            self._advance_cells(at)
            self.publish_offers(at)
            self.next_offer_ms = at + self.every_ms
        self._advance_cells(t_ms)

    def _advance_cells(self, t_ms: int) -> None:
        for cell in self.cells.values():
            cell.advance(t_ms)

    def publish_offers(self, t_ms: int) -> None:
        """Each cell's offer at ``t_ms`` to admission, in cell order."""
        for name, cell in self.cells.items():
            # every simulated core calls itself ``kinds.CELL``: its offer says which it is
            fields = {**cell.cell.offer_fields(), "cell": name}
            # ``offer_fields`` holds CellOffer's own fields, typed dict[str, object]
            make: Callable[..., ev.CellOffer] = ev.CellOffer
            self._fold(make(event_id=f"offer:{name}@{t_ms}", ts_ms=t_ms, **fields))

    def submit(self, trace: TraceJob) -> None:
        """Route one job at its submit time (theory of operation 5)."""
        t = trace.submit_ms
        spec = job_spec(trace, self.policy)
        if self.limited:
            refused = self._edge(spec, t)
            if refused is not None:
                self.refused += 1
                cell = self.cells[refused.cell]
                cell.receive(trace, t, cell.edge.rejection(spec, refused, t))
                return
        command = ev.SubmitJob(event_id=f"submit:{spec.job_id}", ts_ms=t, spec=spec)
        for out in self._fold(command):
            if isinstance(out, ev.JobAdmitted):
                self.admitted[out.cell] += 1
                self.cells[out.cell].receive(trace, t)
            elif isinstance(out, ev.JobRejected):
                if out.reason == NO_CELL_CAN_RUN:
                    self.rejected += 1
                self.cells[rendezvous(spec.job_id, self.names)].receive(trace, t, out)

    def _edge(self, spec: ev.JobSpec, now_ms: int) -> WaitRefusal | None:
        """The API's refusal, on what it would see (theory of operation 5a)."""
        admission = self.admission
        live = live_offers(admission.offers, self.names, now_ms, admission.config.offer_stale_s)
        waiting = running = 0
        for cell in self.cells.values():
            w, r = cell.cell.tenant_jobs(spec.tenant)
            waiting += w
            running += r
        return wait_refusal(live, spec, admission.routed, Own.of_jobs(spec, waiting, running))

    def _fold(self, command: Any) -> list[Any]:
        self.commands += 1
        if self.tape is not None:
            self.tape.append(command)
        return self.admission.apply(command, f"adm:{self.commands}")

    def decisions(self) -> dict[str, Any]:
        """What admission decided, for the fleet summary."""
        counters = self.admission.counters
        return {
            "admitted": sum(self.admitted.values()),
            "admitted_per_cell": {n: self.admitted.get(n, 0) for n in self.names},
            "rerouted": counters.get("rerouted", 0),
            "rejected_no_cell_can_run": self.rejected,
            "refused_predicted_wait": self.refused,
            "quota_spills": counters.get("quota_spills", 0),
            "offers": counters.get("offers", 0),
        }


def simulate_admitted(
    workload: Workload,
    policy: Policy,
    opts: SimOptions,
    base: CellConfig,
    out_dir: Path,
    names: tuple[str, ...],
    config: CellConfig,
    tape: list[Any] | None = None,
    progress: Callable[[float, str], None] | None = None,
) -> tuple[list[Simulation], AdmittedFleet, float]:
    """Fold the cells ``names`` (``opts`` is one cell's) as one fleet routed by
    admission; return the cells (not yet finished), the fleet and the wall time."""
    wall0 = perf_counter()
    for name in names:
        (out_dir / name).mkdir(parents=True, exist_ok=True)
    cells = {
        name: Simulation(
            _no_stream(workload, name), policy, opts, base, out_dir / name, config=config
        )
        for name in names
    }
    interval = base.status_interval_s or DEFAULT_INTERVAL_S
    admission = AdmissionState(admission_config(names, config))
    fleet = AdmittedFleet(cells, admission, policy, interval, tape, progress)
    horizon_ms = int(opts.max_sim_s * 1000) if opts.max_sim_s > 0 else None
    fleet.run(workload.jobs(), horizon_ms, workload.total)
    return list(cells.values()), fleet, perf_counter() - wall0
