"""Routing by predicted wait through the processors' own folds (no broker).

A two-cell log is built in memory by the admission and scheduler folds, every
output routed by ``framespool.processors.routing`` exactly as the processors
write it. On it: where ``CellOffer`` and ``JobRerouted`` go, ``verify`` and
``replay`` accept a drain, the job view shows it, and the API cannot write
either event.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path
from typing import Any

from framespool.log import Record, partition_for_key
from framespool.processors.routing import destinations, encode_outputs
from framespool.processors.tools.replay import replay
from framespool.processors.tools.verify import verify
from framespool.projections import jobs as view
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.states import JobState
from tests.support.reroute import ADMISSION, CELL_CONFIG, CELLS, T0, TwoCells, drained_world


def test_offers_go_to_every_commands_partition_and_reroutes_to_the_tenants():
    offer = ev.CellOffer(event_id="cell-1@3/0", ts_ms=0, cell="cell-1")
    ds = destinations(offer)
    assert [(d.topic, d.partition, d.key) for d in ds] == [
        (catalogue.COMMANDS.name, p, "cell-1") for p in range(catalogue.COMMANDS.partitions)
    ] + [  # and job-events, where the API's cluster projection keeps each cell's latest
        (
            catalogue.JOB_EVENTS.name,
            partition_for_key("cell-1", catalogue.JOB_EVENTS.partitions),
            "cell-1",
        )
    ]
    moved = ev.JobRerouted(
        event_id="cell-0@9/0",
        ts_ms=0,
        job_id="j1",
        tenant="acme",
        from_cell="cell-0",
        reason="r",
        spec=ev.JobSpec(job_id="j1", tenant="acme"),
    )
    ds = destinations(moved)
    assert [(d.topic, d.key) for d in ds] == [
        (catalogue.JOB_EVENTS.name, "j1"),
        (catalogue.COMMANDS.name, "acme"),
    ]
    assert ds[1].partition == partition_for_key("acme", catalogue.COMMANDS.partitions)
    assert len(encode_outputs([offer, moved])) == catalogue.COMMANDS.partitions + 3


def test_a_big_job_lands_in_the_cell_that_can_run_it_and_a_dead_cell_drains():
    w = drained_world()
    admitted = {e.spec.job_id: e.cell for e in w.events(catalogue.JOB_EVENTS.name, ev.JobAdmitted)}
    assert admitted["big"] == "cell-1"
    assert not w.events(catalogue.JOB_EVENTS.name, ev.JobRejected)
    moved = w.events(catalogue.JOB_EVENTS.name, ev.JobRerouted)
    assert moved and all(m.from_cell == "cell-0" for m in moved)
    cells = {p: r.cell for p, r in w.cells.items()}
    assert not cells[0].jobs  # the dead cell holds nothing
    for m in moved:
        assert m.job_id in cells[1].jobs
    # each rerouted job was admitted twice: once by its submit, once by its reroute
    admits = [e.spec.job_id for e in w.events(catalogue.JOB_EVENTS.name, ev.JobAdmitted)]
    assert all(admits.count(m.job_id) == 2 for m in moved)


def test_verify_and_replay_accept_a_drain():
    w = drained_world()
    log = w.contents()
    report = verify(log, CELL_CONFIG)
    assert report.ok, report.render()
    assert report.jobs.get("in_flight", 0) == 0
    again = replay(log, CELL_CONFIG, admission_config=ADMISSION)
    assert again.ok, again.render()
    assert again.counts["matched"] > 0 and again.admission_counts["matched"] > 0


def test_verify_flags_a_second_admission_without_a_reroute():
    w = drained_world()
    log = w.contents()
    first = next(e for e in w.events(catalogue.JOB_EVENTS.name, ev.JobAdmitted))
    forged = ev.JobAdmitted(event_id="admission-9@0/0", ts_ms=T0, spec=first.spec, cell="cell-1")
    log.job_events.append(
        Record(
            catalogue.JOB_EVENTS.name, 0, 10_000, first.spec.job_id.encode(), codec.encode(forged)
        )
    )
    kinds = verify(log, CELL_CONFIG).by_kind()
    assert kinds["admitted_twice"] == 1


def test_verify_counts_a_reroute_admission_has_not_read_as_in_flight():
    w = TwoCells()
    w.submit("j1", gpus=8, gpus_per_node=8, tenant="t3")  # no offers yet: rendezvous
    assert w.cells[0].cell.jobs, "the scenario needs j1 in cell-0 (rendezvous of its id)"
    w.register(1, "b0")
    w.paused = True  # admission reads nothing more
    w.tick(30)  # cell-0 never had a node: j1 drains after 20 s
    assert w.events(catalogue.COMMANDS.name, ev.JobRerouted)
    report = verify(w.contents(), CELL_CONFIG)
    assert report.ok, report.render()
    assert report.in_flight == ["j1"]
    # had admission committed past the reroute without acting, the job would be lost
    log = w.contents()
    log.committed = {**log.committed, "admission": {p: 10_000 for p in range(4)}}
    assert verify(log, CELL_CONFIG).by_kind()["lost_in_reroute"] == 1


def test_the_job_view_shows_the_reroute_and_follows_the_new_cell():
    w = drained_world()
    moved = w.events(catalogue.JOB_EVENTS.name, ev.JobRerouted)[0]
    mine = [e for e in w.events(catalogue.JOB_EVENTS.name) if view.job_id_of(e) == moved.job_id]
    v = view.fold(mine)
    assert v is not None and v.cell == "cell-1"
    assert v.state in (JobState.QUEUED, JobState.ASSIGNED)
    summaries = [e.summary for e in v.timeline]
    assert any(s.startswith("rerouted from cell-0: cell-0 has no UP nodes") for s in summaries)
    # while between cells: SUBMITTED, phase REROUTED, the reason shown
    upto = mine[: mine.index(moved) + 1]
    between = view.fold(upto)
    assert between.state == view.SUBMITTED and between.phase == "REROUTED"
    assert between.reason.startswith("rerouted from cell-0")


def test_the_job_view_follows_the_runs_the_next_cell_numbers_on():
    spec = ev.JobSpec(job_id="j", tenant="t")
    placed = ev.NodeSlice(node_id="n", gpus=(0,))
    events = [
        ev.JobAdmitted(event_id="a/0", ts_ms=1, spec=spec, cell="cell-0"),
        ev.JobQueued(event_id="c0@1/0", ts_ms=1, job_id="j", tenant="t", tier="free"),
        ev.JobAssigned(
            event_id="c0@2/0", ts_ms=2, job_id="j", run=1, placement=(placed,), gpus=1, estimate_s=1
        ),
        ev.JobRequeued(event_id="c0@3/0", ts_ms=3, job_id="j", run=1, reason="node lost"),
        ev.JobRerouted(
            event_id="c0@4/0",
            ts_ms=4,
            job_id="j",
            tenant="t",
            from_cell="cell-0",
            reason="r",
            spec=spec,
            run=1,
            resume_from="mem://ck",
        ),
        ev.JobAdmitted(
            event_id="a/1", ts_ms=4, spec=spec, cell="cell-1", run=1, resume_from="mem://ck"
        ),
        ev.JobQueued(event_id="c1@1/0", ts_ms=5, job_id="j", tenant="t", tier="free"),
        ev.JobAssigned(
            event_id="c1@2/0",
            ts_ms=6,
            job_id="j",
            run=2,
            placement=(placed,),
            gpus=1,
            estimate_s=1,
            resume_from="mem://ck",
        ),
    ]
    v = view.fold(events)
    assert v.state == JobState.ASSIGNED and v.run == 2 and v.cell == "cell-1" and v.ignored == 0
    # a late report of cell-0's run 1 is stale in the view too
    late = ev.JobRequeued(event_id="c0@9/0", ts_ms=7, job_id="j", run=1, reason="late")
    assert view.apply(v, late).ignored == 1


def test_the_api_can_write_neither_offers_nor_reroutes():
    """The API produces only SubmitJob and CancelJob: nothing in producers/ names
    the events only the cells' schedulers may write to the commands topic."""
    root = Path(__file__).resolve().parents[2] / "producers"
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not names & {"CellOffer", "JobRerouted"}, path


