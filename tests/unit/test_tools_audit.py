"""audit: a job's timeline, and the cell's answer to "why is it still waiting?"."""

from __future__ import annotations

from framespool.processors.core import CellConfig, TenantConfig
from framespool.processors.tools.audit import audit, explain_wait
from tests.support.cell_log import CellLog, clean_history, codes


def busy_cell(config: CellConfig | None = None) -> CellLog:
    """n0 and n1 (8 GPUs each, one rail): a (8 GPUs) runs on n0, b (4 GPUs) on n1,
    and a 16-GPU gang waits, holding the reservation."""
    log = CellLog(config)
    log.tick()
    log.register("n0")
    log.register("n1")
    log.admit("a", gpus=8)
    log.admit("b", gpus=4, tenant="studio")
    log.tick()
    log.start_all()
    log.admit("gang", gpus=16, per_node=8, tenant="studio")
    log.tick()
    return log


def test_a_completed_jobs_timeline_is_in_log_order_with_its_reasons():
    log = clean_history()
    report = audit(log.contents(), "gang", log.config)
    assert report.state == "COMPLETED" and report.cell == "cell-0"
    kinds = [e.kind for e in report.timeline]
    assert kinds[:4] == ["SubmitJob", "JobAdmitted", "JobQueued", "JobWaitEstimated"]
    # one node reported completion; the gang's other node is told to stop
    assert kinds[-3:] == ["RunCompleted", "JobCompleted", "StopRun"]
    assert kinds.count("StartRun") == 2 and "RunStarted" in kinds and "heartbeats" in kinds
    assigned = next(e for e in report.timeline if e.kind == "JobAssigned")
    assert "reservation holder" in assigned.summary and "gang: 2 nodes in rail" in assigned.summary
    assert assigned.run == 1 and set(assigned.nodes) == {"n0", "n1"}
    waited = next(e for e in report.timeline if e.kind == "JobWaitEstimated")
    assert "reservation: holds 2 node(s)" in waited.summary
    (run,) = report.runs
    assert run["run"] == 1 and run["end"].startswith("JobCompleted")
    assert report.explanation is None
    text = report.render()
    assert "job gang: COMPLETED in cell-0" in text and "reservation holder" in text
    assert report.to_dict()["timeline"][0]["type"] == "SubmitJob"


def test_a_waiting_gang_is_told_it_holds_the_reservation_and_when_it_starts():
    log = busy_cell()
    x = explain_wait(log.refold.cell, "gang")
    assert x["waiting"] and x["state"] == "QUEUED"
    assert codes(x)[:2] == ["reservation_holder", "capacity"]
    (shape,) = x["shapes"]
    assert shape["nodes_needed"] == 2 and not shape["fits_now"]
    assert shape["nodes_with_room"] == 0 and shape["eligible_nodes"] == 0
    assert 55 <= shape["earliest_start_in_s"] <= 60  # when a and b are projected to end
    assert x["reservation"]["holder"] == "gang"
    assert x["fair_share"]["position_in_queue"] == 1
    assert [lv["level"] for lv in x["fair_share"]["levels"]] == ["user", "organisation", "tier"]
    assert any("projected start" in u for u in x["unblock"])


def test_a_long_job_may_not_backfill_onto_reserved_nodes_a_short_one_may():
    log = busy_cell()
    log.admit("short", gpus=2, estimate_s=10)
    log.admit("long", gpus=2, estimate_s=600)
    cell = log.refold.cell
    assert "short" not in cell.jobs or cell.jobs["short"].state != "QUEUED"
    x = explain_wait(cell, "long")
    assert codes(x)[0] == "reservation"
    assert (
        "gang holds" in x["blockers"][0]["detail"] and "EASY backfill" in x["blockers"][0]["detail"]
    )
    (shape,) = x["shapes"]
    assert shape["fits_ignoring_reservation"] and not shape["fits_now"]
    assert shape["excluded"] == {"reserved for the reservation holder": 1}


