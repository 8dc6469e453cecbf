"""Checks of a cell's emitted history against its inputs, without the core (pure).

Theory of operation
-------------------
A cell's inputs (by offset) and its outputs (by ``cell-<p>@<offset>/<i>``)
form one timeline: input ``o`` is followed by its outputs ``o/0, o/1, ...``.
Walking it, :class:`CellLedger` keeps what the log itself says, independently
of the core's state:

- **GPU holdings.** A ``JobAssigned`` takes its placement's GPUs; a GPU already
  held by another run is a *double booking*. A run's GPUs on a node are given
  back when the run has ended (``JobCompleted``/``JobFailed``/``JobCancelled``/
  ``JobRequeued``/``JobPreempted`` for that run) AND that node's agent
  confirmed its processes there are gone: a ``RunStopped``, ``RunFailed`` or
  ``RunCompleted`` from that node about the run (even one the cell ignored as
  stale: it is still the agent's word), or an accepted heartbeat of that node
  that no longer lists the run; or at once when the node goes DOWN or
  re-registers (an accepted registration: one the cell did not answer with a
  ``ReportIgnored``). This is stricter than the core, which takes one node's
  ``RunCompleted`` as confirming every node of a gang.

  ``JobPreempted`` ends its run: the core emits it from ``finish_exit`` after
  ``end_run`` has released (or asked to stop) the run's GPUs, and then a
  ``JobRequeued`` of the same run puts the *job* back in the queue
  (docs/design.md#job-lifecycle-and-fencing). Either event alone is enough
  here; the second one of a run changes nothing.
- **What the nodes ran.** Seen from the agents' reports (each report id
  counted once: a re-delivered report is the same report): a ``RunStarted`` on
  a GPU of a node where another run started and has not yet sent its final
  report from that node (``RunCompleted``/``RunFailed``/``RunStopped``), nor
  has the node registered again since (a new incarnation's agent ended its old
  processes), is a *double start*: two generators on one GPU.
- **Fencing.** The job's current run is its latest ``JobAssigned``; a node's
  current incarnation is its latest accepted ``NodeRegistered``. A report of
  another run, of a finished job, or of an older incarnation is *stale*: its
  outputs may only be ``ReportIgnored`` and ``StopRun`` (telling zombies to
  stop); anything else is a state change from a stale report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from framespool.schemas import events as ev
from framespool.schemas import positions
from framespool.schemas.states import NodeState

RUN_REPORTS = (ev.RunStarted, ev.RunCheckpointed, ev.RunCompleted, ev.RunFailed, ev.RunStopped)
STALE_MAY_EMIT = (ev.ReportIgnored, ev.StopRun)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: ``kind`` (machine-readable), what it is about, where."""

    kind: str
    subject: str
    detail: str
    where: str = ""
    gpus: tuple[tuple[str, int], ...] = ()  # the (node, GPU)s concerned, if any

    def to_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "detail": self.detail,
            "where": self.where,
        }

    def line(self) -> str:
        return f"{self.kind}: {self.subject}: {self.detail}" + (
            f" [{self.where}]" if self.where else ""
        )


@dataclass
class _Holding:
    run: tuple[str, int]
    since: str  # event id of the JobAssigned


