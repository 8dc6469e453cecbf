"""Issue #33, 2: slow runs are evidence against a node only across tenants, and a
node degraded on that evidence probes its way back (processors/core/stragglers.py)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core import CellConfig
from framespool.schemas import events as ev
from framespool.schemas.states import NodeState
from tests.support.core_harness import Harness

NODES = ("n0", "n1", "n2", "n3")


def cfg(**kw) -> CellConfig:
    base = dict(
        status_interval_s=0,
        estimate_interval_s=0,
        heartbeat_timeout_s=1e9,
        report_lease_s=1e9,
        straggler_interval_s=1.0,
    )
    base.update(kw)
    return CellConfig(**base)


def fleet(tenants: str = "ab", **kw) -> Harness:
    """Four 8-GPU nodes, each running one checkpointable run of model m per letter
    of ``tenants``, the GPUs split evenly (a0 and b0 on n0, a1 and b1 on n1, ...;
    a repeated letter's further runs are a0x1, a0x2...)."""
    h = Harness(nodes=len(NODES), config=cfg(**kw))
    gpus = 8 // len(tenants)
    for i in range(len(NODES)):
        for k, t in enumerate(tenants):
            job = f"{t}{i}" if k == tenants.index(t) else f"{t}{i}x{k}"
            h.submit(job, tenant=t, gpus=gpus, checkpoint_interval_s=30, estimate_s=3600, model="m")
    h.start_all()
    assert all(h.runs_on(n) for n in NODES)
    return h


def rounds(h: Harness, rate: Callable[[str, str], float], n: int = 15) -> list:
    """``n`` heartbeat rounds a second apart; ``rate(node, job)`` is each run's step rate."""
    out: list = []
    for _ in range(n):
        for node_id in NODES:
            reports = tuple(
                ev.RunReport(job_id=job, run=run, step_rate=rate(node_id, job))
                for job, run in h.runs_on(node_id)
                if h.cell.runs[(job, run)].phase == "running"
            )
            out += h.heartbeat(node_id, runs=reports)
        out += h.tick(1)
    return out


def states(h: Harness) -> dict[str, str]:
    return {n: h.cell.index.nodes[n].state for n in NODES}


def test_one_tenants_deliberately_slow_jobs_leave_no_node_degraded():
    # mallory's runs on n2 and n3 crawl (its own params); acme's run normally
    h = fleet("am")
    out = rounds(h, lambda node, job: 0.1 if job in ("m2", "m3") else 10.0, n=30)
    assert set(states(h).values()) == {NodeState.UP}
    assert not [o for o in out if isinstance(o, ev.CheckpointRun)]  # nothing moved either
    assert h.cell.counters.get("straggler_sightings") == 2  # seen, filed, not acted on


def test_a_tenants_fast_flood_does_not_make_other_tenants_runs_stragglers():
    # mallory's runs (two thirds of the fleet's) report 100x the rate of acme's and
    # globex's: with one global median, every honest run would be a straggler
    h = fleet("ammmmmmg")
    rounds(h, lambda node, job: 1000.0 if job.startswith("m") else 10.0, n=30)
    assert set(states(h).values()) == {NodeState.UP}


def test_a_node_slow_for_two_tenants_is_degraded_and_their_runs_moved():
    h = fleet("ab")
    out = rounds(h, lambda node, job: 2.0 if node == "n2" else 10.0)
    assert states(h)["n2"] == NodeState.DEGRADED
    assert {n: s for n, s in states(h).items() if n != "n2"} == dict.fromkeys(
        ("n0", "n1", "n3"), NodeState.UP
    )
    moved = sorted(o.job_id for o in out if isinstance(o, ev.CheckpointRun))
    assert moved == ["a2", "b2"]
    [change] = [o for o in out if isinstance(o, ev.NodeStateChanged) and o.state == "DEGRADED"]
    assert change.reason.startswith("straggler: runs of 2 tenants")
    assert "a2" not in change.reason and "b2" not in change.reason  # no job ids on the cluster view


def test_straggler_tenants_knob():
    # control above: one tenant's stragglers are not enough; set to 1, they are
    h = fleet("am", straggler_tenants=1)
    rounds(h, lambda node, job: 0.1 if job == "m2" else 10.0)
    assert states(h)["n2"] == NodeState.DEGRADED


def test_straggler_window_knob():
    # a2 straggles, then b2 straggles 100 s later: within a 600 s window that is
    # evidence of two tenants; with a 50 s window the first sighting has expired
    for window, expect in ((600.0, NodeState.DEGRADED), (50.0, NodeState.UP)):
        h = fleet("ab", straggler_window_s=window)
        rounds(h, lambda node, job: 2.0 if job == "a2" else 10.0)
        rounds(h, lambda node, job: 10.0, n=100)
        rounds(h, lambda node, job: 2.0 if job == "b2" else 10.0)
        assert states(h)["n2"] == expect, window


def test_a_degraded_node_comes_back_on_probation_and_waits_longer_if_still_slow():
    h = fleet("ab", straggler_probation_s=100.0)
    rounds(h, lambda node, job: 2.0 if node == "n2" else 10.0)
    assert states(h)["n2"] == NodeState.DEGRADED
    h.confirm_stops()
    out = rounds(h, lambda node, job: 10.0, n=80)
    assert states(h)["n2"] == NodeState.DEGRADED  # 95 s: still on probation
    out += rounds(h, lambda node, job: 10.0, n=10)
    assert states(h)["n2"] == NodeState.UP
    [back] = [o for o in out if isinstance(o, ev.NodeStateChanged) and o.state == "UP"]
    assert back.node_id == "n2" and back.reason.startswith("probation:")
    # the moved jobs come back (new runs: the probe) and are slow there again
    h.start_all()
    placed = {job for job, _ in h.runs_on("n2")}
    assert placed, "the node on probation takes work again"
    rounds(h, lambda node, job: 2.0 if node == "n2" else 10.0)
    assert states(h)["n2"] == NodeState.DEGRADED
    until_ms, in_a_row, _ = h.cell.straggler_nodes["n2"]
    assert in_a_row == 2 and until_ms - h.cell.now_ms > 150_000  # twice the probation


def test_reregistering_forgets_straggler_evidence():
    h = fleet("ab", straggler_probation_s=1e6)
    rounds(h, lambda node, job: 2.0 if node == "n2" else 10.0)
    assert "n2" in h.cell.straggler_nodes and "n2" in h.cell.node_slow
    h.register("n2", 8, "rail-1")
    assert states(h)["n2"] == NodeState.UP
    assert "n2" not in h.cell.straggler_nodes and "n2" not in h.cell.node_slow


@settings(max_examples=40, deadline=None)
@given(
    slow=st.lists(
        st.tuples(st.sampled_from(NODES), st.floats(0.001, 1000.0)), min_size=1, max_size=30
    )
)
def test_property_no_rates_of_one_tenant_ever_degrade_a_node(slow):
    """Whatever rates mallory's runs report (each round, its run on one node gets
    an arbitrary rate, the others theirs from before), with the other tenants
    running at a steady rate, no node is ever DEGRADED."""
    h = fleet("amgg")
    mine: dict[str, float] = {}
    for node_id, rate in slow:
        mine[node_id] = rate
        rounds(
            h,
            lambda node, job: mine.get(node, 10.0) if job.startswith("m") else 10.0,
            n=4,
        )
        assert set(states(h).values()) == {NodeState.UP}


def test_a_node_a_pre_probation_snapshot_left_degraded_is_put_on_probation():
    # the state a snapshot from before this rule holds: DEGRADED for a straggler,
    # and neither of the new tables
    h = fleet("ab", straggler_probation_s=100.0)
    node = h.cell.index.nodes["n1"]
    h.cell.set_node_state(node, "DEGRADED", "straggler: a1 at 2.00 steps/s vs median 10.00")
    del h.cell.__dict__["node_slow"], h.cell.__dict__["straggler_nodes"]
    h.tick(1)
    assert "n1" in h.cell.straggler_nodes and states(h)["n1"] == NodeState.DEGRADED
    h.tick(101)
    assert states(h)["n1"] == NodeState.UP


# -- the reference rates kept incrementally (issue 35) -------------------------------
_RATES = st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 2.5, 3.0, 7.25, float("nan")])
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["rate", "rate", "rate", "end", "refresh"]),
        st.integers(0, 39),  # run
        _RATES,
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, nan=st.booleans())
def test_property_incremental_medians_equal_the_full_rebuild(ops, nan):
    """``refresh_medians`` (sorted lists per model and tenant, only changed models
    recomputed) files exactly what a rebuild from every run's rate does
    (``full_medians``), whatever order rates arrive, change and leave in."""
    from types import SimpleNamespace

    from framespool.processors.core import Cell

    cell = Cell(cfg())
    runs = [
        # two models, five tenants each, four runs a tenant
        SimpleNamespace(key=(f"j{i}", 1), tenant="abcde"[i % 5], model_version=f"m{i // 20}")
        for i in range(40)
    ]
    for op, i, rate in ops:
        run = runs[i]
        if not nan and rate != rate:
            rate = 1.5
        if op == "rate":
            cell.runs[run.key] = run  # type: ignore[assignment]
            cell.note_rate(run, rate)  # type: ignore[arg-type]
        elif op == "end" and run.key in cell.runs:
            cell.forget_rate(run)  # type: ignore[arg-type]
            del cell.runs[run.key]
        else:
            cell.refresh_medians()
            assert repr(sorted(cell.model_median.items(), key=repr)) == repr(
                sorted(cell.full_medians().items(), key=repr)
            )
    cell.refresh_medians()
    assert repr(sorted(cell.model_median.items(), key=repr)) == repr(
        sorted(cell.full_medians().items(), key=repr)
    )
