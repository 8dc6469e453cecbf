"""Property-based tests of the cell core's invariants (docs/design.md#invariants).

Random action sequences drive a Cell through a harness that plays the agents
(sometimes badly: stale, duplicated, late reports; silent and returning
nodes; health faults) and checks after every step: no GPU in two runs,
capacity never exceeded, gangs all-or-nothing, no gang member computing before
every member holds its GPUs, at most one terminal event per job; at the end
every job drains to exactly one terminal event.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.schemas import events as ev
from framespool.schemas.refusals import IgnoreCode
from framespool.schemas.states import RunPhase
from tests.support.core import action, play
from tests.support.core_harness import Harness, state_digest


@pytest.mark.slow
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
)
@given(st.lists(action, min_size=20, max_size=120))
def test_invariants_hold_and_every_job_ends_exactly_once(actions):
    h = Harness()
    play(h, actions)
    h.drain()
    assert set(h.terminal) == set(h.admitted)
    assert all(count == 1 for count in h.terminal.values())
    assert not h.cell.runs or all(r.phase == RunPhase.STOPPING for r in h.cell.runs.values())
    # every refusal says why as a code readers can group on (schemas/refusals.py)
    codes = {o.code for o in h.log if isinstance(o, ev.ReportIgnored)}
    assert codes <= set(IgnoreCode) - {IgnoreCode.UNRECORDED}, codes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(action, min_size=10, max_size=80))
def test_identical_inputs_give_identical_outputs(actions):
    """Replaying the same input log into a fresh cell yields the same outputs,
    byte for byte (event ids, timestamps, reasons and all)."""
    first = Harness()
    play(first, actions)
    first.drain()
    fresh = first.cell.__class__(first.cell.config)
    replayed = []
    for event in first.inputs:
        replayed.extend(fresh.apply(event))
    assert repr(replayed) == repr(first.log)
    assert state_digest(fresh) == state_digest(first.cell)
