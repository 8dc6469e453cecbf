"""Model loads in the point wait estimate (issue #10): a run placed on GPUs
that do not hold its model loads it first (``CellConfig.model_load_s`` GPU-
seconds, which no estimate counts). The cell knows at placement which runs
load (``note_load``, asked before the GPUs are marked warm) and keeps a
moving share ``s`` of the GPUs started that load, and ``n`` of those started on
GPUs that held a model (the next starts' share, with a model-mix prior); the
point then counts ``n * L`` more GPU-seconds per GPU ahead, ``s * L`` per running
GPU, and the loads in a busy GPU's mean residual (``WaitEstimates.load_terms``).

``cold_cell`` starts 16 one-GPU runs of 1,000 s at once on GPUs that hold no
model: all of them load (``s = 1``), and the next starts' share ``n`` has only
its prior (no start on GPUs that held a model): 0, one model started."""

from __future__ import annotations

import pickle
from dataclasses import fields, replace

import pytest

from framespool.processors import sim
from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.estimates import LOAD_PRIOR_GPUS, MIX_HALVE_AT, LoadMix
from framespool.schemas import events as ev
from tests.support.core import queued
from tests.support.core_harness import Harness

LOAD_S = 20.0
# arrival order within a user's queue: the flood's regime below queues a small
# job behind a deep one of its own user, which size order would put first
BASE = CellConfig(status_interval_s=0, estimate_interval_s=0, size_order_gpu_s_per_s=0)


def cold_cell(load_s: float = LOAD_S, model: str = "m") -> Harness:
    """Two 8-GPU nodes, every GPU running a 1-GPU job of 1,000 s with 900 s
    left, all of them placed on GPUs that held no model."""
    h = Harness(replace(BASE, model_load_s=load_s), nodes=2)
    for i in range(16):
        h.submit(f"r{i}", tenant=f"t{i}", gpus=1, estimate_s=1000, model=model)
    h.start_all()
    for _ in range(10):
        h.tick(10)
        h.heartbeat("n0")
        h.heartbeat("n1")
    assert h.cell.index.free_total == 0 and h.cell.running_gpus == 16
    return h


def one_gpu(node: str = "n0", gpu: int = 0) -> tuple[ev.NodeSlice, ...]:
    return (ev.NodeSlice(node_id=node, gpus=(gpu,)),)


def test_the_cell_counts_the_gpus_whose_run_loads_its_model():
    h = cold_cell()
    cell = h.cell
    assert cell.cold_share() == 1.0  # every GPU held no model
    # none held a model: the next starts have only the prior, and the cell
    # started one model, so a freed GPU holds the next job's
    assert cell.next_cold_share() == 0.0
    # the 16 runs end; the same model again on the same GPUs: no load
    for i in range(16):
        h.complete((f"r{i}", 1))
    for i in range(16):
        h.submit(f"w{i}", tenant=f"t{i}", gpus=1, estimate_s=1000, model="m")
    assert cell.running_gpus == 16
    assert cell.cold_share() == pytest.approx(0.5)
    assert cell.next_cold_share() == 0.0
    # another model on a GPU that holds "m": a load, on a GPU that held a model
    h.complete(("w0", 1))
    h.submit("other", tenant="x", gpus=1, estimate_s=1000, model="other")
    assert cell.cold_share() == pytest.approx(17 / 33)
    prior = 1 - (32**2 + 1**2) / 33**2
    assert cell.next_cold_share() == pytest.approx((1 + LOAD_PRIOR_GPUS * prior) / (17 + 256))


def test_a_run_loads_when_any_of_its_gpus_does_and_all_its_gpus_wait():
    h = Harness(BASE, nodes=1)
    cell = h.cell
    cell.index.nodes["n0"].warm[0] = "m"
    two = (ev.NodeSlice(node_id="n0", gpus=(0, 1)),)
    cell.note_load(two, "m", 2, 100.0)  # GPU 1 holds nothing: both GPUs wait
    assert cell.cold_share() == 1.0
    cell.index.nodes["n0"].warm[1] = "x"
    cell.note_load(two, "m", 2, 100.0)  # GPU 1 holds another model
    assert cell.cold_share() == 1.0
    cell.index.nodes["n0"].warm[1] = "m"
    cell.note_load(two, "m", 2, 100.0)
    assert cell.cold_share() == pytest.approx(2 / 3)
    # of the two starts on GPUs that all held a model, one loaded
    assert cell.load_mix is not None
    assert (cell.load_mix.warm, cell.load_mix.warm_loaded) == (4.0, 2.0)


