"""What a generator gets from its node: a minimal environment, its own user."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from framespool.agents.profiles import ModelProfile
from framespool.agents.runner import COMPLETED, FAILED, Runner
from framespool.agents.sandbox import (
    Identity,
    SandboxError,
    generator_env,
    generator_identity,
    hand_over,
    unreachable_part,
)
from tests.support.agents import plain_argv

USERS = {"gen": (1500, 1500, "gen"), "root": (0, 0, "root"), 1600: (1600, 1600, "1600")}


def lookup(user):
    return USERS.get(user)


def test_env_starts_from_nothing_but_locale_and_search_paths():
    base = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "AWS_SECRET_ACCESS_KEY": "hunter2",
        "AWS_ACCESS_KEY_ID": "AKIA",
        "FRAMESPOOL_API_KEY": "k",
        "HF_HOME": "/models",
        "PYTHONPATH": "/agent/src",
    }
    env = generator_env({"PYTHONPATH": "/gen"}, ("HF_HOME",), {"CUDA_VISIBLE_DEVICES": "1"}, base)
    assert env == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "HF_HOME": "/models",
        "PYTHONPATH": "/gen",
        "CUDA_VISIBLE_DEVICES": "1",
    }


def test_profile_search_paths_prepend_and_the_runs_variables_win():
    env = generator_env(
        {"PATH": "/opt/gen/bin", "X": "profile"}, (), {"X": "run"}, {"PATH": "/usr/bin"}
    )
    assert env["PATH"] == f"/opt/gen/bin{os.pathsep}/usr/bin" and env["X"] == "run"
    assert generator_env({}, (), {}, {})["PATH"] == os.defpath


@pytest.mark.parametrize(
    "configured, euid, expected",
    [
        (None, 0, None),
        ("", 0, None),
        ("gen", 1000, None),  # not root: cannot switch, runs as itself
        ("gen", 0, Identity(1500, 1500, "gen")),
        (1600, 0, Identity(1600, 1600, "1600")),
    ],
)
def test_who_generators_run_as(configured, euid, expected):
    identity, why = generator_identity(configured, euid, lookup)
    assert identity == expected and why


@pytest.mark.parametrize(
    "configured, message", [("nobody-here", "does not exist"), ("root", "root")]
)
def test_a_root_agent_refuses_a_missing_or_root_generator_user(configured, message):
    with pytest.raises(SandboxError, match=message):
        generator_identity(configured, 0, lookup)


def test_the_real_lookup_knows_nobody_and_bare_uids():
    identity, _ = generator_identity("nobody", 0)
    assert identity is not None and identity.uid != 0 and identity.name == "nobody"
    assert generator_identity("4242424", 0)[0] == Identity(4242424, 4242424, "4242424")


@pytest.fixture
def open_dir():
    """A directory an unprivileged user can reach (pytest's tmp dirs are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="framespool-sandbox-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


root_only = pytest.mark.skipif(
    os.geteuid() != 0 or generator_identity("nobody", 0)[0] is None,
    reason="dropping to another user needs root and a 'nobody' user",
)


def run(profile: ModelProfile, out: Path, workdir: Path, identity: Identity | None):
    async def main():
        r = Runner(
            profile,
            plain_argv(profile, str(out)),
            output_path=out,
            cwd=workdir,
            identity=identity,
        )
        await r.start()
        return await r.wait()

    return asyncio.run(main())


@root_only
def test_a_dropped_generator_writes_its_work_dir_but_cannot_read_the_agents_files(open_dir):
    nobody = generator_identity("nobody", 0)[0]
    secret = open_dir / "credentials"
    secret.write_text("hunter2")
    secret.chmod(0o600)
    workdir = open_dir / "run"
    (workdir / "output").mkdir(parents=True)
    hand_over(workdir, nobody)
    out = workdir / "output" / "o"
    touch = ModelProfile.from_dict({"name": "touch", "command": ["/usr/bin/touch", "{out}"]})
    assert run(touch, out, workdir, nobody).kind == COMPLETED
    assert out.stat().st_uid == nobody.uid
    out.unlink()
    steal = ModelProfile.from_dict({"name": "cp", "command": ["/bin/cp", str(secret), "{out}"]})
    outcome = run(steal, out, workdir, nobody)
    assert outcome.kind == FAILED and "Permission denied" in outcome.stderr_tail
    assert run(steal, out, workdir, None).kind == COMPLETED  # as the agent it could


def test_a_directory_others_cannot_traverse_is_named(open_dir):
    inner = open_dir / "a" / "b"
    inner.mkdir(parents=True)
    assert unreachable_part(inner) is None
    (open_dir / "a").chmod(0o700)
    assert unreachable_part(inner) == open_dir / "a"


@root_only
def test_a_root_agent_with_a_generator_user_refuses_a_data_dir_it_cannot_reach(open_dir):
    from framespool.agents.agent import NodeAgent
    from framespool.agents.gpus import SimulatedProbe

    hidden = open_dir / "private"
    hidden.mkdir(mode=0o700)
    agent = NodeAgent(
        "n1",
        "cell-0",
        "127.0.0.1:1",
        None,
        SimulatedProbe(1),
        {},
        hidden / "agent",
        generator_user="nobody",
    )
    with pytest.raises(SandboxError, match=r"chmod o\+x .*private"):
        asyncio.run(agent.start())
