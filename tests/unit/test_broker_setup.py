"""Setting up the durable broker without starting it: what it is configured with,
and the errors a user can act on when Java or Maven is missing; ``reset``."""

from __future__ import annotations

import fcntl
import signal

import pytest

from framespool import cli
from framespool.broker import BrokerError, JarsError, KafkaBroker, jars
from framespool.broker.kafka import java_binary


def test_flush_policy_and_single_node_settings(tmp_path):
    plain = KafkaBroker(tmp_path / "a", port=9101, controller_port=9102)
    props = plain.server_properties()
    assert "log.flush.interval.messages" not in props  # page cache: survives process crashes
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9102"
    assert props["auto.create.topics.enable"] == "false"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["log.dirs"] == str((tmp_path / "a" / "log").resolve())
    synced = KafkaBroker(tmp_path / "b", port=9103, controller_port=9104, fsync=True)
    assert synced.server_properties()["log.flush.interval.messages"] == "1"


def test_missing_java_says_what_to_install(monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BrokerError, match=r"(?s)no `java`.*apt-get install.*--broker tansu"):
        java_binary()


def test_missing_maven_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("FRAMESPOOL_KAFKA_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not jars.resolved()
    with pytest.raises(JarsError, match=r"(?s)Maven.*not on PATH.*apt-get install"):
        jars.resolve()


def test_up_without_maven_fails_with_the_hint_before_starting_anything(
    monkeypatch, capsys, tmp_path
):
    monkeypatch.setenv("FRAMESPOOL_KAFKA_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", "/nonexistent")
    before = signal.getsignal(signal.SIGTERM)
    status = cli.main(["up", "--data-dir", str(tmp_path / "data"), "--port", "1"])
    err = capsys.readouterr().err
    assert status == 2
    assert "mvn" in err and "--broker tansu" in err, err
    # the caller's SIGTERM handler is back (a forked worker that inherited up's
    # handler ignored Pool.terminate and hung the test session at exit)
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_pinned_version_and_cache_follow_the_pom(monkeypatch, tmp_path):
    monkeypatch.delenv("FRAMESPOOL_KAFKA_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jars.kafka_version() == "4.4.0"
    home = jars.cache_dir()
    assert home.parent == tmp_path / "framespool" / "kafka"
    assert home.name.startswith("4.4.0-")


def test_reset_removes_the_stack_state_only_and_never_under_a_running_stack(tmp_path, capsys):
    data = tmp_path / "data"
    for name in ("kafka/log", "processors/admission", "api", "agents", "artifacts", "logs"):
        (data / name).mkdir(parents=True)
    (data / "stack-secrets.json").write_text("{}")
    (data / "tenant-keys.json").write_text("{}")
    (data / "notes.txt").write_text("mine")
    with open(data / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert cli.main(["reset", "--data-dir", str(data)]) == 2
        assert "running" in capsys.readouterr().err
        assert (data / "kafka").is_dir()
    assert cli.main(["reset", "--data-dir", str(data)]) == 0
    assert sorted(p.name for p in data.iterdir()) == [".lock", "notes.txt"]
    with pytest.raises(SystemExit):
        cli.main(["reset"])  # the data dir must be named
