"""Fetch wait and linger per client role (framespool.log.kafka.Role)."""

from __future__ import annotations

import pytest

from framespool.log import kafka
from framespool.log.kafka import Role


class Recorded:
    settings: list[dict] = []

    def __init__(self, settings: dict) -> None:
        Recorded.settings.append(settings)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.fixture
def recorded(monkeypatch):
    Recorded.settings = []
    monkeypatch.setattr(kafka.consumer, "Consumer", Recorded)
    monkeypatch.setattr(kafka.producer, "Producer", Recorded)
    return Recorded.settings


def test_request_path_consumers_wait_less_than_background_ones(recorded):
    kafka.LogConsumer("b:1")
    kafka.LogConsumer("b:1", role=Role.REQUEST_PATH)
    kafka.LogConsumer("b:1", role=Role.FLEET)
    kafka.LogConsumer("b:1", role=Role.BACKGROUND)
    kafka.LogConsumer("b:1", role=Role.BACKGROUND, **{"fetch.wait.max.ms": 7})
    waits = [s["fetch.wait.max.ms"] for s in recorded]
    assert waits == [
        kafka.settings.FETCH_WAIT_MS_REQUEST_PATH,
        kafka.settings.FETCH_WAIT_MS_REQUEST_PATH,
        kafka.settings.FETCH_WAIT_MS_FLEET,
        kafka.settings.FETCH_WAIT_MS_BACKGROUND,
        7,  # an explicit setting wins
    ]
    assert kafka.settings.FETCH_WAIT_MS == kafka.settings.FETCH_WAIT_MS_REQUEST_PATH


def _tuning(broker: str) -> dict:
    """The adapter's defaults as a process with ``FRAMESPOOL_BROKER=broker`` sees them."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMESPOOL_")}
    env["FRAMESPOOL_BROKER"] = broker
    code = (
        "import json; from framespool.log import kafka as k; from framespool.log.kafka import Role;"
        "print(json.dumps({'fetch': [k.settings.FETCH_WAIT_MS_BY_ROLE[r] for r in Role],"
        "'linger': [k.settings.LINGER_MS_BY_ROLE[r] for r in Role],"
        "'rest': [k.settings.IDLE_BACKOFF_MS_BY_ROLE[r] for r in Role],"
        "'nagle_off': k.settings.SOCKET_SETTINGS['socket.nagle.disable']}))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_fetch_waits_follow_the_broker_kind():
    """On Tansu a Fetch is held for its whole wait, so the request path waits least
    (3 ms), a reader per node 10 and background readers 20, and idle fleet and
    background readers rest for 100 ms; on Kafka a parked Fetch answers as soon as
    data arrives, so every role waits 500 ms (it only paces an idle reader) and
    nothing rests. Roles: request path, fleet, background."""
    tansu, kafka_ = _tuning("tansu"), _tuning("kafka")
    assert tansu["fetch"] == [3, 10, 20] and tansu["rest"] == [0, 100, 100]
    assert kafka_["fetch"] == [500, 500, 500] and kafka_["rest"] == [0, 0, 0]
    assert tansu["linger"] == kafka_["linger"] == [0, 1, 5]
    assert tansu["nagle_off"] is kafka_["nagle_off"] is True


def test_an_unknown_broker_kind_is_refused():
    import os
    import subprocess
    import sys

    env = dict(os.environ, FRAMESPOOL_BROKER="redpanda")
    out = subprocess.run(
        [sys.executable, "-c", "import framespool.log.kafka"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "FRAMESPOOL_BROKER='redpanda'" in out.stderr


def test_each_role_s_producers_linger_their_role_s_linger(recorded):
    producers = [
        kafka.LogProducer("b:1"),
        kafka.LogProducer("b:1", role=Role.REQUEST_PATH),
        kafka.LogProducer("b:1", role=Role.FLEET),
        kafka.LogProducer("b:1", role=Role.BACKGROUND),
        kafka.LogProducer("b:1", role=Role.FLEET, **{"linger.ms": 7}),
    ]
    for p in producers:
        p.close()
    lingers = [s["linger.ms"] for s in recorded]
    assert lingers == [
        kafka.settings.LINGER_MS_REQUEST_PATH,
        kafka.settings.LINGER_MS_REQUEST_PATH,
        kafka.settings.LINGER_MS_FLEET,
        kafka.settings.LINGER_MS_BACKGROUND,
        7,  # an explicit setting wins
    ]
    assert (
        kafka.settings.LINGER_MS_REQUEST_PATH
        <= kafka.settings.LINGER_MS_FLEET
        < kafka.settings.LINGER_MS_BACKGROUND
    )


def test_a_submission_does_not_linger_on_its_way_to_admission(recorded):
    """The API's producer (a request-path one) sends each SubmitJob at once: its
    CreateTime is taken before any linger, so a linger would be added to every
    submission's admission hop (docs/broker-notes.md#fetch-wait)."""
    import inspect

    from framespool import bootstrap

    # no role: REQUEST_PATH
    assert "LogProducer(args.bootstrap)" in inspect.getsource(bootstrap.run_api)
    kafka.LogProducer("b:1").close()
    assert recorded[-1]["linger.ms"] == kafka.settings.LINGER_MS_REQUEST_PATH == 0


