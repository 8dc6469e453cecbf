"""Example-based tests of each scheduling policy of the cell core, one behaviour each."""

from __future__ import annotations

from framespool.processors.core import CellConfig, TenantConfig
from framespool.schemas import events as ev
from tests.support.core import of
from tests.support.core_harness import Harness


def cfg(**kw):
    return CellConfig(status_interval_s=0, estimate_interval_s=0, **kw)


def test_multi_node_gang_is_placed_in_one_rail_atomically():
    h = Harness(nodes=4, nodes_per_rail=2)
    h.submit("small", gpus=1)  # lands on n0 (best fit keeps others whole)
    out = h.submit("gang", gpus=16, per_node=8)
    [assigned] = of(out, ev.JobAssigned)
    assert [s.node_id for s in assigned.placement] == ["n2", "n3"]
    assert "rail rail-1" in assigned.reason
    assert len(of(out, ev.StartRun)) == 2


def test_single_gpu_jobs_bin_pack_to_keep_whole_nodes_free():
    h = Harness(nodes=2)
    for i in range(8):
        h.submit(f"s{i}", gpus=1)
    nodes = {s.node_id for s in h.assigned()}
    assert nodes == {"n0"}
    [assigned] = of(h.submit("eight", gpus=8), ev.JobAssigned)
    assert assigned.placement[0].node_id == "n1"


def test_blocked_gang_gets_reservation_and_only_short_jobs_backfill():
    h = Harness(nodes=2, nodes_per_rail=2)
    h.submit("long", gpus=4, estimate_s=1000)
    h.submit("long2", gpus=4, estimate_s=100)  # fills n0 (best fit); n1 is whole
    h.submit("long3", gpus=4, estimate_s=100)  # n1 half
    h.start_all()
    out = h.submit("gang", gpus=16, per_node=8)  # cannot fit: needs both nodes
    assert not of(out, ev.JobAssigned)
    h.tick(1)
    assert h.cell.reservation_job == "gang"
    assert h.cell.reservation_shadow_ms > h.now_ms
    h.complete(("long2", 1))  # 4 GPUs free on n0, shadow at ~t+1000s
    late = of(h.submit("too-long", gpus=4, estimate_s=5000), ev.JobAssigned)
    short = of(h.submit("short", gpus=4, estimate_s=10), ev.JobAssigned)
    assert not late and short and "backfill" in short[0].reason


def test_gang_runs_when_reservation_time_comes():
    h = Harness(nodes=2, nodes_per_rail=2)
    h.submit("a", gpus=8, estimate_s=50)
    h.start_all()
    h.submit("gang", gpus=16, per_node=8)
    h.tick(1)
    h.complete(("a", 1))
    out = h.tick(1)
    [assigned] = of(out, ev.JobAssigned)
    assert assigned.job_id == "gang" and "reservation holder" in assigned.reason


def test_interactive_job_past_sla_preempts_checkpointable_batch_run():
    h = Harness(nodes=1, config=cfg(heartbeat_timeout_s=1000))
    h.submit(
        "batch", gpus=8, tier="batch", preemptible=True, checkpoint_interval_s=30, estimate_s=3600
    )
    h.start_all()
    h.tick(100)
    h.heartbeat("n0")
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    out = h.tick(31)
    [ask] = of(out, ev.CheckpointRun)
    assert ask.job_id == "batch"
    out = h.report(ev.RunCheckpointed, "batch", 1, "n0", checkpoint_uri="mem://batch/ck1")
    assert of(out, ev.JobPreempted)[0].by_job_id == "hurry"
    assert of(out, ev.JobRequeued)[0].resume_from == "mem://batch/ck1"
    assert of(out, ev.StopRun)
    out = h.report(ev.RunStopped, "batch", 1, "n0")
    [assigned] = of(out, ev.JobAssigned) or of(h.tick(1), ev.JobAssigned)
    assert assigned.job_id == "hurry"


# test_non_preemptible_runs_are_never_preempted: in test_core_knobs.py, with
# leases that keep the run RUNNING and a preemptible control (here its node
# timed out on the first Tick, so nothing could have been preempted).


def test_stale_incarnation_heartbeat_is_ignored_and_its_runs_stopped():
    h = Harness(nodes=1)
    h.submit("j", gpus=2)
    h.start_all()
    h.register("n0")  # new incarnation: run lost, requeued
    stale = (ev.RunReport(job_id="j", run=1),)
    out = h.heartbeat("n0", runs=stale, incarnation=1)
    assert of(out, ev.ReportIgnored)
    assert of(out, ev.StopRun)[0].incarnation == 1
    assert h.cell.jobs["j"].run == 2


