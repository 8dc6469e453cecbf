"""One test per policy knob, each with a control: the knob set one way changes
the outcome, so a knob that stopped working fails its test."""

from __future__ import annotations

from framespool.processors.core import CellConfig, TenantConfig
from framespool.schemas import events as ev
from tests.support.core import asked, cfg, of
from tests.support.core_harness import Harness

# -- preemption ---------------------------------------------------------------------


def batch_cell(nodes: int, preemptible: bool = True, **kw) -> Harness:
    """Every node full of one 8-GPU checkpointable batch run, started at t=1."""
    h = Harness(nodes=nodes, config=cfg(**kw))
    for i in range(nodes):
        h.submit(
            f"batch{i}",
            gpus=8,
            tier="batch",
            preemptible=preemptible,
            checkpoint_interval_s=30,
            estimate_s=3600,
        )
    h.start_all()
    return h


def test_non_preemptible_runs_are_never_preempted():
    """Leases that never expire, so the run stays RUNNING and only its
    non-preemptibility protects it; the control shows the same cell preempts a
    preemptible run."""
    for preemptible, expect in ((False, []), (True, ["batch0"])):
        h = batch_cell(1, preemptible=preemptible)
        h.tick(100)
        h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
        seen = []
        for _ in range(10):
            seen += asked(h.tick(60))
        if not preemptible:
            assert h.cell.runs[("batch0", 1)].phase == "running"
        assert seen == expect, (preemptible, seen)


def test_a_run_younger_than_min_run_before_preempt_is_not_preempted():
    h = batch_cell(1, min_run_before_preempt_s=200)
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    assert asked(h.tick(100)) == []  # past the SLA, but the run is 101 s old
    assert asked(h.tick(100)) == ["batch0"]  # now 201 s old


def test_preemptions_per_minute_caps_victims_in_any_minute():
    h = batch_cell(4, preemptions_per_minute=2, min_run_before_preempt_s=0)
    h.tick(10)
    for i in range(4):  # four organisations: each flow's head may preempt
        h.submit(f"hurry{i}", tenant=f"i{i}", gpus=8, tier="interactive", estimate_s=30)
    first = asked(h.tick(100))
    assert len(first) == 2, first
    assert "churn limit" in h.cell.jobs["hurry2"].reason
    assert asked(h.tick(30)) == []  # the same minute
    assert len(asked(h.tick(31))) == 2  # the next one


def test_a_job_is_preempted_at_most_max_preemptions_per_job_times():
    """The count is kept on the job (``Job.preemptions``, raised by each
    JobPreempted); at the limit the run is no victim, below it it is."""
    for limit, expect in ((1, []), (2, ["batch0"])):
        h = batch_cell(1, max_preemptions_per_job=limit, min_run_before_preempt_s=0)
        h.cell.jobs["batch0"].preemptions = 1
        h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
        assert asked(h.tick(100)) == expect, limit


# -- fair share ---------------------------------------------------------------------


def served_share(tenants, jobs_of, rounds: int = 60, nodes: int = 1, **kw) -> dict[str, float]:
    """Run 1-GPU (or ``jobs_of``) jobs back to back; GPU-seconds per tenant."""
    h = Harness(nodes=nodes, config=cfg(tenants=tenants, **kw))
    for name, spec in jobs_of.items():
        for j in range(rounds * nodes * 8):
            h.submit(f"{name}-{j}", tenant=name, estimate_s=10, **spec)
    used: dict[str, float] = {name: 0.0 for name in jobs_of}
    for _ in range(rounds):
        h.start_all()
        h.tick(10)
        for key in list(h.live_runs()):
            run = h.cell.runs[key]
            used[run.tenant] += run.gpus * 10
            h.complete(key)
        h.tick(0)
    return used


def test_unequal_weights_split_gpu_time_in_their_ratio():
    used = served_share(
        (TenantConfig("a", weight=3.0), TenantConfig("b", weight=1.0)),
        {"a": {"gpus": 1}, "b": {"gpus": 1}},
    )
    assert 2.6 <= used["a"] / used["b"] <= 3.4, used


def test_drf_charges_a_cpu_heavy_job_for_its_dominant_share():
    """Both tenants use 1 GPU a job, but ``a`` asks for half a node's CPUs: its
    dominant share is 4x a GPU's, so it is charged 4x and served ~1/4 as much."""
    h = Harness(nodes=1, config=cfg())
    node = h.cell.index.nodes["n0"]
    node.cpus, node.mem_gb = 64.0, 0.0
    h.submit("probe", tenant="a", gpus=1, cpus=32.0, estimate_s=10)
    job = h.cell.jobs["probe"]
    assert h.cell.cost_of(job, 1, 10) == 1 * 10 * 4.0
    h.submit("plain", tenant="b", gpus=1, estimate_s=10)
    assert h.cell.cost_of(h.cell.jobs["plain"], 1, 10) == 10.0


def test_idle_credit_lets_a_returning_tenant_burst_ahead():
    """``a`` runs alone; ``b`` arrives. Without idle credit they alternate at
    once; with credit ``b`` may first run that many GPU-seconds back to back."""

    def first_served(credit: float) -> list[str]:
        h = Harness(nodes=1, config=cfg(idle_credit_gpu_s=credit))
        for j in range(40):
            h.submit(f"a{j}", tenant="a", gpus=8, estimate_s=10)
        for _ in range(20):
            h.start_all()
            key = next(iter(h.cell.runs))
            h.tick(10)
            h.complete(key)
            h.tick(0)
        for j in range(40):
            h.submit(f"b{j}", tenant="b", gpus=8, estimate_s=10)
        served = []
        for _ in range(8):
            h.start_all()
            key = next(iter(h.cell.runs))
            served.append(key[0][0])
            h.tick(10)
            h.complete(key)
            h.tick(0)
        return served

    assert first_served(0.0) == ["a", "b"] * 4
    # 400 GPU-s of credit is five 80 GPU-s jobs: b runs 5 (plus its fair turn)
    # back to back, then alternation resumes
    assert first_served(400.0) == ["a"] + ["b"] * 6 + ["a"]


