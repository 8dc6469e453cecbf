"""The chaos drill's pure parts: the seeded plan, and the accounting over decoded events."""

from __future__ import annotations

import json
from types import SimpleNamespace

from framespool.agents.faults import FaultFileProbe, write_gpu_faults
from framespool.agents.gpus import SimulatedProbe
from framespool.chaos import accounting, malformed
from framespool.chaos import plan as chaos
from framespool.processors.core import CellConfig
from framespool.processors.tools.ledger import check_cell_history, first_terminal_violations
from framespool.processors.tools.verify import VerifyReport, verify
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.causes import MOVES, RunCause
from framespool.schemas.events import NodeSlice
from tests.support.cell_log import CellLog, clean_history


# -- the plan -----------------------------------------------------------------------
def test_workload_and_schedule_are_functions_of_the_seed():
    assert chaos.build_workload(7, 200, 10.0) == chaos.build_workload(7, 200, 10.0)
    assert chaos.build_workload(7, 200, 10.0) != chaos.build_workload(8, 200, 10.0)
    assert chaos.build_schedule(7, 200, 6, 8, 60) == chaos.build_schedule(7, 200, 6, 8, 60)
    assert chaos.build_schedule(7, 200, 6, 8, 60) != chaos.build_schedule(8, 200, 6, 8, 60)


def test_a_durable_broker_is_killed_apart_from_scheduler_faults_and_emptied_cells():
    timing = chaos.Timing()
    for seed in range(20):
        plain = chaos.build_schedule(seed, 300, 6, 8, 120, timing, cells=2, schedulers=2)
        durable = chaos.build_schedule(
            seed, 300, 6, 8, 120, timing, cells=2, schedulers=2, durable_broker=True
        )
        kills = [f for f in durable if f.kind == chaos.KILL_BROKER]
        assert len(kills) == 1 and kills[0].target == "broker"
        assert 1.0 <= kills[0].duration_s <= 3.0
        assert chaos.KILL_BROKER not in {f.kind for f in plain}  # in memory: never killed
        # the other faults of the seed are the same ones, at the same times
        strip = lambda fs: [(f.kind, f.at_s, f.target) for f in fs if f.kind != chaos.KILL_BROKER]
        assert strip(durable) == strip(plain)
        k = kills[0]
        k_end = k.at_s + k.duration_s + timing.session_timeout_s + timing.rebalance_s
        for f in durable:
            if f.kind in chaos.SCHEDULER_FAULTS or f.kind == chaos.EMPTY_CELL:
                f_end = f.at_s + f.duration_s + timing.session_timeout_s + timing.rebalance_s
                assert k_end <= f.at_s or f_end <= k.at_s, (seed, f, k)
        ops = [a.op for a in chaos.actions_of(kills, timing)]
        assert ops == ["crash", "restart"]


def test_workload_mixes_shapes_and_plants_jobs_that_fail_every_time():
    plans = chaos.build_workload(1, 500, 10.0)
    assert [p.at_s for p in plans] == sorted(p.at_s for p in plans)
    assert {p.body["gpus"] for p in plans} == {1, 2, 4, 8, 16}
    assert all(p.body["gpus_per_node"] == 8 for p in plans if p.body["gpus"] == 16)
    assert any(p.body["preemptible"] for p in plans)
    assert any(p.body["checkpoint_interval_s"] == 0 for p in plans)
    crash = [p for p in plans if p.role == chaos.CRASH]
    hang = [p for p in plans if p.role == chaos.HANG]
    assert len(crash) == len(hang) == 5
    assert all(p.body["params"]["fail_at_step"] == 2 for p in crash)
    assert len({p.body["model_version"] for p in crash}) == 5  # no shared breaker
    assert all(p.body["params"]["hang_at_step"] == 2 for p in hang)


def test_node_faults_hit_distinct_nodes_and_at_most_two_at_once():
    timing = chaos.Timing()
    for seed in range(20):
        faults = chaos.build_schedule(seed, 500, 6, 8, 120, timing)
        kinds = {f.kind for f in faults}
        assert kinds == {
            chaos.KILL_AGENT,
            chaos.PAUSE_AGENT,
            chaos.DOWN_AGENT,
            chaos.ECC_GPU,
            chaos.THROTTLE_GPU,
            chaos.KILL_SCHEDULER,
            chaos.DUPLICATE_REPORTS,
            chaos.MALFORMED_RECORDS,
            chaos.WEDGE_GENERATOR,
        }
        assert {f.target for f in faults if f.kind == chaos.KILL_SCHEDULER} == {"scheduler-0"}
        spans = [
            (f.at_s, f.at_s + chaos.node_fault_length_s(f.kind, f.duration_s, timing), f.target)
            for f in faults
            if f.kind in chaos.NODE_FAULTS
        ]
        for t, _, _ in spans:
            active = [s for s in spans if s[0] <= t < s[1]]
            assert len(active) <= chaos.MAX_IMPAIRED_NODES
            assert len({s[2] for s in active}) == len(active)
        pauses = [f for f in faults if f.kind == chaos.PAUSE_AGENT]
        assert all(f.duration_s > timing.heartbeat_timeout_s for f in pauses)