def test_offers_and_reroutes_are_admission_inputs_and_never_scheduler_inputs():
    from framespool.processors.core.admission import ADMISSION_INPUTS
    from framespool.processors.scheduler import SCHEDULER_INPUTS

    assert {ev.CellOffer, ev.JobRerouted} <= set(ADMISSION_INPUTS)
    assert not {ev.CellOffer, ev.JobRerouted} & set(SCHEDULER_INPUTS)


def test_a_stack_of_several_cells_drains_and_a_stack_of_one_does_not(tmp_path):
    import json

    from framespool.processors.config_file import load_admission_config, load_cell_config
    from framespool.stack import DRAIN_GRACE_S, Stack, StackConfig

    for name in ("one", "two", "three"):
        (tmp_path / name).mkdir()
    two = Stack(StackConfig(data_dir=tmp_path / "two", cells=2)).write_processor_config()
    assert load_cell_config(two).drain_grace_s == DRAIN_GRACE_S > 0
    assert load_admission_config(two).cells == CELLS
    one = Stack(StackConfig(data_dir=tmp_path / "one", cells=1)).write_processor_config()
    assert load_cell_config(one).drain_grace_s == 0
    # the operator's file wins
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"scheduler": {"drain_grace_s": 5}}))
    three = Stack(
        StackConfig(data_dir=tmp_path / "three", cells=2, processor_config=mine)
    ).write_processor_config()
    assert load_cell_config(three).drain_grace_s == 5


