"""Run one run's generator as a subprocess and watch it.

Theory of operation
-------------------
The generator is opaque: it gets a command line from its :class:`ModelProfile`
and talks back through JSON lines on stdout (progress, checkpoint files). The
runner

1. starts it directly (no shell) in a new session, so it leads its own
   process group and every helper it forks can be signalled with one
   ``killpg``; it gets a minimal environment and, when given one, its own
   user (see :mod:`sandbox`);
2. reads stdout (progress, checkpoints) and keeps the tail of stderr;
3. watches for silence: no progress, checkpoint or status line for
   ``hang_timeout_s`` means hung, and the group is killed; before its first
   line the allowance is ``startup_timeout_s`` (an interpreter or a model
   loading says nothing yet; a time-scaled hang timeout must not count its
   start-up, which runs in real time, as a hang);
4. on stop, sends SIGTERM to the group, waits ``stop_grace_s`` for the leader,
   then SIGKILLs the group; after any exit it SIGKILLs the group once more so
   no helper outlives the run (no GPU stays busy for a finished run);
5. classifies the end as an :class:`Outcome`: completed (exit 0 and something
   at the output path, or no output where none is required; whether the agent
   may upload it is decided on upload), stopped (a stop was asked for), hung,
   or failed (``generator_error`` with exit code and stderr tail). Malformed
   JSON lines are skipped: the generator is not trusted to speak well.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from framespool.agents.ledger import StepRate
from framespool.agents.profiles import ModelProfile
from framespool.agents.sandbox import Identity, generator_env

log = logging.getLogger(__name__)

COMPLETED, FAILED, HUNG, STOPPED = "completed", "failed", "hung", "stopped"
STDERR_TAIL_BYTES = 4000
LINE_LIMIT = 1 << 20


class LaunchError(RuntimeError):
    """The generator could not be started (the profile's or the node's fault)."""


@dataclass(frozen=True, slots=True)
class Progress:
    progress: float
    step: int
    total_steps: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: Path
    step: int


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str
    exit_code: int | None = None
    output_path: Path | None = None
    failure_class: str = ""
    reason: str = ""
    stderr_tail: str = ""
    # an output the agent made itself (a builtin's), kept from memory: no file
    output_data: bytes | None = None


class _AsUser(TypedDict, total=False):
    """The generator's identity, as ``create_subprocess_exec`` takes it."""

    user: int
    group: int
    extra_groups: list[int]