def test_the_cold_share_follows_the_load():
    """Halved every ``MIX_HALVE_AT`` starts, like the started mix: the shares
    are kept across a halving, and a new regime takes over."""
    h = Harness(BASE, nodes=1)
    cell = h.cell
    cell.index.nodes["n0"].warm[0] = "m"
    for i in range(int(MIX_HALVE_AT) - 1):
        cell.note_load(one_gpu(), "m" if i % 4 else "x", 1, 100.0)
    mix = cell.load_mix
    assert mix is not None
    share, prior = cell.cold_share(), 1 - mix.model_sq / mix.gpus**2
    assert share == pytest.approx(0.25, abs=0.001)
    assert prior == pytest.approx(1 - 0.75**2 - 0.25**2, abs=0.001)
    cell.note_load(one_gpu(), "m", 1, 100.0)  # the window is full: halved
    assert mix.starts == MIX_HALVE_AT / 2
    assert cell.cold_share() == pytest.approx(share, abs=0.001)
    assert 1 - mix.model_sq / mix.gpus**2 == pytest.approx(prior, abs=0.001)
    assert mix.model_sq == pytest.approx(sum(g * g for g in mix.models.values()))
    for _ in range(4 * int(MIX_HALVE_AT)):
        cell.note_load(one_gpu(), "m", 1, 100.0)
    assert cell.cold_share() < 0.02 and cell.next_cold_share() < 0.03


def test_the_cold_share_survives_a_snapshot_and_an_older_one_starts_without():
    h = cold_cell()
    copy = pickle.loads(pickle.dumps(h.cell))
    assert copy.load_mix == h.cell.load_mix  # its models too
    assert copy.load_terms() == h.cell.load_terms()
    state = h.cell.__getstate__()
    state = {k: v for k, v in state.items() if k not in ("load_mix", "load_models")}
    old = Cell.__new__(Cell)
    old.__setstate__(state)
    assert old.cold_share() == 0.0 and old.next_cold_share() == 0.0
    assert old.load_terms() == (1.0, 0.0, old.run_residual_s(), 0.0)
    old.note_load(one_gpu(), "new", 1, 100.0)
    assert old.cold_share() == 1.0


def test_the_running_runs_load_share_is_that_of_the_runs_running_now():
    """A fresh cell's first runs all loaded; once half of them have ended and
    runs that found their model warm took their GPUs, the running runs free
    their GPUs ``0.5 * L`` after their estimated ends, though two thirds of
    the GPUs started loaded (``cold_share``): the estimate cadence counts the
    running runs' share, and a snapshot keeps it."""
    h = cold_cell()
    cell = h.cell
    cell.publish_estimates()
    assert cell.load_terms().late_s == LOAD_S
    for key in sorted(h.live_runs())[:8]:
        h.complete(key)
    h.confirm_stops()
    for i in range(8):
        h.submit(f"w{i}", tenant=f"w{i}", gpus=1, estimate_s=1000, model="m")
    h.start_all()
    assert cell.running_gpus == 16
    assert cell.cold_share() == pytest.approx(16 / 24)
    assert cell.load_terms().late_s == LOAD_S  # not counted since
    cell.publish_estimates()
    factor, loading, _, late_s = cell.load_terms()
    assert late_s == pytest.approx(0.5 * LOAD_S)
    assert loading == pytest.approx(0.5 * LOAD_S * 16)
    assert len(cell.loaded_runs or {}) == 8  # the ended runs' placements are pruned
    copy = pickle.loads(pickle.dumps(cell))
    assert copy.load_terms() == cell.load_terms()
    state = {
        k: v for k, v in cell.__getstate__().items() if k not in ("loaded_runs", "running_cold")
    }
    old = Cell.__new__(Cell)
    old.__setstate__(state)  # an older snapshot: the started GPUs' share until counted
    assert old.load_terms().late_s == pytest.approx(16 / 24 * LOAD_S)


def loads(cell: Cell, running: float, recycled: float, models: dict[str, float]) -> None:
    """Set the loads' moments: 16 GPUs started, a share ``running`` of them
    loading; ``recycled`` of them on GPUs that held a model, all loading."""
    square = sum(g * g for g in models.values())
    cell.load_mix = LoadMix(16.0, 16.0, 16 * running, recycled, recycled, square, dict(models))


def expected_point(ahead: float, running: float, s: float, n: float) -> float:
    """The flood's arithmetic, by hand, for 1-GPU runs of 1,000 s on 16 GPUs
    and a 1-GPU job (``point_wait_s`` with the loads in its inputs)."""
    e = 1000.0
    ahead *= 1 + n * LOAD_S / e
    running += s * LOAD_S * 16
    rho = (e * e + 2 * n * LOAD_S * e + n * LOAD_S**2) / (2 * (e + n * LOAD_S))
    own = running / 16
    behind = min(1.0, ahead / running)
    return (ahead + own + behind * (running - own - rho * 16)) / 16


