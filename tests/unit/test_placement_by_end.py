"""Placement by expected end (``CellConfig.pack_by_end_s``, placement.py
``_single_by_end``): a long single-node job joins the node whose runs end
late, not the first best fit, so a node whose runs end soon stays drainable
for whole-node work (issue 34). The first test fails when the knob is
ignored (or placement by end is broken); the second pins best fit in node
order with the knob at 0 (the default)."""

from __future__ import annotations

import pytest

from framespool.processors.core import Cell, CellConfig
from tests.support import core_harness
from tests.support.core_oracle import NaiveCell


def _node_of(h: core_harness.Harness, job_id: str) -> str:
    return next(s.node_id for s in h.assigned() if s.spec.job_id == job_id)


def _two_partly_used(cls, monkeypatch, pack_by_end_s: float) -> core_harness.Harness:
    """n0 and n1 with one free GPU each, n0's run ending in a minute, n1's
    in an hour, n2 whole and free."""
    monkeypatch.setattr(core_harness, "Cell", cls)
    config = CellConfig(status_interval_s=0, estimate_interval_s=0, pack_by_end_s=pack_by_end_s)
    h = core_harness.Harness(config, nodes=3)
    h.submit("soon", gpus=7, estimate_s=60.0)
    h.submit("late", gpus=7, estimate_s=3600.0)
    h.start_all()
    assert (_node_of(h, "soon"), _node_of(h, "late")) == ("n0", "n1")
    return h


@pytest.mark.parametrize("cls", [Cell, NaiveCell])
def test_a_long_job_joins_the_node_whose_runs_end_late(monkeypatch, cls):
    h = _two_partly_used(cls, monkeypatch, pack_by_end_s=60.0)
    h.submit("long", gpus=1, estimate_s=3000.0)
    h.tick(1)
    assert _node_of(h, "long") == "n1"  # n0 drains in a minute for whole-node work
    h.submit("short", gpus=1, estimate_s=30.0)
    h.tick(1)
    assert _node_of(h, "short") == "n0"  # ends before n0's run: extends nothing


@pytest.mark.parametrize("cls", [Cell, NaiveCell])
def test_off_it_is_best_fit_in_node_order(monkeypatch, cls):
    h = _two_partly_used(cls, monkeypatch, pack_by_end_s=0.0)
    h.submit("long", gpus=1, estimate_s=3000.0)
    h.tick(1)
    assert _node_of(h, "long") == "n0"
