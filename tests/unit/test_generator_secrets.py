"""A generator learns none of the agent's secrets (issue 33, item 9).

A real generator process, started the way the agent starts one
(:func:`runner_for`), writes out its whole environment and tries to read the
agent's secret files, whose paths it is told on its command line (a path is
no secret: the tenant may guess it). Its environment must hold no broker or
object-store credential and no path of a secret file, even from a profile
that asks for them; as a dropped user (root only) it reads neither file.
Without a generator user it runs as the agent and could read them: that is
the deployment docs/operator.md#generators-and-secrets warns about.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from framespool.agents.agent import NodeAgent
from framespool.agents.gang import Membership
from framespool.agents.gpus import SimulatedProbe
from framespool.agents.launch import runner_for
from framespool.agents.profiles import ModelProfile, ProfileError
from framespool.agents.runner import COMPLETED
from framespool.agents.sandbox import (
    Identity,
    SandboxError,
    exposed,
    generator_identity,
    unreachable_part,
)
from framespool.schemas import events as ev

KAFKA_PASSWORD = "kafka-pw-c0ffee"
AWS_SECRET = "aws-secret-f00d"
API_KEY_HASH_SALT = "stack-secret-beef"

# An interpreter any user may run (the test's own may live under /root); the spy
# needs the standard library only.
PUBLIC_PYTHON = next(
    (
        p
        for p in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable)
        if os.access(p, os.X_OK) and unreachable_part(Path(os.path.realpath(p)).parent) is None
    ),
    None,
)

SPY = r"""
import json, os, sys
out, *paths = sys.argv[1:]
read = {}
for p in paths:
    try:
        read[p] = open(p).read()
    except OSError as e:
        read[p] = "refused: " + type(e).__name__
json.dump({"env": dict(os.environ), "read": read, "uid": os.getuid()}, open(out, "w"))
print(json.dumps({"progress": 1.0}), flush=True)
"""


@pytest.fixture
def agent_dirs(monkeypatch):
    """An agent's secrets in a 0700 directory, work dirs in one others may enter,
    and the agent's environment holding its broker and object-store credentials."""
    top = Path(tempfile.mkdtemp(prefix="framespool-secrets-"))
    top.chmod(0o755)
    private = top / "stack"
    private.mkdir(mode=0o700)
    stack_secrets = private / "stack-secrets.json"
    stack_secrets.write_text(json.dumps({"url_signing_key": API_KEY_HASH_SALT}))
    password_file = private / "kafka-password"
    password_file.write_text(KAFKA_PASSWORD)
    for f in (stack_secrets, password_file):
        f.chmod(0o600)
    work = top / "work"
    work.mkdir(mode=0o755)
    (work / "spy.py").write_text(SPY)
    (work / "spy.py").chmod(0o644)
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SASL_USERNAME", "agent-0")
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SASL_PASSWORD", KAFKA_PASSWORD)
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE", str(password_file))
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFRAMESPOOL")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    yield top, stack_secrets, password_file, work
    shutil.rmtree(top, ignore_errors=True)


def spy_profile(work: Path, stack_secrets: Path) -> ModelProfile:
    """A profile that asks for everything it should not get (built directly: the
    profile loader refuses it, see the test below)."""
    return ModelProfile(
        name="spy",
        command=(PUBLIC_PYTHON or sys.executable, str(work / "spy.py"), "{out}"),
        inherit_env=(
            "FRAMESPOOL_KAFKA_SASL_PASSWORD",
            "FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE",
            "FRAMESPOOL_KAFKA_SASL_USERNAME",
            "AWS_SECRET_ACCESS_KEY",
            "KAFKA_BOOTSTRAP_SERVERS",
        ),
        env={"SPY_CONFIG": str(stack_secrets), "SPY_OK": "yes"},
    )