def test_with_several_cells_and_instances_one_instance_and_one_node_per_cell_is_out_at_once():
    timing = chaos.Timing()
    cell_of = {f"node-{i}": i % 2 for i in range(6)}
    for seed in range(20):
        faults = chaos.build_schedule(seed, 500, 6, 8, 120, timing, cells=2, schedulers=2)
        assert {chaos.PAUSE_SCHEDULER, chaos.KILL_SCHEDULER, chaos.DOWN_AGENT} <= {
            f.kind for f in faults
        }
        spans = [
            (f.at_s, f.at_s + chaos.node_fault_length_s(f.kind, f.duration_s, timing), f.target)
            for f in faults
            if f.kind in chaos.NODE_FAULTS
        ]
        for t, _, _ in spans:
            active = [s for s in spans if s[0] <= t < s[1]]
            assert len({cell_of[s[2]] for s in active}) == len(active)  # one per cell
        sched = sorted(
            (f.at_s, f.at_s + f.duration_s, f.target)
            for f in faults
            if f.kind in chaos.SCHEDULER_FAULTS
        )
        assert {target for *_, target in sched} == {"scheduler"}  # an owner, when injected
        # never both instances at once, and each out past the session timeout: the
        # other one takes its cells over
        assert all(b[0] >= a[1] for a, b in zip(sched, sched[1:]))
        moved_s = timing.session_timeout_s + timing.rebalance_s
        assert all(end - start > moved_s for start, end, _ in sched)


def test_with_several_cells_one_cell_is_emptied_past_the_drain_grace_alone_in_its_cell():
    timing = chaos.Timing()
    cell_of = {f"node-{i}": f"cell-{i % 2}" for i in range(6)}
    assert chaos.fault_counts(500, 2, cells=1)[chaos.EMPTY_CELL] == 0  # nowhere to drain to
    for seed in range(20):
        faults = chaos.build_schedule(seed, 300, 6, 8, 120, timing, cells=2, schedulers=2)
        emptied = [f for f in faults if f.kind == chaos.EMPTY_CELL]
        assert len(emptied) == 1
        (f,) = emptied
        assert f.target in ("cell-0", "cell-1")
        # dead past the lease (the nodes go DOWN) and a whole grace with a margin
        assert f.duration_s > timing.heartbeat_timeout_s + timing.drain_grace_s + 5
        lo, hi = timing.drain_window_ms(int(f.at_s * 1000), int((f.at_s + f.duration_s) * 1000))
        assert hi > lo  # a job queued in the window has a grace to leave before the restart
        back = round(f.at_s + f.duration_s + chaos.EMPTY_CELL_SETTLE_S, 3)
        for g in faults:
            # no other node fault of its cell until its agents are back
            if g.kind in chaos.NODE_FAULTS and cell_of[g.target] == f.target:
                end = g.at_s + chaos.node_fault_length_s(g.kind, g.duration_s, timing)
                assert end <= f.at_s or g.at_s >= back, (seed, g, f)
            if g.kind in chaos.SCHEDULER_FAULTS:  # the cell has an owner when emptied
                moved_s = timing.session_timeout_s + timing.rebalance_s
                assert not g.at_s < f.at_s < g.at_s + g.duration_s + moved_s + 2.0
        steps = [a for a in chaos.actions_of(faults, timing) if a.fault_id == f.fault_id]
        assert [(a.at_s, a.op, a.final) for a in steps] == [
            (f.at_s, "crash", False),
            (round(f.at_s + f.duration_s, 3), "restart", True),
        ]
    # one cell: the plan (and so every seeded single-cell run) is as before
    assert chaos.EMPTY_CELL not in {f.kind for f in chaos.build_schedule(3, 300, 6, 8, 120)}


def _empty_cell_log(timing, queued_at_s, rerouted_at_s):
    """An empty_cell fault on cell-1 from t=100 s to t=130 s, a CellStatus of cell-1
    showing 2 queued jobs at ``queued_at_s`` and a JobRerouted out of it at
    ``rerouted_at_s`` (None: no reroute), plus noise from cell-0."""
    t = 1_000_000
    fault_log = [
        {"t_ms": t + 100_000, "fault_id": 4, "kind": chaos.EMPTY_CELL, "op": "crash",
         "node": "", "target": "cell-1", "nodes": ["node-1", "node-3"], "ok": True},
        {"t_ms": t + 130_000, "fault_id": 4, "kind": chaos.EMPTY_CELL, "op": "restart",
         "node": "", "target": "cell-1", "nodes": ["node-1", "node-3"], "ok": True},
    ]  # fmt: skip
    depth = (ev.QueueDepth(tier="free", tenant="a", queued=2),)
    events = [
        ev.CellStatus(event_id="cell-1@5/0", ts_ms=t + queued_at_s * 1000, cell="cell-1",
                      queues=depth),
        ev.CellStatus(event_id="cell-0@5/0", ts_ms=t + 110_000, cell="cell-0", queues=depth),
        ev.JobRerouted(event_id="cell-0@6/0", ts_ms=t + 111_000, job_id="job_x", tenant="a",
                       from_cell="cell-0", reason="elsewhere",
                       spec=ev.JobSpec(job_id="job_x", tenant="a")),
    ]  # fmt: skip
    if rerouted_at_s is not None:
        events.append(
            ev.JobRerouted(event_id="cell-1@9/0", ts_ms=t + rerouted_at_s * 1000, job_id="job_y",
                           tenant="a", from_cell="cell-1", reason="no UP node can run it",
                           spec=ev.JobSpec(job_id="job_y", tenant="a"))
        )  # fmt: skip
    return events, fault_log


