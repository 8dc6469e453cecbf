"""A small job's model warmth does not break a whole free node while a
partly used node fits it (placement.py, ``_single``): on the genai workload
whole-node jobs queued behind small runs spread one per node. The first test
fails when the warm preference may take a whole free node over the best fit."""

from __future__ import annotations

import pytest

from framespool.processors.core import Cell
from tests.support import core_harness
from tests.support.core_oracle import NaiveCell


def _node_of(h: core_harness.Harness, job_id: str) -> str:
    return next(s.node_id for s in h.assigned() if s.spec.job_id == job_id)


@pytest.mark.parametrize("cls", [Cell, NaiveCell])
def test_a_warm_whole_node_stays_whole_when_a_partly_used_node_fits(monkeypatch, cls):
    monkeypatch.setattr(core_harness, "Cell", cls)
    h = core_harness.Harness(nodes=2)
    h.submit("w", gpus=8, model="m")
    h.submit("big", gpus=7, model="x")
    h.start_all()
    warm, used = _node_of(h, "w"), _node_of(h, "big")
    assert warm != used
    h.complete(("w", 1))  # its node is whole and warm with m again
    h.tick(1)
    h.submit("small", gpus=1, model="m")
    h.tick(1)
    assert _node_of(h, "small") == used


@pytest.mark.parametrize("cls", [Cell, NaiveCell])
def test_a_warm_partly_used_node_still_wins(monkeypatch, cls):
    monkeypatch.setattr(core_harness, "Cell", cls)
    h = core_harness.Harness(nodes=2)
    h.submit("a", gpus=5, model="x")
    h.submit("b", gpus=5, model="y")
    h.submit("w", gpus=3, model="m")
    h.start_all()
    warm = _node_of(h, "w")
    h.complete(("w", 1))  # 3 GPUs free on each node, one of them warm with m
    h.tick(1)
    h.submit("small", gpus=1, model="m")
    h.tick(1)
    assert _node_of(h, "small") == warm
