"""A promised start (``TierConfig.start_within_s``, rescue.py): per job, wait for
runs that end in time, ask a victim whose checkpoint is near, or evict one
whose last checkpoint is recent. One test per knob, each with a control, and a
property: whatever the runs, only preemptible, checkpointable runs of a less
important tier are ever asked or stopped, and a stop without a checkpoint never
loses more than ``evict_max_lost_s`` of work."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.processors.core import CellConfig
from framespool.processors.core.config import DEFAULT_TIERS
from framespool.schemas import events as ev
from tests.support.core import of
from tests.support.core_harness import Harness


def cfg(promise: float = 10.0, **kw) -> CellConfig:
    tiers = tuple(
        replace(t, start_within_s=promise) if t.name == "interactive" else t for t in DEFAULT_TIERS
    )
    base = dict(
        tiers=tiers,
        status_interval_s=0,
        estimate_interval_s=0,
        heartbeat_timeout_s=1e9,
        report_lease_s=1e9,
        min_run_before_preempt_s=0,
    )
    base.update(kw)
    return CellConfig(**base)


def full_cell(config: CellConfig, runs: list[dict]) -> Harness:
    """One node, full: each entry is a run's submit kwargs (8 GPUs in all)."""
    h = Harness(nodes=1, config=config)
    for i, spec in enumerate(runs):
        h.submit(f"v{i}", tier=spec.pop("tier", "batch"), **spec)
    h.start_all()
    return h


def checkpointed(h: Harness, job_id: str) -> None:
    h.report(ev.RunCheckpointed, job_id, 1, "n0", checkpoint_uri=f"mem://{job_id}", progress=0.1)


def victim(**kw) -> dict:
    spec = dict(gpus=8, preemptible=True, checkpoint_interval_s=60, estimate_s=3600)
    spec.update(kw)
    return spec


def test_a_victim_whose_checkpoint_is_near_is_asked_at_once():
    """Its next checkpoint (last + 60 s) comes 5 s after the interactive job
    arrives: it is asked on the job's first Tick, not after ``sla_wait_s``.
    Control: without the promise, nothing until the 5 s SLA."""
    for promise, want_at in ((10.0, 1), (0.0, 5)):
        h = full_cell(cfg(promise), [victim()])
        h.tick(15)
        checkpointed(h, "v0")  # t = 16 s: the next one is due at 76 s
        h.tick(55)  # t = 71 s: 39 s of work since, too much to throw away (20 s)
        asked_at = None
        out = h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
        for second in range(8):
            if of(out, ev.CheckpointRun):
                asked_at = second
                break
            out = h.tick(1)
        assert asked_at == want_at, (promise, asked_at)
        assert not of(h.log, ev.StopRun) or promise == 0.0


def test_a_victim_that_just_checkpointed_is_evicted_within_evict_max_lost_s():
    """Checkpointed 5 s before the interactive job arrives, its next checkpoint
    55 s away: stopped on its first Tick (6 s x 8 GPUs lost) and requeued, and the job
    starts on the next pass. With ``evict_max_lost_s`` 4 s it is not."""
    for lost_s, evicted in ((20.0, True), (4.0, False)):
        h = full_cell(cfg(evict_max_lost_s=lost_s), [victim()])
        h.tick(30)
        checkpointed(h, "v0")
        h.tick(5)
        h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
        out = h.tick(1)  # its first full pass (the cell is full: no quick one)
        stops = of(out, ev.StopRun)
        assert bool(stops) == evicted, (lost_s, out)
        if evicted:
            [pre] = of(out, ev.JobPreempted)
            assert pre.job_id == "v0" and pre.by_job_id == "hurry"
            assert "evicted" in pre.reason and "6s since its last checkpoint" in pre.reason
            assert not of(out, ev.CheckpointRun)
            h.confirm_stops()
            out = h.tick(1)
            assert [a.job_id for a in of(out, ev.JobAssigned)] == ["hurry"]
            assert h.cell.jobs["v0"].checkpoint == "mem://v0"  # resumes from it


