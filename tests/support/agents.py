"""Agent test helpers: commands for the run ledger, a fake run host, a profile's argv.

``NODE``/``INC`` and ``start``/``stop`` came from test_agent_ledger.py; ``FakeHost`` and
``start_run`` from test_agent_execution.py; ``plain_argv`` from test_agent_runner.py.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from framespool.agents.artifacts import LocalDirStore
from framespool.agents.execution import RunExecution
from framespool.agents.ledger import RunLedger
from framespool.agents.profiles import ModelProfile
from framespool.schemas.events import JobSpec, NodeSlice, StartRun, StopRun

NODE, INC = "node-a", 7


def start(job="job-1", run=1, *, node=NODE, inc=INC, eid=None, gpus=(0,), model="demo"):
    return StartRun(
        event_id=eid or f"start-{job}-{run}-{inc}",
        ts_ms=0,
        node_id=node,
        incarnation=inc,
        run=run,
        spec=JobSpec(job_id=job, tenant="t", model=model),
        gpus=gpus,
        placement=(),
        estimate_s=10.0,
    )


def stop(job="job-1", run=1, *, node=NODE, inc=INC, eid=None, reason="cancelled"):
    return StopRun(
        event_id=eid or f"stop-{job}-{run}-{inc}",
        ts_ms=0,
        node_id=node,
        incarnation=inc,
        job_id=job,
        run=run,
        reason=reason,
    )


class FakeHost:
    """The RunHost port, recording what a run reports."""

    def __init__(self, tmp_path: Path, node_id: str = NODE, identity: Any = None) -> None:
        self.identity = identity
        self.node_id, self.incarnation = node_id, 7
        self.store = LocalDirStore(tmp_path / "store", secret="s")
        self.ledger = RunLedger(node_id, 7)
        self.time_scale, self.closing = 1000.0, False
        self.reports: list[Any] = []
        self.progress: list[Any] = []
        self.data_dir = tmp_path / "agent"

    async def report(self, event: Any) -> None:
        self.reports.append(event)

    def publish_progress(self, event: Any) -> None:
        self.progress.append(event)

    def spawn(self, coro: Any, name: str) -> asyncio.Task:
        return asyncio.ensure_future(coro)

    def run_started(self, execution: RunExecution) -> None:
        pass

    def run_ended(self, execution: RunExecution) -> None:
        pass

    def of(self, cls: type) -> list[Any]:
        return [e for e in self.reports if isinstance(e, cls)]


def start_run(
    host: FakeHost,
    job_id: str = "job-1",
    *,
    model: str = "x",
    params: dict | None = None,
    placement: tuple[NodeSlice, ...] = (),
    resume_from: str | None = None,
) -> StartRun:
    return StartRun(
        event_id=uuid.uuid4().hex,
        ts_ms=0,
        node_id=host.node_id,
        incarnation=host.incarnation,
        run=1,
        spec=JobSpec(job_id=job_id, tenant="t", model=model, prompt="p", params=params or {}),
        gpus=(0,),
        placement=placement,
        estimate_s=1.0,
        resume_from=resume_from,
    )


def plain_argv(profile: ModelProfile, out: str) -> list[str]:
    """A profile's command line with every placeholder but the output empty."""
    return profile.argv(
        prompt="",
        out=out,
        params_json="{}",
        checkpoint_dir="",
        resume_from=None,
        time_scale="1",
        gpus="",
        job_id="j",
        run="1",
    )
