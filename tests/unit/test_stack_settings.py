"""``framespool up`` refuses settings no stack runs with, before it starts anything."""

from __future__ import annotations

import pytest

import framespool.cli as cli
from framespool import stack


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--nodes-per-rail", "0"], "nodes_per_rail=0"),  # was a ZeroDivisionError
        (["--time-scale", "0"], "time_scale=0.0"),  # agents would divide by it
        (["--time-scale", "-1"], "time_scale=-1.0"),
        (["--time-scale", "nan"], "time_scale=nan"),
        (["--port", "70000"], "port=70000"),  # the API died with only its log to say why
        (["--port", "0"], "port=0"),
        (["--cells", "0"], "cells=0"),  # the broker started before these two were refused
        (["--cells", "999"], "cells=999"),
        (["--schedulers", "0"], "schedulers=0"),
    ],
)
def test_up_refuses_impossible_settings_before_starting_anything(
    monkeypatch, capsys, tmp_path, argv, says
):
    def no_broker(self):
        raise AssertionError("the broker started for a stack that cannot run")

    monkeypatch.setattr(stack.KafkaBroker, "command", no_broker)
    monkeypatch.setattr(stack.TansuBroker, "start", no_broker)
    status = cli.main(["up", "--data-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert status != 0
    assert says in err, err