def test_a_cell_emptied_with_jobs_queued_must_reroute_them_or_the_drill_fails():
    timing = chaos.Timing(heartbeat_timeout_s=6.0, drain_grace_s=12.0)
    # queued at t=110 s: DOWN by then (100 + 6 + 3) and a grace left before 130 - 14
    events, fault_log = _empty_cell_log(timing, 110, 124)
    (row,) = accounting.drain_checks(events, fault_log, timing)
    assert row["expected"] and row["queued_max"] == 2
    assert (row["cell"], row["rerouted"], row["rerouted_jobs"]) == ("cell-1", 1, ["job_y"])
    report = {"drains": [row], "dead_letter": {"missing": []}}
    assert accounting.failures(report) == []
    # the same without the reroute (cell-0's reroute does not count): a named failure
    events, fault_log = _empty_cell_log(timing, 110, None)
    (row,) = accounting.drain_checks(events, fault_log, timing)
    assert row["expected"] and row["rerouted"] == 0
    assert accounting.failures({"drains": [row]}) == [
        "no reroute: empty_cell #4 left 2 job(s) queued in cell-1 past the drain grace and "
        "none was rerouted"
    ]
    # queued only before the nodes were DOWN, or too close to the restart to drain:
    # nothing was owed, so no reroute is no failure
    for at in (104, 120):
        events, fault_log = _empty_cell_log(timing, at, None)
        (row,) = accounting.drain_checks(events, fault_log, timing)
        assert not row["expected"] and accounting.failures({"drains": [row]}) == []
    # a fault that failed to inject owes nothing either
    events, fault_log = _empty_cell_log(timing, 110, None)
    fault_log[0]["ok"] = False
    assert accounting.drain_checks(events, fault_log, timing) == []


def test_account_counts_every_reroute_and_reports_the_drains():
    timing = chaos.Timing()
    events, fault_log = _empty_cell_log(timing, 110, 124)
    report = accounting.account(
        events + events[-1:],  # a redelivered reroute counts once
        [], [], [], {}, [], fault_log, (), 10.0, verdict=None, timing=timing,
    )  # fmt: skip
    assert report["reroutes"] == 2
    assert [row["rerouted"] for row in report["drains"]] == [1]
    assert "reroutes" in accounting.SUMMARY_KEYS
    assert accounting.summary({**report, "config": {}})["reroutes"] == 2


def test_a_run_lost_to_an_emptied_cell_is_blamed_on_it():
    end = SimpleNamespace(ts_ms=5_000, cause=RunCause.NODE_DOWN, failure_class="")
    fault_log = [{"t_ms": 4_000, "kind": chaos.EMPTY_CELL, "node": "", "nodes": ["node-1"]}]
    kind = accounting.classify_run_end(end, False, chaos.NORMAL, False, ["node-1"], fault_log)
    assert kind == chaos.EMPTY_CELL


def test_a_down_agent_is_paused_past_its_lease_resumed_and_never_restarted():
    timing = chaos.Timing(heal_s=15.0)
    faults = (
        chaos.Fault(1, chaos.DOWN_AGENT, 5.0, "node-1", 0, 9.0),
        chaos.Fault(2, chaos.PAUSE_SCHEDULER, 6.0, "scheduler-1", duration_s=9.0),
    )
    assert [(a.at_s, a.kind, a.op, a.final) for a in chaos.actions_of(faults, timing)] == [
        (5.0, chaos.DOWN_AGENT, "pause", False),
        (6.0, chaos.PAUSE_SCHEDULER, "pause", False),
        (14.0, chaos.DOWN_AGENT, "resume", False),
        (15.0, chaos.PAUSE_SCHEDULER, "resume", True),
        (29.0, chaos.DOWN_AGENT, "heal_check", True),
    ]


def test_an_agent_fault_moves_to_the_busiest_eligible_node_of_its_cell():
    # (generators of checkpointing jobs, generators) per eligible node
    assert chaos.pick_node("node-0", {"node-0": (0, 0), "node-2": (1, 1), "node-4": (0, 3)}) == (
        "node-2"
    )
    assert chaos.pick_node("node-0", {"node-0": (1, 1), "node-2": (1, 1)}) == "node-0"  # a tie
    assert chaos.pick_node("node-4", {"node-0": (0, 2), "node-2": (0, 2)}) == "node-0"
    assert chaos.pick_node("node-4", {}) == "node-4"  # nothing eligible, nothing known


def test_actions_expand_each_fault_into_ordered_steps():
    faults = (
        chaos.Fault(1, chaos.PAUSE_AGENT, 5.0, "node-1", 0, 8.0),
        chaos.Fault(2, chaos.ECC_GPU, 6.0, "node-2", 3, 10.0),
    )
    actions = chaos.actions_of(faults, chaos.Timing(zombie_s=4.0))
    assert [(a.at_s, a.op, a.final) for a in actions] == [
        (5.0, "pause", False),
        (6.0, "ecc", False),
        (13.0, "resume", False),
        (16.0, "unecc", False),
        (16.0, "restart", True),
        (17.0, "restart", True),
    ]


def test_malformed_records_are_unique_and_cover_every_consumed_topic():
    records = malformed.malformed_records(catalogue, "node-3", "m1")
    assert len({m.value for m in records}) == len(records)
    assert {m.topic for m in records} == {
        catalogue.COMMANDS.name,
        catalogue.SCHEDULER.name,
        catalogue.ASSIGNMENTS.name,
        catalogue.JOB_EVENTS.name,
        catalogue.PROGRESS.name,
    }
    assert {m.key for m in records if m.topic == catalogue.ASSIGNMENTS.name} == {b"node-3"}
    again = {m.value for m in malformed.malformed_records(catalogue, "node-3", "m2")}
    assert not again & {m.value for m in records}