def spawn(profile, work: Path, identity: Identity | None, secrets, targets) -> dict:
    """Start ``profile`` as the agent would for a one-node run; what it saw."""
    workdir = work / "run"
    for sub in ("output", "tmp"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    if identity is not None:
        for p in (workdir, *workdir.rglob("*")):
            os.chown(p, identity.uid, identity.gid)
    cmd = ev.StartRun(
        event_id="s",
        ts_ms=0,
        node_id="n0",
        incarnation=1,
        run=1,
        gpus=(0,),
        spec=ev.JobSpec(job_id="j1", tenant="acme", model="spy"),
        placement=(),
        estimate_s=1.0,
    )
    profile = ModelProfile(
        **{
            **{f: getattr(profile, f) for f in profile.__dataclass_fields__},
            "command": (*profile.command, *map(str, targets)),
        }
    )

    async def main():
        runner = runner_for(
            profile,
            cmd,
            workdir,
            Membership(0, 1),
            resume_from=None,
            time_scale=1.0,
            identity=identity,
            secrets=tuple(secrets),
        )
        await runner.start()
        return await runner.wait()

    outcome = asyncio.run(main())
    assert outcome.kind == COMPLETED, outcome
    return json.loads((workdir / "output" / profile.output_name).read_text())


def assert_no_secret_in(env: dict[str, str], *paths: Path) -> None:
    text = json.dumps(env)
    for secret in (KAFKA_PASSWORD, AWS_SECRET, "AKIAFRAMESPOOL", *map(str, paths)):
        assert secret not in text, f"{secret!r} reached the generator: {env}"
    leaked = [k for k in env if k.startswith(("FRAMESPOOL_KAFKA_", "KAFKA_", "AWS_"))]
    assert not leaked, leaked


def test_a_generators_environment_holds_no_credential_nor_secret_path(agent_dirs):
    _, stack_secrets, password_file, work = agent_dirs
    seen = spawn(spy_profile(work, stack_secrets), work, None, (stack_secrets,), (stack_secrets,))
    assert_no_secret_in(seen["env"], stack_secrets, password_file)
    assert seen["env"]["SPY_OK"] == "yes"  # the profile's own variables still arrive
    assert seen["env"]["FRAMESPOOL_JOB_ID"] == "j1"


def only_root(reason: str):
    return pytest.mark.skipif(
        os.geteuid() != 0 or generator_identity("nobody", 0)[0] is None or PUBLIC_PYTHON is None,
        reason=reason,
    )


@only_root("dropping a generator to another user needs root")
def test_a_dropped_generator_reads_no_secret_file_even_knowing_its_path(agent_dirs):
    _, stack_secrets, password_file, work = agent_dirs
    nobody = generator_identity("nobody", 0)[0]
    assert nobody is not None
    assert exposed(stack_secrets, nobody) == exposed(password_file, nobody) == ""
    targets = (stack_secrets, password_file)
    seen = spawn(spy_profile(work, stack_secrets), work, nobody, (stack_secrets,), targets)
    assert seen["uid"] == nobody.uid
    assert_no_secret_in(seen["env"], stack_secrets, password_file)
    assert all(v.startswith("refused: PermissionError") for v in seen["read"].values()), seen
    # the same generator as the agent's user reads them: why a generator user matters
    seen = spawn(spy_profile(work, stack_secrets), work, None, (stack_secrets,), targets)
    assert seen["read"][str(password_file)] == KAFKA_PASSWORD


def test_a_profile_naming_the_agents_credentials_is_refused():
    for bad in (
        {"inherit_env": ["FRAMESPOOL_KAFKA_SASL_PASSWORD"]},
        {"inherit_env": ["AWS_SECRET_ACCESS_KEY"]},
        {"env": {"FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE": "/run/secrets/x"}},
    ):
        with pytest.raises(ProfileError, match="never gets them"):
            ModelProfile.from_dict({"name": "m", "command": ["gen", "{out}"], **bad})
    ok = ModelProfile.from_dict(
        {"name": "m", "command": ["gen", "{out}"], "inherit_env": ["HF_HOME"]}
    )
    assert ok.inherit_env == ("HF_HOME",)


GEN = Identity(65534, 65534, "gen")


def test_a_secret_file_must_be_0600_not_the_generators_and_behind_a_closed_directory(tmp_path):
    top = tmp_path / "top"
    closed = top / "closed"
    closed.mkdir(parents=True)
    secret = closed / "s"
    secret.write_text("x")
    secret.chmod(0o600)
    closed.chmod(0o700)
    assert exposed(secret, GEN) == ""
    secret.chmod(0o640)
    assert "chmod 600" in exposed(secret, GEN)
    secret.chmod(0o600)
    for d in (closed, *closed.parents):  # every directory on the way open to others
        if d.stat().st_uid == os.geteuid():
            d.chmod(d.stat().st_mode | 0o011)
    if all(d.stat().st_mode & 0o001 for d in closed.parents):
        assert "lets gen through" in exposed(secret, GEN)
    assert exposed(top / "missing", GEN) == ""  # nothing to read
    if os.geteuid() == 0:
        os.chown(secret, GEN.uid, GEN.gid)
        assert "belongs to the generator user" in exposed(secret, GEN)


def test_an_agent_with_a_generator_user_refuses_a_secret_it_could_read(tmp_path, monkeypatch):
    """The check the agent makes before registering (needs no root: the identity
    is set by hand)."""
    top = tmp_path / "t"
    top.mkdir()
    top.chmod(0o755)
    stack = top / "stack"
    stack.mkdir(mode=0o755)
    secrets = stack / "stack-secrets.json"
    secrets.write_text("{}")
    secrets.chmod(0o600)
    work = top / "work"
    work.mkdir(mode=0o755)
    for d in (top, *top.parents):  # tmp_path's parents may be 0700
        if d.stat().st_uid == os.geteuid() and not d.stat().st_mode & 0o001:
            d.chmod(d.stat().st_mode | 0o001)
    monkeypatch.delenv("FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE", raising=False)

    def agent() -> NodeAgent:
        a = NodeAgent(
            "n0",
            "cell-0",
            "unused:9092",
            None,
            SimulatedProbe(1),
            {},
            stack / "agents" / "n0",
            work_dir=work / "n0",
            secret_files=(secrets,),
        )
        a.identity = GEN
        return a

    with pytest.raises(SandboxError, match="lets gen through"):
        agent()._fence_generators(GEN)
    stack.chmod(0o700)
    agent()._fence_generators(GEN)
    assert (stack / "agents" / "n0").stat().st_mode & 0o777 == 0o700  # its own data dir
    pw = top / "kafka-password"
    pw.write_text("x")
    pw.chmod(0o644)
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE", str(pw))
    with pytest.raises(SandboxError, match="chmod 600"):
        agent()._fence_generators(GEN)