def test_the_measured_defaults_and_their_overrides():
    """submit -> assigned crosses three request-path readers and no fleet one: the
    request path waits 3 ms, the fleet 10, the background 20 on Tansu (500 ms each
    on Kafka); request-path producers linger 0, fleet ones 1, background ones 5
    (the trade-offs measured in docs/broker-notes.md#fetch-wait). Each is
    overridable under its own name."""
    import inspect
    import os

    source = inspect.getsource(kafka.settings)
    waits = (3, 10, 20) if kafka.settings.ON_TANSU else (500, 500, 500)
    for i, name in enumerate(("REQUEST_PATH", "FLEET", "BACKGROUND")):
        var = f"FRAMESPOOL_FETCH_WAIT_{name}_MS"
        assert f'env_ms("{var}", _FETCH_DEFAULTS[{i}])' in source, var
        if not os.environ.get(var):
            assert kafka.settings.FETCH_WAIT_MS_BY_ROLE[Role[name]] == waits[i], var
    defaults = {
        "LINGER_REQUEST_PATH": (kafka.settings.LINGER_MS_REQUEST_PATH, 0),
        "LINGER_FLEET": (kafka.settings.LINGER_MS_FLEET, 1),
        "LINGER_BACKGROUND": (kafka.settings.LINGER_MS_BACKGROUND, 5),
    }
    for name, (value, default) in defaults.items():
        var = f"FRAMESPOOL_{name}_MS"
        assert f'env_ms("{var}", {default})' in source, var
        if not os.environ.get(var):
            assert value == default, var


def test_an_environment_override_is_whole_milliseconds(monkeypatch):
    monkeypatch.setenv("FRAMESPOOL_TEST_WAIT_MS", "5")
    assert kafka.settings.env_ms("FRAMESPOOL_TEST_WAIT_MS", 2) == 5
    monkeypatch.setenv("FRAMESPOOL_TEST_WAIT_MS", "")
    assert kafka.settings.env_ms("FRAMESPOOL_TEST_WAIT_MS", 2) == 2
    for bad in ("-1", "2.5", "fast"):
        monkeypatch.setenv("FRAMESPOOL_TEST_WAIT_MS", bad)
        with pytest.raises(ValueError, match="FRAMESPOOL_TEST_WAIT_MS.*milliseconds"):
            kafka.settings.env_ms("FRAMESPOOL_TEST_WAIT_MS", 2)


def test_request_counts_are_collected_only_when_the_diagnostic_asks(recorded, monkeypatch, caplog):
    import json
    import logging

    kafka.LogConsumer("b:1")
    assert "statistics.interval.ms" not in recorded[-1] and "stats_cb" not in recorded[-1]
    monkeypatch.setattr(kafka.settings, "CLIENT_STATS_MS", 500)
    consumer = kafka.LogConsumer("b:1", **{"client.id": "c-1"})
    settings = recorded[-1]
    assert settings["statistics.interval.ms"] == 500
    stats = settings["stats_cb"]
    stats(
        json.dumps(
            {
                "brokers": {
                    "b:1/bootstrap": {"req": {"Metadata": 1, "Fetch": 0}},
                    "b:1/1": {"req": {"Fetch": 40, "OffsetCommit": 2, "Produce": 0}},
                }
            }
        )
    )
    assert stats.requests() == {"Fetch": 40, "Metadata": 1, "OffsetCommit": 2}
    with caplog.at_level(logging.INFO, logger=kafka.__name__):
        consumer.close()
    assert "consumer c-1 sent Fetch=40, Metadata=1, OffsetCommit=2" in caplog.text