# -- accounting ---------------------------------------------------------------------
def assigned(pos, job, run, node="n0", gpus=(0,), resume=None):
    return ev.JobAssigned(
        event_id=f"cell-0@{pos}/0",
        ts_ms=pos * 1000,
        job_id=job,
        run=run,
        placement=(NodeSlice(node_id=node, gpus=gpus),),
        gpus=len(gpus),
        estimate_s=10,
        resume_from=resume,
    )


def requeued(pos, job, run, reason, resume=None, cause=RunCause.UNRECORDED, failure_class=""):
    return ev.JobRequeued(
        event_id=f"cell-0@{pos}/0",
        ts_ms=pos * 1000,
        job_id=job,
        run=run,
        reason=reason,
        resume_from=resume,
        cause=cause,
        failure_class=failure_class,
    )


def completed(pos, job, run, index=0):
    return ev.JobCompleted(event_id=f"cell-0@{pos}/{index}", ts_ms=pos * 1000, job_id=job, run=run)


def test_terminal_summary_counts_lost_jobs_and_redeliveries_and_verify_the_duplicates():
    events = [
        completed(5, "a", 1),
        completed(5, "a", 1),  # redelivered: same id
        completed(6, "b", 1),
        completed(9, "b", 2, index=1),  # two decisions: duplicate
        ev.JobFailed(
            event_id="cell-0@7/0", ts_ms=0, job_id="c", run=3, reason="x", failure_class="hung"
        ),
    ]
    s = accounting.terminal_summary(events, ["a", "b", "c", "d"])
    assert (s["submitted"], s["completed"], s["failed"], s["lost"]) == (4, 2, 1, 1)
    assert s["lost_jobs"] == ["d"]
    assert s["redelivered_terminal_records"] == 1
    assert s["failed_by_class"] == {"hung": 1}
    # the duplicate is verify's finding (one checker), reported under chaos's keys
    violations, first = first_terminal_violations(events)
    found = accounting.invariants(VerifyReport(violations=violations, first_terminal=first))
    assert found["duplicate_terminal_events"] == 1
    assert found["duplicate_terminal_jobs"] == {"b": ["cell-0@6/0", "cell-0@9/1"]}
    assert accounting.failures({**s, **found}) == ["lost = 1", "duplicate_terminal_events = 1"]


def test_cell_order_follows_input_positions_not_partitions():
    events = [
        completed(10, "x", 1),
        assigned(2, "x", 1),
        assigned(2, "y", 1),
        ev.JobAdmitted(
            event_id="admission-0@1/0", ts_ms=0, spec=ev.JobSpec(job_id="x", tenant="t")
        ),
    ]
    events[2] = ev.JobAssigned(**{**vars_of(events[2]), "event_id": "cell-0@2/1"})
    ordered = accounting.cell_ordered(events)
    assert [e.event_id for e in ordered] == ["cell-0@2/0", "cell-0@2/1", "cell-0@10/0"]


def vars_of(e):
    return {f: getattr(e, f) for f in e.__slots__}


# -- the log invariants are verify's ---------------------------------------------------
def registered(node="n0", incarnation=1):
    return ev.NodeRegistered(
        event_id=f"{node}:{incarnation}:registered",
        ts_ms=0,
        node_id=node,
        incarnation=incarnation,
        cell="cell-0",
        gpus=8,
    )


def agent(cls, job, run=1, node="n0", inc=1, tag=""):
    name = cls.__name__.removeprefix("Run").lower()
    return cls(
        event_id=f"{node}:{job}:{run}:{name}{tag}",
        ts_ms=0,
        job_id=job,
        run=run,
        node_id=node,
        incarnation=inc,
    )


def judged(inputs, outputs):
    """chaos's invariant keys for one cell's history, as verify's ledger judges it."""
    ledger = check_cell_history("cell-0", list(enumerate(inputs)), outputs)
    return accounting.invariants(VerifyReport(violations=ledger.violations)), ledger.violations


def test_scheduler_double_booking_is_an_assignment_onto_gpus_not_released_and_confirmed():
    ok = [
        assigned(1, "a", 1, gpus=(0, 1)),
        requeued(2, "a", 1, "retry after node_lost: x"),
        assigned(3, "b", 1, gpus=(1,)),
        ev.JobAssigned(**{**vars_of(assigned(3, "a", 2, gpus=(0,))), "event_id": "cell-0@3/1"}),
    ]
    # the agent confirms run a#1 is gone before its GPUs are given out again
    inputs = [registered(), None, agent(ev.RunStopped, "a"), None]
    found, violations = judged(inputs, ok)
    assert violations == [] and found["double_booked_gpus"] == 0
    # without the agent's word, the GPUs are still a#1's (the core waits for it too)
    found, violations = judged([registered(), None, None, None], ok)
    assert {v.kind for v in violations} == {"double_booked"} and found["double_booked_gpus"] == 2
    bad = [assigned(1, "a", 1, gpus=(0, 1)), assigned(2, "b", 1, gpus=(1,))]
    found, (conflict,) = judged([registered(), None, None], bad)
    assert (conflict.kind, conflict.subject, conflict.gpus) == (
        "double_booked",
        "n0:1",
        (("n0", 1),),
    )
    assert "a#1" in conflict.detail and found["double_booked_gpus"] == 1
    assert found["double_booking"] == [conflict.to_dict()]


