"""The point wait estimate (issue #10): the time until the work ahead has
started and the job's own GPUs have freed, not until all running work ends:
``(A + g * r + min(1, A / R) * (R - g * r - rho * capacity)) / capacity``, where
``rho`` is the mean residual of a busy GPU for the mix of runs the cell starts
(``sum(g * e**2) / (2 * sum(g * e))``): the work ahead has then started, not
ended; and at least when the running runs free the GPUs the work ahead and the
job take, by their estimated ends (runs that started together end together).

``full_cell_of_one_gpu_runs`` started 16 runs of 1,000 s at once: ``rho`` =
500 s, and all 16 end together 900 s on. ``staggered_cell`` has 16 runs of
1,700 s started 100 s apart: they end 100, 200, ..., 1,600 s on."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core import Cell
from framespool.processors.core.estimates import MIX_HALVE_AT, point_wait_s
from framespool.processors.core.offers import predicted_wait_s
from framespool.schemas import events as ev
from tests.support.core import queued
from tests.support.core_harness import Harness

RHO = 1000 * 1000 / (2 * 1000)  # the started runs' mean residual: 16 runs of 1,000 s


def full_cell_of_one_gpu_runs() -> Harness:
    """Two 8-GPU nodes, each GPU running a 1-GPU job with 900 s left."""
    h = Harness(nodes=2)
    for i in range(16):
        h.submit(f"r{i}", tenant=f"t{i}", gpus=1, estimate_s=1000)
    h.start_all()
    _reported_for_100_s(h)
    assert h.cell.index.free_total == 0 and h.cell.running_gpus == 16
    return h


def _reported_for_100_s(h: Harness) -> None:
    """100 s of Ticks, both nodes reporting their runs every 10 s."""
    for _ in range(10):
        h.tick(10)
        h.heartbeat("n0")
        h.heartbeat("n1")


def staggered_cell() -> Harness:
    """Two 8-GPU nodes, each GPU running a 1-GPU job of 1,700 s, one started
    every 100 s: 100, 200, ..., 1,600 s left (R = 13,600 GPU-s, r = 850 s)."""
    h = Harness(nodes=2)
    for i in range(16):
        h.submit(f"r{i}", tenant=f"t{i}", gpus=1, per_node=1, estimate_s=1700)
        h.start_all()
        _reported_for_100_s(h)
    assert h.cell.index.free_total == 0 and h.cell.running_gpus == 16
    assert h.cell.running_left_gpu_s() == pytest.approx(13600)
    return h


def test_a_job_with_nothing_ahead_waits_for_its_own_gpus_not_all_running_work():
    h = staggered_cell()
    # the first run to end frees its GPU: 100 s. The running work's mean
    # residual per GPU over the capacity says 850 / 16 = 53 s (GPUs freeing in
    # turn, one every r / capacity), all the running work 850 s
    one = queued(h.submit("one", tenant="new", gpus=1, per_node=1, estimate_s=60))
    assert one.wait_estimate_s == pytest.approx(100, abs=0.01)
    # a gang of 8 waits for the eighth end (8 * 850 / 16 = 425 s in turn)
    h = staggered_cell()
    eight = queued(h.submit("eight", tenant="other", gpus=8, estimate_s=60))
    assert eight.wait_estimate_s == pytest.approx(800, abs=0.01)


def test_runs_that_started_together_free_their_gpus_together():
    h = full_cell_of_one_gpu_runs()
    # all 16 end 900 s on: a job with nothing ahead waits for that, not for
    # one residual over the 16 GPUs (900 / 16 s)
    one = queued(h.submit("one", tenant="new", gpus=1, estimate_s=60))
    assert one.wait_estimate_s == pytest.approx(900, abs=0.01)


def test_work_ahead_takes_the_gpus_that_free_first():
    h = staggered_cell()
    first = queued(h.submit("q1", tenant="same", gpus=1, per_node=1, estimate_s=160))
    second = queued(h.submit("q2", tenant="same", gpus=1, per_node=1, estimate_s=160))
    assert first.wait_estimate_s == pytest.approx(100, abs=0.01)
    assert second.wait_estimate_s == pytest.approx(200, abs=0.01)


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
    h = staggered_cell()
    h.submit("q1", tenant="same", gpus=1, per_node=1, estimate_s=160)
    # nothing beyond its own GPU's end: one job deep
    assert h.cell.wait_depth(100, 1) == pytest.approx(1.0)
    # the wait told to a job behind it waits for the queued job's GPU too: two deep
    assert h.cell.wait_depth(200, 1) == pytest.approx(2.0)
    # a gang's own GPUs take longer to free: the eighth end drains no queue
    assert h.cell.wait_depth(800, 8) == pytest.approx(1.0)
    # runs that end together: every job told their end is one end deep
    h = full_cell_of_one_gpu_runs()
    for i in range(5):
        h.submit(f"q{i}", tenant="same", gpus=1, estimate_s=160)
    assert h.cell.wait_depth(900, 1) == pytest.approx(1.0)
    # past them the fluid arithmetic's inversion: the deep job is 3 deep in a
    # queue of 160 s jobs (A = 480 GPU-s beyond R)
    deep = (14400 + 480 + 14400 - 16 * RHO) / 16
    assert h.cell.wait_depth(deep, 1) == pytest.approx(1 + (14400 + 480) / 160, rel=1e-6)


def test_the_offer_gives_admission_the_cell_arithmetic_less_the_runs_ends():
    """An offer carries the running work, not when each run ends: it says one
    residual per GPU over the capacity, the cell (which knows the ends) the
    end of the job's own GPUs."""
    for gpus, end in ((1, 100), (8, 800)):
        h = staggered_cell()
        offer = ev.CellOffer(event_id="o", ts_ms=h.now_ms, **h.cell.offer_fields())
        spec = ev.JobSpec(job_id="x", tenant="new", tier="free", gpus=gpus, gpus_per_node=8)
        assert predicted_wait_s(offer, spec) == pytest.approx(gpus * 850 / 16, abs=0.01)
        cell_says = queued(h.submit(f"j{gpus}", tenant=f"n{gpus}", gpus=gpus))
        assert cell_says.wait_estimate_s == pytest.approx(end, abs=0.01)


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
    assert cell.start_mix is not None and cell.start_mix.starts == MIX_HALVE_AT / 2
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