@pytest.mark.parametrize(
    "running, recycled, models",
    [(1.0, 0.0, {"m": 16.0}), (0.5, 8.0, {"m": 8.0, "x": 8.0}), (1.0, 16.0, {"m": 4.0, "x": 12.0})],
)
def test_a_deep_job_waits_the_expected_load_time_more(running, recycled, models):
    """The flood's regime (a queue as deep as the running work): each GPU
    ahead loads ``n * L`` (``n`` the next starts' share), each running GPU
    holds ``s * L`` more (``s`` the started GPUs' share), and a busy GPU's
    residual is that of runs ``L`` longer a share ``n`` of the time."""
    points = {}
    for load_s in (0.0, LOAD_S):
        h = cold_cell(load_s)
        loads(h.cell, running, recycled, models)
        h.submit("deep", tenant="same", gpus=16, per_node=8, estimate_s=900)
        behind = queued(h.submit("behind", tenant="same", gpus=1, estimate_s=60))
        points[load_s] = behind.wait_estimate_s
    s, n = h.cell.cold_share(), h.cell.next_cold_share()
    assert s == running
    prior = 1 - sum(g * g for g in models.values()) / 256
    assert n == pytest.approx((recycled + LOAD_PRIOR_GPUS * prior) / (recycled + 256))
    ahead = running_gpu_s = 16 * 900
    assert points[0.0] == pytest.approx((ahead + running_gpu_s) / 16 - 500, abs=0.01)
    assert points[LOAD_S] == pytest.approx(expected_point(ahead, running_gpu_s, s, n), abs=0.01)
    assert points[LOAD_S] > points[0.0] + 10


def test_runs_that_load_free_their_gpus_that_much_later():
    """Nothing ahead: the job waits for the running runs' ends, each ``s * L``
    after its estimated end."""
    waits = {}
    for load_s in (0.0, LOAD_S):
        h = cold_cell(load_s)
        waits[load_s] = queued(h.submit("one", tenant="new", gpus=1, estimate_s=60))
    assert waits[0.0].wait_estimate_s == pytest.approx(900, abs=0.01)
    assert waits[LOAD_S].wait_estimate_s == pytest.approx(900 + LOAD_S, abs=0.01)


def test_no_load_is_counted_when_no_run_loads_or_none_is_configured():
    h = cold_cell(LOAD_S)
    cell = h.cell
    loads(cell, 0.0, 0.0, {"m": 16.0})  # every GPU was warm, one model
    factor, loading, residual, late_s = cell.load_terms()
    assert (factor, loading, late_s) == (1.0, 0.0, 0.0)
    assert residual == pytest.approx(cell.run_residual_s())
    h = cold_cell(0.0)
    assert h.cell.cold_share() == 1.0
    assert h.cell.load_terms() == (1.0, 0.0, h.cell.run_residual_s(), 0.0)


def test_the_depth_prior_inverts_the_loaded_point():
    """``wait_depth`` inverts the point with the loads in it: a job is as many
    jobs deep (the queued work ahead over the mean queued job) with the loads
    counted as without, though its point is longer."""
    points = {}
    for load_s in (0.0, LOAD_S):
        h = cold_cell(load_s)
        loads(h.cell, 1.0, 16.0, {"m": 8.0, "x": 8.0})
        for i in range(5):
            h.submit(f"q{i}", tenant="same", gpus=1, estimate_s=160)
        out = h.submit("deep", tenant="same", gpus=16, per_node=8, estimate_s=900)
        point = points[load_s] = queued(out).wait_estimate_s
        assert point > 900 + load_s  # past the running runs' ends: the fluid arithmetic
        queued_jobs, backlog = 6, 5 * 160 + 16 * 900
        expect = 1 + 5 * 160 * queued_jobs / backlog
        # (the event's estimate is rounded to the millisecond)
        assert h.cell.wait_depth(point, 16) == pytest.approx(expect, rel=1e-5)
    assert points[LOAD_S] > points[0.0] + LOAD_S


def test_an_older_config_pickle_loads_without_the_knob_and_counts_no_load():
    config = replace(BASE, model_load_s=LOAD_S)
    old = CellConfig.__new__(CellConfig)
    names = [f.name for f in fields(CellConfig)]
    # pickled before the knob (and the knobs added after it)
    old.__setstate__(config.__getstate__()[: names.index("model_load_s")])
    assert getattr(old, "model_load_s", 0.0) == 0.0
    h = cold_cell()
    h.cell.config = old
    assert h.cell.load_terms() == (1.0, 0.0, h.cell.run_residual_s(), 0.0)
    h.cell.config = config
    assert h.cell.load_terms()[1] == 16 * LOAD_S  # every running GPU loaded


def test_the_simulated_cell_is_configured_with_the_fleets_load_time():
    for cold_s in (0.0, 7.5):
        opts = sim.SimOptions(cold_start_s=cold_s)
        assert sim.engine.cell_config(CellConfig(), opts).model_load_s == cold_s
