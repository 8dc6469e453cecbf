"""Calibrated wait bands: the core learns P50/P90 from observed waits; the job
view, its timeline (what SSE streams), ``framespool status`` and the
simulator's quality tables publish them."""

from __future__ import annotations

import argparse
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.commands import jobs as job_commands
from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.waitbands import (
    FLOOR_S,
    HALVE_AT,
    HELD,
    HELD_FLOOR_S,
    HELD_WAIT_CLASS,
    KEEP_REFRESHES,
    MIN_REFRESH_SAMPLES,
    MIN_SAMPLES,
    PRIOR,
    REFRESH,
    REFRESH_HALVE_AT,
    SIGMA_JOB,
    SIGMA_SYS,
    WAIT,
    WAIT_FLOOR_S,
    Z90,
    WaitBands,
    depth_prior,
    estimate_class,
)
from framespool.processors.sim.quality import (
    WaitRow,
    calibration_table,
    noisy_neighbour_table,
)
from framespool.projections.jobs import QUEUED, fold
from framespool.projections.serde import public_job
from framespool.schemas import events as ev
from tests.support.projections import lifecycle


def _observe(bands: WaitBands, ratios: list[float], tier: str = "paid", point: float = 600.0):
    """Jobs told ``point`` seconds that then waited ``ratio`` times as long (with the floor)."""
    for i, ratio in enumerate(ratios):
        job_id = f"j{len(bands.pending)}-{i}-{ratio}"
        bands.admitted(job_id, tier, 0, point)
        actual_s = (point + FLOOR_S) * ratio - FLOOR_S
        bands.started(job_id, int(actual_s * 1000))


def test_band_moves_toward_the_observed_ratios():
    bands = WaitBands()
    assert bands.band("paid", 600.0) == (
        (600 + FLOOR_S) * PRIOR[0] - FLOOR_S,
        (600 + FLOOR_S) * PRIOR[1] - FLOOR_S,
    )
    # Waits ran 2x to 8x the estimate (log-uniform): median 4x, 95th ~7.3x.
    ratios = [2 ** (1 + 2 * k / 199) for k in range(200)]
    _observe(bands, ratios)
    p50, p90 = bands.band("paid", 600.0)
    m50, m90 = (p50 + FLOOR_S) / (600 + FLOOR_S), (p90 + FLOOR_S) / (600 + FLOOR_S)
    assert math.isclose(m50, 4.0, rel_tol=0.06)
    assert 6.5 < m90 < 8.2
    # another tier learned nothing: still the prior
    assert bands.band("free", 600.0) == (
        (600 + FLOOR_S) * PRIOR[0] - FLOOR_S,
        (600 + FLOOR_S) * PRIOR[1] - FLOOR_S,
    )


def test_quantiles_are_read_within_their_bucket_not_at_its_centre():
    # log2 ratios spread evenly over [1/32, 1 + 1/32): the median 2 ** (17/32)
    # lies on a bucket's edge (buckets are 1/16 wide, centred on multiples of
    # 1/16), so its centre would be 2.2 % off; the P90 is 2 ** (29.8/32)
    bands = WaitBands()
    _observe(bands, [2 ** ((1 + 32 * (k + 0.5) / 1600) / 32) for k in range(1600)])
    p50, p90 = bands.band("paid", 600.0)
    m50, m90 = (p50 + FLOOR_S) / (600 + FLOOR_S), (p90 + FLOOR_S) / (600 + FLOOR_S)
    assert math.isclose(m50, 2 ** (17 / 32), rel_tol=0.003)
    assert math.isclose(m90, 2 ** (29.8 / 32), rel_tol=0.003)


def test_without_calibration_the_band_stays_at_the_prior():
    learned, frozen = WaitBands(), WaitBands(enabled=False)
    ratios = [0.25] * 100  # jobs start four times sooner than estimated
    _observe(learned, ratios)
    _observe(frozen, ratios)
    assert learned.band("paid", 600.0)[0] < 0.3 * frozen.band("paid", 600.0)[0]
    assert frozen.band("paid", 600.0) == ((600 + FLOOR_S) * PRIOR[0] - FLOOR_S,) + (
        (600 + FLOOR_S) * PRIOR[1] - FLOOR_S,
    )


def test_a_job_that_never_started_teaches_nothing():
    bands = WaitBands()
    bands.admitted("gone", "paid", 0, 100.0)
    bands.forget("gone")
    bands.started("gone", 10_000_000)
    assert bands.pending == {} and bands.hists == {}


