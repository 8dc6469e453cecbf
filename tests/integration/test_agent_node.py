"""The node agent against a real broker and a real S3 API (moto).

Each test gets empty topics (``fresh_topics``), starts one agent in-process,
writes instructions to the assignments topic with the codec, and reads what
the agent wrote back. Generators run at a high time scale.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from framespool.agents.agent import NodeAgent
from framespool.agents.artifacts import LocalDirStore, S3Store
from framespool.agents.gpus import SimulatedProbe
from framespool.agents.profiles import load_profiles
from framespool.log import LogConsumer, LogProducer, Record, partition_for_key
from framespool.schemas.codec import decode, encode
from framespool.schemas.events import (
    BeginRun,
    CheckpointRun,
    JobSpec,
    NodeHeartbeat,
    NodeRegistered,
    NodeSlice,
    RunCheckpointed,
    RunCompleted,
    RunFailed,
    RunProgress,
    RunStarted,
    RunStopped,
    StartRun,
    StopRun,
)
from framespool.schemas.topics import partition_of_cell

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CELL = "cell-2"


class Observer:
    """Reads the agent's output topics from offset 0 and keeps every event."""

    def __init__(self, bootstrap: str, topics: Any) -> None:
        self.topics = topics
        self._sched = LogConsumer(bootstrap)
        self._sched.assign(topics.SCHEDULER.name, [partition_of_cell(CELL)], 0)
        self._progress = LogConsumer(bootstrap)
        self._progress.assign(topics.PROGRESS.name, range(topics.PROGRESS.partitions), 0)
        self._dead = LogConsumer(bootstrap)
        self._dead.assign(topics.DEAD_LETTER.name, [0], 0)
        self.scheduler: list[Any] = []
        self.scheduler_records: list[Record] = []
        self.progress: list[RunProgress] = []
        self.dead: list[Record] = []

    def _poll(self) -> None:
        for record in self._sched.consume(200, 0.05):
            self.scheduler_records.append(record)
            self.scheduler.append(decode(record.value))
        # the progress topic also carries the stored-object reports (RunCheckpointed,
        # RunCompleted with their sizes) the API's storage ledger counts
        for r in self._progress.consume(200, 0.02):
            event = decode(r.value)
            if isinstance(event, RunProgress):
                self.progress.append(event)
        self.dead.extend(self._dead.consume(200, 0.02))

    def of(self, cls: type, job_id: str | None = None) -> list[Any]:
        return [
            e
            for e in self.scheduler
            if isinstance(e, cls) and (job_id is None or getattr(e, "job_id", None) == job_id)
        ]

    async def wait_for(
        self, pred: Callable[[Observer], Any], timeout: float = 15.0, what: str = ""
    ) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            await asyncio.to_thread(self._poll)
            result = pred(self)
            if result:
                return result
            if time.monotonic() > deadline:
                seen = [type(e).__name__ for e in self.scheduler]
                raise AssertionError(
                    f"timed out waiting for {what or pred}; scheduler topic had {seen}"
                )

    def close(self) -> None:
        for c in (self._sched, self._progress, self._dead):
            c.close()


