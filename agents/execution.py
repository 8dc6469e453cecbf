"""One run on this node, from StartRun to its single final report.

Theory of operation
-------------------
1. Without a profile for the job's model, or with a placement this node has
   no rank in, the run fails at once (``launch_error``).
2. With ``resume_from``, the checkpoint (this rank's, in a gang) is
   downloaded and checksum-verified; an unusable one is logged and the run
   starts from scratch: losing progress beats failing the job.
3. The work directory goes to the generator's user. A gang member then
   reports ``RunStarted`` (it holds its GPUs) and waits at the start barrier
   for the scheduler's ``BeginRun`` (every member holds its GPUs) before it
   starts anything; a stop (or the agent closing) ends the wait instead. The
   generator starts with a minimal environment (a run alone queues
   ``RunStarted`` now, without waiting for the broker: the producer keeps the
   partition's order, and a short run's final report shares its request); a
   stop that arrived meanwhile stops it at once. A builtin (``noop``) runs in
   the agent: it gets no work directory, and its output is kept from memory
   (:meth:`RunFiles.keep_result`).
   Periodic checkpoints are requested every
   ``checkpoint_interval_s / time_scale`` (at least ``MIN_CHECKPOINT_WALL_S``)
   when the spec asks for them.
4. Progress goes to the progress topic through a per-run throttle; every
   checkpoint the generator reports is staged from its work directory (see
   :mod:`keeping`), uploaded under a run-scoped key (its rank's in a gang)
   and reported (``RunCheckpointed`` with its step, by every rank: the
   scheduler resumes a gang from the latest step all ranks wrote), in step
   order.
5. When the process group is gone, pending checkpoint uploads finish, then the
   run ends with exactly one of ``RunCompleted`` (output uploaded with its
   digest), ``RunFailed`` (class, reason with stderr tail, exit code) or
   ``RunStopped``; once that report is queued the node's heartbeats stop
   listing the run. A gang member other than the result rank that exits 0
   holds the run until the gang is stopped (see :mod:`gang`). While the agent
   shuts down nothing is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Protocol

from framespool.agents import reports
from framespool.agents.artifacts.port import ArtifactStore
from framespool.agents.builtin import BuiltinRunner
from framespool.agents.gang import GangError, Membership, membership
from framespool.agents.keeping import RunFiles
from framespool.agents.launch import runner_for
from framespool.agents.ledger import ProgressThrottle, RunLedger, RunState
from framespool.agents.profiles import ModelProfile
from framespool.agents.runner import (
    COMPLETED,
    HUNG,
    STOPPED,
    Checkpoint,
    LaunchError,
    Outcome,
    Progress,
    Runner,
)
from framespool.agents.sandbox import Identity, hand_over
from framespool.agents.uploads import UploadRefused
from framespool.schemas.events import RunProgress, RunReport, StartRun

log = logging.getLogger(__name__)

# wall seconds between periodic checkpoints at the least, whatever the spec says
# (the API refuses less than Limits.checkpoint_interval_min_s; a job admitted
# before that check, or a fast time scale, must not make the agent spin)
MIN_CHECKPOINT_WALL_S = 1.0


def checkpoint_period_s(interval_s: float, time_scale: float) -> float:
    """Wall seconds between the periodic checkpoints of a spec's ``interval_s``."""
    return max(MIN_CHECKPOINT_WALL_S, interval_s / max(time_scale, 1e-9))


class RunHost(Protocol):
    """What a run needs from its agent."""

    node_id: str
    incarnation: int
    store: ArtifactStore
    ledger: RunLedger
    time_scale: float
    closing: bool

    async def report(self, event: Any) -> None: ...

    def publish_progress(self, event: RunProgress) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

    def run_started(self, execution: RunExecution) -> None: ...

    def run_ended(self, execution: RunExecution) -> None: ...


def now_ms() -> int:
    return int(time.time() * 1000)