def test_cell_publishes_a_band_that_learns_from_starts():
    cell = Cell(CellConfig(status_interval_s=0, estimate_interval_s=0), "c")
    cell.apply(
        ev.NodeRegistered(event_id="r", ts_ms=0, node_id="n0", incarnation=1, cell="c", gpus=1)
    )
    cell.apply(ev.Tick(event_id="t0", ts_ms=1000, cell="c", now_ms=1000))
    queued = []
    for i in range(3):
        spec = ev.JobSpec(
            job_id=f"q{i}", tenant="x", tier="paid", gpus=1, gpus_per_node=1, estimate_s=60
        )
        out = cell.apply(ev.JobAdmitted(event_id=f"a{i}", ts_ms=1000, spec=spec))
        queued += [o for o in out if isinstance(o, ev.JobQueued)]
    assert len(queued) == 3
    for q in queued:
        assert 0 <= q.wait_p50_s <= q.wait_p90_s
    assert set(cell.wait_bands.pending) == {"q1", "q2"}  # q0 started at once
    # q0 started in its admission's pass: it was told 0 (its wait) and, never
    # having waited, teaches nothing; q1 and q2 were passed over and told a wait
    assert (queued[0].wait_estimate_s, queued[0].wait_p50_s, queued[0].wait_p90_s) == (0, 0, 0)
    assert all(q.wait_estimate_s > 0 for q in queued[1:])
    assert cell.wait_bands.hists == {}
    cell.apply(ev.Tick(event_id="t1", ts_ms=5_000, cell="c", now_ms=5_000))
    cell.apply(
        ev.RunCompleted(
            event_id="done", ts_ms=5_000, job_id="q0", run=1, node_id="n0", incarnation=1
        )
    )
    cell.apply(ev.Tick(event_id="t2", ts_ms=6_000, cell="c", now_ms=6_000))
    assert {k: h.total for k, h in cell.wait_bands.hists.items()} == {
        ("paid/0", estimate_class(queued[1].wait_estimate_s)): 1.0,
        ("paid/0", -1): 1.0,
        ("paid/0", WAIT + estimate_class(queued[1].wait_estimate_s)): 1.0,  # its wait's frame
    }  # q1 started when q0 ended: the first wait learned, under its tier and
    # shape class (``band_key``: 1 GPU is class 0)


def test_view_timeline_and_public_job_carry_the_band():
    events = lifecycle("j1")
    events = [e for e in events if not isinstance(e, ev.JobWaitEstimated)]
    at = next(i for i, e in enumerate(events) if isinstance(e, ev.JobQueued))
    events[at] = ev.JobQueued(**{**_fields(events[at]), "wait_p50_s": 40.0, "wait_p90_s": 300.0})
    view = fold(events[: at + 1])
    assert view.state == QUEUED and (view.wait_p50_s, view.wait_p90_s) == (40.0, 300.0)
    assert "P50 40s, P90 300s" in view.timeline[-1].summary  # what SSE streams
    doc = public_job(view)
    assert doc["wait_p50_s"] == 40.0 and doc["wait_p90_s"] == 300.0
    refreshed = ev.JobWaitEstimated(
        event_id="w2", ts_ms=view.updated_ms + 1, job_id="j1", wait_estimate_s=5.0,
        position=1, wait_p50_s=8.0, wait_p90_s=90.0,
    )  # fmt: skip
    view = fold([refreshed], view)
    assert (view.wait_p50_s, view.wait_p90_s) == (8.0, 90.0)
    assert "P50 8s, P90 90s" in view.timeline[-1].summary
    after = fold(events[at + 1 : at + 2], view)  # assigned: no more waiting
    assert (after.wait_p50_s, after.wait_p90_s) == (-1.0, -1.0)
    assert public_job(after)["wait_p50_s"] is None


def _fields(event) -> dict:
    return {name: getattr(event, name) for name in event.__dataclass_fields__}


def test_status_command_prints_the_band(monkeypatch, capsys):
    class FakeClient:
        def status(self, job_id):
            return {"job_id": job_id, "state": "QUEUED", "run": 0, "progress": 0.0,
                    "reason": "fair-share queue", "wait_p50_s": 42.4, "wait_p90_s": 610.0}  # fmt: skip

    monkeypatch.setattr(job_commands, "client_for", lambda args: FakeClient())
    args = argparse.Namespace(job_id="j1", json=False)
    assert job_commands.status(args) == 0
    assert "wait P50 ~42s, P90 ~610s" in capsys.readouterr().out