class Runner:
    """One generator process (group) for one run."""

    def __init__(
        self,
        profile: ModelProfile,
        argv: list[str],
        *,
        output_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        hang_timeout_s: float | None = None,
        startup_timeout_s: float | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        on_checkpoint: Callable[[Checkpoint], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        identity: Identity | None = None,
        output_required: bool = True,
        secrets: tuple[Path, ...] = (),
    ) -> None:
        self.profile = profile
        self.identity = identity
        self.output_required = output_required  # False: a gang member may write none
        self.argv = argv
        self.output_path = output_path
        self.cwd = cwd
        self.hang_timeout_s = profile.hang_timeout_s if hang_timeout_s is None else hang_timeout_s
        self.startup_timeout_s = (
            startup_timeout_s or profile.startup_timeout_s or self.hang_timeout_s
        )
        self._env = generator_env(profile.env, profile.inherit_env, env or {}, secrets=secrets)
        self._on_progress = on_progress
        self._on_checkpoint = on_checkpoint
        self._clock = clock
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: deque[bytes] = deque()
        self._stderr_len = 0
        self._rate = StepRate()
        self._last_activity = 0.0
        self._stop_requested = False
        self._hung = ""  # why the watchdog killed it, when it did
        self._done: asyncio.Task[Outcome] | None = None
        self._checkpoint_waiters: list[asyncio.Future[Checkpoint]] = []
        self.last: Progress = Progress(0.0, 0, 0)
        # Set by the generator's first JSON line: only then are its signal
        # handlers surely installed (a signal before that would kill it).
        self._spoke = asyncio.Event()
        self.checkpoints: list[Checkpoint] = []

    # -- public --------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def step_rate(self) -> float:
        return self._rate.rate

    @property
    def running(self) -> bool:
        return self._done is not None and not self._done.done()

    async def start(self) -> None:
        as_user: _AsUser = (
            {"user": self.identity.uid, "group": self.identity.gid, "extra_groups": []}
            if self.identity is not None
            else {}
        )
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                cwd=self.cwd,
                start_new_session=True,
                limit=LINE_LIMIT,
                **as_user,
            )
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in an argument
            raise LaunchError(
                f"cannot start {self.argv[0]!r} for profile {self.profile.name!r}: {e}"
            ) from e
        self._last_activity = self._clock()
        self._done = asyncio.create_task(self._supervise(), name=f"runner-{self._proc.pid}")

    async def wait(self) -> Outcome:
        assert self._done is not None, "start() first"
        return await asyncio.shield(self._done)

    def request_checkpoint(self) -> asyncio.Future[Checkpoint]:
        """Signal the generator; the future resolves with the next checkpoint it reports."""
        if self.profile.checkpoint is None:
            raise ValueError(f"profile {self.profile.name!r} does not support checkpoints")
        fut: asyncio.Future[Checkpoint] = asyncio.get_running_loop().create_future()
        if not self.running:
            fut.set_exception(ProcessLookupError("generator is not running"))
            return fut
        self._checkpoint_waiters.append(fut)
        if self._spoke.is_set():
            self._signal_leader(self.profile.checkpoint.signum)
        else:
            asyncio.ensure_future(self._signal_once_spoken(self.profile.checkpoint.signum))
        return fut

    async def _signal_once_spoken(self, signum: int) -> None:
        await self._spoke.wait()
        if self.running:
            self._signal_leader(signum)

    async def stop(self, grace_s: float | None = None) -> Outcome:
        """SIGTERM the group, SIGKILL it after the grace period; returns the outcome."""
        if self._done is None:
            raise RuntimeError("stop() before start()")
        if not self._done.done():
            self._stop_requested = True
            await self._terminate(self.profile.stop_grace_s if grace_s is None else grace_s)
        return await self.wait()

    def kill(self) -> None:
        """SIGKILL the whole group now (no grace); for emergencies and shutdown."""
        self._stop_requested = True
        self._killpg(signal.SIGKILL)

    # -- internals -----------------------------------------------------------
    async def _supervise(self) -> Outcome:
        proc = self._proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        readers = [
            asyncio.create_task(self._read_stdout(proc.stdout)),
            asyncio.create_task(self._read_stderr(proc.stderr)),
        ]
        watchdog = asyncio.create_task(self._watchdog())
        try:
            rc = await proc.wait()
        finally:
            watchdog.cancel()
            self._killpg(signal.SIGKILL)  # helpers of an exited leader go too
        # Pipes close once every holder is dead; don't wait forever on a stray one.
        _, pending = await asyncio.wait(readers, timeout=5.0)
        for task in pending:
            task.cancel()
        for fut in self._checkpoint_waiters:
            if not fut.done():
                fut.set_exception(
                    ProcessLookupError(f"generator exited ({rc}) before checkpointing")
                )
        self._checkpoint_waiters.clear()
        return self._classify(rc)

    def _classify(self, rc: int) -> Outcome:
        tail = self.stderr_tail()
        if self._stop_requested:
            return Outcome(STOPPED, rc, reason="stopped on request", stderr_tail=tail)
        if self._hung:
            return Outcome(
                HUNG,
                rc,
                failure_class="hung",
                stderr_tail=tail,
                reason=self._hung,
            )
        # Whether the output is a file the agent may upload is decided on upload.
        if rc == 0 and os.path.lexists(self.output_path):
            return Outcome(COMPLETED, rc, output_path=self.output_path, stderr_tail=tail)
        if rc == 0 and not self.output_required:
            return Outcome(COMPLETED, rc, stderr_tail=tail)
        reason = (
            f"exited 0 but wrote no output at {self.output_path}"
            if rc == 0
            else f"exited with {_describe(rc)}: {tail.strip().splitlines()[-1] if tail.strip() else 'no stderr'}"
        )
        return Outcome(FAILED, rc, failure_class="generator_error", reason=reason, stderr_tail=tail)

    async def _read_stdout(self, stream: asyncio.StreamReader) -> None:
        fmt = self.profile.progress
        ckpt = self.profile.checkpoint
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line over LINE_LIMIT: skip it, keep reading
                continue
            if not line:
                return
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # generators may print logs; only JSON lines speak to us
            if not isinstance(msg, dict):
                continue
            now = self._clock()
            if not self._spoke.is_set():
                self._spoke.set()
                self._last_activity = now  # start-up is over: the hang clock starts here
            if ckpt is not None and ckpt.path_key in msg:
                self._last_activity = now
                path = Path(str(msg[ckpt.path_key]))
                if not path.is_absolute() and self.cwd is not None:
                    path = self.cwd / path  # where it may lead is checked on upload
                step = _count(msg.get(ckpt.step_key, self.last.step))
                if step is None:
                    log.warning(
                        "generator pid %s: checkpoint line without a step: %r", self.pid, msg
                    )
                    continue
                cp = Checkpoint(path, step)
                self.checkpoints.append(cp)
                waiters, self._checkpoint_waiters = self._checkpoint_waiters, []
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(cp)
                self._callback(self._on_checkpoint, cp)
            elif fmt.progress_key in msg:
                self._last_activity = now
                fraction = _fraction(msg[fmt.progress_key])
                step, total = _count(msg.get(fmt.step_key, 0)), _count(msg.get(fmt.total_key, 0))
                if fraction is None or step is None or total is None:
                    continue  # a malformed line is noise, not a reason to stop listening
                p = Progress(fraction, step, total)
                self.last = p
                self._rate.add(now, p.step)
                self._callback(self._on_progress, p)
            elif fmt.status_key in msg:
                self._last_activity = now

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self._stderr.append(chunk)
            self._stderr_len += len(chunk)
            while self._stderr_len - len(self._stderr[0]) >= STDERR_TAIL_BYTES:
                self._stderr_len -= len(self._stderr.popleft())

    def stderr_tail(self) -> str:
        return b"".join(self._stderr)[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")

    async def _watchdog(self) -> None:
        if self.hang_timeout_s <= 0:
            return
        period = min(1.0, self.hang_timeout_s / 4, self.startup_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            spoke = self._spoke.is_set()
            allowed = self.hang_timeout_s if spoke else self.startup_timeout_s
            if self._clock() - self._last_activity > allowed:
                self._hung = (
                    f"no progress for {allowed:g}s (last step {self.last.step})"
                    if spoke
                    else f"no output for {allowed:g}s after it started"
                )
                log.warning("generator pid %s hung (%s): killing its group", self.pid, self._hung)
                await self._terminate(min(self.profile.stop_grace_s, 2.0))
                return

    async def _terminate(self, grace_s: float) -> None:
        proc = self._proc
        assert proc is not None
        self._killpg(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace_s)
        except TimeoutError:
            log.warning("generator pid %s ignored SIGTERM for %.1fs: SIGKILL", proc.pid, grace_s)
        self._killpg(signal.SIGKILL)

    def _killpg(self, sig: int) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def _signal_leader(self, sig: int) -> None:
        # os.kill, not Process.send_signal: on Python 3.11 that reaches
        # Popen.send_signal, which first polls (waitpid WNOHANG). A leader that
        # has just exited is then reaped here, and asyncio's child watcher,
        # finding nothing to wait for, reports exit code 255: a completed run
        # would be failed. Until the watcher reaps it the pid is our zombie and
        # names no other process; the moment between that reap and returncode
        # being set is the one ``_killpg`` lives with too.
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, sig)

    @staticmethod
    def _callback(fn: Callable | None, arg: object) -> None:
        if fn is None:
            return
        try:
            fn(arg)
        except Exception:  # a reporting bug must not kill the run's supervision
            log.exception("runner callback %r failed", fn)


def _number(value: object) -> float | None:
    """A finite number from a JSON value (numeric strings too), else None."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):  # "two", or an int past a double's range
        return None
    return number if math.isfinite(number) else None


def _fraction(value: object) -> float | None:
    """A progress value clamped to 0..1."""
    number = _number(value)
    return None if number is None else min(max(number, 0.0), 1.0)


def _count(value: object) -> int | None:
    """A step or step count: a non-negative whole number."""
    number = _number(value)
    if number is None or number < 0 or number != int(number):
        return None
    return int(number)


def _describe(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-rc).name}"
    return f"exit code {rc}"
