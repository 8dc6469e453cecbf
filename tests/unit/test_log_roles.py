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
    monkeypatch.setattr(kafka, "Consumer", Recorded)
    monkeypatch.setattr(kafka, "Producer", Recorded)
    return Recorded.settings


def test_request_path_consumers_wait_less_than_background_ones(recorded):
    kafka.LogConsumer("b:1")
    kafka.LogConsumer("b:1", role=Role.REQUEST_PATH)
    kafka.LogConsumer("b:1", role=Role.FLEET)
    kafka.LogConsumer("b:1", role=Role.BACKGROUND)
    kafka.LogConsumer("b:1", role=Role.BACKGROUND, **{"fetch.wait.max.ms": 7})
    waits = [s["fetch.wait.max.ms"] for s in recorded]
    assert waits == [
        kafka.FETCH_WAIT_MS_REQUEST_PATH,
        kafka.FETCH_WAIT_MS_REQUEST_PATH,
        kafka.FETCH_WAIT_MS_FLEET,
        kafka.FETCH_WAIT_MS_BACKGROUND,
        7,  # an explicit setting wins
    ]
    # a reader per node waits longer than the few on the request path
    assert (
        kafka.FETCH_WAIT_MS_REQUEST_PATH
        < kafka.FETCH_WAIT_MS_FLEET
        <= kafka.FETCH_WAIT_MS_BACKGROUND
    )
    assert kafka.FETCH_WAIT_MS == kafka.FETCH_WAIT_MS_REQUEST_PATH


def test_request_path_producers_linger_less_than_background_ones(recorded):
    producers = [
        kafka.LogProducer("b:1"),
        kafka.LogProducer("b:1", role=Role.BACKGROUND),
    ]
    for p in producers:
        p.close()
    lingers = [s["linger.ms"] for s in recorded]
    assert lingers == [kafka.LINGER_MS_REQUEST_PATH, kafka.LINGER_MS_BACKGROUND]
    assert kafka.LINGER_MS_REQUEST_PATH < kafka.LINGER_MS_BACKGROUND


def test_an_environment_override_is_whole_milliseconds(monkeypatch):
    monkeypatch.setenv("FRAMESPOOL_TEST_WAIT_MS", "5")
    assert kafka._env_ms("FRAMESPOOL_TEST_WAIT_MS", 2) == 5
    monkeypatch.setenv("FRAMESPOOL_TEST_WAIT_MS", "")
    assert kafka._env_ms("FRAMESPOOL_TEST_WAIT_MS", 2) == 2
    for bad in ("-1", "2.5", "fast"):
        monkeypatch.setenv("FRAMESPOOL_TEST_WAIT_MS", bad)
        with pytest.raises(ValueError, match="FRAMESPOOL_TEST_WAIT_MS.*milliseconds"):
            kafka._env_ms("FRAMESPOOL_TEST_WAIT_MS", 2)


def test_request_counts_are_collected_only_when_the_diagnostic_asks(recorded, monkeypatch, caplog):
    import json
    import logging

    kafka.LogConsumer("b:1")
    assert "statistics.interval.ms" not in recorded[-1] and "stats_cb" not in recorded[-1]
    monkeypatch.setattr(kafka, "CLIENT_STATS_MS", 500)
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