def test_calibration_table_counts_shares_per_tier():
    rows = [
        WaitRow("paid", "a", 10.0, 20.0, 50.0),  # under both
        WaitRow("paid", "a", 30.0, 20.0, 50.0),  # under P90 only
        WaitRow("paid", "b", 60.0, 20.0, 50.0),  # over both
        WaitRow("paid", "b", 0.0, 0.0, 30.0),  # a tie at 0 counts as under
        WaitRow("free", "c", 5.0, -1.0, -1.0),  # no band: not rated
        WaitRow("free", "c", 5.0, 10.0, 10.0),
    ]
    table = calibration_table(rows)
    assert table["paid"] == {
        "n": 4,
        "le_p50": 0.5,
        "le_p90": 0.75,
        "waited": 3,
        "told_0": 1,
        "told_0_right": 1.0,  # told "starts now" and it did
        "told_pos": 3,
        "told_pos_le_p50": round(1 / 3, 4),
        "told_pos_le_p90": round(2 / 3, 4),
    }
    assert table["free"] == {
        "n": 1,
        "le_p50": 1.0,
        "le_p90": 1.0,
        "waited": 1,
        "told_0": 0,
        "told_0_right": None,
        "told_pos": 1,
        "told_pos_le_p50": 1.0,
        "told_pos_le_p90": 1.0,
    }
    assert table["all"]["n"] == 5 and table["all"]["le_p50"] == 0.6


def test_noisy_neighbour_table_splits_light_from_heavy_tenants():
    jobs = {"big": 10, "mid": 5, "one": 1, "two": 2}
    volume = {"big": 1e6, "mid": 1e3, "one": 10.0, "two": 20.0}
    rows = [WaitRow("paid", "big", float(w), -1, -1) for w in range(10)]
    rows += [WaitRow("paid", "mid", 99.0, -1, -1)]
    rows += [WaitRow("paid", "one", 1.0, -1, -1), WaitRow("paid", "two", 3.0, -1, -1)]
    rows += [WaitRow("paid", "two", 5.0, -1, -1), WaitRow("free", "one", 7.0, -1, -1)]
    table = noisy_neighbour_table(rows, jobs, volume)
    assert (table["light_tenants"], table["heavy_tenants"]) == (2, 1)
    paid = table["tiers"]["paid"]
    assert paid["light"] == {"tenants": 2, "jobs": 3, "p50_s": 3.0, "p90_s": 5.0}
    assert paid["heavy"] == {"tenants": 1, "jobs": 10, "p50_s": 4.0, "p90_s": 8.0}
    free = table["tiers"]["free"]
    assert free["light"]["jobs"] == 1 and free["heavy"] == {
        "tenants": 0,
        "jobs": 0,
        "p50_s": None,
        "p90_s": None,
    }


def test_jobs_queued_past_the_p90_widen_it_before_they_start():
    bands = WaitBands()
    _observe(bands, [1.0] * 100)  # so far every job started when estimated
    before = bands.band("paid", 600.0)[1]
    for i in range(40):  # 40 jobs told 600 s still queued after 3000 s
        bands.admitted(f"late{i}", "paid", 0, 600.0)
    bands.censor(3_000_000)
    after = bands.band("paid", 600.0)[1]
    assert after > 2 * before
    bands.censor(0)  # at admission time nobody is late: back to what was learned
    assert bands.band("paid", 600.0)[1] == before


def _deep_queue_shares(depth_aware: bool, jobs: int = 1000) -> tuple[float, float]:
    """A flood into a fresh cell: ``jobs`` jobs admitted at once, every one
    before any queued job starts (so nothing is learned in time). A job
    ``n`` jobs deep is told the fluid point estimate (n jobs' estimated run
    time over the capacity); its actual wait is the same sum of *actual* run
    times, each job's a lognormal draw whose mean is its estimate (log-spread
    0.55: a relative spread of ~0.59, the prior's ``SIGMA_JOB``), times one
    factor for the whole queue (log-normal, ``SIGMA_SYS``: the queue's run
    times against its estimates, which no depth averages away). Depths are
    log-uniform from 2 to 2000, each job an independent queue so the shares
    are a fair sample. Returns the shares of jobs that waited at most their
    P50 and their P90."""
    rng = random.Random(7)
    bands = WaitBands()
    mean_s, capacity = 100.0, 16
    le50 = le90 = 0
    for k in range(jobs):
        depth = int(2 * 1000 ** (k / (jobs - 1)))
        point = depth * mean_s / capacity
        p50, p90 = bands.band("paid", point, float(depth) if depth_aware else 1.0)
        ran = sum(rng.lognormvariate(0.0, 0.55) for _ in range(depth)) / math.exp(0.55**2 / 2)
        actual = ran * rng.lognormvariate(0.0, SIGMA_SYS) * mean_s / capacity
        le50 += actual <= p50
        le90 += actual <= p90
    return le50 / jobs, le90 / jobs