def test_silent_node_goes_down_and_runs_resume_from_checkpoint_elsewhere():
    h = Harness(nodes=2)
    h.submit("j", gpus=8, checkpoint_interval_s=30)
    h.start_all()
    node = h.cell.runs[("j", 1)].placement[0].node_id
    other = "n1" if node == "n0" else "n0"
    h.report(ev.RunCheckpointed, "j", 1, node, checkpoint_uri="mem://j/ck")
    for _ in range(12):
        h.heartbeat(other)
        h.tick(1)
    downs = [o for o in h.log if isinstance(o, ev.NodeStateChanged) and o.state == "DOWN"]
    assert [d.node_id for d in downs] == [node]
    requeued = [o for o in h.log if isinstance(o, ev.JobRequeued)]
    assert requeued[0].resume_from == "mem://j/ck"
    reassigned = [o for o in h.log if isinstance(o, ev.JobAssigned) and o.run == 2]
    assert reassigned[0].placement[0].node_id == other
    assert reassigned[0].resume_from == "mem://j/ck"


def test_heartbeat_reconciliation_stops_unknown_runs_and_requeues_missing_ones():
    h = Harness(nodes=1, config=cfg(report_lease_s=5))
    h.submit("j", gpus=1)
    h.start_all()
    out = h.heartbeat("n0", runs=(ev.RunReport(job_id="ghost", run=7),))
    assert of(out, ev.StopRun)[0].job_id == "ghost"
    h.tick(6)
    out = h.heartbeat("n0", runs=())
    assert of(out, ev.JobRequeued)[0].job_id == "j"


def test_assigned_but_never_started_run_is_requeued_after_its_lease():
    h = Harness(nodes=1, config=cfg(start_lease_s=10, heartbeat_timeout_s=60))
    h.submit("j", gpus=1)
    h.heartbeat("n0", runs=())
    out = h.tick(11)
    assert "never started" in of(out, ev.JobRequeued)[0].reason


def test_retries_are_bounded_per_failure_class_and_end_failed_with_reason():
    h = Harness(nodes=1, config=cfg(breaker_node_failures=100, breaker_type_failures=100))
    h.submit("j", gpus=1)
    for run in (1, 2, 3):
        h.start_all()
        out = h.report(
            ev.RunFailed, "j", run, "n0", failure_class="generator_error", reason="exit 3"
        )
        h.confirm_stops()
        h.tick(1)
    [failed] = of(out, ev.JobFailed)
    assert "retry budget 2" in failed.reason and failed.failure_class == "generator_error"


def test_breaker_stops_placing_a_failing_model_on_a_node():
    h = Harness(
        nodes=2,
        config=cfg(
            breaker_node_failures=2,
            breaker_min_tenants=1,  # a single-tenant cell: its own failures are the evidence
            default_retries=10,
            retries=(("generator_error", 10),),
        ),
    )
    h.submit("j", gpus=8)
    for _ in range(2):
        h.start_all()
        run = h.cell.jobs["j"].run
        node = h.cell.runs[("j", run)].placement[0].node_id
        h.report(ev.RunFailed, "j", run, node, failure_class="generator_error")
        h.tick(1)
    tripped = [o for o in h.log if isinstance(o, ev.BreakerTripped)]
    assert tripped and tripped[0].scope == "node"
    last = [o for o in h.log if isinstance(o, ev.JobAssigned)][-1]
    assert last.placement[0].node_id != tripped[0].key


def test_thermal_throttle_marks_gpu_degraded_and_no_new_work_lands_on_it():
    h = Harness(nodes=1)
    out = h.heartbeat("n0", gpus=(ev.GpuHealth(index=0, temperature_c=95.0),))
    assert of(out, ev.NodeStateChanged)[0].state == "degraded"
    [assigned] = of(h.submit("j", gpus=1), ev.JobAssigned)
    assert 0 not in assigned.placement[0].gpus