def test_node_double_booking_is_a_start_before_the_previous_runs_final_report():
    outputs = [
        assigned(1, "a", 1, gpus=(0,)),
        requeued(3, "a", 1, "retry after hung: x"),
        assigned(5, "b", 1, gpus=(0,)),
    ]
    # a heartbeat that no longer lists a#1 frees its GPU for the scheduler ...
    beat = ev.NodeHeartbeat(event_id="n0:hb", ts_ms=0, node_id="n0", incarnation=1, runs=())

    def history(*between, b_inc=1):
        return [
            registered(),
            None,
            agent(ev.RunStarted, "a"),
            None,
            beat,
            *between,
            None,
            agent(ev.RunStarted, "b", inc=b_inc),
        ]

    def shifted(n):  # b's assignment follows whatever was inserted
        return [
            *outputs[:2],
            ev.JobAssigned(**{**vars_of(outputs[2]), "event_id": f"cell-0@{5 + n}/0"}),
        ]

    # ... but only a#1's own final report (or the node's next registration) ends it on the node
    found, violations = judged(history(agent(ev.RunStopped, "a")), shifted(1))
    assert violations == []
    found, violations = judged(history(registered(incarnation=2), b_inc=2), shifted(1))
    assert violations == []
    # a re-delivered RunStarted of a finished run opens nothing (first id wins)
    again = history(agent(ev.RunStopped, "a")) + [agent(ev.RunStarted, "a")]
    assert [v for v in judged(again, shifted(1))[1] if v.kind == "double_started"] == []
    found, violations = judged(history(), shifted(0))
    (conflict,) = violations
    assert (conflict.kind, conflict.gpus) == ("double_started", (("n0", 0),))
    assert "b#1" in conflict.detail and "a#1" in conflict.detail
    assert found["double_booked_gpus"] == 1


def test_leaks_are_the_gpus_runs_still_hold_at_the_end_of_verifys_refold():
    log = clean_history()
    found = accounting.invariants(verify(log.contents(), log.config))
    # the gang's other node has not confirmed its stop yet: held (within the stop lease)
    assert found["leaked_gpus"] == 8 and {leak["job_id"] for leak in found["leaks"]} == {"gang"}
    for node in ("n0", "n1"):
        log.heartbeat(node)  # nothing runs here any more
    found = accounting.invariants(verify(log.contents(), log.config))
    assert (found["leaked_gpus"], found["leaks"]) == (0, [])
    assert found["final_cell_status"] == f"cell-0@{len(log.scheduler) - 1}"
    log.admit("stuck", gpus=2)
    log.tick()
    log.start_all()
    log.tick()
    found = accounting.invariants(verify(log.contents(), log.config))
    assert found["leaked_gpus"] == 2
    assert {(leak["cell"], leak["job_id"], leak["run"]) for leak in found["leaks"]} == {
        ("cell-0", "stuck", 1)
    }


def test_without_a_verdict_nothing_is_known_and_the_drill_fails():
    found = accounting.invariants(None)
    assert set(found) == set(accounting.INVARIANT_KEYS) and set(found.values()) == {None}
    report = {**found, "lost": 0, "verify": {"ok": None, "error": "broker gone"}}
    assert accounting.failures(report) == [
        "verify could not run (broker gone): the log invariants are unknown"
    ]


# -- JobPreempted ends its run (the core's semantics; one definition, the ledger's) -----
def test_a_preempted_run_has_ended_so_its_confirmed_gpus_may_go_to_the_preemptor():
    preempted = ev.JobPreempted(
        event_id="cell-0@2/0", ts_ms=0, job_id="a", run=1, reason="preempted", by_job_id="b"
    )
    inputs = [registered(), None, agent(ev.RunStopped, "a"), None]
    outputs = [assigned(1, "a", 1, gpus=(0, 1)), preempted, assigned(3, "b", 1, gpus=(0, 1))]
    found, violations = judged(inputs, outputs)
    assert violations == [] and found["double_booked_gpus"] == 0
    # control: the same history without the JobPreempted: a#1 never ended
    found, violations = judged(inputs, [outputs[0], outputs[2]])
    assert {v.kind for v in violations} == {"double_booked"} and found["double_booked_gpus"] == 2


def test_a_preemption_by_the_real_core_passes_verify_and_is_wasted_time_of_preemption():
    config = CellConfig(status_interval_s=0, estimate_interval_s=0, heartbeat_timeout_s=1000)
    log = CellLog(config)
    log.tick()
    log.register("n0")
    log.admit(
        "batch", gpus=8, tier="batch", preemptible=True, checkpoint_interval_s=30, estimate_s=3600
    )
    log.tick()
    log.start_all()
    log.tick(100)
    log.heartbeat("n0", (("batch", 1),))
    log.admit("hurry", gpus=8, tier="interactive", estimate_s=30)
    out = log.tick(31)
    assert [o.job_id for o in out if isinstance(o, ev.CheckpointRun)] == ["batch"]
    out = log.report(ev.RunCheckpointed, "batch", 1, "n0", checkpoint_uri="mem://batch/ck1")
    assert [type(o).__name__ for o in out if isinstance(o, (ev.JobPreempted, ev.JobRequeued))] == [
        "JobPreempted",
        "JobRequeued",
    ]
    log.report(ev.RunStopped, "batch", 1, "n0")
    log.tick()
    log.start_all()
    log.tick()
    verdict = verify(log.contents(), config)
    assert verdict.ok, verdict.render()
    found = accounting.invariants(verdict)
    assert (found["double_booked_gpus"], found["duplicate_terminal_events"]) == (0, 0)
    assert {leak["job_id"] for leak in found["leaks"]} == {"hurry"}  # still running: held
    job_events = [codec.decode(r.value) for r in log.contents().job_events]
    spec = {"batch": ev.JobSpec(job_id="batch", tenant="acme", checkpoint_interval_s=30)}
    sched = [codec.decode(r.value) for r in log.scheduler]
    wasted = accounting.wasted_by_fault(
        accounting.cell_ordered(job_events), sched, spec, {}, (), [], 1.0
    )
    assert list(wasted) == ["preemption"] and wasted["preemption"]["runs"] == 1