def test_a_deep_queue_admitted_at_once_gets_calibrated_bands_from_the_depth_prior():
    """The flood case: the learned ratios come too late, so the prior must be
    honest for a deep queue. With the fixed one-job prior (P90 = 3x the point)
    every job lands under its P90; the depth prior narrows the band with the
    square root of the jobs ahead."""
    le50, le90 = _deep_queue_shares(depth_aware=True)
    assert 0.40 <= le50 <= 0.60, le50
    assert 0.85 <= le90 <= 0.95, le90
    # control: without the depth the band is the one-job prior, far too wide
    _, wide = _deep_queue_shares(depth_aware=False)
    assert wide > 0.98, wide


def test_the_depth_prior_is_the_old_prior_one_job_deep_and_narrows_after():
    assert depth_prior(1.0) == PRIOR and depth_prior(0.0) == PRIOR
    m90s = [depth_prior(d)[1] for d in (2.0, 10.0, 100.0, 10_000.0)]
    assert m90s == sorted(m90s, reverse=True) and m90s[0] < PRIOR[1]
    # a floor remains: what the sum does not average away (SIGMA_SYS), and no more
    floor = math.exp(Z90 * SIGMA_SYS)
    assert SIGMA_SYS > 0 and floor < m90s[-1] < floor * 1.01
    assert m90s[-1] == math.exp(Z90 * math.sqrt(SIGMA_SYS**2 + SIGMA_JOB**2 / 10_000.0))


def test_cell_gives_a_deep_job_a_narrower_band_than_a_shallow_one():
    cell = Cell(CellConfig(status_interval_s=0, estimate_interval_s=0), "c")
    cell.apply(
        ev.NodeRegistered(event_id="r", ts_ms=0, node_id="n0", incarnation=1, cell="c", gpus=8)
    )
    cell.apply(ev.Tick(event_id="t0", ts_ms=1000, cell="c", now_ms=1000))
    queued = []
    for i in range(400):
        spec = ev.JobSpec(
            job_id=f"q{i}", tenant="x", tier="paid", gpus=1, gpus_per_node=1, estimate_s=60
        )
        out = cell.apply(ev.JobAdmitted(event_id=f"a{i}", ts_ms=1000, spec=spec))
        queued += [o for o in out if isinstance(o, ev.JobQueued)]
    # q0-q7 started at once and end together, 60 s on: the jobs at the front
    # of the queue each wait for one end of that wave (the one-job prior), not
    # for their place in it (the fluid arithmetic, which has the 8 GPUs free in
    # turn, takes over only past half the wave: q14 is told 69 s)
    wave, second, deep = queued[8:12], queued[16], queued[-1]
    assert all(q.wait_estimate_s == 60.0 for q in wave) and deep.wait_p50_s > 0
    ratio = lambda q: (q.wait_p90_s + FLOOR_S) / (q.wait_p50_s + FLOOR_S)
    assert all(math.isclose(ratio(q), PRIOR[1]) for q in wave)
    # the next wave's first job waits for the queued jobs ahead to end too
    assert second.wait_estimate_s > 60.0 and ratio(deep) < ratio(second) < PRIOR[1]
    # ~390 ends ahead: the sum averages out down to the queue-wide spread (SIGMA_SYS)
    assert ratio(deep) < math.exp(Z90 * SIGMA_SYS) * 1.01


@settings(max_examples=200, deadline=None)
@given(
    point=st.floats(min_value=0.0, max_value=1e6),
    d1=st.floats(min_value=0.0, max_value=1e7),
    d2=st.floats(min_value=0.0, max_value=1e7),
    ratios=st.lists(st.floats(min_value=0.01, max_value=100.0), max_size=60),
)
def test_bands_are_ordered_and_a_deeper_queue_never_gets_a_wider_prior(point, d1, d2, ratios):
    """Invariants: 0 <= P50 <= P90 for any point, depth and learned history; and
    before anything is learned, more jobs ahead never widen the band."""
    bands = WaitBands()
    _observe(bands, ratios, point=600.0)
    for depth in (d1, d2):
        p50, p90 = bands.band("paid", point, depth)
        assert 0.0 <= p50 <= p90
    fresh = WaitBands()
    lo, hi = sorted((d1, d2))
    assert fresh.band("free", point, hi)[1] <= fresh.band("free", point, lo)[1]
    assert fresh.band("free", point, hi)[0] == fresh.band("free", point, lo)[0]  # P50: the point