class Harness:
    def __init__(self, bootstrap: str, topics: Any, store: Any, tmp_path: Path) -> None:
        self.bootstrap, self.topics, self.store, self.tmp_path = bootstrap, topics, store, tmp_path
        self.node_id = f"node-{uuid.uuid4().hex[:8]}"
        self.probe = SimulatedProbe(2, "H100", seed=1)
        self.producer = LogProducer(bootstrap)
        self.observer = Observer(bootstrap, topics)
        self.agents: list[NodeAgent] = []

    async def start_agent(self, **kw: Any) -> NodeAgent:
        agent = NodeAgent(
            kw.pop("node_id", self.node_id),
            CELL,
            self.bootstrap,
            self.store,
            self.probe,
            load_profiles(),
            self.tmp_path / kw.pop("data_dir", "agent"),
            heartbeat_s=0.3,
            time_scale=kw.pop("time_scale", 50.0),
            topics=self.topics,
            **kw,
        )
        self.agents.append(agent)
        await agent.start()
        return agent

    def start_run(
        self,
        agent: Any,
        job_id: str,
        run: int = 1,
        *,
        params: dict | None = None,
        incarnation: int | None = None,
        node_id: str | None = None,
        resume_from: str | None = None,
        checkpoint_interval_s: float = 0.0,
        model: str = "demo",
        placement: tuple[NodeSlice, ...] = (),
    ) -> StartRun:
        spec = JobSpec(
            job_id=job_id,
            tenant="acme",
            model=model,
            prompt=f"prompt for {job_id}",
            params=params or {"steps": "10", "resolution": "64x36", "duration_s": "1"},
            checkpoint_interval_s=checkpoint_interval_s,
        )
        return StartRun(
            event_id=uuid.uuid4().hex,
            ts_ms=int(time.time() * 1000),
            node_id=node_id or self.node_id,
            incarnation=agent.incarnation if incarnation is None else incarnation,
            run=run,
            spec=spec,
            gpus=(0,),
            placement=placement,
            estimate_s=5.0,
            resume_from=resume_from,
        )

    def stop_run(
        self, agent: NodeAgent, job_id: str, run: int = 1, reason: str = "cancelled"
    ) -> StopRun:
        return StopRun(
            event_id=uuid.uuid4().hex,
            ts_ms=0,
            node_id=self.node_id,
            incarnation=agent.incarnation,
            job_id=job_id,
            run=run,
            reason=reason,
        )

    def begin_run(
        self, agent: NodeAgent, job_id: str, run: int = 1, node_id: str | None = None
    ) -> BeginRun:
        """The scheduler's go once every member of a gang is ready."""
        return BeginRun(
            event_id=uuid.uuid4().hex,
            ts_ms=0,
            node_id=node_id or self.node_id,
            incarnation=agent.incarnation,
            job_id=job_id,
            run=run,
            reason="start barrier passed",
        )

    def checkpoint_run(self, agent: NodeAgent, job_id: str, run: int = 1) -> CheckpointRun:
        return CheckpointRun(
            event_id=uuid.uuid4().hex,
            ts_ms=0,
            node_id=self.node_id,
            incarnation=agent.incarnation,
            job_id=job_id,
            run=run,
            reason="preempt",
        )

    async def send(self, cmd: Any, key: str | None = None, raw: bytes | None = None) -> None:
        await self.producer.send(
            self.topics.ASSIGNMENTS.name,
            key or cmd.node_id,
            raw if raw is not None else encode(cmd),
        )

    async def close(self) -> None:
        for agent in self.agents:
            await agent.stop()
        self.producer.close()
        self.observer.close()


@pytest.fixture
def local_store(tmp_path):
    return LocalDirStore(tmp_path / "artifacts", secret="s")


def scenario(bootstrap, topics, store, tmp_path, body) -> None:
    async def main():
        h = Harness(bootstrap, topics, store, tmp_path)
        try:
            await body(h)
        finally:
            await h.close()

    asyncio.run(main())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")