class RunExecution:
    def __init__(
        self,
        host: RunHost,
        cmd: StartRun,
        profile: ModelProfile | None,
        workdir: Path,
        progress_interval_s: float = 0.2,
        identity: Identity | None = None,
        secrets: tuple[Path, ...] = (),
    ) -> None:
        self.host, self.cmd, self.profile, self.workdir = host, cmd, profile, workdir
        self.identity = identity
        self.secrets = secrets  # files whose paths the generator must not be told
        # The registration this run belongs to: its reports keep it even after the
        # node re-registers, so the scheduler fences them as stale.
        self.incarnation = host.incarnation
        self.staging = workdir.with_name(f"{workdir.name}.staging")  # not the generator's
        self.job_id, self.run = cmd.spec.job_id, cmd.run
        self.runner: Runner | BuiltinRunner | None = None
        self.member = Membership(0, 1)
        self.files: RunFiles  # set by execute() once the run's place is known
        self._throttle = ProgressThrottle(progress_interval_s)
        self._uploads: list[asyncio.Task] = []
        self._upload_lock = asyncio.Lock()
        self._checkpointing: asyncio.Task | None = None
        self._gang_ended = asyncio.Event()
        self._go = asyncio.Event()  # BeginRun: the gang's start barrier is passed
        self._has_workdir = False  # a builtin runs in the agent and needs none
        # Set once the run's final report is queued: heartbeats stop listing the run,
        # so one produced behind that report cannot make the scheduler stop a run it
        # already counts as ended (reconcile: "running but not assigned here").
        self.ending = False

    @property
    def key(self) -> tuple[str, int]:
        return self.job_id, self.run

    def report(self) -> RunReport:
        r = self.runner
        return RunReport(
            job_id=self.job_id,
            run=self.run,
            step_rate=round(r.step_rate, 4) if r else 0.0,
            progress=r.last.progress if r else 0.0,
        )

    # -- commands -------------------------------------------------------------
    async def stop(self, grace_s: float | None = None) -> None:
        """Stop the process group; a checkpoint in flight is let finish first
        (preemption asks for a checkpoint, then a stop)."""
        if self._checkpointing is not None and not self._checkpointing.done():
            await asyncio.wait([self._checkpointing])
        if self.runner is not None:
            await self.runner.stop(grace_s)
        self._gang_ended.set()  # a gang member that finished its part is released
        # Still launching: execute() sees the STOPPING state once the process is up.

    async def shutdown(self) -> None:
        """The agent is closing: end the process group now (a short grace, no
        checkpoint wait) and release a gang member's hold; nothing is reported."""
        self._gang_ended.set()
        if self.runner is not None:
            await self.runner.stop(grace_s=min(self.runner.profile.stop_grace_s, 5.0))

    def begin(self) -> None:
        """The scheduler's ``BeginRun``: every member of the gang holds its GPUs."""
        self._go.set()

    async def _start_barrier(self) -> bool:
        """Report this member ready and wait for the gang's go; False if the run
        was stopped (reported) or the agent is closing meanwhile."""
        host, (job_id, n) = self.host, self.key
        await host.report(reports.started(host.node_id, self.incarnation, job_id, n, now_ms()))
        if not self._go.is_set():
            log.info(
                "job %s run %d on %s: rank %d of %d holds its GPUs; waiting for the gang",
                job_id,
                n,
                host.node_id,
                self.member.rank,
                self.member.world_size,
            )
            go = asyncio.ensure_future(self._go.wait())
            ended = asyncio.ensure_future(self._gang_ended.wait())
            await asyncio.wait((go, ended), return_when=asyncio.FIRST_COMPLETED)
            go.cancel()
            ended.cancel()
        if host.closing:
            return False
        entry = host.ledger.entry(job_id, n)
        if not self._go.is_set() or (entry is not None and entry.state is RunState.STOPPING):
            reason = entry.stop_reason if entry and entry.stop_reason else "stopped at the barrier"
            await self._final(
                reports.stopped(host.node_id, self.incarnation, job_id, n, now_ms(), reason)
            )
            return False
        return True

    def checkpoint(self) -> None:
        if self.runner is None:
            return
        if self.profile is None or self.profile.checkpoint is None:
            log.warning(
                "job %s run %d on %s: profile cannot checkpoint; request dropped",
                *self.key,
                self.host.node_id,
            )
            return
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = self.host.spawn(
                self._take_checkpoint(), f"checkpoint-{self.job_id}-{self.run}"
            )

    async def _take_checkpoint(self) -> None:
        """Ask for a checkpoint; the run shows CHECKPOINTING until it is written (or
        the request gives up), whether the scheduler asked (preemption, a move) or
        the run's own interval did."""
        assert self.runner is not None and self.profile is not None and self.profile.checkpoint
        self._phase("CHECKPOINTING", "writing a checkpoint")
        try:
            await asyncio.wait_for(
                self.runner.request_checkpoint(), self.profile.checkpoint.timeout_s
            )
        except (TimeoutError, ProcessLookupError) as e:
            log.warning(
                "job %s run %d on %s: checkpoint not taken: %s",
                *self.key,
                self.host.node_id,
                e or "timed out",
            )
        finally:
            self._phase("", "checkpoint written")

    def _phase(self, phase: str, message: str) -> None:
        """A progress report of the run's last progress in ``phase`` (not throttled:
        the state it shows changes)."""
        if self.host.closing or self.runner is None:
            return
        self._publish(self.runner.last, message=message, phase=phase)

    async def _periodic_checkpoints(self, interval_s: float) -> None:
        while self.runner is not None and self.runner.running:
            await asyncio.sleep(interval_s)
            if self.runner.running and not self.host.closing:
                self.checkpoint()

    # -- the run ----------------------------------------------------------------
    async def execute(self) -> None:
        host, cmd, spec = self.host, self.cmd, self.cmd.spec
        job_id, n = self.key
        periodic: asyncio.Task | None = None
        try:
            if self.profile is None:
                await self._fail(
                    "launch_error", f"node {host.node_id} has no profile for model {spec.model!r}"
                )
                return
            profile = self.profile
            try:
                self.member = membership(cmd, host.node_id, profile.result_rank)
            except GangError as e:
                await self._fail("launch_error", str(e))
                return
            self.files = RunFiles(
                host.store, profile, job_id, n, self.member, self.workdir, self.staging
            )
            in_process = bool(profile.builtin)  # no generator: no work directory to give it
            if not in_process:
                self._has_workdir = True
                # off the event loop: an agent hosting many nodes must not stall on the disk
                await asyncio.to_thread(self._prepare_workdir)
            resume = await self.files.resume(self.cmd.resume_from, host.node_id)
            if host.closing:
                return
            entry = host.ledger.entry(job_id, n)
            if entry is not None and entry.state is RunState.STOPPING:
                await self._final(
                    reports.stopped(
                        host.node_id, self.incarnation, job_id, n, now_ms(), entry.stop_reason
                    )
                )
                return
            if not in_process:
                await asyncio.to_thread(hand_over, self.workdir, self.identity)
            if self.member.gang and not await self._start_barrier():
                return
            runner = runner_for(
                profile,
                cmd,
                self.workdir,
                self.member,
                resume_from=resume,
                time_scale=host.time_scale,
                identity=self.identity,
                secrets=self.secrets,
                on_progress=self._on_progress,
                on_checkpoint=self._on_checkpoint,
            )
            try:
                await runner.start()
            except LaunchError as e:
                await self._fail("launch_error", str(e))
                return
            self.runner = runner  # only a started runner is visible to stop()/checkpoint()
            host.run_started(self)
            if not host.ledger.started(job_id, n):
                await self.runner.stop()  # a stop arrived while it was starting
            else:
                if not self.member.gang:  # a gang member reported it at the barrier
                    # Queued, not awaited: the producer keeps the cell partition's order,
                    # so the run goes on at once and a short run's final report can share
                    # RunStarted's produce request (one broker request, not two).
                    host.spawn(
                        host.report(
                            reports.started(host.node_id, self.incarnation, job_id, n, now_ms())
                        ),
                        f"started-{job_id}-{n}",
                    )
                if spec.checkpoint_interval_s > 0 and profile.can_checkpoint:
                    periodic = asyncio.create_task(
                        self._periodic_checkpoints(
                            checkpoint_period_s(spec.checkpoint_interval_s, host.time_scale)
                        )
                    )
            outcome = await self.runner.wait()
            await asyncio.gather(*self._uploads, return_exceptions=True)
            if outcome.kind == COMPLETED and not self.member.speaks_for_job:
                await self._member_done(outcome)
            elif not host.closing:
                await self._report_outcome(outcome)
        finally:
            if periodic is not None:
                periodic.cancel()
            if self.runner is not None and self.runner.running:
                self.runner.kill()  # cancelled mid-run (shutdown): no process group outlives it
            host.ledger.finished(job_id, n)
            host.run_ended(self)
            if self._has_workdir:
                await asyncio.shield(asyncio.to_thread(self._remove_workdir))

    def _prepare_workdir(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)  # nothing left from an earlier agent
        for sub in ("tmp", "output"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)

    def _remove_workdir(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        with contextlib.suppress(OSError):  # the job's directory, once its last run is gone
            self.workdir.parent.rmdir()

    async def _final(self, event: Any) -> None:
        """Write the run's one final report; from here heartbeats no longer list it."""
        self.ending = True
        await self.host.report(event)

    async def _fail(self, failure_class: str, reason: str, exit_code: int = 0) -> None:
        host = self.host
        await self._final(
            reports.failed(
                host.node_id,
                self.incarnation,
                *self.key,
                now_ms(),
                failure_class,
                reason,
                exit_code,
            )
        )

    async def _member_done(self, outcome: Outcome) -> None:
        """A gang member's part is done: keep its output, hold the run until the
        scheduler ends the gang (see :mod:`gang`)."""
        host, (job_id, n) = self.host, self.key
        if outcome.output_path is not None or outcome.output_data is not None:
            try:
                await self.files.keep_result(outcome)
            except Exception as e:
                log.warning(
                    "job %s run %d on %s: rank %d output not kept: %s",
                    job_id,
                    n,
                    host.node_id,
                    self.member.rank,
                    e,
                )
        if not self._gang_ended.is_set() and not host.closing:
            log.info(
                "job %s run %d on %s: rank %d done; holding the run until the gang ends",
                job_id,
                n,
                host.node_id,
                self.member.rank,
            )
        await self._gang_ended.wait()
        if not host.closing:
            entry = host.ledger.entry(job_id, n)
            reason = entry.stop_reason if entry and entry.stop_reason else "gang ended"
            await self._final(
                reports.stopped(host.node_id, self.incarnation, job_id, n, now_ms(), reason)
            )

    async def _report_outcome(self, outcome: Outcome) -> None:
        host, (job_id, n) = self.host, self.key
        assert self.profile is not None
        if outcome.kind == STOPPED:
            entry = host.ledger.entry(job_id, n)
            reason = entry.stop_reason if entry and entry.stop_reason else "stopped"
            await self._final(
                reports.stopped(host.node_id, self.incarnation, job_id, n, now_ms(), reason)
            )
        elif outcome.kind == COMPLETED:
            try:
                stored = await self.files.keep_result(outcome)
            except UploadRefused as e:
                log.warning("job %s run %d on %s: %s", job_id, n, host.node_id, e)
                await self._fail("generator_error", str(e))
                return
            except Exception as e:
                log.error(
                    "job %s run %d on %s: output upload failed: %s", job_id, n, host.node_id, e
                )
                await self._fail(
                    "upload_error", f"output upload to {self.files.output_key} failed: {e}"
                )
                return
            await self._final(
                reports.completed(
                    host.node_id,
                    self.incarnation,
                    job_id,
                    n,
                    now_ms(),
                    stored.uri,
                    stored.sha256,
                    stored.size_bytes,
                )
            )
        else:
            reason = outcome.reason
            tail = outcome.stderr_tail.strip()
            if "\n" in tail:
                reason += "\nstderr tail:\n" + tail[-1500:]
            cls = "hung" if outcome.kind == HUNG else outcome.failure_class or "generator_error"
            log.warning(
                "job %s run %d on %s failed (%s): %s", job_id, n, host.node_id, cls, outcome.reason
            )
            await self._fail(cls, reason, outcome.exit_code or 0)

    # -- runner callbacks ---------------------------------------------------------
    def _on_progress(self, p: Progress) -> None:
        if self.host.closing or not self._throttle.should_send(
            self.key, p.progress, time.monotonic()
        ):
            return
        self._publish(p)

    def _publish(self, p: Progress, message: str = "", phase: str = "") -> None:
        """The run's progress ``p`` as a RunProgress on the host's progress topic."""
        self.host.publish_progress(
            reports.progress(
                event_id=uuid.uuid4().hex,
                node_id=self.host.node_id,
                job_id=self.job_id,
                run=self.run,
                ts_ms=now_ms(),
                progress=p.progress,
                step=p.step,
                total_steps=p.total_steps,
                message=message,
                phase=phase,
            )
        )

    def _on_checkpoint(self, cp: Checkpoint) -> None:
        assert self.profile is not None
        if not self.files.admit_checkpoint():
            log.warning(
                "job %s run %d on %s: checkpoint %s dropped: past the profile's"
                " max_checkpoints (%d)",
                *self.key,
                self.host.node_id,
                cp.path,
                self.profile.max_checkpoints,
            )
            return
        self._uploads.append(asyncio.create_task(self._upload_checkpoint(cp)))

    async def _upload_checkpoint(self, cp: Checkpoint) -> None:
        host, (job_id, n) = self.host, self.key
        async with self._upload_lock:  # in step order: the last RunCheckpointed is the newest
            try:
                stored = await self.files.keep_checkpoint(cp.path, cp.step)
            except Exception as e:
                log.error(
                    "job %s run %d on %s: checkpoint upload failed: %s", job_id, n, host.node_id, e
                )
                return
            last = self.runner.last if self.runner else Progress(0.0, 0, 0)
            progress = cp.step / last.total_steps if last.total_steps else last.progress
            await host.report(
                reports.checkpointed(
                    host.node_id,
                    self.incarnation,
                    job_id,
                    n,
                    now_ms(),
                    stored.uri,
                    cp.step,
                    min(progress, 1.0),
                    stored.size_bytes,
                )
            )
