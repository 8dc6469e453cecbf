"""The replay/audit/verify commands: argument handling and exit statuses (log reads faked)."""

from __future__ import annotations

import json

import pytest

import framespool.cli as cli
import framespool.processors.tools.reader as reader
from framespool.processors.core import CellConfig
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from tests.support.cell_log import clean_history, record


@pytest.fixture
def main(monkeypatch, capsys):
    monkeypatch.setattr(
        cli, "COMMANDS", tuple(dict.fromkeys((*cli.COMMANDS, "replay", "audit", "verify")))
    )
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture
def fake_log(monkeypatch):
    """read_log returns an in-memory log (made under the default policy, as the
    commands assume without --config); ``contents`` may be edited by the test."""
    log = clean_history(CellConfig())
    contents = log.contents()
    calls = []

    def read_log(bootstrap, topics, **kw):
        calls.append((bootstrap, kw))
        return contents

    monkeypatch.setattr(reader, "read_log", read_log)
    return contents, calls


def test_verify_and_replay_exit_zero_on_a_clean_log(main, fake_log):
    status, out, _ = main("verify", "--bootstrap", "broker:9092")
    assert status == 0 and "OK: no invariant violated" in out
    status, out, _ = main("replay", "--bootstrap", "broker:9092", "--json")
    assert status == 0 and json.loads(out)["ok"] is True
    assert fake_log[1][0][0] == "broker:9092"


def test_verify_exits_one_naming_a_forged_terminal(main, fake_log):
    contents, _ = fake_log
    forged = ev.JobCancelled(event_id="forged", ts_ms=1, job_id="b", run=1)
    contents.job_events.append(record(catalogue.JOB_EVENTS.name, 0, 999, forged))
    status, out, _ = main("verify", "--bootstrap", "b:1", "--json")
    report = json.loads(out)
    assert status == 1 and report["violation_counts"] == {"duplicate_terminal": 1}
    assert report["violations"][0]["subject"] == "b"


def test_replay_exits_one_on_divergence_and_reads_only_the_asked_cell(main, fake_log):
    contents, calls = fake_log
    contents.job_events.append(
        record(
            catalogue.JOB_EVENTS.name,
            0,
            999,
            ev.JobCompleted(event_id="cell-0@2/5", ts_ms=1, job_id="zzz", run=1),
        )
    )
    status, out, _ = main("replay", "--bootstrap", "b:1", "--cell", "cell-0", "--until", "20")
    assert status == 1 and "unexpected output at cell-0@2 output #5" in out
    assert calls[-1][1]["cells"] == [0] and calls[-1][1]["commands"] is False


def test_audit_prints_a_timeline_and_refuses_an_unknown_job(main, fake_log):
    status, out, _ = main("audit", "gang", "--bootstrap", "b:1")
    assert status == 0 and "JobAssigned" in out and "reservation holder" in out
    status, _, err = main("audit", "no-such-job", "--bootstrap", "b:1")
    assert status == 2 and "does not appear in the log" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (("replay", "--bootstrap", "b:1", "--cell", "east"), "--cell"),
        (("replay", "--bootstrap", "b:1", "--cell", "cell-9"), "cell-0 to cell-3"),
        (("replay", "--bootstrap", "b:1", "--until", "yesterday"), "ISO-8601"),
        (("verify", "--bootstrap", "b:1", "--config", "/nonexistent.toml"), "cannot read config"),
    ],
)
def test_usage_errors_exit_two_and_say_what_to_change(main, fake_log, argv, message):
    status, _, err = main(*argv)
    assert status == 2 and message in err


def test_the_bootstrap_comes_from_stack_json(main, fake_log, tmp_path):
    status, _, err = main("verify", "--data-dir", str(tmp_path))
    assert status == 2 and "stack.json" in err and "--bootstrap" in err
    (tmp_path / "stack.json").write_text(json.dumps({"bootstrap_servers": "127.0.0.1:1234"}))
    status, _, _ = main("verify", "--data-dir", str(tmp_path))
    assert status == 0 and fake_log[1][-1][0] == "127.0.0.1:1234"


def test_the_config_file_is_the_scheduler_policy(main, fake_log, tmp_path):
    config = tmp_path / "fs.toml"
    config.write_text("[scheduler]\nstatus_interval_s = 0\n")  # no CellStatus
    status, out, _ = main("replay", "--bootstrap", "b:1", "--config", str(config))
    assert status == 1 and "unexpected output" in out and "CellStatus" in out


