"""The point wait estimate (issue #10): the time until the work ahead has
started and the job's own GPUs have freed, not until all running work ends:
``(A + g * r + min(1, A / R) * (R - g * r)) / capacity``."""

from __future__ import annotations

import pytest

from framespool.processors.core.offers import predicted_wait_s
from framespool.schemas import events as ev
from tests.unit.core_harness import Harness


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
    rest = 60 / 14400 * (14400 - 8 * 900)
    assert eight.wait_estimate_s == pytest.approx((60 + 8 * 900 + rest) / 16, abs=0.01)


def test_work_ahead_adds_its_gpu_seconds_over_the_capacity():
    h = full_cell_of_one_gpu_runs()
    first = queued(h.submit("q1", tenant="same", gpus=1, estimate_s=160)).wait_estimate_s
    second = queued(h.submit("q2", tenant="same", gpus=1, estimate_s=160)).wait_estimate_s
    assert first == pytest.approx(900 / 16, abs=0.01)
    assert second == pytest.approx((160 + 900 + 160 / 14400 * 13500) / 16, abs=0.01)


def test_a_queue_as_deep_as_the_running_work_waits_behind_all_of_it():
    h = full_cell_of_one_gpu_runs()
    # 16 x 900 = 14400 GPU-s ahead: the flood's regime, (A + R) / capacity
    h.submit("deep", tenant="same", gpus=16, per_node=8, estimate_s=900)
    behind = queued(h.submit("behind", tenant="same", gpus=1, estimate_s=60))
    assert behind.wait_estimate_s == pytest.approx((14400 + 14400) / 16, abs=0.01)


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
    told = (160 + 900 + 160 / 14400 * 13500) / 16
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
