"""Admission routes by predicted wait across cells (issue #9): the pure core.

Offers (``CellOffer``) arrive on the commands partition like any command; the
routing rule is in ``framespool.processors.core.admission``'s theory of operation.
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from framespool.processors.core.admission import (
    NO_CELL_CAN_RUN,
    AdmissionConfig,
    AdmissionState,
    CellCommand,
    predicted_wait_s,
    rendezvous,
)
from framespool.schemas import events as ev
from tests.support.admission import T0, submit

CELLS = ("cell-0", "cell-1")
PURE_WAIT = AdmissionConfig(cells=CELLS, sticky_slack_s=0.0, sticky_slack_ratio=0.0)


def offer(
    cell: str,
    ts: int = T0,
    nodes: int = 2,
    per_node: int = 8,
    free: int | None = None,
    running_gpu_s: float = 0.0,
    queued: float = 0.0,
    gpu_type: str = "H100",
) -> ev.CellOffer:
    """An offer of ``nodes`` UP nodes of ``per_node`` healthy GPUs; ``queued``
    GPU-seconds ahead of every tier."""
    capacity = nodes * per_node
    free = capacity if free is None else free
    return ev.CellOffer(
        event_id=f"{cell}@{ts}/0",
        ts_ms=ts,
        cell=cell,
        capacity_gpus=capacity,
        free_gpus=free,
        running_gpu_s=running_gpu_s,
        gpu_types=(
            ev.GpuOffer(
                gpu_type=gpu_type,
                healthy_gpus=capacity,
                free_gpus=free,
                largest_job=min(64, capacity),
                groups=(ev.NodeGroup(gpus=per_node, nodes=nodes),) if nodes else (),
            ),
        ),
        tiers=tuple(ev.TierBacklog(tier=t, queued_gpu_s=queued) for t in ("paid", "free")),
    )


def rerouted(job_id: str, from_cell: str, ts: int = T0, tenant: str = "acme", **spec: object):
    return ev.JobRerouted(
        event_id=f"{from_cell}@{ts}/0",
        ts_ms=ts,
        job_id=job_id,
        tenant=tenant,
        from_cell=from_cell,
        reason=f"{from_cell} has no UP nodes",
        spec=ev.JobSpec(job_id=job_id, tenant=tenant, **spec),
    )


def feed(state: AdmissionState, *commands: object) -> list:
    out = []
    for i, c in enumerate(commands):
        out.extend(state.apply(c, f"admission-0@{len(state.counters)}-{i}"))
    return out


def admitted_to(out: list) -> list[str]:
    return [o.cell for o in out if isinstance(o, ev.JobAdmitted)]


def test_the_lowest_predicted_wait_wins():
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0", queued=16 * 600), offer("cell-1", queued=16 * 60))
    assert admitted_to(feed(state, submit("j1"))) == ["cell-1"]
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0", queued=16 * 60), offer("cell-1", queued=16 * 600))
    assert admitted_to(feed(state, submit("j1"))) == ["cell-0"]


def test_the_wait_is_the_cells_own_arithmetic():
    o = offer("cell-0", nodes=2, per_node=8, free=0, running_gpu_s=1600.0, queued=800.0)
    spec = ev.JobSpec(job_id="j", tenant="t", tier="free", gpus=1)
    # the work ahead (800), the job's own GPUs freeing (one mean residual, 1600
    # GPU-s over 16 running GPUs, each), and the share 800 / 1600 of the rest
    # of the running work that the work ahead waits behind, over the capacity
    assert predicted_wait_s(o, spec) == pytest.approx((800 + 100 + 0.5 * 1500) / 16)
    gang = ev.JobSpec(job_id="g", tenant="t", tier="free", gpus=8, gpus_per_node=8)
    assert predicted_wait_s(o, gang) == pytest.approx((800 + 800 + 0.5 * 800) / 16)
    idle = offer("cell-0", free=16)
    assert predicted_wait_s(idle, spec) == 0.0  # nothing ahead and GPUs free
    # work routed there since the offer counts: GPU-seconds ahead, GPUs taken
    assert predicted_wait_s(idle, spec, routed_gpu_s=160.0, routed_gpus=16) == pytest.approx(10)


def test_a_burst_spreads_by_the_work_routed_since_the_offers():
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0", free=0), offer("cell-1", free=0))
    cells = admitted_to(feed(state, *(submit(f"j{i}", estimate_s=600) for i in range(10))))
    assert cells.count("cell-0") == cells.count("cell-1") == 5
    # a fresh offer replaces what was routed before it
    feed(state, offer("cell-0", ts=T0 + 1000, free=0, queued=10.0))
    assert state.routed.get("cell-0") is None and state.routed["cell-1"][1] == 5


def test_never_a_cell_that_cannot_host_the_shape():
    state = AdmissionState(PURE_WAIT)
    # cell-0 is idle but has 16 GPUs; cell-1 is busy but has four 8-GPU nodes
    feed(state, offer("cell-0", nodes=2), offer("cell-1", nodes=4, free=0, queued=1e6))
    out = feed(state, submit("big", gpus=32, gpus_per_node=8))
    assert admitted_to(out) == ["cell-1"]
    # nor a cell whose nodes are too small for the per-node size
    out = feed(state, submit("wide", gpus=16, gpus_per_node=16))
    assert [type(o) for o in out] == [ev.JobRejected]


def test_no_cell_can_host_it_is_rejected_naming_the_largest_job():
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0", nodes=2), offer("cell-1", nodes=3))
    out = feed(state, submit("big", gpus=64, gpus_per_node=8))
    assert [type(o) for o in out] == [ev.JobRejected]
    assert out[0].reason == NO_CELL_CAN_RUN
    assert "largest job any cell can run is 24 GPU(s) (cell-1)" in out[0].detail
    # the decision stands: a retry of the same job id is a duplicate
    assert [type(o) for o in feed(state, submit("big", gpus=64, gpus_per_node=8))] == [
        ev.ReportIgnored
    ]


def test_no_offers_at_all_routes_by_rendezvous_as_before():
    state = AdmissionState(AdmissionConfig(cells=CELLS))
    ids = [f"j{i}" for i in range(20)]
    out = feed(state, *(submit(j) for j in ids))
    assert admitted_to(out) == [rendezvous(j, CELLS) for j in ids]


def test_a_stale_offer_is_unknown_and_fresh_hosts_are_preferred():
    config = AdmissionConfig(cells=CELLS, offer_stale_s=15, sticky_slack_s=0, sticky_slack_ratio=0)
    state = AdmissionState(config)
    # cell-0 looked idle, but its offer is 20 s older than the clock: a dead scheduler
    feed(state, offer("cell-0", ts=T0), offer("cell-1", ts=T0 + 20_000, queued=1e5))
    assert admitted_to(feed(state, submit("j1", ts=T0 + 20_000))) == ["cell-1"]
    # within the staleness it counts again (the knob decides)
    state = AdmissionState(
        AdmissionConfig(cells=CELLS, offer_stale_s=30, sticky_slack_s=0, sticky_slack_ratio=0)
    )
    feed(state, offer("cell-0", ts=T0), offer("cell-1", ts=T0 + 20_000, queued=1e5))
    assert admitted_to(feed(state, submit("j1", ts=T0 + 20_000))) == ["cell-0"]


def test_with_no_fresh_host_an_unknown_cell_is_tried():
    config = AdmissionConfig(cells=CELLS, offer_stale_s=15)
    state = AdmissionState(config)
    # cell-1's fresh offer cannot host 32 GPUs; cell-0 is unknown (stale): try it
    feed(state, offer("cell-0", ts=T0, nodes=0), offer("cell-1", ts=T0 + 60_000, nodes=2))
    out = feed(state, submit("big", ts=T0 + 60_000, gpus=32, gpus_per_node=8))
    assert admitted_to(out) == ["cell-0"]


def _home_and_other(tenant: str) -> tuple[str, str]:
    home = rendezvous(tenant, CELLS)
    return home, next(c for c in CELLS if c != home)


def test_a_fresh_offer_of_a_cell_with_no_up_node_is_unknown_not_a_no():
    state = AdmissionState(PURE_WAIT)
    # both cells just started (no agent registered yet) or lost every node
    feed(state, offer("cell-0", nodes=0), offer("cell-1", nodes=0))
    out = feed(state, submit("j1", gpus=8, gpus_per_node=8))
    assert admitted_to(out) == [rendezvous("j1", CELLS)]
    # one cell with nodes that cannot host it and one empty: the empty one is tried
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0", nodes=0), offer("cell-1", nodes=1))
    assert admitted_to(feed(state, submit("j2", gpus=16, gpus_per_node=8))) == ["cell-0"]


def test_a_tenant_sticks_to_its_home_cell_while_waits_are_close():
    home, other = _home_and_other("acme")
    # home 4 s worse than the other: within max(5 s, 20 %) -> home
    state = AdmissionState(AdmissionConfig(cells=CELLS))
    feed(state, offer(home, free=0, queued=16 * 4.0), offer(other, free=0))
    assert admitted_to(feed(state, submit("j1", estimate_s=1))) == [home]
    # 20 s worse: beyond the slack -> the best cell
    state = AdmissionState(AdmissionConfig(cells=CELLS))
    feed(state, offer(home, free=0, queued=16 * 20.0), offer(other, free=0))
    assert admitted_to(feed(state, submit("j1", estimate_s=1))) == [other]
    # the ratio: 1000 s vs 1150 s is within 20 % of the best, though past 5 s
    state = AdmissionState(AdmissionConfig(cells=CELLS))
    feed(state, offer(home, free=0, queued=16 * 1150.0), offer(other, free=0, queued=16 * 1000.0))
    assert admitted_to(feed(state, submit("j1", estimate_s=1))) == [home]


def test_stickiness_knobs_at_zero_route_purely_by_wait():
    home, other = _home_and_other("acme")
    state = AdmissionState(PURE_WAIT)
    feed(state, offer(home, free=0, queued=16 * 20.0), offer(other, free=0))
    assert admitted_to(feed(state, submit("j1", estimate_s=1))) == [other]
    state = AdmissionState(AdmissionConfig(cells=CELLS, sticky_slack_s=0.0))
    feed(state, offer(home, free=0, queued=16 * 1150.0), offer(other, free=0, queued=16 * 1000.0))
    assert admitted_to(feed(state, submit("j1", estimate_s=1))) == [home]  # the 20 % still holds
    state = AdmissionState(AdmissionConfig(cells=CELLS, sticky_slack_ratio=0.0))
    feed(state, offer(home, free=0, queued=16 * 1150.0), offer(other, free=0, queued=16 * 1000.0))
    assert admitted_to(feed(state, submit("j1", estimate_s=1))) == [other]


def test_the_gpu_type_still_limits_the_candidates():
    config = AdmissionConfig(cells=CELLS, cell_gpu_types={"cell-0": ("A100",), "cell-1": ("H100",)})
    state = AdmissionState(config)
    feed(state, offer("cell-0", gpu_type="A100"), offer("cell-1", gpu_type="H100", queued=1e6))
    assert admitted_to(feed(state, submit("j1", gpu_type="H100"))) == ["cell-1"]


def test_an_older_offer_never_replaces_a_newer_one_and_unknown_cells_are_dropped():
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0", ts=T0 + 5000, queued=1.0), offer("cell-0", ts=T0, queued=2.0))
    assert state.offers["cell-0"].ts_ms == T0 + 5000
    feed(state, offer("cell-7"))
    assert "cell-7" not in state.offers
    assert feed(state, offer("cell-1")) == []  # an offer produces nothing


def test_a_rerouted_job_goes_to_another_cell_once():
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0", queued=1.0), offer("cell-1", queued=1e5))
    assert admitted_to(feed(state, submit("j1"))) == ["cell-0"]
    out = feed(state, rerouted("j1", "cell-0", ts=T0 + 1000))
    assert admitted_to(out) == ["cell-1"]  # the only other cell, though its wait is worse
    assert state.jobs["j1"].cell == "cell-1"
    # a re-delivered reroute, or one from a cell that no longer holds it: nothing
    again = feed(state, rerouted("j1", "cell-0", ts=T0 + 1000))
    assert [type(o) for o in again] == [ev.ReportIgnored]
    assert "stale reroute" in again[0].reason
    # a cancel now goes to the cell that holds it
    cancel = ev.CancelJob(event_id="c", ts_ms=T0 + 2000, job_id="j1", tenant="acme")
    out = feed(state, cancel)
    assert [(type(o), o.cell) for o in out] == [(CellCommand, "cell-1")]


def test_a_rerouted_job_keeps_its_run_numbers_and_checkpoint():
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0"), offer("cell-1"))
    feed(state, submit("j1"))
    moved = dataclasses.replace(
        rerouted("j1", state.jobs["j1"].cell, ts=T0 + 1000), run=3, resume_from="mem://ck"
    )
    [admitted] = feed(state, moved)
    assert (admitted.run, admitted.resume_from) == (3, "mem://ck")
    fresh = feed(state, submit("j2"))[0]
    assert (fresh.run, fresh.resume_from) == (0, None)


def test_a_reroute_with_no_other_cell_is_rejected_with_both_reasons():
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0"), offer("cell-1", nodes=1))
    assert admitted_to(feed(state, submit("j1", gpus=16, gpus_per_node=8))) == ["cell-0"]
    out = feed(state, rerouted("j1", "cell-0", ts=T0 + 1000, gpus=16, gpus_per_node=8))
    assert [type(o) for o in out] == [ev.JobRejected]
    assert out[0].reason == NO_CELL_CAN_RUN
    assert out[0].detail.startswith("cell-0 has no UP nodes; no cell can run 16")
    assert "largest job any cell can run is 8" in out[0].detail


def test_a_cancel_that_raced_the_reroute_ends_the_job():
    state = AdmissionState(PURE_WAIT)
    feed(state, offer("cell-0"), offer("cell-1", queued=1e5))
    feed(state, submit("j1"))
    cancel = ev.CancelJob(event_id="c", ts_ms=T0 + 500, job_id="j1", tenant="acme")
    assert [o.cell for o in feed(state, cancel)] == ["cell-0"]
    # cell-0 had already given it up, so it ignored the cancel; the reroute comes after
    out = feed(state, rerouted("j1", "cell-0", ts=T0 + 1000))
    assert [type(o) for o in out] == [ev.JobCancelled]
    assert "cancelled while cell-0 gave it up" in out[0].reason


def test_a_reroute_of_an_expired_decision_is_routed_and_remembered_again():
    config = AdmissionConfig(cells=CELLS, idempotency_horizon_s=60)
    state = AdmissionState(config)
    feed(state, submit("j1"), submit("j2", ts=T0 + 120_000))  # j1 forgotten
    assert "j1" not in state.jobs
    out = feed(state, rerouted("j1", "cell-0", ts=T0 + 130_000))
    assert admitted_to(out) == ["cell-1"]
    assert [type(o) for o in feed(state, rerouted("j1", "cell-0", ts=T0 + 130_000))] == [
        ev.ReportIgnored
    ]


def test_a_decision_made_again_expires_once_with_bounded_state():
    config = AdmissionConfig(cells=CELLS, idempotency_horizon_s=60)
    state = AdmissionState(config)
    feed(state, submit("j1"), submit("j2"))
    feed(state, rerouted("j1", rendezvous("j1", CELLS), ts=T0 + 30_000))  # j1 decided again
    assert list(state.expiry) == ["j1", "j2", "j1"] and state.superseded == {"j1": 1}
    feed(state, submit("j3", ts=T0 + 70_000))  # j2 expires; j1's newer decision stands
    assert set(state.jobs) == {"j1", "j3"} and state.superseded == {}
    feed(state, submit("j4", ts=T0 + 100_000))
    assert set(state.jobs) == {"j3", "j4"} and list(state.expiry) == ["j3", "j4"]


def test_the_same_log_gives_the_same_decisions_and_state():
    log = [
        offer("cell-0", ts=T0, free=4, queued=100.0),
        offer("cell-1", ts=T0, nodes=4, free=0, queued=50.0),
        *(submit(f"j{i}", tenant=f"t{i % 3}", ts=T0 + i, gpus=1 + i % 4) for i in range(30)),
        offer("cell-0", ts=T0 + 5000, nodes=0),
        rerouted("j3", "cell-0", ts=T0 + 6000),
        submit("big", ts=T0 + 6000, gpus=32, gpus_per_node=8),
        offer("cell-1", ts=T0 + 30_000, nodes=4),
        submit("late", ts=T0 + 30_000),
    ]
    runs = []
    for _ in range(2):
        state = AdmissionState(AdmissionConfig(cells=CELLS))
        out = [state.apply(c, f"admission-0@{i}") for i, c in enumerate(log)]
        runs.append((out, pickle.dumps(state)))
    assert runs[0] == runs[1]


def test_a_snapshot_from_before_offers_loads_with_none():
    state = AdmissionState(AdmissionConfig(cells=CELLS))
    feed(state, submit("j1"))
    old = pickle.loads(pickle.dumps(state))
    for name in ("offers", "routed", "superseded"):
        del old.__dict__[name]
    restored = pickle.loads(pickle.dumps(old))
    assert restored.offers == {} and restored.routed == {} and restored.superseded == {}
    assert admitted_to(feed(restored, submit("j2"))) == [rendezvous("j2", CELLS)]


@pytest.mark.parametrize(
    "bad",
    [
        {"offer_stale_s": 0},
        {"offer_stale_s": -1},
        {"sticky_slack_s": -1},
        {"sticky_slack_ratio": -0.1},
        {"sticky_slack_ratio": 1.5},
    ],
)
def test_routing_knobs_are_validated(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        AdmissionConfig(cells=CELLS, **bad)