def test_uncorrectable_ecc_drains_node_and_moves_checkpointable_run():
    h = Harness(nodes=2)
    h.submit("j", gpus=8, checkpoint_interval_s=30)
    h.start_all()
    node = h.cell.runs[("j", 1)].placement[0].node_id
    out = h.heartbeat(node, gpus=(ev.GpuHealth(index=3, ecc_uncorrected=1),))
    assert any(o.state == "DRAINING" for o in of(out, ev.NodeStateChanged))
    assert of(out, ev.CheckpointRun)
    out = h.report(ev.RunCheckpointed, "j", 1, node, checkpoint_uri="mem://ck")
    assert of(out, ev.JobRequeued)[0].resume_from == "mem://ck"


def test_cancel_running_job_emits_one_terminal_and_holds_gpus_until_stop_confirmed():
    h = Harness(nodes=1)
    h.submit("j", gpus=8)
    h.start_all()
    out = h.feed(ev.CancelJob(event_id=h.next_id(), ts_ms=0, job_id="j", tenant="t0"))
    assert of(out, ev.JobCancelled) and of(out, ev.StopRun)
    assert h.cell.index.free_total == 0
    h.report(ev.RunStopped, "j", 1, "n0")
    assert h.cell.index.free_total == 8
    late = h.report(ev.RunCompleted, "j", 1, "n0")
    assert of(late, ev.ReportIgnored) and not of(late, ev.JobCompleted)


def test_cancel_of_other_tenants_job_is_refused():
    h = Harness(nodes=1)
    h.submit("j", tenant="a", gpus=1)
    out = h.feed(ev.CancelJob(event_id=h.next_id(), ts_ms=0, job_id="j", tenant="b"))
    assert of(out, ev.ReportIgnored) and "j" in h.cell.jobs


def test_admission_rejects_with_reasons():
    h = Harness(nodes=1, config=cfg(tenants=(TenantConfig("capped", max_queued=1),)))
    assert "unknown" in of(h.submit("a", tier="gold"), ev.JobRejected)[0].detail
    assert of(h.submit("b", gpus=16, per_node=8), ev.JobRejected)[0].reason == "infeasible"
    assert of(h.submit("c", gpus=6, per_node=4), ev.JobRejected)[0].reason == "invalid_shape"
    h.submit("d", tenant="capped", gpus=8, estimate_s=100)
    h.submit("e", tenant="capped", gpus=8)
    assert of(h.submit("f", tenant="capped", gpus=8), ev.JobRejected)[0].reason == "queue_cap"


def test_tenant_gpu_quota_caps_concurrent_use():
    h = Harness(nodes=2, config=cfg(tenants=(TenantConfig("a", max_gpus=4),)))
    for i in range(4):
        h.submit(f"a{i}", tenant="a", gpus=2)
    assert len(h.cell.runs) == 2


def test_elastic_job_picks_the_shape_that_finishes_first():
    h = Harness(nodes=2)
    h.submit("busy", gpus=8, estimate_s=1000)
    shapes = (
        ev.Shape(gpus=4, gpus_per_node=4, estimate_s=400),
        ev.Shape(gpus=16, gpus_per_node=8, estimate_s=100),
    )
    [assigned] = of(
        h.submit("e", gpus=8, per_node=8, estimate_s=200, shapes=shapes), ev.JobAssigned
    )
    assert assigned.gpus == 8  # 16 not free; 8 fits now and beats 4x400


def test_warm_model_affinity_prefers_gpus_with_weights_loaded():
    # the warm node is partly used (a whole free node is kept whole for
    # 8-GPU jobs: test_placement_keeps_whole_nodes.py), the best fit is the other
    h = Harness(nodes=2)
    h.submit("w1", gpus=1, model="sora-xl")
    h.submit("hold", gpus=4, model="x")  # beside w1: 3 free, then 4 once w1 ends
    h.start_all()
    h.complete(("w1", 1))
    h.submit("other", gpus=6, model="other")  # the other node: 2 free, the best fit
    [assigned] = of(h.submit("w2", gpus=1, model="sora-xl"), ev.JobAssigned)
    assert "warm" in assigned.reason


def test_reserved_capacity_is_lent_then_reclaimed_by_preempting_borrowers():
    h = Harness(
        nodes=1,
        config=cfg(tenants=(TenantConfig("owner", reserved_gpus=8),), heartbeat_timeout_s=1000),
    )
    h.submit(
        "borrow",
        tenant="other",
        gpus=8,
        preemptible=True,
        checkpoint_interval_s=30,
        estimate_s=3600,
    )
    assert h.cell.runs  # idle guarantee is lent
    h.start_all()
    h.tick(100)
    h.heartbeat("n0")
    h.submit("mine", tenant="owner", gpus=8)
    out = h.tick(1)
    assert of(out, ev.CheckpointRun)[0].job_id == "borrow"