# ---------------------------------------------------------------------------
def test_registers_and_heartbeats_on_its_cell_partition(
    kafka_bootstrap, fresh_topics, local_store, tmp_path
):
    async def body(h: Harness):
        agent = await h.start_agent()
        reg = (await h.observer.wait_for(lambda o: o.of(NodeRegistered), what="NodeRegistered"))[0]
        assert (reg.node_id, reg.cell, reg.incarnation, reg.gpus, reg.gpu_type) == (
            h.node_id,
            CELL,
            agent.incarnation,
            2,
            "H100",
        )
        assert reg.cpus > 0 and reg.mem_gb > 0
        h.probe.throttle(1)
        beats = await h.observer.wait_for(
            lambda o: len(o.of(NodeHeartbeat)) >= 3 and o.of(NodeHeartbeat), what="3 heartbeats"
        )
        assert all(b.incarnation == agent.incarnation and len(b.gpus) == 2 for b in beats)
        assert beats[-1].gpus[1].temperature_c > 85
        assert all(
            r.key == CELL.encode() and r.partition == partition_of_cell(CELL)
            for r in h.observer.scheduler_records
        )
        assert agent.assignment_partition == partition_for_key(
            h.node_id, fresh_topics.ASSIGNMENTS.partitions
        )

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_start_run_completes_with_artifact_in_s3(
    kafka_bootstrap, fresh_topics, s3_endpoint, s3_bucket, tmp_path
):
    store = S3Store(s3_bucket, endpoint_url=s3_endpoint)

    async def body(h: Harness):
        agent = await h.start_agent()
        await h.send(h.start_run(agent, "job-ok", params={"steps": "12", "resolution": "64x36"}))
        done = await h.observer.wait_for(
            lambda o: o.of(RunCompleted, "job-ok"), what="RunCompleted"
        )
        started = h.observer.of(RunStarted, "job-ok")
        assert len(started) == 1 and started[0].incarnation == agent.incarnation
        c = done[0]
        assert (c.run, c.node_id, c.incarnation) == (1, h.node_id, agent.incarnation)
        assert c.event_id == f"{h.node_id}:job-ok:1:completed"
        assert c.artifact_uri == f"s3://{s3_bucket}/jobs/job-ok/runs/1/output/output.gif"
        assert store.exists(c.artifact_uri)
        got = store.get_file(c.artifact_uri, tmp_path / "dl.gif")
        assert (
            got.sha256 == c.sha256 == hashlib.sha256((tmp_path / "dl.gif").read_bytes()).hexdigest()
        )
        assert (
            got.size_bytes == c.size_bytes and (tmp_path / "dl.gif").read_bytes()[:6] == b"GIF89a"
        )
        progress = await h.observer.wait_for(
            lambda o: (
                [p for p in o.progress if p.job_id == "job-ok" and p.progress == 1.0] and o.progress
            ),
            what="final progress",
        )
        assert progress[0].progress == 0.0 and progress[-1].progress == 1.0
        assert all(p.run == 1 and p.total_steps == 12 for p in progress)
        beat = await h.observer.wait_for(
            lambda o: [b for b in o.of(NodeHeartbeat) if b.gpus[0].warm_models == ("demo",)],
            what="warm",
        )
        assert beat[-1].gpus[1].warm_models == ()

    scenario(kafka_bootstrap, fresh_topics, store, tmp_path, body)


