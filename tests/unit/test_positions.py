"""The event-id position is the contract's: formatted by the folds, parsed only by
framespool.schemas.positions."""

from __future__ import annotations

import pathlib
import re

from hypothesis import given
from hypothesis import strategies as st

from framespool.chaos import accounting
from framespool.processors.admission import position as admission_position
from framespool.processors.scheduler import position as cell_position
from framespool.schemas import events as ev
from framespool.schemas import positions

ROOT = pathlib.Path(__file__).resolve().parents[2]


@given(st.integers(0, 999), st.integers(0, 2**62), st.integers(0, 10_000))
def test_a_folds_output_id_parses_back_to_its_source_offset_and_index(p, offset, index):
    cell_id = f"{cell_position(f'cell-{p}', offset)}/{index}"
    assert positions.parse(cell_id) == (f"cell-{p}", offset, index)
    assert positions.parse_cell(cell_id) == (f"cell-{p}", offset, index)
    assert positions.parse_admission(cell_id) is None
    adm_id = f"{admission_position(p, offset)}/{index}"
    assert positions.parse_admission(adm_id) == (f"admission-{p}", offset, index)
    assert positions.parse_cell(adm_id) is None


@given(st.sampled_from(["", "job-1", "cell-0@1", "cell-0@x/1", "cell-٣@1/2", "a@1/2/3", "@1/2"]))
def test_ids_made_outside_a_fold_are_no_position(event_id):
    assert positions.parse_cell(event_id) is None


def test_no_module_outside_the_contract_parses_an_event_id():
    """The position format's regex lives in schemas/positions.py alone."""
    pattern = re.compile(r"@\(\?P<offset>|\)@\(\[0-9\]\+\)/|@\(\[0-9\]\+\)/")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("agents", "framespool", "processors", "producers", "projections", "schemas")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "positions.py" and pattern.search(path.read_text())
    ]
    assert offenders == []


def _ev(cls, run, ts, **kw):
    return cls(event_id=f"cell-0@{ts}/0", ts_ms=ts, job_id="j", run=run, **kw)


def test_a_preempted_run_is_ended_by_its_requeue_or_else_by_the_preemption():
    preempted = _ev(ev.JobPreempted, 1, 10, reason="p")
    requeued = _ev(ev.JobRequeued, 1, 20, reason="r")
    assert accounting._run_ends([preempted, requeued])[("j", 1)] is requeued
    assert accounting._run_ends([preempted])[("j", 1)] is preempted
    done = _ev(ev.JobCompleted, 2, 30)
    assert accounting._run_ends([done, _ev(ev.JobRequeued, 2, 40, reason="x")])[("j", 2)] is done