def test_non_preemptible_work_does_not_borrow_idle_guarantees():
    h = Harness(nodes=1, config=cfg(tenants=(TenantConfig("owner", reserved_gpus=8),)))
    assert not of(h.submit("np", tenant="other", gpus=8), ev.JobAssigned)


def test_run_past_its_hard_limit_is_stopped_as_timeout():
    h = Harness(nodes=1, config=cfg(overrun_factor=1.0, overrun_grace_s=10, report_lease_s=1e9))
    h.submit("j", gpus=1, estimate_s=20)
    h.start_all()
    out = []
    for _ in range(4):
        h.heartbeat("n0")
        out += h.tick(10)
    assert any("time limit" in o.reason for o in of(out, ev.StopRun))
    assert of(out, ev.JobRequeued)


def test_wait_estimate_grows_with_backlog_ahead():
    h = Harness(nodes=1)
    h.submit("run", gpus=8, estimate_s=100)
    first = of(h.submit("q1", gpus=8, estimate_s=100), ev.JobQueued)[0].wait_estimate_s
    second = of(h.submit("q2", gpus=8, estimate_s=100), ev.JobQueued)[0].wait_estimate_s
    assert 0 < first < second


def test_nodes_registered_before_the_first_tick_are_not_expired_by_it():
    from framespool.processors.core import Cell

    cell = Cell(cfg())
    cell.apply(
        ev.NodeRegistered(
            event_id="r", ts_ms=0, node_id="n1", incarnation=1, cell="cell-0", gpus=8
        ),
        "p@0",
    )
    out = cell.apply(ev.Tick(event_id="t", ts_ms=0, cell="cell-0", now_ms=1_700_000_000_250), "p@1")
    assert not [o for o in out if isinstance(o, ev.NodeStateChanged)]


def test_late_reports_of_a_requeued_run_change_nothing():
    h = Harness(nodes=1, config=cfg(start_lease_s=10, heartbeat_timeout_s=1000))
    h.submit("j", gpus=1)
    h.heartbeat("n0", runs=())
    h.tick(11)  # start lease expired: requeued, run 1 stopping
    assert h.cell.jobs["j"].state == "QUEUED" or h.cell.jobs["j"].run == 2
    out = h.report(ev.RunStarted, "j", 1, "n0")
    assert [type(o) for o in out] == [ev.ReportIgnored]
    out = h.report(ev.RunFailed, "j", 1, "n0", failure_class="generator_error")
    assert not of(out, ev.JobFailed)
    h.tick(1)
    h.drain()
    assert h.terminal["j"] == 1


def test_gang_completion_from_one_node_does_not_free_the_other_nodes_gpus():
    h = Harness(nodes=2, nodes_per_rail=2)
    h.submit("gang", gpus=16, per_node=8)
    h.start_all()
    out = h.report(ev.RunCompleted, "gang", 1, "n0")
    assert of(out, ev.JobCompleted)
    assert [s.node_id for s in of(out, ev.StopRun)] == ["n1"]
    assert h.cell.index.free_total == 8  # n1 held until it confirms
    h.report(ev.RunCompleted, "gang", 1, "n1")
    assert h.cell.index.free_total == 16


def test_redelivered_old_heartbeat_is_no_sign_of_life():
    h = Harness(nodes=1, config=cfg(heartbeat_timeout_s=10))
    first = ev.NodeHeartbeat(event_id="hb", ts_ms=h.now_ms + 1000, node_id="n0", incarnation=1)
    h.tick(1)
    h.feed(first)
    h.tick(8)
    assert of(h.feed(first), ev.ReportIgnored)  # the same heartbeat again
    out = h.tick(4)
    assert [o.state for o in of(out, ev.NodeStateChanged)] == ["DOWN"]


def test_redelivered_older_checkpoint_does_not_move_the_checkpoint_back():
    h = Harness(nodes=1)
    h.submit("j", gpus=1, checkpoint_interval_s=30)
    h.start_all()
    for step in (10, 20, 10):
        h.report(ev.RunCheckpointed, "j", 1, "n0", checkpoint_uri=f"ck/{step}", progress=step / 100)
    assert h.cell.jobs["j"].checkpoint == "ck/20"