def test_a_quota_cap_is_named_with_its_numbers():
    config = CellConfig(
        status_interval_s=0, estimate_interval_s=0, tenants=(TenantConfig("acme", max_gpus=8),)
    )
    log = busy_cell(config)
    log.admit("capped", gpus=1)
    x = explain_wait(log.refold.cell, "capped")
    assert codes(x)[0] == "quota_org"
    assert "acme uses 8 GPUs (max 8)" in x["blockers"][0]["detail"]
    assert x["quota"]["org"] == {
        "name": "acme",
        "gpus": 8,
        "max_gpus": 8,
        "running": 1,
        "max_running": 0,
    }


def test_a_job_that_fits_now_waits_only_for_the_next_pass():
    config = CellConfig(
        status_interval_s=0, estimate_interval_s=0, tenants=(TenantConfig("acme", max_running=1),)
    )
    log = CellLog(config)
    log.tick()
    log.register("n0")
    log.admit("first", gpus=1)
    log.admit("second", gpus=1)
    log.tick()
    log.start_all()
    assert codes(explain_wait(log.refold.cell, "second")) == ["quota_org"]
    log.complete("first")  # released, but the next pass runs on the next Tick
    x = explain_wait(log.refold.cell, "second")
    assert codes(x) == ["next_pass"] and x["shapes"][0]["fits_now"]


def test_a_running_job_reports_its_run_and_an_unknown_job_nothing():
    log = busy_cell()
    x = explain_wait(log.refold.cell, "a")
    assert (
        not x["waiting"]
        and x["run"]["phase"] == "running"
        and x["run"]["held"] == {"n0": list(range(8))}
    )
    assert explain_wait(log.refold.cell, "nope")["state"] == "UNKNOWN"


def test_audit_of_a_waiting_job_refolds_its_cell_and_explains():
    log = busy_cell()
    report = audit(log.contents(), "gang", log.config)
    assert report.state == "QUEUED" and report.explanation["waiting"]
    text = report.render()
    assert "blocked (reservation_holder)" in text and "unblocks when:" in text
    assert audit(log.contents(), "nope", log.config).timeline == []


def test_the_timeline_names_a_run_ends_cause_code():
    from framespool.processors.tools.timeline import summarize
    from framespool.schemas import events as ev
    from framespool.schemas.causes import RunCause

    requeued = ev.JobRequeued(
        event_id="e",
        ts_ms=1,
        job_id="j",
        run=1,
        reason="retry after node_lost: node n1 down: no heartbeat for 6.1s",
        retries_left=2,
        cause=RunCause.NODE_DOWN,
        failure_class="node_lost",
    )
    assert summarize(requeued).startswith("requeued (node_down; 2 retries left): retry after")
    failed = ev.JobFailed(
        event_id="f",
        ts_ms=2,
        job_id="j",
        run=3,
        reason="x",
        failure_class="oom",
        cause="run_failed",
    )
    assert summarize(failed) == "FAILED (run_failed, oom): x"


def test_an_expired_head_is_said_and_a_snapshot_still_explains_the_wait():
    import pickle

    from framespool.processors.tools.history import Refold

    log = busy_cell()
    contents = log.contents()
    cut = 2  # the registrations expired
    state = Refold(0, log.config).run([r for r in contents.scheduler if r.offset <= cut]).cell
    contents.scheduler = [r for r in contents.scheduler if r.offset > cut]
    blind = audit(contents, "gang", log.config)
    assert blind.explanation is None
    assert any("head expired" in n and "cannot be re-derived" in n for n in blind.notes)
    assert "note: the log's head expired on" in blind.render()
    seen = audit(contents, "gang", log.config, starts={0: (pickle.loads(pickle.dumps(state)), cut)})
    assert seen.state == "QUEUED" and seen.explanation["waiting"]
    assert "blocked (reservation_holder)" in seen.render()