def test_run_ends_are_blamed_on_the_fault_that_caused_them():
    log = [
        {"t_ms": 5_000, "kind": chaos.KILL_AGENT, "node": "n1"},
        {"t_ms": 9_000, "kind": chaos.PAUSE_AGENT, "node": "n2"},
    ]
    blame = lambda end, **kw: accounting.classify_run_end(
        end,
        kw.get("pre", False),
        kw.get("role", chaos.NORMAL),
        kw.get("wedged", False),
        kw.get("nodes", ["n1"]),
        log,
    )
    down = requeued(
        8,
        "a",
        1,
        "retry after node_lost: node n1 down: no heartbeat for 6.1s",
        cause=RunCause.NODE_DOWN,
        failure_class="node_lost",
    )
    assert blame(down) == chaos.KILL_AGENT
    assert blame(down, nodes=["n3"]) == "node_lost (no injected fault)"
    stalled = requeued(
        12,
        "a",
        1,
        "retry after hung: no progress for 3s (last step 9)",
        cause=RunCause.HUNG,
        failure_class="hung",
    )
    assert blame(stalled, nodes=["n2"]) == chaos.PAUSE_AGENT  # its agent was stopped
    assert blame(stalled, wedged=True) == chaos.WEDGE_GENERATOR
    assert blame(stalled, role=chaos.HANG) == chaos.HANG_GENERATOR
    crash = ev.JobFailed(
        event_id="cell-0@3/0",
        ts_ms=3000,
        job_id="a",
        run=3,
        reason="x",
        failure_class="generator_error",
        cause=RunCause.GENERATOR_ERROR,
    )
    assert blame(crash, role=chaos.CRASH) == chaos.CRASH_GENERATOR
    move = requeued(
        4,
        "a",
        1,
        "checkpoint-and-move: node n1 draining (GPU 2 failed: uncorrectable ECC errors: 1)",
        cause=RunCause.GPU_ECC,
    )
    assert blame(move) == chaos.ECC_GPU
    hot = requeued(
        4,
        "a",
        1,
        "checkpoint-and-move: GPU unhealthy on n1 (thermal: 92C >= 87C)",
        cause=RunCause.GPU_THROTTLED,
    )
    assert blame(hot) == chaos.THROTTLE_GPU
    assert blame(down, pre=True) == "preemption"


def test_run_ends_are_classified_by_their_cause_code_not_their_wording():
    blame = lambda end, **kw: accounting.classify_run_end(
        end, False, kw.get("role", chaos.NORMAL), kw.get("wedged", False), ["n1"], []
    )
    prose = "checkpoint-and-move: node n1 draining (GPU 2 failed: uncorrectable ECC errors: 1)"
    for cause, kind in [
        (RunCause.GPU_ECC, chaos.ECC_GPU),
        (RunCause.GPU_THROTTLED, chaos.THROTTLE_GPU),
        (RunCause.STRAGGLER, "straggler"),
        (RunCause.NODE_DRAINING, "move"),
        (RunCause.TIMEOUT, "timeout"),
        (RunCause.PREEMPTED, "preemption"),
    ]:
        assert blame(requeued(4, "a", 1, prose, cause=cause)) == kind, cause
    # the same words with no code (an event written before causes) are not parsed
    assert blame(requeued(4, "a", 1, prose)) == "other (no injected fault)"
    hung = requeued(4, "a", 1, "retry after generator_error: x", cause=RunCause.HUNG)
    assert blame(hung, role=chaos.HANG) == chaos.HANG_GENERATOR
    assert blame(hung, role=chaos.CRASH) == "other (no injected fault)"
    assert set(accounting.MOVE_KINDS) == set(MOVES)


def test_waste_is_gpu_time_from_the_last_checkpoint_to_the_end_of_the_run():
    spec = ev.JobSpec(job_id="a", tenant="t", checkpoint_interval_s=10)  # 1 s at time scale 10
    events = [
        assigned(10, "a", 1, gpus=(0, 1)),
        requeued(20, "a", 1, "retry after node_lost: node n0 down: x", "ck"),
        assigned(21, "a", 2, node="n1", gpus=(0, 1), resume="ck"),
        completed(30, "a", 2),
    ]
    sched = [
        ev.RunStarted(event_id="s", ts_ms=11_000, job_id="a", run=1, node_id="n0", incarnation=1),
        ev.RunCheckpointed(
            event_id="c",
            ts_ms=17_500,
            job_id="a",
            run=1,
            node_id="n0",
            incarnation=1,
            checkpoint_uri="ck",
        ),
    ]
    log = [{"t_ms": 18_000, "kind": chaos.KILL_AGENT, "node": "n0"}]
    wasted = accounting.wasted_by_fault(
        accounting.cell_ordered(events), sched, {"a": spec}, {"a": chaos.NORMAL}, (), log, 10.0
    )
    assert wasted == {
        chaos.KILL_AGENT: {
            "runs": 1,
            "gpu_s": 5.0,
            "checkpointable_runs": 1,
            "resumed_from_checkpoint": 1,
            "gpu_s_per_run": 5.0,
            "lost_intervals_mean": 2.5,
            "lost_intervals_max": 2.5,
        }
    }


