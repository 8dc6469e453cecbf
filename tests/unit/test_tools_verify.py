"""verify's checks on hand-built event lists, and on whole in-memory logs."""

from __future__ import annotations

from dataclasses import replace

from framespool.processors.core import CellConfig
from framespool.processors.tools.ledger import check_cell_history, first_terminal_violations
from framespool.processors.tools.verify import allocation_problems, jain, ownership_problems, verify
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from tests.support.cell_log import T0, CellLog, clean_history, record


def node(node_id: str, gpus: int = 8, incarnation: int = 1) -> ev.NodeRegistered:
    return ev.NodeRegistered(
        event_id=f"reg:{node_id}:{incarnation}",
        ts_ms=T0,
        node_id=node_id,
        incarnation=incarnation,
        cell="cell-0",
        gpus=gpus,
    )


def assigned(pos: str, job: str, run: int, node_id: str, gpus: tuple[int, ...]) -> ev.JobAssigned:
    return ev.JobAssigned(
        event_id=pos,
        ts_ms=T0,
        job_id=job,
        run=run,
        gpus=len(gpus),
        estimate_s=60.0,
        placement=(ev.NodeSlice(node_id=node_id, gpus=gpus),),
    )


def completed(pos: str, job: str, run: int = 1) -> ev.JobCompleted:
    return ev.JobCompleted(event_id=pos, ts_ms=T0, job_id=job, run=run)


def run_completed(eid: str, job: str, run: int, node_id: str, inc: int = 1) -> ev.RunCompleted:
    return ev.RunCompleted(
        event_id=eid, ts_ms=T0, job_id=job, run=run, node_id=node_id, incarnation=inc
    )


# --------------------------------------------------------------------------
# One terminal event per job
# --------------------------------------------------------------------------
def test_a_duplicated_terminal_event_is_flagged_naming_the_job_and_both_ids():
    events = [
        completed("cell-0@5/0", "job-a"),
        ev.JobFailed(event_id="forged-1", ts_ms=T0, job_id="job-a", run=1, reason="x"),
        completed("cell-0@6/0", "job-b"),
    ]
    violations, first = first_terminal_violations(events)
    assert [(v.kind, v.subject) for v in violations] == [("duplicate_terminal", "job-a")]
    assert "forged-1" in violations[0].detail and "cell-0@5/0" in violations[0].detail
    assert first["job-a"].event_id == "cell-0@5/0"


def test_the_same_event_id_twice_is_one_event_but_different_contents_are_flagged():
    again = completed("cell-0@5/0", "job-a")
    violations, _ = first_terminal_violations([again, again])
    assert violations == []
    changed = replace(again, artifact_uri="s3://elsewhere")
    violations, _ = first_terminal_violations([again, changed])
    assert [v.kind for v in violations] == ["conflicting_duplicate"]


# --------------------------------------------------------------------------
# No GPU in two runs (the emitted history, walked without the core)
# --------------------------------------------------------------------------
def test_a_double_booked_placement_is_flagged():
    inputs = [(0, node("n1")), (1, None), (2, None)]
    outputs = [
        assigned("cell-0@1/0", "a", 1, "n1", (0, 1)),
        assigned("cell-0@2/0", "b", 1, "n1", (1, 2)),
    ]
    ledger = check_cell_history("cell-0", inputs, outputs)
    (v,) = ledger.violations
    assert v.kind == "double_booked" and v.subject == "n1:1" and v.where == "cell-0@2"
    assert "a#1" in v.detail and "b#1" in v.detail


def test_gpus_come_back_only_when_the_run_ended_and_the_node_confirmed():
    inputs = [(0, node("n1")), (1, None), (2, run_completed("done", "a", 1, "n1")), (3, None)]
    outputs = [
        assigned("cell-0@1/0", "a", 1, "n1", (0, 1)),
        completed("cell-0@2/0", "a"),
        assigned("cell-0@3/0", "b", 1, "n1", (0, 1)),
    ]
    assert check_cell_history("cell-0", inputs, outputs).violations == []
    # ended (requeued) but never confirmed by the node: still held
    requeued = ev.JobRequeued(event_id="cell-0@2/0", ts_ms=T0, job_id="a", run=1, reason="x")
    unconfirmed = [(0, node("n1")), (1, None), (2, None), (3, None)]
    ledger = check_cell_history("cell-0", unconfirmed, [outputs[0], requeued, outputs[2]])
    assert [v.kind for v in ledger.violations] == ["double_booked"]


