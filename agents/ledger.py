"""The agent's decisions, as a pure state machine with no IO.

Theory of operation
-------------------
The agent shell decodes a record from its assignments partition and hands the
instruction to :class:`RunLedger`, which answers with one :class:`Decision`.
The shell carries the decision out (launch a runner, signal it, report) and
later tells the ledger how the run ended with :meth:`RunLedger.finished`.

Fencing, in the order it is checked:

1. an instruction for another node is ``SKIP`` (the partition is shared);
2. an instruction whose ``incarnation`` is not this agent's is ``IGNORE``:
   it was meant for an earlier (or a later, unknown) registration of the node;
3. an ``event_id`` seen before is ``IGNORE`` (at-least-once redelivery);
4. a ``StartRun`` for a ``(job_id, run)`` seen before, or with a run number
   lower than the highest seen for that job, is ``IGNORE``: runs are the job's
   fencing epoch and only move forward. A higher run of a job that still runs
   here ``LAUNCH``-es and names the older run in ``supersedes`` so the shell
   stops it (its attempt is over);
5. ``StopRun``/``CheckpointRun`` for a run this node runs act on it; for a run
   it does not have they ``REPORT_STOPPED`` so the scheduler can release GPUs;
6. ``BeginRun`` (a gang's start barrier is passed) ``BEGIN``-s a run this node
   holds and has not started computing; otherwise it is ``IGNORE``-d (a run
   that is not here meets the scheduler's per-member lease).

A node declared DOWN registers again (:meth:`RunLedger.reincarnate`): the ledger
takes the new incarnation, so everything addressed to the old one is fenced by
rule 2, and the old incarnation's runs are stopped (they were requeued).

Bounded memory: the ledger remembers the last ``MAX_SEEN_EVENTS`` event ids
(redelivery is of recent records: the agent resumes at its committed offset)
and the fencing epochs of the last ``MAX_JOBS`` jobs it was told about; an
older job's epoch is forgotten once none of its runs is active here (a very
late instruction for it then meets the scheduler's reconciliation, which
stops any run it did not assign). ``ignored`` keeps the last
``MAX_IGNORED`` refusals.

Per-run states: ``LAUNCHING`` (checkpoint download, process start),
``RUNNING``, ``STOPPING`` and ``FINISHED``. Small timing policies the shell
consults (progress throttling, step rate) live here too: they take
``now`` as an argument and never read a clock.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from framespool.schemas.events import BeginRun, CheckpointRun, StartRun, StopRun

Instruction = StartRun | StopRun | CheckpointRun | BeginRun
RunKey = tuple[str, int]


class Action(enum.Enum):
    SKIP = "skip"  # not for this node
    IGNORE = "ignore"  # fenced or duplicate: do nothing
    LAUNCH = "launch"  # start the generator
    STOP = "stop"  # stop a run this node has
    CHECKPOINT = "checkpoint"  # ask a run this node has to checkpoint
    REPORT_STOPPED = "report_stopped"  # node has no such run: confirm it is gone
    BEGIN = "begin"  # every gang member holds its GPUs: the run may compute


class RunState(enum.Enum):
    LAUNCHING = "launching"
    RUNNING = "running"
    STOPPING = "stopping"
    FINISHED = "finished"


ACTIVE_STATES = (RunState.LAUNCHING, RunState.RUNNING, RunState.STOPPING)

MAX_SEEN_EVENTS = 50_000
MAX_JOBS = 10_000
MAX_IGNORED = 1_000

# (current state, action) -> next state; a pair not listed leaves it unchanged.
TRANSITIONS: dict[tuple[RunState, Action], RunState] = {
    (RunState.LAUNCHING, Action.STOP): RunState.STOPPING,
    (RunState.RUNNING, Action.STOP): RunState.STOPPING,
}


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str
    job_id: str = ""
    run: int = 0
    supersedes: tuple[RunKey, ...] = ()


@dataclass(slots=True)
class RunEntry:
    job_id: str
    run: int
    gpus: tuple[int, ...]
    model: str
    state: RunState = RunState.LAUNCHING
    stop_reason: str = ""


class RunLedger:
    """What this node (one incarnation) was told to run, and what it runs."""

    def __init__(self, node_id: str, incarnation: int) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self._seen_events: set[str] = set()
        self._event_order: deque[str] = deque()  # oldest first, to forget
        self._seen_runs: set[RunKey] = set()
        self._highest_run: dict[str, int] = {}
        self._job_order: deque[str] = deque()  # jobs in the order first seen, to forget
        self._runs: dict[RunKey, RunEntry] = {}
        # (event_id, reason), for logs/tests: the most recent (up to 2 * MAX_IGNORED)
        self.ignored: list[tuple[str, str]] = []

    # -- instructions -------------------------------------------------------
    def decide(self, cmd: Instruction) -> Decision:
        """Classify one instruction and update the ledger accordingly."""
        job_id = cmd.spec.job_id if isinstance(cmd, StartRun) else cmd.job_id
        if cmd.node_id != self.node_id:
            return Decision(Action.SKIP, f"for node {cmd.node_id}", job_id, cmd.run)
        if cmd.incarnation != self.incarnation:
            older = "stale" if cmd.incarnation < self.incarnation else "unknown"
            return self._ignore(
                cmd,
                f"{older} incarnation {cmd.incarnation} (this node is {self.incarnation})",
                job_id,
            )
        if cmd.event_id in self._seen_events:
            return self._ignore(cmd, "duplicate event_id", job_id)
        self._seen_events.add(cmd.event_id)
        self._event_order.append(cmd.event_id)
        if len(self._event_order) > MAX_SEEN_EVENTS:
            self._seen_events.discard(self._event_order.popleft())
        if isinstance(cmd, StartRun):
            return self._start(cmd)
        if isinstance(cmd, BeginRun):
            return self._begin(cmd)
        return self._stop_or_checkpoint(cmd)

    def _begin(self, cmd: BeginRun) -> Decision:
        entry = self._runs.get((cmd.job_id, cmd.run))
        if entry is None or entry.state is not RunState.LAUNCHING:
            why = "no such run on this node" if entry is None else f"run is {entry.state.value}"
            return self._ignore(cmd, why, cmd.job_id)
        return Decision(Action.BEGIN, cmd.reason or "start barrier passed", cmd.job_id, cmd.run)

    def _start(self, cmd: StartRun) -> Decision:
        key = (cmd.spec.job_id, cmd.run)
        highest = self._highest_run.get(cmd.spec.job_id, 0)
        if key in self._seen_runs:
            return self._ignore(cmd, f"duplicate run {cmd.run}", key[0])
        if cmd.run < highest:
            return self._ignore(cmd, f"stale run {cmd.run} (seen run {highest})", key[0])
        self._seen_runs.add(key)
        self._raise_epoch(key[0], cmd.run)
        superseded = tuple(
            k for k, e in self._runs.items() if k[0] == key[0] and e.state in ACTIVE_STATES
        )
        for k in superseded:
            self._apply(self._runs[k], Action.STOP, f"superseded by run {cmd.run}")
        self._runs[key] = RunEntry(key[0], cmd.run, tuple(cmd.gpus), cmd.spec.model)
        return Decision(Action.LAUNCH, "new run", key[0], cmd.run, superseded)

    def _stop_or_checkpoint(self, cmd: StopRun | CheckpointRun) -> Decision:
        key = (cmd.job_id, cmd.run)
        entry = self._runs.get(key)
        if entry is None or entry.state is RunState.FINISHED:
            # A late StartRun for this run must not launch it after we said "stopped".
            if isinstance(cmd, StopRun):
                self._seen_runs.add(key)
                self._raise_epoch(cmd.job_id, max(self._highest_run.get(cmd.job_id, 0), cmd.run))
            return Decision(Action.REPORT_STOPPED, "no such run on this node", *key)
        if isinstance(cmd, StopRun):
            if entry.state is RunState.STOPPING:
                return self._ignore(cmd, "already stopping", cmd.job_id)
            self._apply(entry, Action.STOP, cmd.reason or "stop requested")
            return Decision(Action.STOP, entry.stop_reason, *key)
        if entry.state is not RunState.RUNNING:
            return self._ignore(cmd, f"run is {entry.state.value}", cmd.job_id)
        return Decision(Action.CHECKPOINT, cmd.reason or "checkpoint requested", *key)

    def _raise_epoch(self, job_id: str, run: int) -> None:
        """Record the job's highest run; past ``MAX_JOBS`` jobs, forget the oldest
        whose runs are all over here."""
        if job_id not in self._highest_run:
            self._job_order.append(job_id)
        self._highest_run[job_id] = run
        for _ in range(len(self._job_order)):
            if len(self._highest_run) <= MAX_JOBS:
                return
            oldest = self._job_order.popleft()
            if any(e.state in ACTIVE_STATES for k, e in self._runs.items() if k[0] == oldest):
                self._job_order.append(oldest)  # still running here: keep its epoch
                continue
            for r in range(self._highest_run.pop(oldest, 0) + 1):
                self._seen_runs.discard((oldest, r))

    def _apply(self, entry: RunEntry, action: Action, reason: str) -> None:
        nxt = TRANSITIONS.get((entry.state, action))
        if nxt is not None:
            entry.state = nxt
            if action is Action.STOP:
                entry.stop_reason = reason

    def _ignore(self, cmd: Instruction, reason: str, job_id: str) -> Decision:
        self.ignored.append((cmd.event_id, reason))
        if len(self.ignored) > 2 * MAX_IGNORED:
            del self.ignored[:-MAX_IGNORED]
        return Decision(Action.IGNORE, reason, job_id, cmd.run)

    # -- run lifecycle, as the shell observes it ----------------------------
    def started(self, job_id: str, run: int) -> bool:
        """The process is up. False if a stop arrived meanwhile (shell must stop it)."""
        entry = self._runs.get((job_id, run))
        if entry is None or entry.state is not RunState.LAUNCHING:
            return False
        entry.state = RunState.RUNNING
        return True

    def finished(self, job_id: str, run: int) -> None:
        entry = self._runs.get((job_id, run))
        if entry is not None:
            entry.state = RunState.FINISHED

    def reincarnate(self, incarnation: int, reason: str) -> tuple[RunKey, ...]:
        """The node registers again as ``incarnation`` (it was declared DOWN): every
        active run is over (the scheduler requeued it) and is marked ``STOPPING``;
        their keys are returned for the shell to stop. Fencing memory (seen events,
        runs, job epochs) is kept, so an instruction of the old incarnation is
        ``IGNORE``-d and a ``StopRun`` of the new one still finds an old run."""
        if incarnation <= self.incarnation:
            raise ValueError(
                f"incarnation {incarnation} must exceed {self.incarnation} (node {self.node_id})"
            )
        self.incarnation = incarnation
        over = tuple(k for k, e in sorted(self._runs.items()) if e.state in ACTIVE_STATES)
        for key in over:
            self._apply(self._runs[key], Action.STOP, reason)
        return over

    def entry(self, job_id: str, run: int) -> RunEntry | None:
        return self._runs.get((job_id, run))

    def active(self) -> list[RunEntry]:
        """Runs whose processes may exist, in a stable order."""
        return sorted(
            (e for e in self._runs.values() if e.state in ACTIVE_STATES),
            key=lambda e: (e.job_id, e.run),
        )

    def forget_finished(self) -> None:
        """Drop finished entries; fencing sets (seen events, runs) are kept."""
        for key in [k for k, e in self._runs.items() if e.state is RunState.FINISHED]:
            del self._runs[key]


# ---------------------------------------------------------------------------
# Timing policies (pure: ``now`` is an argument)
# ---------------------------------------------------------------------------
@dataclass(slots=True)
class ProgressThrottle:
    """At most one progress report per ``min_interval_s`` per run, except that
    the first report (progress 0) and the last (1.0) always go out."""

    min_interval_s: float = 0.2
    _last: dict[RunKey, tuple[float, float]] = field(default_factory=dict)

    def should_send(self, key: RunKey, progress: float, now: float) -> bool:
        last = self._last.get(key)
        send = (
            last is None
            or progress >= 1.0
            or (progress != last[1] and now - last[0] >= self.min_interval_s)
        )
        if send:
            self._last[key] = (now, progress)
        return send

    def forget(self, key: RunKey) -> None:
        self._last.pop(key, None)


@dataclass(slots=True)
class StepRate:
    """Steps per second over a sliding window of recent progress samples."""

    window: int = 8
    _samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, now: float, step: int) -> None:
        if self._samples and step < self._samples[-1][1]:
            self._samples.clear()  # resumed or restarted: old samples mean nothing
        self._samples.append((now, step))
        del self._samples[: -self.window]

    @property
    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
