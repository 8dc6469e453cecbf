"""One run's execution against a fake agent: what a hostile generator can make
the agent upload, and which rank of a gang speaks for the job."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from framespool.agents.artifacts import LocalDirStore
from framespool.agents.execution import RunExecution
from framespool.agents.ledger import Action
from framespool.agents.profiles import ModelProfile, demo_profile
from framespool.agents.sandbox import generator_identity
from framespool.schemas.events import (
    BeginRun,
    NodeSlice,
    RunCheckpointed,
    RunCompleted,
    RunFailed,
    RunStarted,
    RunStopped,
    StartRun,
    StopRun,
)
from tests.support.agents import NODE, FakeHost, start_run


def script_profile(script: str, **extra: Any) -> ModelProfile:
    """A generator written inline: argv[1] is the output path, cwd its work dir."""
    return ModelProfile.from_dict(
        {
            "name": "script",
            "command": ["{python}", "-c", script.replace("{", "{{").replace("}", "}}"), "{out}"],
            "checkpoint": {"signal": "SIGUSR1"},
            "hang_timeout_s": 30,
            **extra,
        }
    )


def begin_run(host: FakeHost, cmd: StartRun) -> BeginRun:
    return BeginRun(
        event_id=uuid.uuid4().hex,
        ts_ms=0,
        node_id=host.node_id,
        incarnation=host.incarnation,
        job_id=cmd.spec.job_id,
        run=cmd.run,
    )


async def play_scheduler_barrier(host: FakeHost, cmd: StartRun, execution: RunExecution) -> None:
    """The scheduler's part of the start barrier, the rest of the gang being ready:
    once this member reports it holds its GPUs, the go."""
    while not host.of(RunStarted):
        await asyncio.sleep(0.005)
    if host.ledger.decide(begin_run(host, cmd)).action is Action.BEGIN:
        execution.begin()


def execute(
    host: FakeHost, cmd: StartRun, profile: ModelProfile, then=None, go: bool = True
) -> RunExecution:
    """Run ``cmd`` to its end; a gang member gets its go once it reports ready
    unless ``go`` is False (then ``then`` plays the scheduler)."""
    workdir = host.data_dir / "runs" / cmd.spec.job_id / str(cmd.run)

    async def main() -> RunExecution:
        host.ledger.decide(cmd)
        execution = RunExecution(host, cmd, profile, workdir, identity=host.identity)
        task = asyncio.ensure_future(execution.execute())
        if go and len(cmd.placement) > 1:
            asyncio.ensure_future(play_scheduler_barrier(host, cmd, execution))
        if then is not None:
            await then(execution)
        await asyncio.wait_for(task, 30)
        return execution

    return asyncio.run(main())


def stored_bytes(host: FakeHost) -> list[bytes]:
    root = host.store.root
    return [p.read_bytes() for p in root.rglob("*") if p.is_file() and ".meta" not in p.parts]


WRITE_OUTPUT = "import sys,os; os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)\n"


# -- uploads: only the generator's own files, within limits --------------------
@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "agent-credentials"
    path.write_bytes(b"AWS_SECRET_ACCESS_KEY=hunter2")
    return path


def test_a_checkpoint_path_outside_the_work_dir_is_not_uploaded(tmp_path, secret):
    host = FakeHost(tmp_path)
    script = WRITE_OUTPUT + (
        f"print('{{\"checkpoint\": \"{secret}\", \"step\": 1}}', flush=True)\n"
        "print('{\"checkpoint\": \"../../../../agent-credentials\", \"step\": 2}', flush=True)\n"
        "open(sys.argv[1], 'wb').write(b'video')\n"
    )
    execute(host, start_run(host), script_profile(script))
    assert not host.of(RunCheckpointed) and not host.of(RunFailed)
    assert [c.size_bytes for c in host.of(RunCompleted)] == [5]
    assert b"AWS_SECRET_ACCESS_KEY=hunter2" not in stored_bytes(host)


@pytest.mark.parametrize("how", ["symlink", "symlinked_dir", "hardlink"])
def test_checkpoints_that_lead_out_of_the_work_dir_are_not_uploaded(tmp_path, secret, how):
    host = FakeHost(tmp_path)
    script = WRITE_OUTPUT + (
        "import json\n"
        f"how, secret = {how!r}, {str(secret)!r}\n"
        "if how == 'symlink': os.symlink(secret, 'ck'); path = 'ck'\n"
        "if how == 'symlinked_dir': os.symlink(os.path.dirname(secret), 'd');"
        " path = 'd/' + os.path.basename(secret)\n"
        "if how == 'hardlink': os.link(secret, 'ck'); path = 'ck'\n"
        "print(json.dumps({'checkpoint': path, 'step': 1}), flush=True)\n"
        "open(sys.argv[1], 'wb').write(b'video')\n"
    )
    execute(host, start_run(host), script_profile(script))
    assert not host.of(RunCheckpointed) and len(host.of(RunCompleted)) == 1
    assert b"AWS_SECRET_ACCESS_KEY=hunter2" not in stored_bytes(host)


def test_an_output_that_is_a_symlink_out_fails_the_run_and_is_not_uploaded(tmp_path, secret):
    host = FakeHost(tmp_path)
    script = WRITE_OUTPUT + f"os.symlink({str(secret)!r}, sys.argv[1])\n"
    execute(host, start_run(host), script_profile(script))
    (failed,) = host.of(RunFailed)
    assert failed.failure_class == "generator_error" and "symlink" in failed.reason
    assert not host.of(RunCompleted) and stored_bytes(host) == []


def test_a_fifo_as_output_is_refused_without_blocking(tmp_path):
    host = FakeHost(tmp_path)
    script = WRITE_OUTPUT + "os.mkfifo(sys.argv[1])\n"
    execute(host, start_run(host), script_profile(script))
    (failed,) = host.of(RunFailed)
    assert "not a regular file" in failed.reason


def test_outputs_and_checkpoints_over_the_profiles_limits_are_refused(tmp_path):
    host = FakeHost(tmp_path)
    script = WRITE_OUTPUT + (
        "open('big-ck', 'wb').write(b'c' * 2000)\n"
        "print('{\"checkpoint\": \"big-ck\", \"step\": 1}', flush=True)\n"
        "open('small-ck', 'wb').write(b'c' * 10)\n"
        "print('{\"checkpoint\": \"small-ck\", \"step\": 2}', flush=True)\n"
        "open(sys.argv[1], 'wb').write(b'v' * 5000)\n"
    )
    profile = script_profile(script, max_output_bytes=4096, max_checkpoint_bytes=1024)
    execute(host, start_run(host), profile)
    assert [c.checkpoint_uri.rsplit("/", 1)[1] for c in host.of(RunCheckpointed)] == ["2"]
    (failed,) = host.of(RunFailed)
    assert "4096" in failed.reason and "max_output_bytes" in failed.reason
    assert not host.of(RunCompleted)


def test_checkpoints_past_the_profiles_count_are_dropped(tmp_path):
    host = FakeHost(tmp_path)
    script = WRITE_OUTPUT + (
        "for i in range(1, 6):\n"
        "    open(f'ck{i}', 'w').write(str(i))\n"
        "    print('{\"checkpoint\": \"ck%d\", \"step\": %d}' % (i, i), flush=True)\n"
        "open(sys.argv[1], 'wb').write(b'v')\n"
    )
    execute(host, start_run(host), script_profile(script, max_checkpoints=3))
    assert len(host.of(RunCheckpointed)) == 3 and len(host.of(RunCompleted)) == 1


def test_the_generator_sees_a_minimal_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("FRAMESPOOL_S3_SECRET", "hunter3")
    monkeypatch.setenv("HF_HOME", "/models")
    host = FakeHost(tmp_path)
    script = WRITE_OUTPUT + "import json; json.dump(dict(os.environ), open(sys.argv[1], 'w'))\n"
    profile = script_profile(script, inherit_env=["HF_HOME"])
    execute(host, start_run(host), profile)
    (done,) = host.of(RunCompleted)
    env = json.loads(host.store.local_path(done.artifact_uri).read_text())
    assert "hunter2" not in env.values() and "hunter3" not in env.values()
    assert env["HF_HOME"] == "/models" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["FRAMESPOOL_JOB_ID"] == "job-1" and env["PATH"]
    assert Path(env["HOME"]).name == "1" and Path(env["TMPDIR"]).parent == Path(env["HOME"])


# -- gangs: per-rank keys, one rank's output is the job's result ----------------
GANG = (NodeSlice(node_id="node-a", gpus=(0,)), NodeSlice(node_id="node-b", gpus=(0,)))


def test_the_result_rank_completes_with_its_own_key(tmp_path):
    host = FakeHost(tmp_path, "node-a")
    execute(
        host,
        start_run(host, "job-g", model="demo", params={"steps": "2"}, placement=GANG),
        demo_profile(),
    )
    (done,) = host.of(RunCompleted)
    assert done.artifact_uri == "local://jobs/job-g/runs/1/ranks/0/output/output.gif"


def test_another_rank_uploads_its_own_key_and_waits_for_the_gang_to_end(tmp_path):
    host = FakeHost(tmp_path, "node-b")
    cmd = start_run(host, "job-g", model="demo", params={"steps": "2"}, placement=GANG)
    seen: dict[str, Any] = {}

    async def then(execution: RunExecution) -> None:
        key = "jobs/job-g/runs/1/ranks/1/output/output.gif"
        while not host.store.exists(key):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        seen["before_stop"] = list(host.reports)
        seen["listed"] = execution.report()
        stop = StopRun(
            event_id="s",
            ts_ms=0,
            node_id="node-b",
            incarnation=7,
            job_id="job-g",
            run=1,
            reason="gang completed",
        )
        host.ledger.decide(stop)
        await execution.stop()

    execute(host, cmd, demo_profile(), then)
    assert [type(e) for e in seen["before_stop"]] == [RunStarted]
    assert seen["listed"].job_id == "job-g"
    assert not host.of(RunCompleted) and not host.of(RunFailed)
    (stopped,) = host.of(RunStopped)
    assert stopped.reason == "gang completed"


def test_a_non_result_rank_without_output_does_not_fail_the_gang(tmp_path):
    host = FakeHost(tmp_path, "node-b")

    async def then(execution: RunExecution) -> None:
        while execution.runner is None or execution.runner.running:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        host.ledger.decide(
            StopRun(event_id="s", ts_ms=0, node_id="node-b", incarnation=7, job_id="job-g", run=1)
        )
        await execution.stop()

    execute(host, start_run(host, "job-g", placement=GANG), script_profile("print('hi')"), then)
    assert not host.of(RunFailed) and len(host.of(RunStopped)) == 1


def test_gang_checkpoints_are_per_rank_and_resume_from_the_same_step(tmp_path):
    host = FakeHost(tmp_path, "node-b")
    store = host.store
    for rank, body in ((0, b"rank zero"), (1, b"rank one")):
        src = tmp_path / f"ck{rank}"
        src.write_bytes(body)
        store.put_file(f"jobs/job-g/runs/1/ranks/{rank}/checkpoints/4", src)
    script = WRITE_OUTPUT + (
        "import json\n"
        "resume = [a for a in sys.argv if a.startswith('--resume=')]\n"
        "json.dump(open(resume[0][9:]).read() if resume else None, open('got', 'w'))\n"
        "open('ck', 'w').write('x')\n"
        "print(json.dumps({'checkpoint': 'ck', 'step': 5}), flush=True)\n"
        "open(sys.argv[1], 'wb').write(open('got', 'rb').read())\n"
    )
    profile = script_profile(script, resume_args=["--resume={resume_from}"])
    cmd = start_run(
        host, "job-g", placement=GANG, resume_from="local://jobs/job-g/runs/1/ranks/0/checkpoints/4"
    )
    cmd = StartRun(**{**{f: getattr(cmd, f) for f in cmd.__dataclass_fields__}, "run": 2})

    async def then(execution: RunExecution) -> None:
        key = "jobs/job-g/runs/2/ranks/1/output/output.bin"
        while not store.exists(key):
            await asyncio.sleep(0.01)
        host.ledger.decide(
            StopRun(event_id="s", ts_ms=0, node_id="node-b", incarnation=7, job_id="job-g", run=2)
        )
        await execution.stop()

    execute(host, cmd, profile, then)
    out = json.loads(store.local_path("jobs/job-g/runs/2/ranks/1/output/output.bin").read_text())
    assert out == "rank one"
    assert store.exists("jobs/job-g/runs/2/ranks/1/checkpoints/5")
    # every rank reports its own checkpoint and step: the scheduler resumes the
    # gang from the latest step all ranks wrote
    (ck,) = host.of(RunCheckpointed)
    assert (ck.node_id, ck.step) == ("node-b", 5)
    assert ck.checkpoint_uri == "local://jobs/job-g/runs/2/ranks/1/checkpoints/5"


# -- gangs: the start barrier and what the generator learns of its gang ----------
BARRIER_SCRIPT = WRITE_OUTPUT + (
    "import json\n"
    "open(os.path.join(os.environ['FRAMESPOOL_STARTED_FLAG']), 'w').write('x')\n"
    "keys = ('FRAMESPOOL_RANK', 'FRAMESPOOL_WORLD_SIZE', 'FRAMESPOOL_PEERS', 'FRAMESPOOL_MASTER')\n"
    "json.dump({k: os.environ[k] for k in keys}, open(sys.argv[1], 'w'))\n"
)


def test_a_gang_member_does_not_start_its_generator_before_the_go(tmp_path):
    host = FakeHost(tmp_path, "node-a")
    flag = tmp_path / "generator-started"
    profile = script_profile(BARRIER_SCRIPT, env={"FRAMESPOOL_STARTED_FLAG": str(flag)})
    cmd = start_run(host, "job-g", placement=GANG)
    seen: dict[str, Any] = {}

    async def then(execution: RunExecution) -> None:
        while not host.of(RunStarted):  # ready: it holds its GPUs
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.5)  # time enough to start a process, had it not waited
        seen["runner"], seen["flag"] = execution.runner, flag.exists()
        seen["reports"] = [type(e) for e in host.reports]
        assert host.ledger.decide(begin_run(host, cmd)).action is Action.BEGIN
        execution.begin()

    execute(host, cmd, profile, then, go=False)
    assert seen == {"runner": None, "flag": False, "reports": [RunStarted]}
    assert flag.exists()
    (done,) = host.of(RunCompleted)
    assert [type(e) for e in host.reports] == [RunStarted, RunCompleted]


def test_a_gang_member_stopped_at_the_barrier_never_starts_and_confirms_the_stop(tmp_path):
    host = FakeHost(tmp_path, "node-b")
    flag = tmp_path / "generator-started"
    profile = script_profile(BARRIER_SCRIPT, env={"FRAMESPOOL_STARTED_FLAG": str(flag)})
    cmd = start_run(host, "job-g", placement=GANG)

    async def then(execution: RunExecution) -> None:
        while not host.of(RunStarted):
            await asyncio.sleep(0.005)
        host.ledger.decide(
            StopRun(
                event_id="s",
                ts_ms=0,
                node_id="node-b",
                incarnation=7,
                job_id="job-g",
                run=1,
                reason="gang requeued: member_lost",
            )
        )
        await execution.stop()

    execution = execute(host, cmd, profile, then, go=False)
    assert execution.runner is None and not flag.exists()
    assert [type(e) for e in host.reports] == [RunStarted, RunStopped]
    assert host.of(RunStopped)[0].reason == "gang requeued: member_lost"


def test_the_generator_learns_its_rank_world_size_and_peers(tmp_path):
    host = FakeHost(tmp_path, "node-a")
    profile = script_profile(BARRIER_SCRIPT, env={"FRAMESPOOL_STARTED_FLAG": "flag"})
    execute(host, start_run(host, "job-g", placement=GANG), profile)
    (done,) = host.of(RunCompleted)
    env = json.loads(host.store.local_path(done.artifact_uri).read_text())
    assert env == {
        "FRAMESPOOL_RANK": "0",
        "FRAMESPOOL_WORLD_SIZE": "2",
        "FRAMESPOOL_PEERS": "node-a,node-b",
        "FRAMESPOOL_MASTER": "node-a",
    }


def test_a_run_alone_is_its_own_world(tmp_path):
    host = FakeHost(tmp_path)
    profile = script_profile(BARRIER_SCRIPT, env={"FRAMESPOOL_STARTED_FLAG": "flag"})
    execute(host, start_run(host), profile)
    (done,) = host.of(RunCompleted)
    env = json.loads(host.store.local_path(done.artifact_uri).read_text())
    assert env == {
        "FRAMESPOOL_RANK": "0",
        "FRAMESPOOL_WORLD_SIZE": "1",
        "FRAMESPOOL_PEERS": NODE,
        "FRAMESPOOL_MASTER": NODE,
    }


def test_single_node_runs_keep_their_keys(tmp_path):
    host = FakeHost(tmp_path)
    one = (NodeSlice(node_id=NODE, gpus=(0,)),)
    script = WRITE_OUTPUT + "open(sys.argv[1], 'wb').write(b'v')\n"
    execute(host, start_run(host, placement=one), script_profile(script))
    (done,) = host.of(RunCompleted)
    assert done.artifact_uri == "local://jobs/job-1/runs/1/output/output.bin"


def test_a_gang_member_not_in_the_placement_fails_to_launch(tmp_path):
    host = FakeHost(tmp_path, "node-z")
    execute(host, start_run(host, placement=GANG), script_profile("print(1)"))
    (failed,) = host.of(RunFailed)
    assert failed.failure_class == "launch_error" and "node-z" in failed.reason


def test_work_dir_is_gone_after_the_run(tmp_path):
    host = FakeHost(tmp_path)
    script = WRITE_OUTPUT + "open(sys.argv[1], 'wb').write(b'v')\n"
    execution = execute(host, start_run(host), script_profile(script))
    assert not execution.workdir.exists()
    # nor the job's directory: one left per job would grow runs/ without bound
    assert not execution.workdir.parent.exists()
    assert not any(os.scandir(execution.workdir.parent.parent))


@pytest.mark.skipif(
    os.geteuid() != 0 or generator_identity("nobody", 0)[0] is None,
    reason="dropping to another user needs root and a 'nobody' user",
)
def test_a_root_agent_runs_the_generator_as_its_user_in_a_work_dir_it_owns(secret):
    nobody = generator_identity("nobody", 0)[0]
    base = Path(tempfile.mkdtemp(prefix="framespool-exec-"))
    base.chmod(0o755)  # pytest's tmp dirs are 0700: nobody could not reach its work dir
    try:
        host = FakeHost(base, identity=nobody)
        secret.chmod(0o600)
        ok = ModelProfile.from_dict({"name": "t", "command": ["/usr/bin/touch", "{out}"]})
        execute(host, start_run(host, "job-t"), ok)
        assert len(host.of(RunCompleted)) == 1
        steal = ModelProfile.from_dict({"name": "c", "command": ["/bin/cp", str(secret), "{out}"]})
        execute(host, start_run(host, "job-c"), steal)
        (failed,) = host.of(RunFailed)
        assert "Permission denied" in failed.reason
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_noop_run_needs_no_work_directory_and_keeps_its_output_from_memory(tmp_path):
    from framespool.agents.profiles import noop_profile

    host = FakeHost(tmp_path)
    execution = execute(host, start_run(host, model="noop"), noop_profile())
    assert [type(e) for e in host.reports] == [RunStarted, RunCompleted]
    (done,) = host.of(RunCompleted)
    assert done.size_bytes == 0 and host.store.exists(done.artifact_uri)
    assert not host.data_dir.exists()  # no work directory, staging or output file
    assert execution.ending  # its final report is queued: heartbeats no longer list it


def test_an_empty_output_is_kept_on_the_event_loop_only_where_that_is_cheap(tmp_path, monkeypatch):
    """A noop's empty output costs a local store a few syscalls, less than the thread
    hop (RunFiles.keep_result); a store without ``put_empty_inline`` (S3: a network
    call), or an output with bytes, is still written from a worker thread."""
    from framespool.agents import keeping
    from framespool.agents.gang import Membership
    from framespool.agents.profiles import noop_profile
    from framespool.agents.runner import COMPLETED, Outcome

    hops: list[str] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(fn, *args):
        hops.append(fn.__name__)
        return await real_to_thread(fn, *args)

    monkeypatch.setattr(keeping.asyncio, "to_thread", to_thread)

    class RemoteStore(LocalDirStore):
        put_empty_inline = False

    def keep(store, data: bytes):
        files = keeping.RunFiles(
            store, noop_profile(), f"job-{len(data)}", 1, Membership(0, 1), tmp_path, tmp_path
        )
        return asyncio.run(files.keep_result(Outcome(COMPLETED, 0, output_data=data)))

    local = LocalDirStore(tmp_path / "local", secret="s")
    empty = keep(local, b"")
    assert hops == [] and empty.size_bytes == 0 and local.exists(empty.uri)
    assert keep(local, b"v").size_bytes == 1 and hops == ["put_bytes"]
    remote = RemoteStore(tmp_path / "remote", secret="s")
    assert keep(remote, b"").size_bytes == 0 and hops == ["put_bytes", "put_bytes"]


def test_a_run_is_listed_until_its_final_report_is_queued(tmp_path):
    """Heartbeats skip a run once ``ending`` is set (agent.NodeAgent.heartbeat): a run
    still computing, or holding its place in a gang, is not ``ending``."""
    host = FakeHost(tmp_path)
    seen: list[bool] = []

    async def then(execution: RunExecution) -> None:
        while execution.runner is None:
            await asyncio.sleep(0.005)
        seen.append(execution.ending)

    script = WRITE_OUTPUT + "import time; time.sleep(0.3); open(sys.argv[1], 'wb').write(b'v')\n"
    execution = execute(host, start_run(host), script_profile(script), then=then)
    assert seen == [False] and execution.ending


# -- CHECKPOINTING is visible: the run says so while its checkpoint is written -----
def test_a_requested_checkpoint_shows_the_run_checkpointing_until_it_is_written(tmp_path):
    script = (
        "import json, signal, sys, time\n"
        "def ck(*_):\n"
        "    open('ck', 'w').write('state')\n"
        "    print(json.dumps({'checkpoint': 'ck', 'step': 2}), flush=True)\n"
        "signal.signal(signal.SIGUSR1, ck)\n"
        "for i in range(1, 40):\n"
        "    print(json.dumps({'progress': i / 40, 'step': i, 'total_steps': 40}), flush=True)\n"
        "    time.sleep(0.02)\n"
        "open(sys.argv[1], 'w').write('out')\n"
    )
    host = FakeHost(tmp_path)

    async def ask_for_a_checkpoint(execution: RunExecution) -> None:
        while execution.runner is None or execution.runner.last.step < 3:
            await asyncio.sleep(0.01)
        execution.checkpoint()

    execute(host, start_run(host), script_profile(script), then=ask_for_a_checkpoint)
    phases = [(p.phase, p.message) for p in host.progress if p.message]
    assert phases == [("CHECKPOINTING", "writing a checkpoint"), ("", "checkpoint written")]
    assert host.of(RunCheckpointed) and host.of(RunCompleted)