@dataclass
class CellLedger:
    cell: str
    violations: list[Violation] = field(default_factory=list)
    gpus: dict[tuple[str, int], _Holding] = field(default_factory=dict)
    node_size: dict[str, int] = field(default_factory=dict)
    incarnation: dict[str, int] = field(default_factory=dict)
    current_run: dict[str, int] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    ended: set[tuple[str, int]] = field(default_factory=set)
    confirmed: set[tuple[tuple[str, int], str]] = field(default_factory=set)
    placed: dict[tuple[str, int], dict[str, tuple[int, ...]]] = field(default_factory=dict)
    # (node, GPU) -> (job, run, incarnation) started there and not yet ended there
    occupant: dict[tuple[str, int], tuple[str, int, int]] = field(default_factory=dict)
    reports_seen: set[str] = field(default_factory=set)
    assignments: int = 0
    stale_reports: int = 0
    unplaced: int = 0

    # -- the walk --------------------------------------------------------------
    def walk(
        self, inputs: Iterable[tuple[int, Any]], outputs: Mapping[int, list[Any]]
    ) -> CellLedger:
        """``inputs``: (offset, event) in offset order (None for undecodable);
        ``outputs``: offset -> that input's emitted outputs in index order."""
        seen: set[int] = set()
        for offset, event in inputs:
            seen.add(offset)
            outs = outputs.get(offset, [])
            ignored = {o.source_event_id for o in outs if isinstance(o, ev.ReportIgnored)}
            accepted = event is not None and event.event_id not in ignored
            stale = self._stale(event) if event is not None else False
            if stale:
                self.stale_reports += 1
                changes = [o for o in outs if not isinstance(o, STALE_MAY_EMIT)]
                if changes:
                    self.violations.append(
                        Violation(
                            "stale_report_changed_state",
                            _subject(event),
                            f"stale {type(event).__name__} {event.event_id} ({stale}) produced "
                            + ", ".join(f"{type(o).__name__} {o.event_id}" for o in changes),
                            f"{self.cell}@{offset}",
                        )
                    )
            if event is not None:
                self._input(event, accepted)
                self._node_view(event, f"{self.cell}@{offset}")
            for out in outs:
                self._output(out, offset)
        # Outputs of inputs read after this walk's inputs (the log grew) are left out.
        self.unplaced = sum(len(v) for k, v in outputs.items() if k not in seen)
        return self

    def _stale(self, e: Any) -> str:
        if isinstance(e, RUN_REPORTS):
            if e.job_id in self.finished:
                return f"job {e.job_id} already finished"
            current = self.current_run.get(e.job_id)
            if current is None:
                return f"job {e.job_id} has no run"
            if e.run != current and not isinstance(e, ev.RunStopped):
                return f"run {e.run} is not the current run {current}"
            if (e.job_id, e.run) in self.ended and not isinstance(e, ev.RunStopped):
                return f"run {e.run} already ended"
            if e.incarnation < self.incarnation.get(e.node_id, 0):
                return f"incarnation {e.incarnation} < {self.incarnation[e.node_id]}"
            return ""
        if isinstance(e, (ev.NodeHeartbeat, ev.NodeRegistered)):
            known = self.incarnation.get(e.node_id)
            if known is not None and (
                e.incarnation < known
                or (isinstance(e, ev.NodeRegistered) and e.incarnation == known)
            ):
                return f"incarnation {e.incarnation}, node is at {known}"
        return ""

    def _input(self, e: Any, accepted: bool) -> None:
        if isinstance(e, ev.NodeRegistered):
            if accepted and e.incarnation > self.incarnation.get(e.node_id, 0):
                self._release_node(e.node_id)
                self.incarnation[e.node_id] = e.incarnation
                self.node_size[e.node_id] = e.gpus
        elif isinstance(e, (ev.RunCompleted, ev.RunStopped, ev.RunFailed)):
            self._confirm((e.job_id, e.run), e.node_id)
        elif (
            isinstance(e, ev.NodeHeartbeat)
            and accepted
            and e.incarnation == self.incarnation.get(e.node_id)
        ):
            listed = {(r.job_id, r.run) for r in e.runs}
            for (node, _), h in list(self.gpus.items()):
                if node == e.node_id and h.run not in listed and h.run in self.ended:
                    self._confirm(h.run, node)

    def _node_view(self, e: Any, where: str) -> None:
        """What the agents say ran where (the double-start check; first id wins)."""
        if not isinstance(e, (ev.NodeRegistered, *RUN_REPORTS)) or e.event_id in self.reports_seen:
            return
        self.reports_seen.add(e.event_id)
        if isinstance(e, ev.NodeRegistered):
            for slot, held in list(self.occupant.items()):
                if slot[0] == e.node_id and held[2] < e.incarnation:
                    del self.occupant[slot]
        elif isinstance(e, ev.RunStarted):
            key = (e.job_id, e.run)
            for gpu in self.placed.get(key, {}).get(e.node_id, ()):
                prev = self.occupant.get((e.node_id, gpu))
                if prev is not None and prev[:2] != key:
                    self.violations.append(
                        Violation(
                            "double_started",
                            f"{e.node_id}:{gpu}",
                            f"{e.job_id}#{e.run} started on GPU {gpu} of {e.node_id} "
                            f"({e.event_id}) while {prev[0]}#{prev[1]} (incarnation {prev[2]}) "
                            "had not reported its end there",
                            where,
                            ((e.node_id, gpu),),
                        )
                    )
                self.occupant[(e.node_id, gpu)] = (e.job_id, e.run, e.incarnation)
        elif isinstance(e, (ev.RunCompleted, ev.RunFailed, ev.RunStopped)):
            for slot, held in list(self.occupant.items()):
                if slot[0] == e.node_id and held[:2] == (e.job_id, e.run):
                    del self.occupant[slot]

    def _output(self, o: Any, offset: int) -> None:
        if isinstance(o, ev.JobAssigned):
            self._assign(o, offset)
        elif isinstance(o, ev.RUN_ENDS):
            if isinstance(o, (ev.JobCompleted, ev.JobFailed, ev.JobCancelled)):
                self.finished.add(o.job_id)
            key = (o.job_id, o.run)
            if key not in self.ended:
                self.ended.add(key)
                for node in {n for (n, _), h in self.gpus.items() if h.run == key}:
                    if (key, node) in self.confirmed:
                        self._release(key, node)
        elif isinstance(o, ev.JobRejected):
            self.finished.add(o.job_id)
        elif isinstance(o, ev.NodeStateChanged) and o.gpu == -1 and o.state == NodeState.DOWN:
            self._release_node(o.node_id)

    def _assign(self, o: ev.JobAssigned, offset: int) -> None:
        self.assignments += 1
        key = (o.job_id, o.run)
        self.current_run[o.job_id] = o.run
        self.placed[key] = {p.node_id: tuple(p.gpus) for p in o.placement}
        where = f"{self.cell}@{offset}"
        for piece in o.placement:
            size = self.node_size.get(piece.node_id)
            clashes: dict[tuple[str, int], tuple[str, list[int]]] = {}
            for gpu in piece.gpus:
                if size is not None and not 0 <= gpu < size:
                    self.violations.append(
                        Violation(
                            "gpu_out_of_range",
                            f"{piece.node_id}:{gpu}",
                            f"{o.event_id} places {o.job_id}#{o.run} on GPU {gpu} of a "
                            f"{size}-GPU node",
                            where,
                            ((piece.node_id, gpu),),
                        )
                    )
                holder = self.gpus.get((piece.node_id, gpu))
                if holder is not None and holder.run != key:
                    clashes.setdefault(holder.run, (holder.since, []))[1].append(gpu)
                self.gpus[(piece.node_id, gpu)] = _Holding(key, o.event_id)
            for other, (since, gpus) in clashes.items():
                self.violations.append(
                    Violation(
                        "double_booked",
                        f"{piece.node_id}:{','.join(map(str, gpus))}",
                        f"{o.event_id} gives GPU(s) {gpus} of {piece.node_id} to {o.job_id}#{o.run} "
                        f"while {other[0]}#{other[1]} holds them (assigned by {since}, not yet "
                        "released and confirmed)",
                        where,
                        tuple((piece.node_id, g) for g in gpus),
                    )
                )

    def _confirm(self, run: tuple[str, int], node: str) -> None:
        self.confirmed.add((run, node))
        if run in self.ended:
            self._release(run, node)

    def _release(self, run: tuple[str, int], node: str) -> None:
        for slot in [s for s, h in self.gpus.items() if s[0] == node and h.run == run]:
            del self.gpus[slot]

    def _release_node(self, node: str) -> None:
        for slot in [s for s in self.gpus if s[0] == node]:
            del self.gpus[slot]

    # -- the end ---------------------------------------------------------------
    def held_by(self) -> dict[tuple[str, int], int]:
        """GPUs still held at the end of the log, per run."""
        out: dict[tuple[str, int], int] = {}
        for h in self.gpus.values():
            out[h.run] = out.get(h.run, 0) + 1
        return out