def test_dead_letter_check_matches_records_by_value_and_wants_a_reason():
    injected = malformed.malformed_records(catalogue, "node-0", "dl")[:3]
    rec = lambda value, reason: SimpleNamespace(
        value=value, header=lambda name: reason if name == "reason" else None
    )
    dead = [rec(injected[0].value, b"bad_magic"), rec(injected[1].value, None)]
    check = accounting.dead_letter_check(injected, dead)
    assert check["dead_lettered"] == 1 and check["reasons"] == {"bad_magic": 1}
    assert len(check["missing"]) == 2


def test_failures_name_what_broke():
    report = {
        "lost": 2,
        "duplicate_terminal_events": 0,
        "leaked_gpus": 1,
        "double_booked_gpus": 0,
        "dead_letter": {"missing": []},
        "submit_errors": [],
    }
    assert accounting.failures(report) == ["lost = 2", "leaked_gpus = 1"]


# -- the agent's fault file ----------------------------------------------------------
def test_fault_file_probe_follows_the_file(tmp_path):
    probe = FaultFileProbe(SimulatedProbe(4, seed=1), tmp_path / "faults.json")
    assert all(g.ecc_uncorrected == 0 and g.sm_clock_mhz == 1980 for g in probe.sample())
    write_gpu_faults(tmp_path, throttle=[1], ecc={2: (0, 1)})
    sample = probe.sample()
    assert sample[1].sm_clock_mhz < sample[1].max_sm_clock_mhz and sample[1].temperature_c > 87
    assert sample[2].ecc_uncorrected == 1
    assert probe.sample()[2].ecc_uncorrected == 1  # applied once, not added per sample
    write_gpu_faults(tmp_path, ecc={2: (0, 1)})
    assert probe.sample()[1].sm_clock_mhz == 1980  # healed
    (tmp_path / "faults.json").write_text("{not json")
    assert probe.sample()[2].ecc_uncorrected == 1  # unreadable: unchanged
    (tmp_path / "faults.json").unlink()
    assert all(g.ecc_uncorrected == 0 for g in probe.sample())
    assert json.loads(write_gpu_faults(tmp_path).read_text()) == {"throttle": [], "ecc": {}}


# -- takeovers and self-healing, from a synthetic log ---------------------------------
def rebalance_line(ts_s, instance, op, parts, legacy=False):
    doc = {"ts": ts_s, "level": "info", "instance": instance}
    doc["msg"] = f"{op} framespool.scheduler partitions {list(parts)}"
    if not legacy:
        doc.update(rebalance=op, partitions=list(parts))
    return json.dumps(doc)


def test_takeovers_are_counted_and_timed_from_the_new_owners_assignment():
    from framespool.chaos import takeover

    s0 = [
        rebalance_line(100.0, "scheduler-0", "assigned", [0, 2]),
        "not json",
        json.dumps({"ts": 101.0, "msg": "StartRun job_1 -> framespool.assignments"}),
    ]
    s1 = [
        rebalance_line(100.0, "scheduler-1", "assigned", [1, 3], legacy=True),  # older format
        rebalance_line(110.0, "scheduler-1", "revoked", [1, 3]),
        rebalance_line(110.5, "scheduler-1", "assigned", [0, 1, 2, 3]),
    ]
    changes = takeover.ownership_changes(s0, "scheduler-0") + takeover.ownership_changes(
        s1, "scheduler-1"
    )
    assert takeover.owned_at(changes, "scheduler-0", 104_000) == {0, 2}
    assert takeover.owned_at(changes, "scheduler-1", 100_000) == {1, 3}
    assert takeover.owned_at(changes, "scheduler-1", 110_200) == set()
    assert takeover.owned_at(changes, "scheduler-2", 200_000) is None
    fault_log = [
        {
            "t_ms": 104_000,
            "fault_id": 3,
            "kind": chaos.KILL_SCHEDULER,
            "op": "crash",
            "target": "scheduler-0",
            "ok": True,
        },
        {
            "t_ms": 109_000,
            "fault_id": 3,
            "kind": chaos.KILL_SCHEDULER,
            "op": "restart",
            "target": "scheduler-0",
            "ok": True,
        },
        {
            "t_ms": 104_000,
            "fault_id": 4,
            "kind": chaos.KILL_AGENT,
            "op": "crash",
            "target": "node-1",
            "ok": True,
        },
    ]
    status = ev.CellStatus(event_id="cell-0@900/0", ts_ms=0, cell="cell-0")
    outputs = takeover.cell_outputs(
        [
            (103_000, ev.CellStatus(event_id="cell-0@800/0", ts_ms=0, cell="cell-0")),
            (110_800, completed(901, "j1", 1)),  # cell-0's fold: its first decision
            (111_000, status),
            (109_000, ev.JobAdmitted(event_id="admission-0@5/0", ts_ms=0, spec=None)),  # no cell
            (None, status),  # no timestamp: not counted
        ]
    )
    assert outputs == [(103_000, 0), (110_800, 0), (111_000, 0)]
    rows = takeover.takeovers(fault_log, changes, outputs, cells=2)  # partition 2 is no cell
    assert rows == [
        {
            "fault_id": 3,
            "kind": chaos.KILL_SCHEDULER,
            "instance": "scheduler-0",
            "cell": "cell-0",
            "by": "scheduler-1",
            "measured_from": "rebalance",
            "detect_s": 6.0,  # the fault -> the group revoked the partitions
            "takeover_s": 0.8,  # revoked -> the new owner's first decision
            "decide_s": 0.3,  # assigned -> first decision
            "from_fault_s": 6.8,
        }
    ]
    summary = takeover.takeover_summary(rows)
    assert (summary["takeovers"], summary["takeover_s_max"]) == (1, 0.8)
    assert (summary["takeover_decide_s_max"], summary["takeover_from_fault_s_max"]) == (0.3, 6.8)
    assert summary["takeover_detect_s_max"] == 6.0 and summary["takeovers_unfinished"] == []


