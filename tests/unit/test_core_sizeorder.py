"""A user's own queue served by size (``CellConfig.size_order_gpu_s_per_s``).

A job's key is its admission time plus its cost over the rate r, so a job of
cost C is passed over only by jobs of its own flow admitted less than
(C - their cost) / r after it: the bound on how long a heavy job waits behind
light ones. Fair share between flows is untouched (the fairness guarantee of
``test_core_fairness.py`` runs under the default knob)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core import CellConfig
from framespool.processors.core.fairshare import leaf_jobs
from framespool.schemas import events as ev
from tests.support.core_harness import Harness

BASE = CellConfig(
    status_interval_s=0, estimate_interval_s=0, heartbeat_timeout_s=1e9, report_lease_s=1e9
)


def full_cell(rate: float) -> Harness:
    """One node, its 8 GPUs held by another tenant's 1-hour jobs."""
    h = Harness(replace(BASE, size_order_gpu_s_per_s=rate), nodes=1)
    for i in range(8):
        h.submit(f"busy{i}", tenant="other", estimate_s=3600)
    h.start_all()
    return h


jobs_st = st.lists(
    st.tuples(st.integers(0, 60), st.sampled_from([5.0, 30.0, 120.0, 600.0, 2400.0])),
    min_size=2,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(jobs=jobs_st, rate=st.sampled_from([0.0, 0.5, 2.0, 20.0]))
def test_a_job_is_passed_over_only_within_its_bound(jobs, rate):
    """One tenant queues 1-GPU jobs of random lengths at random gaps into a
    full cell, then GPUs free one at a time: whenever B (admitted after A)
    starts before A, B was admitted less than (C_A - C_B) / r after A; at
    r = 0 never (arrival order). Each JobQueued's position is the job's place
    in the order its flow serves, and ``own_place`` counts the GPU-seconds up
    to it as a walk of that order does."""
    h = full_cell(rate)
    admitted: dict[str, tuple[float, float]] = {}
    for n, (gap, estimate) in enumerate(jobs):
        h.tick(gap + 1)
        job_id = f"j{n}"
        [queued] = [o for o in h.submit(job_id, estimate_s=estimate) if isinstance(o, ev.JobQueued)]
        admitted[job_id] = (h.now_ms / 1000, estimate)
        leaf = h.cell.leaf_of(h.cell.jobs[job_id])
        order = list(leaf_jobs(leaf))
        assert queued.position == order.index(job_id) + 1
        for other in order:
            place, ahead = h.cell.own_place(h.cell.jobs[other])
            upto = order[: order.index(other) + 1]
            assert place == len(upto)
            assert abs(ahead - sum(h.cell.jobs[j].cost for j in upto)) < 1e-6
    started: list[str] = []
    for i in range(len(jobs)):
        h.complete((f"busy{i % 8}", 1)) if i < 8 else h.complete(h.live_runs()[0])
        out = h.tick(1)
        started += [a.job_id for a in out if isinstance(a, ev.JobAssigned)]
        h.start_all()
    assert sorted(started) == sorted(admitted)
    for i, b in enumerate(started):
        for a in started[i + 1 :]:
            (t_a, c_a), (t_b, c_b) = admitted[a], admitted[b]
            if t_b > t_a:  # b passed a over
                assert rate > 0 and t_b - t_a <= (c_a - c_b) / rate, (a, b)


def test_jobs_queued_before_the_knob_are_keyed_at_the_next_admission():
    """A leaf queued in arrival order (a snapshot from before keys, or the
    knob off) is keyed as a whole when the knob is on at its next admission:
    its older jobs take their place by key, not behind every later job."""
    h = full_cell(0.0)
    h.submit("old-heavy", estimate_s=1000)
    h.tick(5)
    h.submit("old-light", estimate_s=10)
    leaf = h.cell.leaf_of(h.cell.jobs["old-light"])
    assert leaf.keys is None and list(leaf_jobs(leaf)) == ["old-heavy", "old-light"]
    h.cell.config = replace(h.cell.config, size_order_gpu_s_per_s=1.0)
    h.tick(5)
    h.submit("new", estimate_s=100)
    assert list(leaf_jobs(leaf)) == ["old-light", "new", "old-heavy"]
    h.cell.config = replace(h.cell.config, size_order_gpu_s_per_s=0.0)
    h.submit("last", estimate_s=1)
    assert leaf.keys is None
    assert list(leaf_jobs(leaf)) == ["old-heavy", "old-light", "new", "last"]


def test_keys_follow_the_clock_set_by_the_first_tick():
    """Jobs admitted before the cell's first Tick are taken to arrive at it
    (``rebase_time``), keys included: a job admitted then does not keep a
    head start of the whole epoch over the ones after."""
    from framespool.processors.core import Cell

    cell = Cell(replace(BASE, size_order_gpu_s_per_s=1.0))
    spec = ev.JobSpec(job_id="early", tenant="t0", tier="free", gpus=8, estimate_s=1000)
    cell.apply(ev.JobAdmitted(event_id="a1", ts_ms=0, spec=spec))
    start_ms = 1_700_000_000_000
    cell.apply(ev.Tick(event_id="t1", ts_ms=start_ms, cell="cell-0", now_ms=start_ms))
    light = ev.JobSpec(job_id="light", tenant="t0", tier="free", gpus=1, estimate_s=10)
    cell.apply(ev.JobAdmitted(event_id="a2", ts_ms=start_ms, spec=light))
    leaf = cell.leaf_of(cell.jobs["light"])
    assert list(leaf_jobs(leaf)) == ["light", "early"]


def test_own_place_reads_a_bounded_number_of_jobs_in_a_flooded_flow(monkeypatch):
    """Cost model of ``own_place``: exact place, GPU-seconds exact for the
    OWN_PLACE_EXACT nearest jobs and the flow's mean beyond, so an admission
    into a flow of q queued jobs reads O(OWN_PLACE_EXACT) jobs, not O(q)
    (a flood of one admission time put every new job mid-queue)."""
    from framespool.processors.core import jobs as jobs_mod

    monkeypatch.setattr(jobs_mod, "OWN_PLACE_EXACT", 5)
    h = full_cell(1.0)
    estimates = [10.0 * (1 + (n * 37) % 50) for n in range(400)]
    for n, estimate in enumerate(estimates):
        h.submit(f"f{n}", estimate_s=estimate)  # one admission time: order by cost alone
    cell = h.cell
    reads = 0
    plain = cell.jobs

    class Counting(dict):
        def __getitem__(self, key):
            nonlocal reads
            reads += 1
            return dict.__getitem__(self, key)

    for probe in ("f7", "f150", "f399"):
        job = plain[probe]
        leaf = cell.leaf_of(job)
        order = list(leaf_jobs(leaf))
        at = order.index(probe) + 1
        mean = leaf.backlog / leaf.queued
        if at <= len(order) // 2:
            near = order[max(0, at - 5) : at]
            expected = sum(plain[j].cost for j in near) + (at - len(near)) * mean
        else:
            near = order[at : at + 5]
            far = len(order) - at - len(near)
            expected = leaf.backlog - sum(plain[j].cost for j in near) - far * mean
        cell.jobs = Counting(plain)
        reads = 0
        place, gpu_s = cell.own_place(job)
        cell.jobs = plain
        assert place == at
        assert abs(gpu_s - expected) < 1e-6
        assert reads <= 5 + 1