def test_refreshed_points_learn_their_own_multipliers():
    """Admissions that waited 2x their point, refreshes that waited half of
    theirs: a refreshed band reads the refreshes' multipliers once a class has
    MIN_REFRESH_SAMPLES, an admission's band its own."""
    bands = WaitBands()
    _observe(bands, [2.0] * 40)
    for i in range(40):
        job_id = f"r{i}"
        bands.admitted(job_id, "paid", 0, 5000.0)  # another class: not in the 600 s one
        bands.refreshed(job_id, "paid", 100_000, 600.0)
        left_s = (600 + FLOOR_S) * 0.5 - FLOOR_S
        # same class, 10 s later, also half its point: every refresh is learned
        bands.refreshed(job_id, "paid", 110_000, (left_s - 10 + FLOOR_S) / 0.5 - FLOOR_S)
        bands.started(job_id, 100_000 + int(left_s * 1000))
    assert bands.rpending == {}
    m50 = (bands.band("paid", 600.0, refresh=True)[0] + FLOOR_S) / (600 + FLOOR_S)
    assert math.isclose(m50, 0.5, rel_tol=0.05)
    m50 = (bands.band("paid", 600.0)[0] + FLOOR_S) / (600 + FLOOR_S)
    assert math.isclose(m50, 2.0, rel_tol=0.05)
    # a refresh class with too few samples has the depth prior: neither another
    # decade's refreshes (0.5x) nor the admissions' (2x)
    for point in (60.0, 20_000.0):
        assert bands.band("paid", point, 50.0, refresh=True) == bands.band("free", point, 50.0)
        assert bands.band("paid", point, 50.0, refresh=True)[0] == point
    assert bands.band("free", 600.0, refresh=True) == bands.band("free", 600.0)


def test_every_published_refresh_is_learned_not_only_a_jobs_first_in_its_class():
    """A flood's jobs enter a decade early, when their points overshoot more
    than later (module doc, 6.): the band learns from all of a job's refreshes,
    the population it is scored on. Each job's first refresh in the 100-999 s
    class waited 0.5x its point, its four later ones 1x: the learned P50 is 1x."""
    bands = WaitBands()
    start_s = (900 + FLOOR_S) * 0.5 - FLOOR_S  # 435 s: the first refresh waited 0.5x
    for i in range(40):
        job_id = f"j{i}"
        bands.refreshed(job_id, "paid", 0, 900.0)
        for at_s in (50, 100, 150, 200):  # each told the wait left exactly
            bands.refreshed(job_id, "paid", at_s * 1000, start_s - at_s)
        bands.started(job_id, int(start_s * 1000))
    hist = bands.hists[("paid", REFRESH + estimate_class(600.0))]
    assert hist.total == 200
    m50 = (bands.band("paid", 600.0, refresh=True)[0] + FLOOR_S) / (600 + FLOOR_S)
    assert 0.95 < m50 < 1.05  # the first refreshes alone: 0.5
    assert bands.rpending == {}


def test_a_snapshot_keeping_first_refreshes_per_class_loads_as_a_list() -> None:
    bands = WaitBands()
    bands.refreshed("q", "paid", 0, 600.0)
    state = dict(bands.__dict__, rpending={"q": ("paid", {3: (0, 600.0), 4: (5, 2000.0)})})
    old = WaitBands.__new__(WaitBands)
    old.__setstate__(state)
    assert old.rpending == {"q": ("paid", [(3, 0, 600.0, 1.0), (4, 5, 2000.0, 1.0)])}
    unweighted = dict(bands.__dict__, rpending={"u": ("paid", [(3, 0, 600.0), (3, 9, 500.0)])})
    older = WaitBands.__new__(WaitBands)
    older.__setstate__(unweighted)
    assert older.rpending == {"u": ("paid", [(3, 0, 600.0, 1.0), (3, 9, 500.0, 1.0)])}
    old.refreshed("q", "paid", 10_000, 500.0)
    old.censor(20_000)
    old.started("q", 300_000)
    assert old.rpending == {} and set(old.hists) == {("paid", REFRESH + 3), ("paid", REFRESH + 4)}


def test_a_snapshot_drops_the_tiers_pools_of_refreshes_which_nothing_reads() -> None:
    bands = WaitBands()
    for i in range(40):
        bands.refreshed(f"r{i}", "paid", 0, 600.0)
        bands.started(f"r{i}", 300_000)
    assert set(bands.hists) == {("paid", REFRESH + estimate_class(600.0))}
    state = dict(
        bands.__dict__, hists={**bands.hists, ("paid", -2): bands.hists[("paid", REFRESH + 3)]}
    )
    old = WaitBands.__new__(WaitBands)
    old.__setstate__(state)
    assert set(old.hists) == set(bands.hists)
    assert old.band("paid", 600.0, refresh=True) == bands.band("paid", 600.0, refresh=True)