def test_compose_drains_between_its_two_cells():
    from framespool.processors.config_file import load_cell_config

    root = Path(__file__).resolve().parents[2]
    assert load_cell_config(root / "compose/framespool.toml").drain_grace_s > 0


def _as_pickled_before_new_fields(config: Any, fields: int) -> Any:
    """``config`` as a snapshot written before its last fields existed unpickles:
    a frozen, slotted dataclass with those slots unset."""
    old = object.__new__(type(config))
    old.__setstate__(config.__getstate__()[:fields])
    return old


def test_snapshots_from_before_routing_are_adopted_under_the_new_config():
    from framespool.processors.admission import AdmissionFold
    from framespool.processors.core import Cell
    from framespool.processors.core.admission import AdmissionState
    from framespool.processors.scheduler import SchedulerFold

    state = AdmissionState(ADMISSION)
    for name in ("offers", "routed", "superseded"):
        del state.__dict__[name]
    state = pickle.loads(pickle.dumps(state))
    state.config = _as_pickled_before_new_fields(ADMISSION, 4)  # before offer_stale_s
    adopted = AdmissionFold(ADMISSION).adopt(state, 0)
    assert adopted.config == ADMISSION and adopted.offers == {}
    cell = Cell(CELL_CONFIG, "cell-0")
    cell.config = _as_pickled_before_new_fields(CELL_CONFIG, 32)  # before drain_grace_s
    adopted_cell = SchedulerFold(CELL_CONFIG).adopt(cell, 0)
    assert adopted_cell.config == CELL_CONFIG


def test_audit_of_a_rerouted_job_explains_it_in_the_cell_that_holds_it():
    from framespool.processors.tools.audit import audit

    w = drained_world()
    moved = w.events(catalogue.JOB_EVENTS.name, ev.JobRerouted)[0]
    report = audit(w.contents(), moved.job_id, CELL_CONFIG)
    assert report.cell == "cell-1"
    summaries = [e.summary for e in report.timeline]
    assert any(s.startswith("rerouted from cell-0: cell-0 has no UP nodes") for s in summaries)
    assert report.explanation and report.explanation["cell"] == "cell-1"


def test_the_routing_knobs_come_from_the_processors_config_file(tmp_path):
    import pytest

    from framespool.processors.config_file import (
        ConfigError,
        load_admission_config,
        load_cell_config,
    )

    good = tmp_path / "p.toml"
    good.write_text(
        '[admission]\ncells = ["cell-0", "cell-1"]\noffer_stale_s = 9\n'
        "sticky_slack_s = 0\nsticky_slack_ratio = 0.5\n[scheduler]\ndrain_grace_s = 45\n"
    )
    config = load_admission_config(good)
    assert (config.offer_stale_s, config.sticky_slack_s, config.sticky_slack_ratio) == (9, 0, 0.5)
    assert load_cell_config(good).drain_grace_s == 45
    bad = tmp_path / "bad.toml"
    bad.write_text('[admission]\ncells = ["cell-0"]\nsticky_slack_ratio = 2\n')
    with pytest.raises(ConfigError, match="sticky_slack_ratio=2.0 must be between 0 and 1"):
        load_admission_config(bad)