def _subject(e: Any) -> str:
    if isinstance(e, RUN_REPORTS):
        return f"{e.job_id}#{e.run}"
    return getattr(e, "node_id", "") or getattr(e, "event_id", "?")


def check_cell_history(
    cell: str, inputs: Iterable[tuple[int, Any]], outputs: Iterable[Any]
) -> CellLedger:
    """Walk one cell's inputs and emitted outputs (any order; placed by event id)."""
    by_offset: dict[int, list[tuple[int, Any]]] = {}
    seen: set[str] = set()
    for o in outputs:
        pos = positions.parse_cell(o.event_id)
        if pos is not None and pos[0] == cell and o.event_id not in seen:
            seen.add(o.event_id)  # at-least-once: a re-delivered output is the same one
            by_offset.setdefault(pos[1], []).append((pos[2], o))
    ordered = {
        off: [o for _, o in sorted(items, key=lambda x: x[0])] for off, items in by_offset.items()
    }
    return CellLedger(cell).walk(inputs, ordered)


def first_terminal_violations(job_events: Iterable[Any]) -> tuple[list[Violation], dict[str, Any]]:
    """Exactly one terminal event per job (after deduplication by event id).

    Returns the violations and each job's first terminal event."""
    violations: list[Violation] = []
    first: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    for e in job_events:
        if e.event_id in seen:
            if seen[e.event_id] != e:
                violations.append(
                    Violation(
                        "conflicting_duplicate",
                        e.event_id,
                        f"two different events carry this id: {type(seen[e.event_id]).__name__} "
                        f"and {type(e).__name__}",
                    )
                )
            continue
        seen[e.event_id] = e
        if not isinstance(e, ev.TERMINAL_EVENTS):
            continue
        earlier: Any | None = first.get(e.job_id)
        if earlier is None:
            first[e.job_id] = e
            continue
        violations.append(
            Violation(
                "duplicate_terminal",
                e.job_id,
                f"{type(e).__name__} {e.event_id} after {type(earlier).__name__} "
                f"{earlier.event_id}: a job has exactly one terminal event",
                e.event_id,
            )
        )
    return violations, first