def test_refreshes_of_a_job_that_never_started_teach_nothing_and_queued_ones_are_censored():
    bands = WaitBands()
    bands.admitted("gone", "paid", 0, 100.0)
    bands.refreshed("gone", "paid", 30_000, 80.0)
    bands.forget("gone")
    bands.started("gone", 10_000_000)
    assert bands.pending == {} and bands.rpending == {} and bands.hists == {}
    for i in range(40):  # refreshes that ended at their point
        bands.refreshed(f"s{i}", "paid", 0, 600.0)
        bands.started(f"s{i}", 600_000)
    bands.refreshed("still", "paid", 0, 600.0)
    bands.censor(6_000_000)  # queued 10x its refreshed point so far
    hist = bands.hists[("paid", REFRESH + estimate_class(600.0))]
    assert hist.total == 40 and hist.censored_total == 1


def _recount(bands: WaitBands, now_ms: int) -> dict[tuple[str, int], dict[int, float]]:
    """Every entry's censored bucket, by the module doc's formula, for the
    histograms that exist."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    entries = [(t, cls, ms, p, False, 1.0) for t, ms, p, cls in bands.pending.values()]
    for tier, seen in bands.rpending.values():
        entries.extend((tier, cls, ms, p, True, w) for cls, ms, p, w in seen)
    for tier, cls, since_ms, point_s, refresh, weight in entries:
        waited_s = max(0.0, (now_ms - since_ms) / 1000)
        keys = (
            ((tier, REFRESH + cls),)
            if refresh
            else ((tier, cls), (tier, -1))
            if cls
            else ((tier, 0),)
        )
        if not refresh and cls and not HELD < cls <= HELD + HELD_WAIT_CLASS:
            keys += ((tier, WAIT + cls),)  # its waits in their own frame (module doc, 10.)
        for key in keys:
            if HELD < key[1] <= HELD + HELD_WAIT_CLASS:  # the wait itself (module doc, 7.)
                ratio = (waited_s + HELD_FLOOR_S) / HELD_FLOOR_S
            elif key[1] > WAIT:
                ratio = (waited_s + WAIT_FLOOR_S) / WAIT_FLOOR_S
            else:
                ratio = (waited_s + FLOOR_S) / (point_s + FLOOR_S)
            i = int(round((min(6.0, max(-6.0, math.log2(ratio))) + 6.0) / 0.0625))
            if key in bands.hists:
                row = out.setdefault(key, {})
                row[i] = row.get(i, 0.0) + weight
    return out


_ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "refresh", "start", "forget", "censor", "restore"]),
        st.integers(0, 7),  # the job
        st.sampled_from([0.0, 3.0, 45.0, 600.0, 7_000.0, 90_000.0]),  # a point
        st.integers(0, 400_000),  # ms the clock moves on
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops)
def test_censored_counts_are_every_queued_entrys_bucket_now(ops):
    """After any admissions, refreshes, starts, forgets and snapshot restores,
    every histogram's censored counts are the buckets of every queued job and
    kept refresh at that moment (``censor`` computes them inline, where two
    calls per entry were most of its cost)."""
    import pickle

    bands = WaitBands()
    _observe(bands, [0.5, 1.0, 2.0] * 12, point=600.0)
    _observe(bands, [1.0] * 31, tier="free", point=45.0)
    for point in (45.0, 600.0):  # held classes: one in the wait's frame, one in the point's
        for i in range(31):
            bands.admitted(f"h{point}-{i}", "paid", 0, point, held=True)
            bands.started(f"h{point}-{i}", 1000 * (i % 3))
    now = 0
    for op, j, point, step in ops:
        now += step
        job_id = f"q{j}"
        if op == "admit":
            bands.admitted(job_id, ("paid", "free")[j % 2], now, point, held=j % 3 == 0)
        elif op == "refresh":
            bands.refreshed(job_id, ("paid", "free")[j % 2], now, point)
        elif op == "start":
            bands.started(job_id, now)
        elif op == "forget":
            bands.forget(job_id)
        elif op == "restore":
            bands = pickle.loads(pickle.dumps(bands))
        bands.censor(now)
        want = _recount(bands, now)
        for key, hist in bands.hists.items():
            assert hist.censored == want.get(key, {}), (key, op)


def test_a_job_keeps_a_bounded_number_of_refreshes_and_each_still_counts_once():
    """A job queued for hours is published dozens of times (module doc, 6.):
    it keeps at most KEEP_REFRESHES, older ones merged with their weights, so
    its start still teaches one observation per published refresh."""
    bands = WaitBands()
    points = [5000.0 - 100 * k for k in range(40)] + [50_000.0, 60_000.0, 70.0]
    for k, point in enumerate(points):
        bands.refreshed("long", "batch", k * 60_000, point)
        kept = bands.rpending["long"][1]
        assert len(kept) <= KEEP_REFRESHES
        assert sum(w for *_, w in kept) == k + 1
        assert [ms for _, ms, _, _ in kept] == sorted(ms for _, ms, _, _ in kept)
    bands.censor(len(points) * 60_000)
    bands.started("long", len(points) * 60_000)
    learned = sum(h.total for key, h in bands.hists.items() if key[1] >= REFRESH)
    assert learned == len(points)


def test_refresh_histograms_forget_twice_as_fast_as_admissions():
    """A refresh histogram halves at REFRESH_HALVE_AT observations (module doc,
    5.), an admission histogram at HALVE_AT: after REFRESH_HALVE_AT of each,
    the refreshes' evidence weighs half, the admissions' whole."""
    assert REFRESH_HALVE_AT < HALVE_AT
    bands = WaitBands()
    n = int(REFRESH_HALVE_AT)
    for i in range(n):
        bands.admitted(f"a{i}", "paid", 0, 600.0)
        bands.started(f"a{i}", 600_000)
        bands.refreshed(f"r{i}", "paid", 0, 600.0)
        bands.started(f"r{i}", 600_000)
    assert bands.hists[("paid", estimate_class(600.0))].total == n
    assert bands.hists[("paid", REFRESH + estimate_class(600.0))].total == n / 2


def test_held_admissions_learn_their_own_classes():
    """A job that fit the free GPUs but that the admission's quick pass left
    queued mostly starts at the next full pass whatever its point (module doc,
    7.): held admissions learn and read their own classes, those of points under
    100 s in the wait's own frame (the point plays no part), longer ones as
    ratios to the point like the others."""
    bands = WaitBands()
    for i in range(40):  # held, told 20-90 s, started a second later
        bands.admitted(f"q{i}", "paid", 0, 20.0 + i * 70 / 39, held=True)
        bands.started(f"q{i}", 1000)
    for i in range(40):  # held, told 600 s, started after 300 s
        bands.admitted(f"l{i}", "paid", 0, 600.0, held=True)
        bands.started(f"l{i}", 300_000)
    assert ("paid", HELD + estimate_class(50.0)) in bands.hists
    assert ("paid", estimate_class(50.0)) not in bands.hists  # not the unheld class
    short = [bands.band("paid", point, held=True) for point in (20.0, 50.0, 90.0)]
    assert short[0] == short[1] == short[2]  # the wait itself, whatever the point
    assert 0.9 < short[0][0] <= short[0][1] < 1.1
    # points of 100 s and more: the learned ratio (330/630) scales the point
    assert math.isclose(bands.band("paid", 600.0, held=True)[0], 300.0, rel_tol=0.03)
    assert math.isclose(
        bands.band("paid", 1200.0, held=True)[0], 1230 * 330 / 630 - 30, rel_tol=0.03
    )
    # an unheld job of the same point reads the tier's pool, not a held class
    assert bands.band("paid", 50.0) != short[1]


def test_an_admissions_band_allows_for_the_clocks_grain():
    """The cell's clock is the Tick's (module doc, 8.): an admission between two
    Ticks is stamped at the one before, so its measured wait is the real one
    plus a uniform share of a Tick; its P50 is half a Tick lower, its P90 a
    tenth. A refresh is made on a Tick: unchanged."""
    bands = WaitBands()
    _observe(bands, [0.5, 1.0, 2.0] * 12, point=600.0)
    before = bands.band("paid", 600.0)
    refresh_before = bands.band("paid", 600.0, refresh=True)
    bands.ticked(1000)
    after = bands.band("paid", 600.0)
    assert math.isclose(before[0] - after[0], 0.5) and math.isclose(before[1] - after[1], 0.1)
    assert bands.band("paid", 600.0, refresh=True) == refresh_before
    cell = Cell(CellConfig(status_interval_s=0, estimate_interval_s=0), "c")
    grains = []
    for now in (1000, 2000, 3000, 63_000, 64_000, 69_000, 74_000):
        cell.apply(ev.Tick(event_id=f"t{now}", ts_ms=now, cell="c", now_ms=now))
        grains.append(cell.wait_bands.tick_ms)
    # the smaller of the last two gaps: a clock down for a minute is not the
    # cadence; a new cadence (5 s) is, from its second gap
    assert grains == [0, 1000, 1000, 1000, 1000, 1000, 5000]


def test_a_job_held_while_it_fit_is_admitted_into_a_held_class():
    """A reservation holds the free GPU: the 1-GPU job fits it, the quick pass
    leaves it queued (it would end after the shadow time), so it learns as
    held; the 2-GPU job did not fit the free GPUs at all, so it does not."""
    cell = Cell(CellConfig(status_interval_s=0, estimate_interval_s=0), "c")
    cell.apply(
        ev.NodeRegistered(event_id="r", ts_ms=0, node_id="n0", incarnation=1, cell="c", gpus=2)
    )
    cell.apply(ev.Tick(event_id="t0", ts_ms=1000, cell="c", now_ms=1000))

    def admit(job_id: str, gpus: int, estimate_s: float) -> list:
        spec = ev.JobSpec(
            job_id=job_id,
            tenant="x",
            tier="paid",
            gpus=gpus,
            gpus_per_node=gpus,
            estimate_s=estimate_s,
        )
        return cell.apply(ev.JobAdmitted(event_id=f"a-{job_id}", ts_ms=1000, spec=spec))

    admit("running", 1, 1000)
    assert "running" not in cell.wait_bands.pending  # started at once
    admit("big", 2, 100)
    cell.apply(ev.Tick(event_id="t1", ts_ms=2000, cell="c", now_ms=2000))
    assert cell.reservation_job == "big"
    out = admit("small", 1, 5000)
    assert not any(isinstance(o, ev.JobAssigned) for o in out)
    assert cell.wait_bands.pending["small"][3] >= HELD
    assert cell.wait_bands.pending["big"][3] < HELD


def test_a_snapshot_from_before_the_held_classes_loads():
    """A snapshot's pending admissions kept (tier, ms, point) and no clock
    grain: restored, each gets its point's class and the grain is 0."""
    import pickle

    bands = WaitBands()
    bands.admitted("old", "paid", 0, 600.0)
    state = bands.__dict__.copy()
    state["pending"] = {"old": ("paid", 0, 600.0)}
    del state["gaps_ms"]
    restored = WaitBands.__new__(WaitBands)
    restored.__setstate__(pickle.loads(pickle.dumps(state)))
    assert restored.pending == {"old": ("paid", 0, 600.0, estimate_class(600.0))}
    assert restored.tick_ms == 0
    restored.started("old", 300_000)
    assert restored.hists[("paid", estimate_class(600.0))].total == 1