def test_replay_refolds_admission_too_and_exits_one_on_its_divergence(main, fake_log, tmp_path):
    contents, calls = fake_log
    status, out, _ = main("replay", "--bootstrap", "b:1")
    assert status == 0 and "admission: replayed 4 commands" in out
    assert calls[-1][1]["commands"] is True
    config = tmp_path / "fs.toml"
    config.write_text('[admission]\ntiers = ["interactive"]\n')  # the jobs' tier unknown there
    status, out, _ = main("replay", "--bootstrap", "b:1", "--config", str(config))
    assert status == 1 and "at admission-0@0 output #0" in out and "JobRejected" in out
    forged = ev.JobRejected(
        event_id="admission-0@0/1", ts_ms=1, job_id="a", tenant="acme", reason="forged"
    )
    contents.job_events.append(record(catalogue.JOB_EVENTS.name, 0, 999, forged))
    status, out, _ = main("replay", "--bootstrap", "b:1")
    assert status == 1 and "unexpected output at admission-0@0 output #1" in out


def test_a_stacks_data_dir_supplies_the_policy_its_processors_ran_with(main, fake_log, tmp_path):
    (tmp_path / "stack.json").write_text(json.dumps({"bootstrap_servers": "127.0.0.1:1234"}))
    status, out, _ = main("replay", "--data-dir", str(tmp_path))
    assert status == 0
    # 'framespool up' writes the processors' config beside stack.json; replay uses it
    (tmp_path / "processors-config.json").write_text(
        json.dumps({"admission": {"cells": ["cell-0"], "tiers": ["interactive"]}})
    )
    status, out, _ = main("replay", "--data-dir", str(tmp_path))
    assert status == 1 and "at admission-0@0 output #0" in out
    # an explicit --bootstrap names no stack: the defaults apply
    status, _, _ = main("replay", "--bootstrap", "127.0.0.1:1234")
    assert status == 0


def test_the_tools_take_the_configuration_the_processors_recorded(tmp_path, capsys):
    """replay, audit and verify fold with the config the scheduler recorded in the
    log (ProcessorConfigured), ahead of the data dir's file, and say when the log
    holds several."""
    import argparse
    import json as _json
    from types import SimpleNamespace

    from framespool.commands.replay import admission_config_for, cell_config_for
    from framespool.log import Record
    from framespool.processors.config_file import recorded_document
    from framespool.schemas import codec
    from framespool.schemas.events import ProcessorConfigured

    def configured(doc: dict, at: int, processor: str = "scheduler") -> Record:
        text, digest = recorded_document(doc)
        event = ProcessorConfigured(
            event_id=f"s-0/configured@{at}",
            ts_ms=at,
            processor=processor,
            instance="s-0",
            document=text,
            sha256=digest,
        )
        return Record("framespool.job-events", 0, at, processor.encode(), codec.encode(event))

    data = tmp_path / "data"
    data.mkdir()
    (data / "processors-config.json").write_text(
        _json.dumps({"scheduler": {"heartbeat_timeout_s": 99.0}})
    )
    args = argparse.Namespace(config=None, bootstrap=None, data_dir=data)
    empty = SimpleNamespace(job_events=[])
    assert cell_config_for(args, empty).heartbeat_timeout_s == 99.0  # nothing recorded: the file
    log = SimpleNamespace(
        job_events=[
            configured({"scheduler": {"heartbeat_timeout_s": 7.0}}, 1),
            configured({"admission": {"cells": ["cell-0", "cell-1", "cell-2"]}}, 2, "admission"),
            configured({"scheduler": {"heartbeat_timeout_s": 8.0}}, 3),
        ]
    )
    assert cell_config_for(args, log).heartbeat_timeout_s == 8.0  # the latest recorded
    assert "ran with 2 configurations" in capsys.readouterr().err
    assert admission_config_for(args, log).cells == ("cell-0", "cell-1", "cell-2")
    explicit = tmp_path / "mine.json"
    explicit.write_text(_json.dumps({"scheduler": {"heartbeat_timeout_s": 5.0}}))
    args.config = explicit
    assert cell_config_for(args, log).heartbeat_timeout_s == 5.0  # --config wins