def test_a_node_going_down_or_re_registering_frees_its_gpus():
    down = ev.NodeStateChanged(
        event_id="cell-0@2/0", ts_ms=T0, node_id="n1", incarnation=1, state="DOWN"
    )
    inputs = [(0, node("n1")), (1, None), (2, None), (3, None)]
    outputs = [
        assigned("cell-0@1/0", "a", 1, "n1", (0,)),
        down,
        assigned("cell-0@3/0", "b", 1, "n1", (0,)),
    ]
    assert check_cell_history("cell-0", inputs, outputs).violations == []
    inputs = [(0, node("n1")), (1, None), (2, node("n1", incarnation=2)), (3, None)]
    outputs = [outputs[0], outputs[2]]
    assert check_cell_history("cell-0", inputs, outputs).violations == []


def test_a_gangs_gpus_on_a_node_come_back_only_when_that_nodes_agent_confirms():
    gang = ev.JobAssigned(
        event_id="cell-0@2/0",
        ts_ms=T0,
        job_id="g",
        run=1,
        gpus=2,
        estimate_s=60.0,
        placement=(ev.NodeSlice(node_id="n0", gpus=(0,)), ev.NodeSlice(node_id="n1", gpus=(0,))),
    )
    inputs = [
        (0, node("n0")),
        (1, node("n1")),
        (2, None),
        (3, run_completed("done-n0", "g", 1, "n0")),
        (4, None),
        (5, None),
    ]
    outputs = [
        gang,
        completed("cell-0@3/0", "g"),
        assigned("cell-0@4/0", "x", 1, "n0", (0,)),  # n0 confirmed: fine
        assigned("cell-0@5/0", "y", 1, "n1", (0,)),
    ]  # n1 has not said a word
    (v,) = check_cell_history("cell-0", inputs, outputs).violations
    assert (v.kind, v.subject) == ("double_booked", "n1:0") and "g#1" in v.detail
    # n1's own report (even one the cell ignored) is its agent's confirmation
    late = run_completed("done-n1", "g", 1, "n1")
    ignored = ev.ReportIgnored(
        event_id="cell-0@4/0", ts_ms=T0, subject="g#1", reason="stale", source_event_id="done-n1"
    )
    inputs[4] = (4, late)
    outputs[2] = ignored
    assert check_cell_history("cell-0", inputs, outputs).violations == []


def test_a_gpu_beyond_the_node_is_flagged():
    ledger = check_cell_history(
        "cell-0", [(0, node("n1", gpus=4)), (1, None)], [assigned("cell-0@1/0", "a", 1, "n1", (4,))]
    )
    assert [v.kind for v in ledger.violations] == ["gpu_out_of_range"]


# --------------------------------------------------------------------------
# No state change from a stale run or incarnation
# --------------------------------------------------------------------------
def _requeued_then_reassigned():
    inputs = [(0, node("n1")), (1, None), (2, None), (3, None)]
    outputs = [
        assigned("cell-0@1/0", "a", 1, "n1", (0,)),
        ev.JobRequeued(event_id="cell-0@2/0", ts_ms=T0, job_id="a", run=1, reason="lost"),
        assigned("cell-0@3/0", "a", 2, "n1", (1,)),
    ]
    return inputs, outputs


def test_a_stale_report_that_changed_state_is_flagged():
    inputs, outputs = _requeued_then_reassigned()
    inputs.append((4, run_completed("late", "a", 1, "n1")))
    outputs.append(completed("cell-0@4/0", "a", run=1))
    ledger = check_cell_history("cell-0", inputs, outputs)
    (v,) = ledger.violations
    assert v.kind == "stale_report_changed_state" and v.subject == "a#1"
    assert "late" in v.detail and "JobCompleted cell-0@4/0" in v.detail and v.where == "cell-0@4"