def test_a_takeover_nobody_finished_is_reported_and_not_counted():
    from framespool.chaos import takeover

    changes = takeover.ownership_changes(
        [rebalance_line(100.0, "scheduler-1", "assigned", [0, 1])], "scheduler-1"
    )
    fault_log = [
        {
            "t_ms": 104_000,
            "fault_id": 1,
            "kind": chaos.PAUSE_SCHEDULER,
            "op": "pause",
            "target": "scheduler-1",
            "ok": True,
        },
    ]
    rows = takeover.takeovers(fault_log, changes, [(105_000, 0)], cells=2)
    assert [(r["cell"], r["by"], r["takeover_s"]) for r in rows] == [
        ("cell-0", None, None),
        ("cell-1", None, None),
    ]
    summary = takeover.takeover_summary(rows)
    assert summary["takeovers"] == 0 and summary["takeover_s_max"] is None
    assert len(summary["takeovers_unfinished"]) == 2
    # without any rebalance line of the victim, every cell is its own and the clock
    # starts at the fault
    rows = takeover.takeovers(fault_log, [], [(105_000, 0), (106_500, 1)], cells=2)
    assert [(r["measured_from"], r["takeover_s"]) for r in rows] == [
        ("fault", 1.0),
        ("fault", 2.5),
    ]


def node_state(ts, node, state, inc):
    return ev.NodeStateChanged(
        event_id=f"cell-0@{ts}/0", ts_ms=ts, node_id=node, incarnation=inc, state=state
    )


def test_a_down_agent_healed_itself_only_if_it_came_back_up_with_a_new_incarnation_unaided():
    from framespool.chaos import takeover

    def fault(fid, node):
        return [
            {
                "t_ms": 10_000,
                "fault_id": fid,
                "kind": chaos.DOWN_AGENT,
                "op": "pause",
                "node": node,
                "ok": True,
            },
            {
                "t_ms": 19_000,
                "fault_id": fid,
                "kind": chaos.DOWN_AGENT,
                "op": "resume",
                "node": node,
                "ok": True,
            },
            {
                "t_ms": 34_000,
                "fault_id": fid,
                "kind": chaos.DOWN_AGENT,
                "op": "heal_check",
                "node": node,
                "ok": True,
            },
        ]

    fault_log = fault(1, "node-1") + fault(2, "node-2") + fault(3, "node-3")
    fault_log.append({"t_ms": 37_000, "kind": "supervisor", "node": "node-2", "op": "restart"})
    changes = [
        node_state(1_000, "node-1", "UP", 1),
        node_state(1_000, "node-2", "UP", 1),
        node_state(1_000, "node-3", "UP", 1),
        node_state(16_000, "node-1", "DOWN", 1),
        node_state(16_000, "node-2", "DOWN", 1),
        node_state(21_500, "node-1", "UP", 2),  # re-registered by itself
        node_state(38_000, "node-2", "UP", 2),  # only after the supervisor restarted it
    ]
    rows = {r["node"]: r for r in takeover.self_healing(fault_log, changes)}
    assert rows["node-1"]["self_healed"] is True and rows["node-1"]["heal_s"] == 2.5
    assert rows["node-2"]["declared_down"] is True and rows["node-2"]["self_healed"] is False
    assert rows["node-3"]["declared_down"] is False and rows["node-3"]["self_healed"] is None
    assert accounting.summary({"self_healing": list(rows.values()), "dead_letter": {}})[
        "self_healed"
    ] == [True, False, None]


def test_the_drill_runs_several_cells_with_its_short_drain_grace_and_one_cell_without(tmp_path):
    from framespool.chaos.drill import chaos_stack
    from framespool.processors.config_file import load_cell_config

    timing = chaos.Timing(drain_grace_s=7.0)
    for cells, grace in ((2, 7.0), (1, 0.0)):
        stack = chaos_stack(tmp_path / f"c{cells}", nodes=6, timing=timing, cells=cells)
        path = stack.write_processor_config()  # the file the processors are started with
        assert load_cell_config(path).drain_grace_s == grace  # not the stack's 60 s
    # the emptied cell's fault lasts past the lease and this grace
    assert timing.empty_cell_s() > timing.heartbeat_timeout_s + timing.drain_grace_s