def test_stop_run_kills_the_generator(kafka_bootstrap, fresh_topics, local_store, tmp_path):
    async def body(h: Harness):
        agent = await h.start_agent(time_scale=10.0)
        slow = {"steps": "1000", "seconds_per_step": "1"}
        await h.send(h.start_run(agent, "job-long", params=slow))
        await h.observer.wait_for(lambda o: o.of(RunStarted, "job-long"), what="RunStarted")
        reports = await h.observer.wait_for(
            lambda o: [
                r
                for b in o.of(NodeHeartbeat)
                for r in b.runs
                if r.job_id == "job-long" and r.step_rate > 0
            ],
            what="a heartbeat with the run's step rate",
        )
        assert reports[-1].run == 1
        pid = agent._runs[("job-long", 1)].runner.pid
        assert alive(pid)
        await h.send(h.stop_run(agent, "job-long", reason="cancelled by user"))
        stopped = await h.observer.wait_for(
            lambda o: o.of(RunStopped, "job-long"), what="RunStopped"
        )
        assert (
            stopped[0].reason == "cancelled by user" and stopped[0].incarnation == agent.incarnation
        )
        assert not alive(pid)
        assert not h.observer.of(RunCompleted) and not h.observer.of(RunFailed)
        await h.observer.wait_for(
            lambda o: not o.of(NodeHeartbeat)[-1].runs, what="heartbeat without the run"
        )

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_stale_incarnation_and_other_nodes_are_ignored(
    kafka_bootstrap, fresh_topics, local_store, tmp_path
):
    async def body(h: Harness):
        agent = await h.start_agent()
        await h.send(h.start_run(agent, "job-stale", incarnation=agent.incarnation - 1))
        other = h.start_run(agent, "job-other", node_id="some-other-node")
        await h.producer.send(
            fresh_topics.ASSIGNMENTS.name, h.node_id, encode(other)
        )  # wrong payload
        await h.send(h.stop_run(agent, "job-ghost"))  # a marker: handled after the two above
        await h.observer.wait_for(
            lambda o: o.of(RunStopped, "job-ghost"), what="RunStopped for ghost"
        )
        await asyncio.sleep(0.5)
        await h.observer.wait_for(lambda o: True)
        assert not h.observer.of(RunStarted) and not h.observer.of(RunFailed)
        assert any("stale incarnation" in reason for _, reason in agent.ledger.ignored)

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_undecodable_record_goes_to_dead_letter_and_agent_keeps_going(
    kafka_bootstrap, fresh_topics, local_store, tmp_path
):
    async def body(h: Harness):
        agent = await h.start_agent()
        await h.send(None, key=h.node_id, raw=b"\xc3\x01garbage")
        await h.send(h.checkpoint_run(agent, "job-cp-ghost"))
        dead = await h.observer.wait_for(lambda o: o.dead, what="dead letter")
        assert dead[0].key == h.node_id.encode() and dead[0].value == b"\xc3\x01garbage"
        assert dead[0].header("reason") in (b"truncated", b"unknown_fingerprint", b"malformed_body")
        stopped = await h.observer.wait_for(
            lambda o: o.of(RunStopped, "job-cp-ghost"), what="RunStopped"
        )
        assert stopped[0].run == 1

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_failing_generator_reports_run_failed(kafka_bootstrap, fresh_topics, local_store, tmp_path):
    async def body(h: Harness):
        agent = await h.start_agent()
        await h.send(h.start_run(agent, "job-bad", params={"steps": "10", "fail_at_step": "4"}))
        failed = (
            await h.observer.wait_for(lambda o: o.of(RunFailed, "job-bad"), what="RunFailed")
        )[0]
        assert (failed.failure_class, failed.exit_code) == ("generator_error", 3)
        assert "injected failure at step 4" in failed.reason
        assert failed.event_id == f"{h.node_id}:job-bad:1:failed"

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_checkpoint_then_stop_then_resume_elsewhere(
    kafka_bootstrap, fresh_topics, local_store, tmp_path
):
    async def body(h: Harness):
        agent = await h.start_agent(time_scale=10.0)
        params = {"steps": "60", "seconds_per_step": "1", "resolution": "64x36"}
        await h.send(h.start_run(agent, "job-pre", params=params))
        await h.observer.wait_for(lambda o: [p for p in o.progress if p.step >= 3], what="step 3")
        await h.send(h.checkpoint_run(agent, "job-pre"))
        await h.send(h.stop_run(agent, "job-pre", reason="preempted"))
        stopped = await h.observer.wait_for(
            lambda o: o.of(RunStopped, "job-pre"), what="RunStopped"
        )
        cps = h.observer.of(RunCheckpointed, "job-pre")
        assert len(cps) == 1 and stopped[0].reason == "preempted"
        assert h.observer.scheduler.index(cps[0]) < h.observer.scheduler.index(stopped[0])
        cp = cps[0]
        assert cp.checkpoint_uri.startswith("local://jobs/job-pre/runs/1/checkpoints/")
        assert local_store.exists(cp.checkpoint_uri) and 0 < cp.progress < 1
        # The scheduler places run 2 (here: the same node) resuming from that checkpoint.
        await h.send(
            h.start_run(
                agent,
                "job-pre",
                run=2,
                params={**params, "seconds_per_step": "0.05"},
                resume_from=cp.checkpoint_uri,
            )
        )
        done = await h.observer.wait_for(
            lambda o: o.of(RunCompleted, "job-pre"), what="RunCompleted"
        )
        assert done[0].run == 2
        # progress is read by another consumer than the run's end: wait for it too
        run2 = await h.observer.wait_for(
            lambda o: [p for p in o.progress if p.job_id == "job-pre" and p.run == 2],
            what="run 2 progress",
        )
        assert (
            run2[0].step == int(cp.checkpoint_uri.rsplit("/", 1)[1]) > 0
        )  # resumed, not restarted

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_periodic_checkpoints_from_the_spec(kafka_bootstrap, fresh_topics, local_store, tmp_path):
    async def body(h: Harness):
        agent = await h.start_agent(time_scale=10.0)
        await h.send(
            h.start_run(
                agent,
                "job-periodic",
                checkpoint_interval_s=10.0,  # 1 s of wall time: the agent's floor
                params={"steps": "70", "seconds_per_step": "0.5"},
            )
        )
        done = await h.observer.wait_for(
            lambda o: o.of(RunCompleted, "job-periodic"), what="RunCompleted"
        )
        cps = h.observer.of(RunCheckpointed, "job-periodic")
        assert len(cps) >= 2  # 3.5 s of run time at one checkpoint every 1 s
        assert [c.progress for c in cps] == sorted(c.progress for c in cps)
        assert h.observer.scheduler.index(cps[-1]) < h.observer.scheduler.index(done[0])

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_restart_takes_a_new_incarnation_and_does_not_rerun_old_instructions(
    kafka_bootstrap, fresh_topics, local_store, tmp_path
):
    async def body(h: Harness):
        first = await h.start_agent()
        await h.send(h.start_run(first, "job-once", params={"steps": "2"}))
        await h.observer.wait_for(lambda o: o.of(RunCompleted, "job-once"), what="RunCompleted")
        await first.stop()
        second = await h.start_agent()
        assert second.incarnation > first.incarnation
        await h.send(h.stop_run(second, "job-marker"))
        await h.observer.wait_for(lambda o: o.of(RunStopped, "job-marker"), what="marker")
        regs = h.observer.of(NodeRegistered)
        assert [r.incarnation for r in regs] == [first.incarnation, second.incarnation]
        assert len(h.observer.of(RunStarted, "job-once")) == 1

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_unknown_model_and_hung_generator_fail_with_their_class(
    kafka_bootstrap, fresh_topics, local_store, tmp_path
):
    async def body(h: Harness):
        agent = await h.start_agent()
        await h.send(h.start_run(agent, "job-nomodel", model="sora-9"))
        await h.send(h.start_run(agent, "job-hang", params={"steps": "10", "hang_at_step": "2"}))
        failed = await h.observer.wait_for(
            lambda o: len(o.of(RunFailed)) == 2 and o.of(RunFailed), what="two RunFailed"
        )
        by_job = {f.job_id: f for f in failed}
        assert by_job["job-nomodel"].failure_class == "launch_error"
        assert "sora-9" in by_job["job-nomodel"].reason
        assert (
            by_job["job-hang"].failure_class == "hung"
            and "last step 2" in by_job["job-hang"].reason
        )

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