def test_runs_that_end_in_time_are_waited_for():
    """A run ending 4 s after the job arrives frees what it needs: nothing is
    preempted. Control: ending 40 s after, the checkpointable neighbour (its
    checkpoint due in 6 s) is asked."""
    for ends_in, preempts in ((4, False), (40, True)):
        h = full_cell(
            cfg(),
            [
                dict(gpus=4, estimate_s=94 + ends_in, tier="paid"),  # ends at 95 + ends_in
                victim(gpus=4),
            ],
        )
        h.tick(40)
        checkpointed(h, "v1")  # t = 41: due again at 101
        h.tick(54)  # t = 95
        out = h.submit("hurry", gpus=4, tier="interactive", estimate_s=30)
        for _ in range(3):
            out += h.tick(1)
        assert bool(of(out, ev.CheckpointRun)) == preempts, (ends_in, out)
        assert not of(out, ev.StopRun)


def test_the_cheapest_node_is_chosen():
    """Two nodes of victims: one checkpointed 15 s ago, one 3 s ago; the job
    needs one node: only the cheaper one is stopped."""
    h = Harness(nodes=2, config=cfg())
    for i in range(2):
        h.submit(f"v{i}", tier="batch", **victim())
    h.start_all()
    h.tick(40)
    on = {h.runs_on(n)[0][0]: n for n in ("n0", "n1")}
    h.report(ev.RunCheckpointed, "v0", 1, on["v0"], checkpoint_uri="mem://v0", progress=0.1)
    h.tick(12)
    h.report(ev.RunCheckpointed, "v1", 1, on["v1"], checkpoint_uri="mem://v1", progress=0.1)
    h.tick(3)
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    out = h.tick(1)
    assert [s.job_id for s in of(out, ev.StopRun)] == ["v1"]


