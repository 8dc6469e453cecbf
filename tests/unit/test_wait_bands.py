"""Calibrated wait bands: the core learns P50/P90 from observed waits; the job
view, its timeline (what SSE streams), ``framespool status`` and the
simulator's quality tables publish them."""

from __future__ import annotations

import argparse
import math

from framespool.commands import jobs as job_commands
from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.waitbands import FLOOR_S, PRIOR, WaitBands
from framespool.processors.sim.quality import (
    WaitRow,
    calibration_table,
    noisy_neighbour_table,
)
from framespool.projections.jobs import QUEUED, fold
from framespool.projections.serde import public_job
from framespool.projections.testing import lifecycle
from framespool.schemas import events as ev


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
    # q0 was told "starts now" and did: it teaches its own class only
    assert {k: h.total for k, h in cell.wait_bands.hists.items()} == {("paid", 0): 1.0}


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
    assert table["paid"] == {"n": 4, "le_p50": 0.5, "le_p90": 0.75, "waited": 3}
    assert table["free"] == {"n": 1, "le_p50": 1.0, "le_p90": 1.0, "waited": 1}
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