class Idle(Recorded):
    """A consumer with one partition assigned (read up to offset 7) and nothing to read."""

    calls: list[str] = []

    def assign(self, parts) -> None:
        Idle.calls.append(f"assign {[(tp.topic, tp.partition, tp.offset) for tp in parts]}")

    def assignment(self) -> list:
        return [kafka.consumer.TopicPartition("t", 0)]

    positions = [7]  # what position() answers, in turn; -1001: nothing handed out yet

    def position(self, parts) -> list:
        offset = Idle.positions.pop(0) if len(Idle.positions) > 1 else Idle.positions[0]
        return [kafka.consumer.TopicPartition(tp.topic, tp.partition, offset) for tp in parts]

    def unassign(self) -> None:
        Idle.calls.append("unassign")

    def poll(self, timeout: float = 0) -> None:
        Idle.calls.append(f"poll {timeout:.3f}")
        return None


def test_an_idle_fleet_consumer_rests_for_its_back_off_then_looks_again(monkeypatch):
    """After IDLE_AFTER_S without a record: let go of the partitions (no Fetch), poll
    no longer than the back-off, assign them again where reading stopped, look for
    IDLE_LOOK_FETCHES fetch waits, rest again."""
    now = [100.0]
    monkeypatch.setattr(kafka.consumer.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(kafka.consumer, "Consumer", Idle)
    Idle.calls, Idle.positions = [], [7, -1001]
    # the Tansu tuning (on Kafka nothing rests: test_fetch_waits_follow_the_broker_kind)
    monkeypatch.setitem(kafka.settings.IDLE_BACKOFF_MS_BY_ROLE, Role.FLEET, 100)
    consumer = kafka.LogConsumer("b:1", role=Role.FLEET, **{"fetch.wait.max.ms": 10})
    consumer.assign("t", [0], 3)
    backoff = kafka.settings.IDLE_BACKOFF_MS_BY_ROLE[Role.FLEET] / 1000
    look = kafka.settings.IDLE_LOOK_FETCHES * 10 / 1000
    assert backoff > 0
    consumer.consume(10, 1.0)
    assert Idle.calls == ["assign [('t', 0, 3)]", "poll 1.000"]  # not idle long enough yet
    now[0] += kafka.settings.IDLE_AFTER_S - 0.25
    consumer.consume(10, 1.0)
    assert Idle.calls[2:] == ["poll 0.250"]  # a poll ends when it is due to rest
    Idle.calls.pop()
    now[0] += 0.25
    consumer.consume(10, 1.0)
    assert Idle.calls[2:] == ["unassign", f"poll {backoff:.3f}"]
    assert consumer.rests == 1
    now[0] += backoff
    consumer.consume(10, 1.0)
    # where reading stopped; it polls no longer than it looks
    assert Idle.calls[4:] == ["assign [('t', 0, 7)]", f"poll {look:.3f}"]
    now[0] += look / 2
    consumer.consume(10, 1.0)
    assert Idle.calls[6:] == [f"poll {look / 2:.3f}"]  # still looking
    now[0] += look
    consumer.consume(10, 1.0)
    assert Idle.calls[7:] == ["unassign", f"poll {backoff:.3f}"]
    assert consumer.rests == 2
    now[0] += backoff
    consumer.consume(10, 1.0)  # nothing handed out since 7: position() knows none
    now[0] += look
    consumer.consume(10, 1.0)
    now[0] += backoff
    consumer.consume(10, 1.0)
    assert Idle.calls[-2:] == ["assign [('t', 0, 7)]", f"poll {look:.3f}"]  # not the start, 3


def test_request_path_and_group_consumers_never_rest(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(kafka.consumer.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(kafka.consumer, "Consumer", Idle)
    Idle.calls = []
    request_path = kafka.LogConsumer("b:1", role=Role.REQUEST_PATH)
    request_path.assign("t", [0], 0)
    member = kafka.LogConsumer("b:1", group_id="g", role=Role.BACKGROUND)
    member._consumer.subscribe = lambda topics, **kw: None
    member.subscribe(["t"])
    Idle.calls = []
    now[0] += 10 * kafka.settings.IDLE_AFTER_S
    request_path.consume(10, 1.0)
    member.consume(10, 1.0)
    assert Idle.calls == ["poll 1.000", "poll 1.000"]