# -- caps ---------------------------------------------------------------------------


def test_user_max_gpus_caps_one_user_not_the_organisation():
    tenant = TenantConfig("org", user_max_gpus=4)
    h = Harness(nodes=2, config=cfg(tenants=(tenant,)))
    for j in range(8):
        h.submit(f"u1-{j}", tenant="org", user="u1", gpus=2)
        h.submit(f"u2-{j}", tenant="org", user="u2", gpus=2)
    h.tick(1)
    per_user: dict[str, int] = {}
    for run in h.cell.runs.values():
        user = h.admitted[run.job_id].user
        per_user[user] = per_user.get(user, 0) + run.gpus
    assert per_user == {"u1": 4, "u2": 4}, per_user


def test_user_max_running_caps_one_users_concurrent_runs():
    tenant = TenantConfig("org", user_max_running=3)
    h = Harness(nodes=2, config=cfg(tenants=(tenant,)))
    for j in range(8):
        h.submit(f"u1-{j}", tenant="org", user="u1", gpus=1)
    h.submit("u2-0", tenant="org", user="u2", gpus=1)
    h.tick(1)
    users = sorted(h.admitted[r.job_id].user for r in h.cell.runs.values())
    assert users == ["u1", "u1", "u1", "u2"], users


# -- stragglers ---------------------------------------------------------------------


def straggler_cell(slow_rate: float, **kw) -> Harness:
    """Three nodes running the same model; n2's run reports ``slow_rate``
    steps/s against 10 on the others, for 15 heartbeat rounds a second apart.
    One tenant: a single-tenant cell (``straggler_tenants=1``); across tenants,
    test_core_stragglers."""
    kw.setdefault("straggler_tenants", 1)
    h = Harness(nodes=3, config=cfg(**kw))
    for i in range(3):
        h.submit(f"j{i}", gpus=8, checkpoint_interval_s=30, estimate_s=3600, model="m")
    h.start_all()
    for _ in range(15):
        for node_id in ("n0", "n1", "n2"):
            [key] = h.runs_on(node_id)
            rate = slow_rate if node_id == "n2" else 10.0
            h.heartbeat(node_id, runs=(ev.RunReport(job_id=key[0], run=key[1], step_rate=rate),))
        h.tick(1)
    return h


def test_a_straggler_is_moved_and_its_node_degraded_after_its_strikes():
    slow = straggler_cell(2.0)  # below straggler_ratio (0.5) x median 10
    assert slow.cell.index.nodes["n2"].state == "DEGRADED"
    assert slow.cell.runs[("j2", 1)].exit_intent == "straggler"
    ok = straggler_cell(6.0)  # slower, but above half the median
    assert ok.cell.index.nodes["n2"].state == "UP"
    patient = straggler_cell(2.0, straggler_strikes=30)  # more strikes than it gets
    assert patient.cell.index.nodes["n2"].state == "UP"


def test_interactive_preempts_within_its_sla_under_backlog():
    """Under a backlog of batch work (nothing frees for an hour), an interactive
    job waits no more than its tier's sla_wait_s (+ one Tick) before a
    checkpointable batch run is asked to make room."""
    sla = CellConfig().tier("interactive").sla_wait_s
    assert sla <= 5.0
    h = batch_cell(2)
    for i in range(4):
        h.submit(f"queued{i}", gpus=8, tier="batch", estimate_s=3600)
    h.tick(100)
    h.submit("hurry", gpus=2, tier="interactive", estimate_s=30)
    waited, seen = 0, []
    while not seen and waited < 60:
        seen = asked(h.tick(1))
        waited += 1
    assert seen and waited <= sla + 1, (waited, seen)


# -- a user's own queue served by size ------------------------------------------


def first_started(rate: float, gap_s: float) -> str:
    """One GPU frees in a full cell whose one tenant queued a heavy job (1 GPU
    x 1,000 s) and, ``gap_s`` later, a light one (1 GPU x 10 s): which starts."""
    h = Harness(nodes=1, config=cfg(size_order_gpu_s_per_s=rate))
    for i in range(8):
        h.submit(f"busy{i}", tenant="other", estimate_s=3600)
    h.start_all()
    h.submit("heavy", tenant="t", estimate_s=1000)
    h.tick(gap_s)
    h.submit("light", tenant="t", estimate_s=10)
    h.tick(1)
    h.complete(("busy0", 1))
    out = h.tick(1)
    [assigned] = of(out, ev.JobAssigned)
    return assigned.job_id


def test_size_order_puts_a_users_light_job_before_its_heavy_one_within_its_bound():
    """At 1 GPU-s/s a 1,000 GPU-s job is passed over only by jobs admitted
    less than 1,000 s after it; 0 keeps arrival order."""
    assert first_started(1.0, 5) == "light"
    assert first_started(1.0, 1200) == "heavy"  # past the bound
    assert first_started(0.0, 5) == "heavy"  # arrival order