run_specs = st.fixed_dictionaries(
    {
        "gpus": st.sampled_from([1, 2, 4]),
        "preemptible": st.booleans(),
        "interval": st.sampled_from([0, 30, 60]),
        "tier": st.sampled_from(["interactive", "enterprise", "paid", "free", "batch"]),
        "estimate_s": st.integers(20, 4000),
        "saved_after": st.integers(0, 120),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=st.lists(run_specs, min_size=1, max_size=12),
    want=st.sampled_from([1, 2, 4, 8]),
    wait_s=st.integers(0, 30),
    max_lost=st.sampled_from([0.0, 10.0, 30.0]),
)
def test_only_eligible_victims_and_bounded_losses(runs, want, wait_s, max_lost):
    h = Harness(nodes=2, config=cfg(evict_max_lost_s=max_lost))
    specs = {}
    for i, r in enumerate(runs):
        specs[f"r{i}"] = r
        submit_run(h, i, r)
    h.start_all()
    saved = {}
    for step in range(0, 121, 10):
        for job_id, r in specs.items():
            run = h.cell.runs.get((job_id, 1))
            if run is not None and run.phase == "running" and r["saved_after"] // 10 * 10 == step:
                h.report(
                    ev.RunCheckpointed,
                    job_id,
                    1,
                    next(iter(run.held)),
                    checkpoint_uri=f"mem://{job_id}",
                    progress=0.1,
                )
                saved[job_id] = h.now_ms
        h.tick(10)
    started = {k[0]: r.started_ms for k, r in h.cell.runs.items()}
    evicted_lost = []

    def note(out):
        for p in of(out, ev.JobPreempted):
            if "evicted" in p.reason:
                since = saved.get(p.job_id, started[p.job_id])
                evicted_lost.append((h.now_ms - since) / 1000)

    note(h.submit("hurry", gpus=want, tier="interactive", estimate_s=30))
    for _ in range(wait_s):
        note(h.tick(1))
    preempted = {p.job_id for p in of(h.log, ev.JobPreempted)}
    for o in h.log:
        if isinstance(o, (ev.CheckpointRun, ev.StopRun)) and o.job_id in preempted:
            r = specs[o.job_id]
            assert r["preemptible"] and r["interval"] > 0 and r["tier"] != "interactive", (o, r)
    assert all(lost <= max_lost + 1e-9 for lost in evicted_lost), (evicted_lost, max_lost)


# -- the node plans' fast path (issue 35) ------------------------------------------
def plain_node_plan(cell, node, per_node, rank, deadline_ms, late=False):
    """``Rescue.node_plan`` as first written (every way of every run built, then
    filtered and the least taken): the oracle of the optimised one."""
    from framespool.processors.core.rescue import FREE, GRACEFUL, HARD, NodePlan
    from framespool.schemas.states import GpuState, RunPhase

    now = cell.now_ms
    free = node.free_count()
    plan = NodePlan(node.node_id)
    if free >= per_node:
        plan.ready_ms = now
        return plan
    min_run_ms = int(cell.config.min_run_before_preempt_s * 1000)
    max_lost_ms = int(getattr(cell.config, "evict_max_lost_s", 0.0) * 1000)
    order = (lambda o: (o[2], o[0], o[1], o[3])) if late else (lambda o: o[:4])
    options = []
    for run in cell.runs_on(node):
        held = sum(1 for i in run.held[node.node_id] if node.gpu_state[i] == GpuState.OK)
        ways = []
        if run.phase == RunPhase.STOPPING:
            ways.append((FREE, 0.0, now))
        elif run.phase == RunPhase.EXITING:
            ways.append((FREE, 0.0, min(run.exit_deadline_ms, cell.next_checkpoint_ms(run))))
        else:
            ways.append((FREE, 0.0, run.projected_end_ms(now)))
            if cell.eligible_victim(run, node, min_run_ms) and (
                cell.config.tier_of(run.tier).rank > rank
            ):
                ways.append((GRACEFUL, 0.0, cell.next_checkpoint_ms(run)))
                if now - run.saved_ms <= max_lost_ms:
                    ways.append((HARD, run.gpus * (now - run.saved_ms) / 1000, now))
        usable = [(a, lost, ready, run.job_id, held, run) for a, lost, ready in ways]
        usable = [o for o in usable if o[2] <= deadline_ms]
        if usable:
            options.append(min(usable, key=order))
    options.sort(key=order)
    for action, lost, ready, _, held, run in options:
        if free >= per_node:
            break
        free += held
        plan.ready_ms = max(plan.ready_ms, ready)
        if action == GRACEFUL:
            plan.graceful.append(run)
        elif action == HARD:
            plan.hard.append(run)
            plan.lost += lost
    return plan if free >= per_node else None


def submit_run(h: Harness, i: int, r: dict) -> None:
    """Submit run spec ``r`` (a strategy's draw) as job ``r{i}``."""
    h.submit(
        f"r{i}",
        tier=r["tier"],
        gpus=r["gpus"],
        estimate_s=r["estimate_s"],
        preemptible=r["preemptible"],
        checkpoint_interval_s=r["interval"],
    )


def checkpoint_due(h: Harness, runs: list[dict], step: int) -> None:
    """Every running run ``r{i}`` whose ``saved_after`` falls in 10 s step
    ``step`` reports a checkpoint now."""
    for i, r in enumerate(runs):
        run = h.cell.runs.get((f"r{i}", 1))
        if run is not None and run.phase == "running" and r["saved_after"] // 10 == step:
            h.report(
                ev.RunCheckpointed,
                f"r{i}",
                1,
                next(iter(run.held)),
                checkpoint_uri=f"mem://r{i}",
                progress=0.1,
            )


def _plan_view(plan):
    if plan is None:
        return None
    return (plan.node_id, plan.lost, plan.ready_ms, plan.graceful, plan.hard)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=st.lists(run_specs, min_size=1, max_size=12),
    steps=st.integers(0, 12),
    max_lost=st.sampled_from([0.0, 10.0, 30.0]),
)
def test_property_node_plans_equal_the_plain_ones(runs, steps, max_lost):
    """Whatever the runs, their phases and checkpoints, ``node_plan`` gives the
    very plan of the plain version for every need, rank, deadline and mode."""
    h = Harness(nodes=2, config=cfg(evict_max_lost_s=max_lost))
    for i, r in enumerate(runs):
        submit_run(h, i, r)
    h.start_all()
    for step in range(steps):
        checkpoint_due(h, runs, step)
        h.tick(10)
    if runs and steps % 3 == 0:  # some runs asked to exit or stopping
        h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
        h.tick(1)
    cell = h.cell
    now = cell.now_ms
    for node in cell.index.nodes.values():
        for per_node in (1, 2, 4, 8):
            for rank in (0, 1, 2, 5):
                for deadline in (now - 1, now, now + 10_000, now + 100_000, 10**15):
                    for late in (False, True):
                        got = cell.node_plan(node, per_node, rank, deadline, late)
                        want = plain_node_plan(cell, node, per_node, rank, deadline, late)
                        assert _plan_view(got) == _plan_view(want)


