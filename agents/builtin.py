"""Generators that run inside the agent's process: no shell, no process per job.

A :class:`BuiltinRunner` has the :class:`~framespool.agents.runner.Runner`
surface the run execution uses (start, wait, stop, kill, checkpoint requests,
progress callbacks), so a run of a builtin profile reports exactly as a
subprocess run does: ``RunStarted``, progress up to 1.0, then one final report.

Builtins (``ModelProfile.builtin``):

``noop``
    Completes with an empty output and reports progress 1.0 (step 1 of 1): zero
    work, for measuring the pipeline itself (``framespool bench pipeline``).

``hold``
    Holds its GPUs for ``params.duration_s`` seconds (1 when absent or not a
    number, at most ``HOLD_MAX_S``) divided by the agent's time scale, one
    progress step a second of ``duration_s``, then completes like ``noop``:
    jobs that occupy capacity without a process each, so that a test or a
    drill builds a backlog of thousands of jobs on a small machine (stopped,
    it ends at once, like a killed process).

A builtin's output is the agent's own bytes (``Outcome.output_data``), not a
file a generator names: it needs no work directory, no staging and no copy,
and the run keeps it in the store with one ``put_bytes``
(:mod:`framespool.agents.keeping`). Cost of a noop run: no thread hop and no
file of its own; its output is one store write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from framespool.agents.profiles import ModelProfile
from framespool.agents.runner import COMPLETED, STOPPED, Checkpoint, Outcome, Progress

log = logging.getLogger(__name__)


HOLD_MAX_S = 3600.0


def hold_duration_s(params: Mapping[str, str]) -> float:
    """``hold``'s duration in job seconds: ``params.duration_s``, else 1."""
    try:
        duration_s = float(params.get("duration_s", "1"))
    except (TypeError, ValueError):
        return 1.0
    if duration_s != duration_s:  # NaN
        return 1.0
    return min(max(duration_s, 0.0), HOLD_MAX_S)


class BuiltinRunner:
    """One in-process run of a builtin profile."""

    pid = None  # no process: nothing to signal, nothing to reap
    step_rate = 0.0

    def __init__(
        self,
        profile: ModelProfile,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        params: Mapping[str, str] | None = None,
        time_scale: float = 1.0,
    ) -> None:
        if profile.builtin not in ("noop", "hold"):
            raise ValueError(f"profile {profile.name!r}: no builtin {profile.builtin!r}")
        self.profile = profile
        self._steps, self._step_s = 1, 0.0
        if profile.builtin == "hold":
            duration_s = hold_duration_s(params or {})
            self._steps = max(1, round(duration_s))
            self._step_s = duration_s / self._steps / max(time_scale, 1e-6)
        self._on_progress = on_progress
        self._task: asyncio.Task[Outcome] | None = None
        self._stopped = False
        self.last = Progress(0.0, 0, 0)
        self.checkpoints: list[Checkpoint] = []

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"builtin-{self.profile.name}")

    async def _run(self) -> Outcome:
        await asyncio.sleep(0)  # like a process, it works after start() returns
        for step in range(1, self._steps + 1):
            if self._step_s:
                await asyncio.sleep(self._step_s)
            self.last = Progress(step / self._steps, step, self._steps)
            if self._on_progress is not None:
                try:
                    self._on_progress(self.last)
                except Exception:  # a reporting bug must not fail the run
                    log.exception("builtin %s: progress callback failed", self.profile.name)
        return Outcome(COMPLETED, 0, output_data=b"")

    async def wait(self) -> Outcome:
        assert self._task is not None, "start() first"
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if self._stopped and self._task.cancelled():
                return Outcome(STOPPED, None, reason="stopped on request")
            raise

    def request_checkpoint(self) -> asyncio.Future[Checkpoint]:
        raise ValueError(f"profile {self.profile.name!r} does not support checkpoints")

    async def stop(self, grace_s: float | None = None) -> Outcome:
        if self._task is None:
            raise RuntimeError("stop() before start()")
        self.kill()
        return await self.wait()

    def kill(self) -> None:
        if self._task is not None and not self._task.done():
            self._stopped = True
            self._task.cancel()