def test_an_admission_class_reads_its_quantiles_sooner_than_a_refresh_class():
    """Module doc, 9.: an admission class's own quantiles from MIN_SAMPLES
    starts (a tier that seldom queues is not told the prior for long), a refresh
    class's from MIN_REFRESH_SAMPLES (its first starts come from another regime)."""
    assert MIN_SAMPLES < MIN_REFRESH_SAMPLES
    bands = WaitBands()

    def m50(refresh: bool) -> float:
        return (bands.band("paid", 600.0, refresh=refresh)[0] + FLOOR_S) / (600 + FLOOR_S)

    _observe(bands, [2.0] * (MIN_SAMPLES - 1))
    assert m50(False) == PRIOR[0]
    _observe(bands, [2.0])
    assert math.isclose(m50(False), 2.0, rel_tol=0.05)
    left_s = (600 + FLOOR_S) * 0.5 - FLOOR_S  # refreshes that waited half their point
    for i in range(MIN_REFRESH_SAMPLES):
        if i == MIN_SAMPLES:
            assert m50(True) == PRIOR[0]  # as many as an admission class needs: not yet
        bands.refreshed(f"r{i}", "paid", 0, 600.0)
        bands.started(f"r{i}", int(left_s * 1000))
    assert math.isclose(m50(True), 0.5, rel_tol=0.05)


