"""Knob tests (issue #10) for two policies that had none: admission by
predicted wait (``TierConfig.max_predicted_wait_s``) and the preemption churn
limit on a preemption that needs several victims at once. Each has a control
that changes the outcome, so a broken knob fails its test.

The predicted-wait limit is the edge's (the API at submit, the simulator's
submit): the cell publishes each tier's limit and backlog in its offer, and
``offers.wait_refusal`` refuses from it; the cell itself queues whatever was
admitted. The API's 429 is test_api_predicted_wait; the simulator's refusal is
at the end of this part."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig, AdmissionState, rendezvous
from framespool.processors.core.offers import Own, live_offers, wait_refusal
from framespool.processors.sim import POLICIES, SimOptions, Simulation, synthetic
from framespool.schemas import events as ev
from tests.support.core import asked, cfg, of, tiers
from tests.support.core_harness import Harness


def with_tier_limit(tier: str, limit_s: float, **kw) -> CellConfig:
    return replace(cfg(**kw), tiers=tiers(limit_s, tier))


# -- admission by predicted wait ----------------------------------------------------


def busy_cell(config: CellConfig) -> Harness:
    """One 8-GPU node running one 8-GPU job estimated at an hour, so a new
    8-GPU job is told about an hour."""
    h = Harness(nodes=1, config=config)
    h.submit("long", gpus=8, tier="paid", estimate_s=3600)
    h.start_all()
    h.tick(10)
    return h


def refusal(h: Harness, tier: str, gpus: int = 8, estimate_s: float = 60):
    """What the edge decides for a job from the cell's offer now."""
    offer = ev.CellOffer(event_id="o", ts_ms=h.now_ms, **h.cell.offer_fields())
    live = live_offers({offer.cell: offer}, [offer.cell], h.now_ms, 15.0)
    spec = ev.JobSpec(
        job_id="late",
        tenant="acme",
        tier=tier,
        gpus=gpus,
        gpus_per_node=gpus,
        estimate_s=estimate_s,
    )
    return wait_refusal(live, spec)


def test_a_job_predicted_to_wait_past_its_tier_limit_is_refused_with_the_reason():
    h = busy_cell(with_tier_limit("free", 600))
    refused = refusal(h, "free")
    assert refused is not None and refused.cell == h.cell.cell_id
    # the wait, the tier, its limit, and what to do about it
    assert "predicted wait 3590s" in refused.message
    assert "free tier limit of 600s" in refused.message
    assert "retry later or use a higher tier" in refused.message
    assert refused.retry_after_s == 2990


def test_the_predicted_wait_limit_binds_only_its_own_tier_and_only_past_the_limit():
    """Controls: the same job in a tier without a limit, or under a limit above
    its predicted wait, or while the node is free, is not refused."""
    h = busy_cell(with_tier_limit("free", 600))
    assert refusal(h, "paid") is None
    assert refusal(busy_cell(with_tier_limit("free", 7200)), "free") is None
    assert refusal(busy_cell(with_tier_limit("free", 0)), "free") is None  # 0 = no limit
    h = Harness(nodes=1, config=with_tier_limit("free", 1))
    assert refusal(h, "free") is None  # it would start now: wait 0


def test_the_cell_queues_a_job_past_its_limit_it_no_longer_rejects_after_the_202():
    """Whatever the edge let through (a stale offer, a burst since the offer) is
    queued: a job the API accepted is never rejected later for its wait."""
    h = busy_cell(with_tier_limit("free", 600))
    assert refusal(h, "free") is not None  # the edge would have refused it
    out = h.submit("late", gpus=8, tier="free", estimate_s=60)
    assert of(out, ev.JobQueued) and not of(out, ev.JobRejected)
    assert "late" in h.cell.jobs


def flooded_cell() -> Harness:
    """One 8-GPU node running a 10-minute paid job, and 40 free-tier 8-GPU jobs
    of an hour queued by one tenant (flood): the free tier's backlog alone is
    40 hours of the cell."""
    h = Harness(nodes=1, config=with_tier_limit("free", 1200))
    h.submit("running", tenant="calm", gpus=8, tier="paid", estimate_s=600)
    h.start_all()
    for i in range(40):
        h.submit(f"flood-{i}", tenant="flood", gpus=8, tier="free", estimate_s=3600)
    h.tick(10)
    return h