# -- the rescue plan's read of the runs' ends (issue 35) ---------------------------
def plain_rescue_plan(cell, job, rank, per_node, nodes_needed, deadline_ms, late=False):
    """``Rescue.rescue_plan`` as first written (every schedulable node planned,
    the plans sorted, the first taken): the oracle of ``waiting_plans``."""
    from framespool.processors.core.rescue import NodePlan

    ok = cell.node_filter(job, job.shape[2], holder=False, claim_only=False)
    plans = [
        plan
        for node in cell.index.nodes.values()
        if node.schedulable and ok(node)
        for plan in [cell.node_plan(node, per_node, rank, deadline_ms, late)]
        if plan is not None
    ]
    if len(plans) < nodes_needed:
        return None
    plans.sort(key=NodePlan.soonest if late else NodePlan.rank)
    return plans[:nodes_needed]


fleet_runs = st.fixed_dictionaries(
    {
        "gpus": st.sampled_from([1, 2, 4, 8, 16]),
        "preemptible": st.booleans(),
        "interval": st.sampled_from([0, 30, 60]),
        "tier": st.sampled_from(["interactive", "paid", "batch"]),
        # few values, so that nodes free at the same moment (ties) and runs
        # outlive their estimate (late: projected from their slack)
        "estimate_s": st.sampled_from([25, 40, 60, 95, 600]),
        "saved_after": st.integers(0, 120),
        "at": st.integers(0, 6),  # submitted after this many 10 s steps
    }
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=st.lists(fleet_runs, min_size=1, max_size=16),
    steps=st.integers(0, 12),
    hurry=st.sampled_from([0, 1, 4, 8]),
    evict=st.booleans(),
    confirm=st.booleans(),
)
def test_property_rescue_plans_equal_the_plain_ones(runs, steps, hurry, evict, confirm):
    """Whatever the fleet (runs ending, late, exiting, stopping, evicted in the
    pass, free GPUs), ``rescue_plan`` gives the plain search's plans for every
    need, rank, deadline and mode: the read of the runs' ends
    (``waiting_plans``) stops early only where no node left could rank first."""
    from framespool.processors.core.model import Job

    h = Harness(nodes=4, config=cfg(evict_max_lost_s=30.0))
    for step in range(max(steps, 7)):
        for i, r in enumerate(runs):
            if r["at"] == step:
                submit_run(h, i, r)
        h.start_all()
        checkpoint_due(h, runs, step)
        if step == steps and hurry:  # runs asked to exit, evicted, then stopping
            h.submit("hurry", gpus=hurry, tier="interactive", estimate_s=30)
        h.tick(10)
        if confirm:
            h.confirm_stops()
    cell = h.cell
    if evict:  # evicted in this pass: EXITING, its stop not yet made (``flush_evictions``)
        running = [r for r in cell.runs.values() if r.phase == "running"]
        if running:
            cell.evict(running[0], "probe", "evicted by the test")
    now = cell.now_ms
    for per_node in (1, 2, 4, 8):
        for nodes_needed in (1, 2, 3):
            spec = ev.JobSpec(
                job_id="probe",
                tenant="t1",
                tier="interactive",
                gpus=per_node * nodes_needed,
                gpus_per_node=per_node,
                estimate_s=30,
            )
            job = Job(spec, "interactive", now)
            tier = cell.config.tier_of("interactive")
            for rank in (0, 2, 5):
                tier = replace(tier, rank=rank)
                for deadline in (now - 1, now, now + 5_000, now + 30_000, now + 600_000):
                    for late in (False, True):
                        got = cell.rescue_plan(job, tier, per_node, nodes_needed, deadline, late)
                        want = plain_rescue_plan(
                            cell, job, rank, per_node, nodes_needed, deadline, late
                        )
                        assert (got is None) == (want is None), (got, want)
                        assert [_plan_view(p) for p in got or ()] == [
                            _plan_view(p) for p in want or ()
                        ]