AGENT_SCRIPT = """
import asyncio, sys, types
from framespool.agents.agent import NodeAgent
from framespool.agents.artifacts import LocalDirStore
from framespool.agents.gpus import SimulatedProbe
from framespool.agents.profiles import load_profiles
from framespool.schemas import topics as catalogue
from framespool.schemas.topics import Topic

bootstrap, suffix, node, root = sys.argv[1:5]
topics = types.SimpleNamespace(**{
    name: Topic(f"{t.name}.{suffix}", t.partitions, t.key)
    for name, t in vars(catalogue).items() if isinstance(t, Topic)})
agent = NodeAgent(node, "cell-2", bootstrap, LocalDirStore(root + "/store", secret="s"),
                  SimulatedProbe(2), load_profiles(), root + "/agent", heartbeat_s=0.3,
                  time_scale=10.0, topics=topics)
asyncio.run(agent.run_until_signalled())
"""


def generator_pids(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if (
                b"framespool.agents.demo_generator" in cmdline
                and marker.encode() in cmdline
                and alive(int(entry))
            ):
                pids.append(int(entry))
    return pids


def test_sigterm_stops_the_agent_and_its_generators(
    kafka_bootstrap, fresh_topics, local_store, tmp_path
):
    async def body(h: Harness):
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": str(root)}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                AGENT_SCRIPT,
                kafka_bootstrap,
                fresh_topics.suffix,
                h.node_id,
                str(tmp_path),
            ],
            env=env,
            cwd=root,
        )
        try:
            reg = (
                await h.observer.wait_for(lambda o: o.of(NodeRegistered), what="NodeRegistered")
            )[0]
            cmd = h.start_run(
                SimpleNamespace(incarnation=reg.incarnation),
                "job-sigterm",
                params={"steps": "1000", "seconds_per_step": "1"},
            )
            await h.send(cmd)
            await h.observer.wait_for(lambda o: o.of(RunStarted, "job-sigterm"), what="RunStarted")
            pids = generator_pids("prompt for job-sigterm")
            assert len(pids) == 1
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 15) == 0
            assert not alive(pids[0])
            await asyncio.sleep(0.3)
            await h.observer.wait_for(lambda o: True)
            # Shut down without reporting: reconciliation after re-registration decides.
            assert not h.observer.of(RunStopped) and not h.observer.of(RunFailed)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_noop_runs_in_process_and_reports_like_a_generator(
    kafka_bootstrap, fresh_topics, local_store, tmp_path, monkeypatch
):
    async def no_processes(*a, **kw):
        raise OSError(f"a noop run must not spawn {a}")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", no_processes)

    async def body(h: Harness):
        agent = await h.start_agent()
        await h.send(h.start_run(agent, "job-noop", model="noop"))
        done = await h.observer.wait_for(
            lambda o: o.of(RunCompleted, "job-noop"), what="RunCompleted"
        )
        assert not h.observer.of(RunFailed)
        started = h.observer.of(RunStarted, "job-noop")
        assert len(started) == 1
        assert h.observer.scheduler.index(started[0]) < h.observer.scheduler.index(done[0])
        assert done[0].artifact_uri == "local://jobs/job-noop/runs/1/output/output.bin"
        assert done[0].size_bytes == 0 and local_store.exists(done[0].artifact_uri)
        progress = await h.observer.wait_for(
            lambda o: [p for p in o.progress if p.job_id == "job-noop"], what="progress"
        )
        assert [(p.progress, p.step, p.total_steps) for p in progress] == [(1.0, 1, 1)]
        await h.observer.wait_for(
            lambda o: not o.of(NodeHeartbeat)[-1].runs, what="heartbeat without the run"
        )

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)


