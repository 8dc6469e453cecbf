"""A command's number flags refuse NaN and infinity as they refuse 0 (``value <= 0``
is false for NaN: ``--load nan`` ran a simulation that never ended)."""

from __future__ import annotations

import pytest

import framespool.cli as cli
from framespool import broker

SIM = ["simulate", "--synthetic", "multitenant", "--jobs", "20", "--no-plot", "--quiet"]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (SIM + ["--load", "nan"], "--load"),
        (SIM + ["--load", "inf"], "--load"),
        (SIM + ["--tick-s", "nan"], "--tick-s"),
        (SIM + ["--max-sim-s", "nan"], "--max-sim-s"),
        (SIM + ["--cold-start-s", "inf"], "--cold-start-s"),
        (["bench", "core", "--load", "nan"], "--load"),
        (["bench", "core", "--backlog-load", "inf"], "--backlog-load"),
        (["bench", "pipeline", "--rate", "nan"], "--rate"),
        (["bench", "pipeline", "--seconds", "inf"], "--seconds"),
        (["chaos", "--time-scale", "nan"], "--time-scale"),
        (["chaos", "--time-scale", "inf"], "--time-scale"),
    ],
)
def test_nan_and_infinity_are_refused_by_flag(monkeypatch, capsys, tmp_path, argv, flag):
    def no_broker(self):
        raise AssertionError("a broker started for a command that cannot run")

    monkeypatch.setattr(broker.KafkaBroker, "start", no_broker)
    monkeypatch.setattr(broker.KafkaBroker, "command", no_broker)
    monkeypatch.setattr(broker.TansuBroker, "start", no_broker)
    if argv[0] == "simulate":
        argv = [*argv, "--out", str(tmp_path)]
    assert cli.main(argv) != 0
    err = capsys.readouterr().err
    assert f"{flag}=" in err, err