@pytest.mark.parametrize("waits", ["flat", "proportional"])
def test_a_class_reads_the_frame_its_waits_follow(waits):
    """Module doc, 10.: jobs told points of 100-1,000 s (one class) that start
    within seconds whatever their point (the genai workload's small paid jobs)
    are calibrated once the class reads its waits in their own frame: read as
    ratios to the point, the larger points were told P50s above their waits
    and the smaller ones 0. Waits that grow with the point stay in its frame."""
    rng = random.Random(7)
    bands = WaitBands()
    told: list[tuple[float, float, float]] = []
    now_ms = 0
    for i in range(600):
        point = 100.0 * 10 ** rng.random()
        wait = rng.uniform(0.0, 10.0) if waits == "flat" else point * rng.uniform(0.5, 1.5)
        bands.admitted(f"j{i}", "paid/0", now_ms, point)
        p50, p90 = bands.band("paid/0", point)
        if i >= 300 and p50 > 0:
            told.append((wait, p50, p90))
        now_ms += int(wait * 1000)
        bands.started(f"j{i}", now_ms)
    assert len(told) > 250  # the class tells a wait, not "starts now"
    under50 = sum(w <= p50 for w, p50, _ in told) / len(told)
    under90 = sum(w <= p90 for w, _, p90 in told) / len(told)
    assert 0.40 <= under50 <= 0.60, under50
    assert 0.85 <= under90 <= 0.95, under90
    assert (bands.frame_score[("paid/0", 3)][0] > 0) == (waits == "flat")
