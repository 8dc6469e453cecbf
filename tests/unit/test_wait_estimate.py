"""The point wait estimate (issue #10): the time until the work ahead has
started and the job's own GPUs have freed, not until all running work ends:
``(A + g * r + min(1, A / R) * (R - g * r - rho * capacity)) / capacity``, where
``rho`` is the mean residual of a busy GPU for the mix of runs the cell starts
(``sum(g * e**2) / (2 * sum(g * e))``): the work ahead has then started, not ended.

The cell below started 16 runs of 1,000 s: ``rho`` = 500 s."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core import Cell
from framespool.processors.core.accounting import MIX_HALVE_AT, point_wait_s
from framespool.processors.core.offers import predicted_wait_s
from framespool.schemas import events as ev
from tests.unit.core_harness import Harness

RHO = 1000 * 1000 / (2 * 1000)  # the started runs' mean residual: 16 runs of 1,000 s


def queued(out: list) -> ev.JobQueued:
    [q] = [o for o in out if isinstance(o, ev.JobQueued)]
    return q


def full_cell_of_one_gpu_runs() -> Harness:
    """Two 8-GPU nodes, each GPU running a 1-GPU job with 900 s left."""
    h = Harness(nodes=2)
    for i in range(16):
        h.submit(f"r{i}", tenant=f"t{i}", gpus=1, estimate_s=1000)
    h.start_all()
    for _ in range(10):  # 100 s, the nodes reporting their runs
        h.tick(10)
        h.heartbeat("n0")
        h.heartbeat("n1")
    assert h.cell.index.free_total == 0 and h.cell.running_gpus == 16
    return h


def test_a_job_with_nothing_ahead_waits_for_its_own_gpus_not_all_running_work():
    h = full_cell_of_one_gpu_runs()
    # one mean residual (900 s) per GPU it needs, over the 16 GPUs freeing in
    # turn; the old estimate (all running work over the capacity) said 900 s
    one = queued(h.submit("one", tenant="new", gpus=1, estimate_s=60))
    assert one.wait_estimate_s == pytest.approx(900 / 16, abs=0.01)
    # a gang waits for eight residuals, after the 60 GPU-s ("one") fair order
    # serves first, and behind that share (60 / 14400) of the other running work
    eight = queued(h.submit("eight", tenant="other", gpus=8, estimate_s=60))
    rest = 60 / 14400 * (14400 - 8 * 900 - 16 * RHO)
    assert eight.wait_estimate_s == pytest.approx((60 + 8 * 900 + rest) / 16, abs=0.01)


def test_work_ahead_adds_its_gpu_seconds_over_the_capacity():
    h = full_cell_of_one_gpu_runs()
    first = queued(h.submit("q1", tenant="same", gpus=1, estimate_s=160)).wait_estimate_s
    second = queued(h.submit("q2", tenant="same", gpus=1, estimate_s=160)).wait_estimate_s
    assert first == pytest.approx(900 / 16, abs=0.01)
    assert second == pytest.approx((160 + 900 + 160 / 14400 * (13500 - 16 * RHO)) / 16, abs=0.01)


def test_a_queue_as_deep_as_the_running_work_starts_one_residual_before_it_all_ends():
    h = full_cell_of_one_gpu_runs()
    # 16 x 900 = 14400 GPU-s ahead: the flood's regime. All the work ahead and
    # running ends at (A + R) / capacity; the job starts when the work ahead has
    # started, a busy GPU's mean residual (rho) earlier
    h.submit("deep", tenant="same", gpus=16, per_node=8, estimate_s=900)
    behind = queued(h.submit("behind", tenant="same", gpus=1, estimate_s=60))
    assert behind.wait_estimate_s == pytest.approx((14400 + 14400) / 16 - RHO, abs=0.01)


def test_a_job_that_fits_the_free_gpus_now_is_told_zero_despite_a_blocked_gang_ahead():
    h = Harness(nodes=2)
    h.submit("a", gpus=7, estimate_s=1000)
    h.submit("b", gpus=7, estimate_s=1000)
    h.start_all()
    assert h.cell.index.free_total == 2 and h.cell.index.largest_free() == 1
    gang = queued(h.submit("gang", tenant="x", gpus=16, per_node=8, estimate_s=600))
    assert gang.wait_estimate_s > 0
    # the gang queued beside 2 free GPUs cannot use them; a 1-GPU job can, now
    out = h.submit("small", tenant="x", gpus=1, estimate_s=60)
    assert queued(out).wait_estimate_s == 0.0
    assert any(isinstance(o, ev.JobAssigned) and o.job_id == "small" for o in out)
    # a 2-GPU job does not fit one node's single free GPU: it waits
    assert queued(h.submit("pair", tenant="x", gpus=2, estimate_s=60)).wait_estimate_s > 0


def test_the_depth_prior_counts_queued_jobs_beyond_the_jobs_own_gpus():
    h = full_cell_of_one_gpu_runs()
    h.submit("q1", tenant="same", gpus=1, estimate_s=160)
    # nothing beyond its own GPU's residual: one job deep
    assert h.cell.wait_depth(900 / 16, 1) == pytest.approx(1.0)
    # the wait told to a job behind it drains the queued job too: two deep
    told = (160 + 900 + 160 / 14400 * (13500 - 16 * RHO)) / 16
    assert h.cell.wait_depth(told, 1) == pytest.approx(2.0)
    # a gang's own GPUs take longer to free: the same wait drains no queue
    assert h.cell.wait_depth(told, 8) == pytest.approx(1.0)


def test_the_offer_gives_admission_the_same_number():
    for gpus in (1, 8):
        h = full_cell_of_one_gpu_runs()
        offer = ev.CellOffer(event_id="o", ts_ms=h.now_ms, **h.cell.offer_fields())
        spec = ev.JobSpec(job_id="x", tenant="new", tier="free", gpus=gpus, gpus_per_node=8)
        assert predicted_wait_s(offer, spec) == pytest.approx(gpus * 900 / 16, abs=0.01)
        cell_says = queued(h.submit(f"j{gpus}", tenant=f"n{gpus}", gpus=gpus, estimate_s=60))
        assert cell_says.wait_estimate_s == pytest.approx(gpus * 900 / 16, abs=0.01)


def test_the_residual_is_that_of_the_started_mix_gpu_weighted():
    """``sum(g * e**2) / (2 * sum(g * e))`` over the runs started: a run holds
    its GPUs for its estimate, so a busy GPU is caught in a long run more often
    than in a short one, halfway through it on average."""
    h = Harness(nodes=1)
    assert h.cell.run_residual_s() == 0.0  # nothing started: nothing taken off
    h.submit("short", tenant="a", gpus=1, estimate_s=100)
    h.submit("long", tenant="b", gpus=1, estimate_s=300)
    h.submit("pair", tenant="c", gpus=2, estimate_s=200)
    h.start_all()
    moments = 100**2 + 300**2 + 2 * 200**2, 100 + 300 + 2 * 200
    assert h.cell.run_residual_s() == pytest.approx(moments[0] / (2 * moments[1]))
    # a run ending does not change the mix the cell starts
    h.complete(("short", 1))
    assert h.cell.run_residual_s() == pytest.approx(moments[0] / (2 * moments[1]))


def test_the_started_mix_follows_the_load():
    """Halved every ``MIX_HALVE_AT`` starts: old starts weigh less, the ratio
    is kept, and a new mix takes over."""
    h = Harness(nodes=1)
    cell = h.cell
    for _ in range(int(MIX_HALVE_AT) - 1):
        cell.note_run_start(1, 100.0)
    assert cell.run_residual_s() == pytest.approx(50.0)
    cell.note_run_start(1, 100.0)  # the window is full: halved, same ratio
    assert cell.start_mix is not None and cell.start_mix[0] == MIX_HALVE_AT / 2
    assert cell.run_residual_s() == pytest.approx(50.0)
    for _ in range(4 * int(MIX_HALVE_AT)):
        cell.note_run_start(1, 1000.0)
    assert cell.run_residual_s() == pytest.approx(500.0, rel=0.01)


def test_the_started_mix_survives_a_snapshot():
    h = full_cell_of_one_gpu_runs()
    copy = pickle.loads(pickle.dumps(h.cell))
    assert copy.start_mix == h.cell.start_mix and copy.run_residual_s() == RHO
    # a snapshot taken before the mix was kept: no residual until runs start
    state = h.cell.__getstate__()
    state = {k: v for k, v in state.items() if k != "start_mix"}
    old = Cell.__new__(Cell)
    old.__setstate__(state)
    assert old.run_residual_s() == 0.0
    old.note_run_start(2, 10.0)
    assert old.run_residual_s() == pytest.approx(5.0)


@settings(max_examples=300, deadline=None)
@given(
    a1=st.floats(min_value=0, max_value=1e6),
    a2=st.floats(min_value=0, max_value=1e6),
    gpus=st.integers(min_value=1, max_value=16),
    running_gpu_s=st.floats(min_value=0, max_value=1e6),
    running=st.integers(min_value=0, max_value=64),
    residual=st.floats(min_value=0, max_value=1e5),
)
def test_the_residual_never_makes_more_work_ahead_a_shorter_wait(
    a1, a2, gpus, running_gpu_s, running, residual
):
    """Taking the residual off keeps the point a wait: never below the job's
    own GPUs' residual, never falling as the work ahead grows, the old
    arithmetic with no residual, and exactly ``(A + R) / C - rho`` once the
    queue is deep and the residual is within what it can take off."""
    capacity = 64
    if running == 0:
        running_gpu_s = 0.0
    low, high = sorted((a1, a2))
    own = gpus * running_gpu_s / running if running else 0.0
    p_low = point_wait_s(low, gpus, running_gpu_s, running, capacity, residual)
    p_high = point_wait_s(high, gpus, running_gpu_s, running, capacity, residual)
    assert p_low <= p_high + 1e-6 * (1 + p_high)
    assert p_low >= own / capacity - 1e-6 * (1 + own)
    extra = max(0.0, running_gpu_s - own)
    behind = min(1.0, low / running_gpu_s) if running_gpu_s > 0 else 1.0
    old = (low + own + behind * extra) / capacity
    assert point_wait_s(low, gpus, running_gpu_s, running, capacity) == pytest.approx(old)
    if high >= running_gpu_s and residual * capacity <= running_gpu_s + extra:
        expect = (high + own + extra) / capacity - residual
        assert p_high == pytest.approx(expect, rel=1e-9, abs=1e-6)