def test_a_stale_report_answered_with_report_ignored_is_fine():
    inputs, outputs = _requeued_then_reassigned()
    inputs.append((4, run_completed("late", "a", 1, "n1")))
    outputs.append(
        ev.ReportIgnored(
            event_id="cell-0@4/0", ts_ms=T0, subject="a#1", reason="stale", source_event_id="late"
        )
    )
    ledger = check_cell_history("cell-0", inputs, outputs)
    assert ledger.violations == [] and ledger.stale_reports == 1


def test_a_report_of_an_old_incarnation_may_not_change_state():
    inputs = [
        (0, node("n1")),
        (1, None),
        (2, node("n1", incarnation=2)),
        (3, run_completed("old-inc", "a", 1, "n1", inc=1)),
    ]
    outputs = [assigned("cell-0@1/0", "a", 1, "n1", (0,)), completed("cell-0@3/0", "a")]
    (v,) = check_cell_history("cell-0", inputs, outputs).violations
    assert v.kind == "stale_report_changed_state" and "incarnation 1 < 2" in v.detail


# --------------------------------------------------------------------------
# Whole logs
# --------------------------------------------------------------------------
def test_a_clean_history_passes_every_check():
    log = clean_history()
    report = verify(log.contents(), log.config)
    assert report.ok, report.render()
    assert report.jobs == {"COMPLETED": 4}
    assert report.cells["cell-0"]["assignments"] == 4
    tenants = report.fairness["tenants"]
    assert set(tenants) == {"acme", "studio"} and tenants["studio"]["completed_gpu_s"] > 0
    assert 0.5 <= report.fairness["jain_index"] <= 1.0
    assert "OK: no invariant violated" in report.render()


def test_a_forged_duplicate_terminal_event_fails_verify_naming_the_job():
    log = clean_history()
    contents = log.contents()
    forged = ev.JobCompleted(event_id="forged-terminal", ts_ms=log.now, job_id="a", run=1)
    contents.job_events.append(record(catalogue.JOB_EVENTS.name, 0, 999, forged))
    report = verify(contents, log.config)
    assert not report.ok
    assert [(v.kind, v.subject) for v in report.violations] == [("duplicate_terminal", "a")]
    assert "forged-terminal" in report.render()


def test_live_jobs_and_in_flight_submissions_are_accounted_for():
    log = CellLog()
    log.tick()
    log.register("n0")
    log.admit("running", gpus=8)
    log.admit("queued", gpus=8)
    log.tick()
    log.start_all()
    contents = log.contents()
    contents.commands.append(
        record(
            catalogue.COMMANDS.name,
            0,
            len(contents.commands),
            ev.SubmitJob(event_id="x", ts_ms=T0, spec=ev.JobSpec(job_id="new", tenant="acme")),
        )
    )
    report = verify(contents, log.config)
    assert report.ok, report.render()
    assert report.jobs == {"RUNNING": 1, "QUEUED": 1, "in_flight": 1}
    assert report.in_flight == ["new"]
    contents.committed = {**contents.committed, "admission": {0: len(contents.commands)}}
    report = verify(contents, log.config)
    assert [(v.kind, v.subject) for v in report.violations] == [("submission_unaccounted", "new")]


def test_ownership_and_allocation_checks_see_a_corrupted_cell():
    log = CellLog()
    log.tick()
    log.register("n0")
    log.admit("a", gpus=2)
    log.tick()
    cell = log.refold.cell
    assert ownership_problems(cell) == [] and allocation_problems(cell)[0] == []
    cell.index.nodes["n0"].owner[5] = ("ghost", 1)
    assert any("n0:5" in p for p in ownership_problems(cell))
    del cell.jobs["a"]
    cell.finished["a"] = "COMPLETED"
    violations, _ = allocation_problems(cell)
    assert [v.kind for v in violations] == ["orphan_run"]


def test_jain_index():
    assert jain([5.0, 5.0, 5.0]) == 1.0
    assert abs(jain([1.0, 0.0, 0.0, 0.0]) - 0.25) < 1e-9
    assert jain([]) == 1.0


def test_verify_uses_the_given_policy():
    log = clean_history()
    other = CellConfig(status_interval_s=0, estimate_interval_s=0, overrun_factor=9.0)
    assert verify(log.contents(), other).ok  # the placement decisions do not depend on it