def own_place(h: Harness, tenant: str, own: Own | None, estimate_s=3600.0):
    offer = ev.CellOffer(event_id="o", ts_ms=h.now_ms, **h.cell.offer_fields())
    live = live_offers({offer.cell: offer}, [offer.cell], h.now_ms, 15.0)
    spec = ev.JobSpec(
        job_id="next", tenant=tenant, tier="free", gpus=8, gpus_per_node=8, estimate_s=estimate_s
    )
    return wait_refusal(live, spec, None, own)


def test_one_tenants_flood_does_not_get_the_other_tenants_of_its_tier_refused():
    """A tenant with nothing waiting starts ahead of the flood (fair share), so
    the edge tells it the running work's wait (~10 min, under the 20 min limit),
    not the flood's 40 hours; the flooding tenant, 40 jobs of 8 GPUs for an
    hour waiting, is refused by its own place. Control: by the tier's whole
    backlog (no own place: the routing figure) the newcomer would be refused."""
    h = flooded_cell()
    assert h.cell.tenant_jobs("flood") == (40, 0) and h.cell.tenant_jobs("newcomer") == (0, 0)
    assert own_place(h, "newcomer", Own()) is None
    refused = own_place(h, "flood", Own(waiting_gpu_s=40 * 8 * 3600))
    assert refused is not None and refused.wait_s > 39 * 3600, refused
    control = own_place(h, "newcomer", None)
    assert control is not None and control.wait_s > 39 * 3600
    # a tenant with a few jobs of its own waiting is told those, not the flood's
    few = own_place(h, "modest", Own(waiting_gpu_s=1 * 8 * 60.0), estimate_s=60.0)
    assert few is None


def test_a_tenant_holding_much_of_the_cell_is_told_the_wait_behind_those_it_leads():
    """A run is charged its estimate as it starts, so a tenant with much running
    leads the tier's least virtual time by at least that much: with 3 GPU-hours
    running and nothing waiting it is served after 3 GPU-hours of the flood
    (the fair order alternates), so it is told past the 20 min limit, where a
    tenant holding nothing is not. Control: the running lead left out."""
    h = flooded_cell()
    busy = Own(waiting_gpu_s=0.0, running_gpu_s=3 * 3600.0)
    refused = own_place(h, "busy", busy)
    assert refused is not None and refused.wait_s > 3 * 3600 / 8, refused
    assert own_place(h, "busy", busy._replace(running_gpu_s=0.0)) is None


def test_the_offer_samples_the_fair_order_of_each_tiers_backlog():
    """``fair_gpu_s``: what the fair order serves of the tier's backlog by each
    step of a newcomer's progress, then the whole backlog; empty for a tier
    with nothing queued. One flood of 40 x 8 GPU-hours: a newcomer with d
    GPU-seconds served sees d of the flood served beside it (equal weights)."""
    from framespool.processors.core.drain import FAIR_STEPS_GPU_S

    h = flooded_cell()
    tiers = {t.tier: t for t in h.cell.offer_fields()["tiers"]}
    free = tiers["free"]
    assert tiers["paid"].fair_gpu_s == () and tiers["interactive"].fair_gpu_s == ()
    assert len(free.fair_gpu_s) == len(FAIR_STEPS_GPU_S) + 1
    assert free.fair_gpu_s[-1] == 40 * 8 * 3600
    # the flood's virtual time is the tier's least: its backlog is served from 0
    assert list(free.fair_gpu_s[:-1]) == [min(d, 40 * 8 * 3600) for d in FAIR_STEPS_GPU_S]
    # only the edge reads it, for a tier with a limit: none, nothing computed
    h.cell.config = with_tier_limit("free", 0)
    (unlimited,) = [t for t in h.cell.offer_fields()["tiers"] if t.tier == "free"]
    assert unlimited.queued_gpu_s == free.queued_gpu_s and unlimited.fair_gpu_s == ()


