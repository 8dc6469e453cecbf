"""The node agent: the imperative shell around the run ledger and the runner.

Theory of operation
-------------------
1. On start the agent takes a new incarnation (greater than any this data dir
   has used, and than the last one it saw by clock) and produces
   ``NodeRegistered`` to its cell's partition of the scheduler topic, keyed by
   the cell id.
2. It reads only the assignments partition its node id hashes to (manual
   assignment, no rebalances), from the position committed under its own group
   (else 0). Records keyed for other nodes are skipped undecoded; records it
   cannot decode go to dead-letter with a ``reason`` header and their key.
   The reading, the producer and the heartbeat pass are an :class:`AgentHost`'s,
   which one node owns alone or several simulated nodes share (see :mod:`host`).
3. Each instruction goes through :class:`RunLedger` (fencing, dedupe); the
   agent carries out the decision: launch (download the checkpoint, start the
   runner, ``RunStarted``), stop (``RunStopped`` once the process group is
   gone), checkpoint (signal, upload, ``RunCheckpointed``), or confirm a run it
   does not have as stopped. Offsets are committed after the batch is handled:
   a redelivered instruction is deduped by the ledger or fenced by incarnation.
4. Runs report progress to the progress topic (throttled; 0 and 1.0 always),
   upload checkpoints and outputs under run-scoped keys, and end with exactly
   one of ``RunCompleted``/``RunFailed``/``RunStopped`` (deterministic ids).
   Checkpoint uploads finish before the run's final report.
5. Every ``heartbeat_s`` a ``NodeHeartbeat`` carries GPU health (probe plus the
   model last run on each GPU) and a report per run it holds.
6. On shutdown it kills its generators' process groups and exits without
   reporting; after a restart the scheduler reconciles the new incarnation.
   Declared ``DOWN`` while it lives (paused, partitioned), it heals itself
   (:mod:`liveness` decides, :mod:`healing` acts) when the ``NodeStateChanged``
   reaches it on its assignments partition, in order with its instructions
   (the scheduler sends a node's own state changes there too; the agent reads
   no job-events): it stops the old
   incarnation's runs (the scheduler requeued them; their reports keep the
   old incarnation and stay fenced),
   registers again as incarnation + 1 and takes work; reconciliation stops
   whatever of the old incarnation is still listed.
7. Generators get a minimal environment, never the agent's credentials nor
   the paths of its secret files, run as ``generator_user`` where the agent is
   root, in work directories under ``work_dir`` (default: the data dir's
   ``runs``), and only files inside their run's work directory, within the
   profile's limits, are uploaded (see :mod:`sandbox`, :mod:`uploads`). With a
   generator user the agent does not start while that user could read one of
   its secret files (``secret_files`` and those its environment names) or, when
   ``work_dir`` lies outside it, enter its data dir (made 0700).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from framespool.agents import reports
from framespool.agents.artifacts.port import ArtifactStore
from framespool.agents.execution import RunExecution, now_ms
from framespool.agents.gpus import GpuProbe, with_warm_models
from framespool.agents.healing import Healing, next_incarnation
from framespool.agents.ledger import Action, RunLedger
from framespool.agents.liveness import Liveness
from framespool.agents.profiles import ModelProfile
from framespool.agents.sandbox import (
    Identity,
    SandboxError,
    exposed,
    generator_identity,
    secret_files,
    unreachable_part,
)
from framespool.log import LogError, LogProducer, Record, partition_for_key
from framespool.private_files import private_dir
from framespool.schemas import deadletter
from framespool.schemas import topics as catalogue
from framespool.schemas.codec import DecodeError, decode, encode
from framespool.schemas.deadletter import DeadLetterReason
from framespool.schemas.events import (
    BeginRun,
    CheckpointRun,
    NodeHeartbeat,
    NodeStateChanged,
    RunCheckpointed,
    RunCompleted,
    RunProgress,
    StartRun,
    StopRun,
)
from framespool.schemas.fencing import EpochFence
from framespool.schemas.topics import Topics, agent_group, partition_of_cell

if TYPE_CHECKING:  # pragma: no cover
    from framespool.agents.host import AgentHost

log = logging.getLogger(__name__)

RETRY_S = 1.0


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100] or "_"


class NodeAgent(Healing):
    """One node's agent. ``await start()`` / ``await stop()``, or ``run_until_signalled()``."""

    def __init__(
        self,
        node_id: str,
        cell: str,
        bootstrap: str,
        store: ArtifactStore,
        probe: GpuProbe,
        profiles: dict[str, ModelProfile],
        data_dir: Path | str,
        heartbeat_s: float = 1.0,
        time_scale: float = 1.0,
        incarnation: int | None = None,
        *,
        rail: str = "rail-0",
        topics: Topics = catalogue,
        progress_interval_s: float = 0.2,
        generator_user: str | int | None = None,
        work_dir: Path | str | None = None,
        secret_files: tuple[Path | str, ...] = (),
    ) -> None:
        self.progress_interval_s = progress_interval_s
        # Refused here, before registering: tenant code must not run as root by mistake.
        self.identity, self._identity_note = generator_identity(generator_user, os.geteuid())
        self.node_id, self.cell, self.bootstrap = node_id, cell, bootstrap
        self.store, self.probe, self.profiles = store, probe, profiles
        self.data_dir = Path(data_dir)
        self.work_dir = Path(work_dir) if work_dir else self.data_dir / "runs"
        self.secret_files = tuple(Path(p) for p in secret_files)
        self.heartbeat_s, self.time_scale = heartbeat_s, time_scale
        self.rail, self.topics = rail, topics
        self._requested_incarnation = incarnation
        self.incarnation = 0
        self.cell_partition = partition_of_cell(cell)
        if self.cell_partition >= topics.SCHEDULER.partitions:
            raise ValueError(
                f"cell {cell!r} needs partition {self.cell_partition} but "
                f"{topics.SCHEDULER.name} has {topics.SCHEDULER.partitions}"
            )
        self.assignment_partition = partition_for_key(node_id, topics.ASSIGNMENTS.partitions)
        self._key = node_id.encode()
        self._fence = EpochFence()  # drops a superseded scheduler instance's instructions
        self._runs: dict[tuple[str, int], RunExecution] = {}
        self._warm: dict[int, str] = {}
        self._tasks: set[asyncio.Task] = set()
        self.closing = False  # RunHost: once set, runs end without reporting
        self._producer: LogProducer | None = None
        self._host: AgentHost | None = None  # the host this node started alone (None when shared)
        self.ledger: RunLedger = RunLedger(node_id, 0)
        self.liveness = Liveness(node_id)
        self.healing = False  # re-registering: no heartbeats meanwhile

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        """Start this node alone in its process: a host of one (see :mod:`host`)."""
        from framespool.agents.host import AgentHost

        self._host = AgentHost([self], self.bootstrap)
        try:
            await self._host.start()
        except BaseException:
            await self._host.stop()
            raise

    async def open(self, producer: LogProducer) -> None:
        """Take a new incarnation and register it, writing through the host's producer."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.identity is not None:
            self._fence_generators(self.identity)
        self._producer = producer
        self.incarnation = next_incarnation(self.data_dir, self._requested_incarnation)
        self.ledger = RunLedger(self.node_id, self.incarnation)
        await self.register()
        log.info(
            "agent %s incarnation %d registered in %s; assignments %s[%d]; %s",
            self.node_id,
            self.incarnation,
            self.cell,
            self.topics.ASSIGNMENTS.name,
            self.assignment_partition,
            self._identity_note,
        )

    def _fence_generators(self, identity: Identity) -> None:
        """Refuse to start (:class:`SandboxError`) while the generator's user could
        not reach its work dirs or could read a secret of the agent's; the data
        dir, when the work dirs lie outside it, becomes the agent's alone."""
        blocked = unreachable_part(self.work_dir)
        if blocked is not None:
            raise SandboxError(
                f"generators run as {identity.name} but cannot reach {self.work_dir}:"
                f" {blocked} is not searchable by other users; chmod o+x {blocked}"
                " or choose a --work-dir they can reach"
            )
        if not self.work_dir.resolve().is_relative_to(self.data_dir.resolve()):
            private_dir(self.data_dir)
        for path in (*self.secret_files, *secret_files()):
            why = exposed(path, identity)
            if why:
                raise SandboxError(
                    f"generators run as {identity.name} and could read a secret: {why}"
                )

    async def register(self) -> None:
        """``NodeRegistered`` of the current incarnation (its id names it: a re-sent
        one is deduped); self-healing counts from here."""
        cpus = float(os.cpu_count() or 0)
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
        await self.report(
            reports.registered(
                node_id=self.node_id,
                incarnation=self.incarnation,
                cell=self.cell,
                gpus=self.probe.count,
                gpu_type=self.probe.gpu_type,
                rail=self.rail,
                cpus=cpus,
                mem_gb=mem_gb,
                ts_ms=now_ms(),
            )
        )
        self.liveness.registered(self.incarnation, time.monotonic())

    async def stop(self) -> None:
        """Kill every generator's process group; a node started alone also stops
        reading, flushes and closes its host."""
        if self._host is not None:
            await self._host.stop()
        else:
            await self.close_runs()

    async def close_runs(self) -> None:
        """Kill every generator's process group and end this node's tasks."""
        if self.closing:
            return
        self.closing = True
        await asyncio.gather(
            *(execution.shutdown() for execution in self._runs.values()),
            return_exceptions=True,
        )
        pending = list(self._tasks)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 5.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def run_until_signalled(self) -> None:
        """Start, run until SIGTERM or SIGINT, then stop."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"agent-{self.node_id}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "agent %s task %s failed", self.node_id, task.get_name(), exc_info=task.exception()
            )

    # -- producing ------------------------------------------------------------
    async def report(self, event: Any) -> None:
        """Write a report to the cell partition; retried until written or closing.

        A report of a stored object (``RunCheckpointed``, ``RunCompleted``) also
        goes to the job's ``progress`` partition, where the API's storage ledger
        counts it against the tenant's quota and its sweeper finds it when its
        retention ends (``framespool.projections.storage``): every stored object,
        a stale run's too, since its bytes are in the store all the same."""
        assert self._producer is not None
        value = encode(event)
        await self._send_retried(
            event, self.topics.SCHEDULER.name, self.cell, value, self.cell_partition
        )
        if isinstance(event, (RunCheckpointed, RunCompleted)):
            await self._send_retried(event, self.topics.PROGRESS.name, event.job_id, value, None)

    async def _send_retried(
        self, event: Any, topic: str, key: str, value: bytes, partition: int | None
    ) -> None:
        assert self._producer is not None
        while True:
            try:
                await self._producer.send(topic, key, value, partition=partition)
                return
            except LogError as e:
                if self.closing:
                    raise
                log.warning(
                    "agent %s: %s not written (%s); retrying", self.node_id, type(event).__name__, e
                )
                await asyncio.sleep(RETRY_S)

    def _fire(self, topic: str, key: str, event: Any, partition: int | None = None) -> None:
        """Samples (heartbeats, progress): queue and move on; a loss is logged, not retried."""
        assert self._producer is not None
        try:
            self._producer.produce(
                topic, key, encode(event), partition=partition, on_delivery=self._delivery_failed
            )
        except LogError as e:
            log.warning("agent %s: %s not queued: %s", self.node_id, type(event).__name__, e)

    def _delivery_failed(self, error: Any, delivered: Any) -> None:
        if error is not None:
            log.warning("agent %s: sample lost: %s", self.node_id, error)

    # -- instructions (the host dispatches this node's records here) -------------
    async def _handle_record(self, record: Record, acks: list | None = None) -> None:
        """Carry out one assignments record. A report it answers with is awaited,
        or, given ``acks``, written in the background and its task added there (the
        host waits for a whole poll's reports at once, before it commits)."""
        if record.key is not None and record.key != self._key:
            return  # another node's instruction shares this partition
        if not self._fence.admit(record.headers):
            log.info(
                "agent %s ignores %s[%d]@%d: from a scheduler instance a newer owner superseded",
                self.node_id,
                record.topic,
                record.partition,
                record.offset,
            )
            return
        if record.value is None:
            return await self._dead_letter(record, DeadLetterReason.NO_VALUE, "record has no value")
        try:
            cmd = decode(record.value)
        except DecodeError as e:
            return await self._dead_letter(record, e.reason, str(e))
        if isinstance(cmd, NodeStateChanged):
            # the scheduler's word on this node (a DOWN heals it: healing.py)
            return self.on_node_state(cmd)
        if not isinstance(cmd, (StartRun, StopRun, CheckpointRun, BeginRun)):
            return await self._dead_letter(
                record,
                DeadLetterReason.UNEXPECTED_TYPE,
                f"{type(cmd).__name__} does not belong on assignments",
            )
        decision = self.ledger.decide(cmd)
        key = (decision.job_id, decision.run)
        if decision.action is Action.IGNORE:
            log.info(
                "agent %s ignores %s %s (job %s run %d): %s",
                self.node_id,
                type(cmd).__name__,
                cmd.event_id,
                *key,
                decision.reason,
            )
        elif decision.action is Action.LAUNCH:
            assert isinstance(cmd, StartRun)
            for old in decision.supersedes:
                self._stop_run(old)
            self._launch(cmd)
        elif decision.action is Action.STOP:
            self._stop_run(key)
        elif decision.action is Action.CHECKPOINT:
            self._checkpoint(key)
        elif decision.action is Action.BEGIN:
            execution = self._runs.get(key)
            if execution is not None:
                execution.begin()
        elif decision.action is Action.REPORT_STOPPED:
            written = self.report(
                reports.stopped(
                    self.node_id,
                    self.incarnation,
                    *key,
                    now_ms(),
                    f"run not on node {self.node_id}",
                )
            )
            if acks is None:
                await written
            else:
                acks.append(self.spawn(written, f"stopped-{key[0]}-{key[1]}"))

    async def _dead_letter(self, record: Record, reason: str, detail: str) -> None:
        log.warning(
            "agent %s: %s[%d]@%d to dead-letter: %s",
            self.node_id,
            record.topic,
            record.partition,
            record.offset,
            detail,
        )
        assert self._producer is not None
        headers = (
            *record.headers,
            *deadletter.headers(
                reason,
                detail,
                agent_group(self.node_id),
                record.topic,
                record.partition,
                record.offset,
            ),
        )
        while True:
            try:
                await self._producer.send(
                    self.topics.DEAD_LETTER.name, record.key, record.value, headers=headers
                )
                return
            except LogError as e:
                if self.closing:
                    raise
                log.warning("agent %s: dead-letter write failed (%s); retrying", self.node_id, e)
                await asyncio.sleep(RETRY_S)

    # -- carrying out decisions -------------------------------------------------
    def _launch(self, cmd: StartRun) -> None:
        spec = cmd.spec
        workdir = self.work_dir / _safe(spec.job_id) / str(cmd.run)
        execution = RunExecution(
            self,
            cmd,
            self.profiles.get(spec.model),
            workdir,
            self.progress_interval_s,
            identity=self.identity,
            secrets=(*self.secret_files, *secret_files()),
        )
        self._runs[execution.key] = execution
        self.spawn(execution.execute(), f"run-{spec.job_id}-{cmd.run}")

    def _stop_run(self, key: tuple[str, int]) -> None:
        execution = self._runs.get(key)
        if execution is not None:
            self.spawn(execution.stop(), f"stop-{key[0]}-{key[1]}")

    def _checkpoint(self, key: tuple[str, int]) -> None:
        execution = self._runs.get(key)
        if execution is not None:
            execution.checkpoint()

    # -- RunHost ------------------------------------------------------------------
    def publish_progress(self, event: RunProgress) -> None:
        self._fire(self.topics.PROGRESS.name, event.job_id, event)

    def run_started(self, execution: RunExecution) -> None:
        for g in execution.cmd.gpus:
            self._warm[g] = execution.cmd.spec.model  # the weights now loaded on that GPU
        self._update_busy()

    def run_ended(self, execution: RunExecution) -> None:
        if self._runs.get(execution.key) is execution:
            del self._runs[execution.key]
        self.ledger.forget_finished()
        self._update_busy()

    # -- heartbeats --------------------------------------------------------------
    def beat(self) -> None:
        """Queue one heartbeat (the host's pass calls it for every node it hosts)."""
        if self.closing or self.healing or self._producer is None:
            return
        try:
            self._fire(self.topics.SCHEDULER.name, self.cell, self.heartbeat(), self.cell_partition)
        except Exception:  # a probe failure must not silence the node (it would look DOWN)
            log.exception("agent %s: heartbeat not built", self.node_id)

    def heartbeat(self) -> NodeHeartbeat:
        """This node's sample: GPU health and the runs it holds, less those whose
        final report is already queued ahead of this heartbeat (``RunExecution.ending``)."""
        runs = [
            self._runs[key].report() for key in sorted(self._runs) if not self._runs[key].ending
        ]
        return reports.heartbeat(
            event_id=uuid.uuid4().hex,
            node_id=self.node_id,
            incarnation=self.incarnation,
            ts_ms=now_ms(),
            gpus=with_warm_models(self.probe.sample(), self._warm),
            runs=runs,
        )

    def _update_busy(self) -> None:
        set_busy = getattr(self.probe, "set_busy", None)
        if set_busy is not None:
            set_busy({g for r in self._runs.values() if r.runner is not None for g in r.cmd.gpus})