def test_gang_members_keep_per_rank_keys_and_only_the_result_rank_completes(
    kafka_bootstrap, fresh_topics, local_store, tmp_path
):
    async def body(h: Harness):
        second = f"{h.node_id}-b"
        a = await h.start_agent()
        b = await h.start_agent(node_id=second, data_dir="agent-b")
        gang = (NodeSlice(node_id=h.node_id, gpus=(0,)), NodeSlice(node_id=second, gpus=(0,)))
        params = {"steps": "4", "resolution": "64x36", "duration_s": "1"}
        await h.send(h.start_run(b, "job-gang", params=params, node_id=second, placement=gang))
        member_key = "jobs/job-gang/runs/1/ranks/1/output/output.gif"

        def ready(node_id):
            return lambda o: [s for s in o.of(RunStarted, "job-gang") if s.node_id == node_id]

        # rank 1 holds its GPUs and waits at the start barrier: it computes nothing
        await h.observer.wait_for(ready(second), what="rank 1 ready")
        await asyncio.sleep(1.0)
        await h.observer.wait_for(lambda o: True, what="one more poll")
        assert not local_store.exists(member_key)
        assert not [p for p in h.observer.progress if p.job_id == "job-gang"]
        await h.send(h.begin_run(b, "job-gang", node_id=second))
        while not local_store.exists(member_key):
            await asyncio.sleep(0.05)
        await h.send(h.start_run(a, "job-gang", params=params, placement=gang))
        await h.observer.wait_for(ready(h.node_id), what="rank 0 ready")
        await h.send(h.begin_run(a, "job-gang"))
        done = await h.observer.wait_for(
            lambda o: o.of(RunCompleted, "job-gang"), what="RunCompleted"
        )
        assert [(c.node_id, c.artifact_uri) for c in done] == [
            (h.node_id, "local://jobs/job-gang/runs/1/ranks/0/output/output.gif")
        ]
        assert local_store.exists(done[0].artifact_uri)
        # rank 1 finished first, yet holds the run (listed in heartbeats) until stopped
        await h.observer.wait_for(
            lambda o: [
                beat
                for beat in o.of(NodeHeartbeat)
                if beat.node_id == second
                and [r.job_id for r in beat.runs] == ["job-gang"]
                and o.scheduler.index(beat) > o.scheduler.index(done[0])
            ],
            what="rank 1 still holding the run",
        )
        stop = h.stop_run(b, "job-gang", reason="gang completed")
        await h.send(replace(stop, node_id=second))
        stopped = await h.observer.wait_for(
            lambda o: o.of(RunStopped, "job-gang"), what="RunStopped"
        )
        assert [(s.node_id, s.reason) for s in stopped] == [(second, "gang completed")]
        assert len(h.observer.of(RunCompleted, "job-gang")) == 1
        assert not h.observer.of(RunFailed, "job-gang")

    scenario(kafka_bootstrap, fresh_topics, local_store, tmp_path, body)