def routed_cell(limit_s: float) -> str:
    """Where admission sends a free-tier job of acme when its home cell predicts
    115 s and the other cell 100 s (within the default stickiness slack, 20 %)."""
    cells = ("cell-0", "cell-1")
    home = rendezvous("acme", cells)
    state = AdmissionState(AdmissionConfig(cells=cells))
    for cell in cells:
        wait = 115.0 if cell == home else 100.0
        groups = (ev.NodeGroup(gpus=8, nodes=2),)
        state.apply(
            ev.CellOffer(
                event_id=f"{cell}@1/0",
                ts_ms=1000,
                cell=cell,
                capacity_gpus=16,
                gpu_types=(ev.GpuOffer(gpu_type="H100", healthy_gpus=16, groups=groups),),
                tiers=(ev.TierBacklog(tier="free", queued_gpu_s=16 * wait, max_wait_s=limit_s),),
            )
        )
    spec = ev.JobSpec(job_id="j", tenant="acme", tier="free", gpus=8, gpus_per_node=8)
    out = state.apply(ev.SubmitJob(event_id="s", ts_ms=1000, spec=spec))
    (admitted,) = of(out, ev.JobAdmitted)
    return "home" if admitted.cell == home else "best"


def test_stickiness_never_takes_a_job_past_its_tier_limit_the_best_cell_keeps():
    """The edge let the job in by the best cell's wait (100 s, limit 110 s):
    admission may not then send it to the tenant's home cell at 115 s. Controls:
    no limit, or a limit above the home cell's wait, and the home cell wins."""
    assert routed_cell(110.0) == "best"
    assert routed_cell(0.0) == "home"
    assert routed_cell(120.0) == "home"


def test_the_simulators_submit_refuses_past_the_limit_as_the_edge_does():
    """``framespool simulate`` plays the edge at submit (processors/sim/edge.py):
    a flood of free-tier work on a small fleet is refused past a 60 s limit and
    counted as ``predicted_wait`` rejections; without the limit none is."""

    def run(limit_s: float) -> dict:
        workload = synthetic("steady", 300, 3, capacity_gpus=16, load=2.0)
        opts = SimOptions(nodes=2, gpus_per_node=8, max_sim_s=3600)
        return Simulation(
            workload, POLICIES["framespool"], opts, CellConfig(tiers=tiers(limit_s))
        ).run()

    limited, free = run(60.0), run(0.0)
    assert limited["rejections"].get("predicted_wait", 0) > 0, limited["rejections"]
    assert "predicted_wait" not in free["rejections"]


# -- churn limit on a multi-victim preemption ---------------------------------------


def small_batch_cell(**kw) -> Harness:
    """One node full of eight 1-GPU checkpointable batch runs, started at t=1."""
    h = Harness(nodes=1, config=cfg(min_run_before_preempt_s=0, **kw))
    for i in range(8):
        h.submit(
            f"b{i}",
            tenant=f"t{i}",
            gpus=1,
            tier="batch",
            preemptible=True,
            checkpoint_interval_s=30,
            estimate_s=3600,
        )
    h.start_all()
    return h


def test_a_preemption_needing_more_victims_than_the_churn_limit_allows_takes_none():
    """An 8-GPU interactive job needs all eight 1-GPU runs to leave. With 4
    preemptions a minute it may not take four and wait for the rest (churn for
    nothing): it takes none, every minute, while the limit stays below 8."""
    h = small_batch_cell(preemptions_per_minute=4)
    h.tick(100)
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    for _ in range(5):
        assert asked(h.tick(30)) == []
    assert h.cell.preempt_times == []
    assert all(h.cell.runs[(f"b{i}", 1)].phase == "running" for i in range(8))
    # the job says why it waits: the churn limit, not "no capacity"
    assert h.cell.jobs["hurry"].reason.startswith("waiting: preemption churn limit reached")
    assert "needs 8 victims, 4 of 4 a minute left" in h.cell.jobs["hurry"].reason


