"""The runner: a generator subprocess in its own process group, watched."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from framespool.agents.demo_generator import EXIT_INJECTED_FAILURE
from framespool.agents.profiles import ModelProfile, demo_profile
from framespool.agents.runner import COMPLETED, FAILED, HUNG, STOPPED, LaunchError, Runner
from tests.support.agents import plain_argv


def alive(pid: int) -> bool:
    """Running (a zombie waiting for an absent reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


async def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def demo_runner(
    tmp_path: Path,
    *extra: str,
    steps: int = 10,
    time_scale: float = 1000.0,
    profile: ModelProfile | None = None,
    prompt: str = "a test",
    **kw,
) -> Runner:
    profile = profile or demo_profile()
    out = tmp_path / "out.gif"
    argv = profile.argv(
        prompt=prompt,
        out=str(out),
        params_json=f'{{"steps": "{steps}"}}',
        checkpoint_dir=str(tmp_path / "ck"),
        resume_from=None,
        time_scale=str(time_scale),
        gpus="0",
        job_id="j",
        run="1",
    ) + list(extra)
    return Runner(profile, argv, output_path=out, cwd=tmp_path, **kw)


def test_completes_with_progress_and_output(tmp_path):
    seen = []

    async def main():
        r = demo_runner(tmp_path, steps=8, time_scale=40, on_progress=seen.append)
        await r.start()
        outcome = await r.wait()
        return r, outcome

    r, outcome = asyncio.run(main())
    assert outcome.kind == COMPLETED and outcome.exit_code == 0
    assert outcome.output_path == tmp_path / "out.gif" and outcome.output_path.stat().st_size > 0
    assert [p.step for p in seen] == list(range(9))
    assert seen[-1].progress == 1.0 and r.last.total_steps == 8
    assert r.step_rate > 0


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid and alive(int(entry)):
                    members.append(int(entry))
            except ProcessLookupError:
                pass
    return members


def test_stop_kills_the_whole_process_group(tmp_path):
    async def main():
        r = demo_runner(tmp_path, "--spawn-child", steps=1000, time_scale=10)
        await r.start()
        while r.last.step < 2:
            await asyncio.sleep(0.02)
        before = group_members(r.pid)
        t0 = time.monotonic()
        outcome = await r.stop(grace_s=2.0)
        took = time.monotonic() - t0
        gone = [await wait_gone(pid) for pid in before]
        return r.pid, before, outcome, took, gone, group_members(r.pid)

    leader, before, outcome, took, gone, after = asyncio.run(main())
    assert leader in before and len(before) == 2  # the generator and its helper
    assert outcome.kind == STOPPED and outcome.exit_code == 143
    assert took < 2.0  # SIGTERM was enough for the leader; the helper got SIGKILL
    assert all(gone) and after == []


def test_stop_escalates_to_sigkill_after_grace(tmp_path):
    async def main():
        r = demo_runner(tmp_path, "--ignore-sigterm", steps=1000, time_scale=10)
        await r.start()
        while r.last.step < 1:
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        outcome = await r.stop(grace_s=0.5)
        return outcome, time.monotonic() - t0, await wait_gone(r.pid)

    outcome, took, gone = asyncio.run(main())
    assert outcome.kind == STOPPED and outcome.exit_code == -9
    assert 0.5 <= took < 3 and gone


@pytest.mark.slow
def test_hang_is_detected_and_the_group_killed(tmp_path):
    async def main():
        r = demo_runner(tmp_path, "--hang-at-step", "3", "--ignore-sigterm", hang_timeout_s=0.6)
        await r.start()
        t0 = time.monotonic()
        outcome = await asyncio.wait_for(r.wait(), 10)
        return outcome, time.monotonic() - t0, await wait_gone(r.pid)

    outcome, took, gone = asyncio.run(main())
    assert outcome.kind == HUNG and outcome.failure_class == "hung"
    assert "no progress for 0.6s" in outcome.reason and "last step 3" in outcome.reason
    assert took < 6 and gone


def test_failure_reports_exit_code_and_stderr_tail(tmp_path):
    async def main():
        r = demo_runner(tmp_path, "--fail-at-step", "2")
        await r.start()
        return await r.wait()

    outcome = asyncio.run(main())
    assert outcome.kind == FAILED and outcome.failure_class == "generator_error"
    assert outcome.exit_code == EXIT_INJECTED_FAILURE
    assert "exit code 3" in outcome.reason and "injected failure at step 2" in outcome.reason
    assert "injected failure" in outcome.stderr_tail


def test_exit_zero_without_output_is_a_failure(tmp_path):
    profile = ModelProfile.from_dict(
        {"name": "liar", "command": ["{python}", "-c", "print('done')"]}
    )

    async def main():
        r = Runner(
            profile,
            plain_argv(profile, ""),
            output_path=tmp_path / "missing",
        )
        await r.start()
        return await r.wait()

    outcome = asyncio.run(main())
    assert outcome.kind == FAILED and "wrote no output" in outcome.reason


def test_checkpoint_request_resolves_with_the_file(tmp_path):
    checkpoints = []

    async def main():
        r = demo_runner(tmp_path, steps=200, time_scale=20, on_checkpoint=checkpoints.append)
        await r.start()
        while r.last.step < 2:
            await asyncio.sleep(0.02)
        cp = await asyncio.wait_for(r.request_checkpoint(), 5)
        await r.stop(grace_s=2)
        return cp

    cp = asyncio.run(main())
    assert cp.step >= 2 and cp.path.is_file() and checkpoints == [cp]


def test_launch_error_names_the_command(tmp_path):
    profile = ModelProfile.from_dict({"name": "missing", "command": ["/nonexistent/generator"]})

    async def main():
        r = Runner(profile, ["/nonexistent/generator"], output_path=tmp_path / "o")
        await r.start()

    with pytest.raises(LaunchError, match="/nonexistent/generator"):
        asyncio.run(main())


def test_profile_env_reaches_the_generator(tmp_path):
    profile = ModelProfile.from_dict(
        {
            "name": "env",
            "env": {"FOO": "bar"},
            "command": [
                "{python}",
                "-c",
                "import os,sys; open(sys.argv[1],'w').write(os.environ['FOO']+os.environ['EXTRA'])",
                "{out}",
            ],
        }
    )
    out = tmp_path / "o.txt"

    async def main():
        r = Runner(
            profile,
            plain_argv(profile, str(out)),
            output_path=out,
            env={"EXTRA": "!"},
        )
        await r.start()
        return await r.wait()

    assert asyncio.run(main()).kind == COMPLETED
    assert out.read_text() == "bar!"
    assert sys.executable  # the {python} placeholder is this interpreter


def test_status_lines_keep_a_busy_generator_from_counting_as_hung(tmp_path):
    script = (
        "import json,sys,time\n"
        "for i in range(8):\n"
        "    print(json.dumps(dict(status='encoding', i=i)), flush=True); time.sleep(0.1)\n"
        "open(sys.argv[1], 'w').write('ok')\n"
    )
    profile = ModelProfile.from_dict(
        {"name": "busy", "command": ["{python}", "-c", script, "{out}"]}
    )
    out = tmp_path / "o"

    async def main():
        r = Runner(
            profile,
            plain_argv(profile, str(out)),
            output_path=out,
            hang_timeout_s=0.4,
        )
        await r.start()
        return await r.wait()

    assert asyncio.run(main()).kind == COMPLETED


@pytest.mark.parametrize(
    "prompt", ["--fail-at-step=0", "-h", "--", "--hang-at-step=1 --ignore-sigterm"]
)
def test_a_prompt_that_looks_like_an_option_is_only_a_prompt(tmp_path, prompt):
    checkpoints = []

    async def main():
        r = demo_runner(
            tmp_path, steps=40, time_scale=20, prompt=prompt, on_checkpoint=checkpoints.append
        )
        await r.start()
        cp = await asyncio.wait_for(r.request_checkpoint(), 10)
        return cp, await r.wait()

    cp, outcome = asyncio.run(main())
    assert outcome.kind == COMPLETED, outcome.reason
    assert json.loads(cp.path.read_text())["prompt"] == prompt


def test_noop_runs_in_the_agents_process(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from framespool.agents.gang import membership
    from framespool.agents.launch import runner_for
    from framespool.agents.profiles import noop_profile
    from tests.support.agents import start_run

    async def no_processes(*a, **kw):
        raise AssertionError(f"spawned {a}")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", no_processes)
    monkeypatch.setattr(asyncio, "create_subprocess_shell", no_processes)
    seen = []
    out = tmp_path / "output" / "output.bin"

    async def main():
        host = SimpleNamespace(node_id="n0", incarnation=1)
        cmd = start_run(host, "j", model="noop")  # type: ignore[arg-type]
        r = runner_for(
            noop_profile(),
            cmd,
            tmp_path,
            membership(cmd, "n0"),
            resume_from=None,
            time_scale=1.0,
            on_progress=seen.append,
        )
        await r.start()
        return r, await r.wait()

    r, outcome = asyncio.run(main())
    assert outcome.kind == COMPLETED and outcome.exit_code == 0
    # its output is the agent's own bytes, kept from memory: no file, no work directory
    assert outcome.output_data == b"" and outcome.output_path is None
    assert not out.exists() and not any(tmp_path.iterdir()) and r.pid is None
    assert [(p.progress, p.step, p.total_steps) for p in seen] == [(1.0, 1, 1)]


def test_malformed_progress_and_checkpoint_lines_are_skipped_not_fatal(tmp_path):
    script = (
        "import json,sys\n"
        "for line in ['{\"progress\": \"lots\"}', '{\"progress\": NaN, \"step\": 1}',\n"
        "             '{\"progress\": 0.5, \"step\": \"two\"}', '{\"progress\": [1]}',\n"
        "             '{\"checkpoint\": \"ck\", \"step\": \"x\"}', '{\"progress\": 7, \"step\": 2}',\n"
        "             '{\"progress\": 0.5, \"step\": 3, \"total_steps\": 6}']:\n"
        "    print(line, flush=True)\n"
        "open(sys.argv[1], 'w').write('ok')\n"
    )
    profile = ModelProfile.from_dict(
        {
            "name": "noisy",
            "command": ["{python}", "-c", script.replace("{", "{{").replace("}", "}}"), "{out}"],
            "checkpoint": {"signal": "SIGUSR1"},
        }
    )
    out = tmp_path / "o"
    seen, checkpoints = [], []

    async def main():
        r = Runner(
            profile,
            plain_argv(profile, str(out)),
            output_path=out,
            cwd=tmp_path,
            on_progress=seen.append,
            on_checkpoint=checkpoints.append,
        )
        await r.start()
        return await r.wait()

    assert asyncio.run(main()).kind == COMPLETED
    assert [(p.progress, p.step, p.total_steps) for p in seen] == [(1.0, 2, 0), (0.5, 3, 6)]
    assert checkpoints == []


def test_a_checkpoint_asked_of_a_generator_that_just_exited_does_not_steal_its_exit(
    tmp_path, monkeypatch
):
    """The leader has exited, asyncio's child watcher has not reaped it yet, and
    a checkpoint is asked for. Signalling must not reap it (Popen.send_signal
    polls first): the watcher would find nothing and report exit code 255, and
    a completed run would be failed. The watcher is held back until the signal
    is sent, so the race that CI once lost is played every time."""
    release = threading.Event()
    real_waitpid = os.waitpid

    def held_waitpid(pid: int, options: int):
        # the thread watcher's blocking wait for its child (Python 3.11); a
        # watcher on the event loop's own thread (pidfd) is never held
        if options == 0 and threading.current_thread() is not threading.main_thread():
            release.wait(10)
        return real_waitpid(pid, options)

    monkeypatch.setattr(os, "waitpid", held_waitpid)

    async def main():
        r = demo_runner(tmp_path, steps=2, time_scale=1000)
        await r.start()
        deadline = time.monotonic() + 10
        while alive(r.pid) or not r._spoke.is_set():  # exited, not yet reaped
            assert time.monotonic() < deadline, "the generator did not exit"
            await asyncio.sleep(0.01)
        asked = r.request_checkpoint()
        release.set()
        outcome = await asyncio.wait_for(r.wait(), 10)
        with pytest.raises(ProcessLookupError):
            await asked
        return outcome

    try:
        outcome = asyncio.run(main())
    finally:
        release.set()
    assert outcome.kind == COMPLETED and outcome.exit_code == 0, outcome


def _script_runner(tmp_path: Path, script: str, **kw) -> Runner:
    profile = ModelProfile.from_dict(
        {"name": "slow-start", "command": ["{python}", "-c", script, "{out}"]}
    )
    out = tmp_path / "o"
    argv = plain_argv(profile, str(out))
    return Runner(profile, argv, output_path=out, **kw)


SLOW_START = (
    "import json,sys,time\n"
    "time.sleep(1.2)\n"  # a model loading: nothing to say yet
    "for i in range(4):\n"
    "    print(json.dumps(dict(progress=i/3, step=i, total_steps=3)), flush=True)\n"
    "    time.sleep(0.05)\n"
    "open(sys.argv[1], 'w').write('ok')\n"
)


@pytest.mark.parametrize("startup_s, kind", [(10.0, COMPLETED), (None, HUNG)])
def test_silence_before_the_first_line_has_its_own_allowance(tmp_path, startup_s, kind):
    """A generator silent for 1.2 s while it starts, then quick: hung under a
    0.4 s hang timeout alone, completed with a start-up allowance."""

    async def main():
        r = _script_runner(tmp_path, SLOW_START, hang_timeout_s=0.4, startup_timeout_s=startup_s)
        await r.start()
        return await asyncio.wait_for(r.wait(), 20)

    outcome = asyncio.run(main())
    assert outcome.kind == kind, outcome
    if kind == HUNG:
        assert "no output for 0.4s after it started" in outcome.reason


def test_the_hang_clock_starts_at_the_first_line_whatever_it_says(tmp_path):
    """A first line that is neither progress nor status (a log record in JSON)
    ends the start-up; the hang timeout counts from it, not from the start."""
    script = SLOW_START.replace(
        "time.sleep(1.2)\n",
        "time.sleep(1.2)\nprint(json.dumps(dict(msg='loaded')), flush=True)\ntime.sleep(0.25)\n",
    )
    assert "loaded" in script

    async def main():
        r = _script_runner(tmp_path, script, hang_timeout_s=0.8, startup_timeout_s=10)
        await r.start()
        return await asyncio.wait_for(r.wait(), 20)

    outcome = asyncio.run(main())
    assert outcome.kind == COMPLETED, outcome


def test_a_generator_that_never_speaks_is_hung_after_its_start_up_allowance(tmp_path):
    async def main():
        r = _script_runner(
            tmp_path, "import time; time.sleep(60)", hang_timeout_s=30, startup_timeout_s=0.5
        )
        await r.start()
        return await asyncio.wait_for(r.wait(), 20)

    outcome = asyncio.run(main())
    assert outcome.kind == HUNG and "after it started" in outcome.reason, outcome


def test_a_time_scale_shortens_the_hang_timeout_but_not_the_start_up(tmp_path):
    from types import SimpleNamespace

    from framespool.agents.gang import membership
    from framespool.agents.launch import runner_for
    from tests.support.agents import start_run

    cmd = start_run(SimpleNamespace(node_id="n0", incarnation=1), "j", model="demo")  # type: ignore[arg-type]
    profile = demo_profile()  # hang_timeout_s 30, no start-up allowance of its own
    r = runner_for(profile, cmd, tmp_path, membership(cmd, "n0"), resume_from=None, time_scale=10.0)
    assert isinstance(r, Runner)
    assert r.hang_timeout_s == 3.0 and r.startup_timeout_s == 30.0
    own = dataclasses.replace(profile, startup_timeout_s=600.0)
    r = runner_for(own, cmd, tmp_path, membership(cmd, "n0"), resume_from=None, time_scale=10.0)
    assert isinstance(r, Runner) and r.startup_timeout_s == 600.0


def test_a_builtin_gets_its_jobs_params_and_the_time_scale_and_is_never_a_command(tmp_path):
    """One place makes builtins (``runner_for``), with the job's params: a
    ``hold`` of 120 job seconds at scale 60 is 120 steps of 1/60 s."""
    from types import SimpleNamespace

    from framespool.agents.builtin import BuiltinRunner
    from framespool.agents.gang import membership
    from framespool.agents.launch import command_runner, runner_for
    from framespool.agents.profiles import load_profiles
    from tests.support.agents import start_run

    hold = load_profiles()["hold"]
    cmd = start_run(
        SimpleNamespace(node_id="n0", incarnation=1),
        "j",
        model="hold",
        params={"duration_s": "120"},
    )  # type: ignore[arg-type]
    r = runner_for(hold, cmd, tmp_path, membership(cmd, "n0"), resume_from=None, time_scale=60.0)
    assert isinstance(r, BuiltinRunner)
    assert (r._steps, round(r._step_s, 6)) == (120, round(1 / 60, 6))
    with pytest.raises(ValueError, match="builtin 'hold': use runner_for"):
        command_runner(hold, tmp_path / "out", tmp_path, {})