def test_a_multi_victim_preemption_within_the_limit_takes_all_its_victims_at_once():
    """Control: the same cell with room for eight victims asks all eight at once."""
    h = small_batch_cell(preemptions_per_minute=8)
    h.tick(100)
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    seen = []
    for _ in range(5):
        seen += asked(h.tick(30))
    assert seen == [f"b{i}" for i in range(8)]
    assert len(h.cell.preempt_times) == 8


def test_victims_already_taken_this_minute_count_against_a_multi_victim_preemption():
    """Room is what is left of the minute's limit: with 8 a minute and 2 already
    taken, an 8-victim preemption waits for the window to slide, then goes."""
    h = small_batch_cell(preemptions_per_minute=8)
    h.tick(100)
    h.cell.preempt_times = [h.now_ms - 1000, h.now_ms - 1000]  # two victims a second ago
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    assert asked(h.tick(10)) == []  # 6 of room < 8 victims
    assert "needs 8 victims, 6 of 8 a minute left" in h.cell.jobs["hurry"].reason
    assert asked(h.tick(10)) == []
    seen = []
    for _ in range(4):
        seen += asked(h.tick(15))  # the two leave the window 60 s after they were taken
    assert seen == [f"b{i}" for i in range(8)]


# -- the edge's own place: properties over random tiers -----------------------------

_orgs = st.lists(
    st.tuples(
        st.sampled_from([0.5, 1.0, 2.0]),  # weight
        st.floats(0, 50_000),  # settled usage
        st.floats(0, 20_000),  # running (charged, not settled)
        st.lists(st.floats(1, 30_000), min_size=1, max_size=4),  # queued jobs' GPU-seconds
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    _orgs,
    st.floats(0, 100_000),
    st.lists(st.floats(0, 200_000), min_size=2, max_size=6),
    st.floats(0, 100_000),
)
def test_the_edges_own_place_is_never_past_the_tier_and_grows_with_what_the_tenant_waits_on(
    orgs, above, owns, running
):
    """For any tier of backlogged organisations (weights, usage, running work,
    queues) and work queued in more important tiers: a tenant's work ahead is
    at least the more important tiers', at most the tier-level figure (the wait
    behind everything queued), never falls as its own waiting work grows nor
    with what it has running, and is the tier-level figure once its own work
    passes the offer's last step."""
    from framespool.processors.core.drain import FAIR_STEPS_GPU_S, fair_served
    from framespool.processors.core.fairshare import FairTree
    from framespool.processors.core.offers import fair_ahead_gpu_s

    tree = FairTree()
    for i, (weight, settled, running, jobs) in enumerate(orgs):
        leaf = tree.leaf(("free", f"org{i}", "u"), (1.0, weight, 1.0))
        tree.charge_start(leaf, settled + running)
        tree.charge_end(leaf, settled + running, settled)
        tree.charge_start(leaf, running)
        for j, cost in enumerate(jobs):
            tree.push(leaf, f"j{i}-{j}", cost)
    flow = tree.root.children["free"]
    fair = fair_served(flow)
    backlog = ev.TierBacklog(
        tier="free", queued_gpu_s=round(above + flow.backlog, 3), fair_gpu_s=fair
    )
    assert list(fair[:-1]) == sorted(fair[:-1]) and fair[-1] == round(flow.backlog, 3)
    ahead = [fair_ahead_gpu_s(backlog, Own(own, running)) for own in sorted(owns)]
    assert all(above - 0.01 <= a <= backlog.queued_gpu_s for a in ahead), ahead
    assert all(b >= a - 1e-6 for a, b in zip(ahead, ahead[1:])), ahead
    # what it holds running never makes it look ahead of where it would be without
    assert all(
        fair_ahead_gpu_s(backlog, Own(own, running)) >= fair_ahead_gpu_s(backlog, Own(own)) - 1e-6
        for own in owns
    )
    assert fair_ahead_gpu_s(backlog, Own(FAIR_STEPS_GPU_S[-1] + 1)) == backlog.queued_gpu_s
