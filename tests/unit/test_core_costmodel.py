"""The core's cost model, and proof that its indexed structures decide as the scans did.

1. Oracle replays: a multitenant backlog workload (thousands of queued jobs,
   hundreds of tenants, guarantees, caps, preemption, production cadences) is
   simulated with the real cell; its input tape is replayed through
   ``NaiveCell`` (linear scans, sorted release lists, no memo) and every
   output event must be equal.
2. Hypothesis: the fair-share heaps pick what a scan picks under random
   queue, charge, offset and exhaust operations; the release list walks the
   ends a full sort gives.
3. The cost model in counts, not seconds: heap work per pick grows with
   log(n) of the backlogged flows, a pass searches each distinct shape once,
   config lookups do not scan.
"""

from __future__ import annotations

import math
import pickle
import sys
from dataclasses import fields, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.processors.core import Cell, CellConfig, TenantConfig, fairshare, walkproofs
from framespool.processors.core.fairshare import FairTree
from framespool.processors.core.model import Node
from framespool.processors.core.placement import NodeIndex
from framespool.processors.core.reservation import LateSlices
from framespool.processors.sim.engine import SimOptions, Simulation
from framespool.processors.sim.policies import POLICIES
from framespool.processors.sim.workload import synthetic
from framespool.schemas import events as ev
from framespool.schemas.states import JobState, NodeState
from tests.support.core_harness import Harness
from tests.support.core_oracle import NaiveCell, NaiveFairTree, naive_queue_depths, naive_releases


def _tape(jobs: int, nodes: int, load: float, base: CellConfig, seed: int = 3):
    # Ticks every 5 s keep the tape short; heartbeats, status and estimates on
    # (guarantees can leave a big non-preemptible gang unplaceable: stop at a horizon)
    opts = SimOptions(
        nodes=nodes,
        tick_s=5.0,
        heartbeat_s=30.0,
        estimates=True,
        seed=seed,
        max_sim_s=40_000,
    )
    workload = synthetic("multitenant", jobs, seed, opts.capacity_gpus, load)
    tape: list = []
    sim = Simulation(workload, POLICIES["framespool"], opts, base, tape=tape)
    summary = sim.run()
    return tape, sim.config, summary


def _guarded_base() -> CellConfig:
    """Guarantees and caps on the busiest tenants, so those paths decide too."""
    tiers = tuple(
        replace(t, reserved_gpus=24) if t.name == "enterprise" else t for t in CellConfig().tiers
    )
    tenants = (
        TenantConfig("ent00000", weight=2.0, reserved_gpus=16, max_gpus=48),
        TenantConfig("pai00000", max_running=3, user_max_gpus=24),
        TenantConfig("fre00000", reserved_gpus=8),
        TenantConfig("fre00000", reserved_gpus=4),  # a repeated name: both entries count
    )
    return CellConfig(tiers=tiers, tenants=tenants)


# "plain" keeps the walk's knobs of before issue 34 (4 reservations, a budget of
# 256): with every reservation slot taken at once the walks ask for the classes'
# proof often, which is what it checks; "defaults" runs today's defaults (16
# reservations, a walk of 2048), where they rarely do
PROOF_KNOBS = CellConfig(reservations=4, backfill_depth=256)


@pytest.mark.slow
@pytest.mark.parametrize(
    "jobs,nodes,load,base,proofs",
    [
        (500, 10, 3.0, PROOF_KNOBS, True),
        (500, 10, 3.0, CellConfig(), False),
        (400, 16, 3.0, _guarded_base(), False),
    ],
    ids=["plain", "defaults", "guarantees-and-caps"],
)
def test_indexed_core_decides_like_the_scans(monkeypatch, jobs, nodes, load, base, proofs) -> None:
    tape, config, summary = _tape(jobs, nodes, load, base)
    held: list[bool] = []  # the classes' proofs the walks asked for (NaiveCell asks none)
    prove = Cell.every_class_blocked
    monkeypatch.setattr(
        Cell, "every_class_blocked", lambda c, m: held.append(prove(c, m)) or held[-1]
    )
    assert summary["violations_by_kind"].keys() <= {"not_terminal"}
    fast, naive = Cell(config, "sim"), NaiveCell(config, "sim")
    deepest = assigned = 0
    for i, event in enumerate(tape):
        position = f"sim:{i + 1}"
        if i == len(tape) // 2:  # the rest from a snapshot: kept structures survive it
            fast = pickle.loads(pickle.dumps(fast))
        out = fast.apply(event, position)
        assert out == naive.apply(event, position), f"outputs differ at input {i}: {event}"
        assigned += sum(type(o) is ev.JobAssigned for o in out)
        deepest = max(deepest, fast.queued_count)
        # the status rows kept as jobs queue, reshape, place and release: the fold's
        assert fast.queue_depths() == naive_queue_depths(fast), f"rows differ at input {i}"
        if type(event) is ev.Tick and i % 7 == 0:
            _check_release_list(fast)
    # the workload really was a backlog of many tenants
    assert deepest > 60 and assigned > jobs // 2
    if proofs:  # walks stopped on the classes' proof, and decided as the whole walks
        assert held.count(True) > 10 and held.count(False) > 10, held.count(True)
        assert summary["walks"]["proofs_held"] > 10  # as the simulator reports them
        # and candidates failed on a class a failed proof had found blocked
        assert summary["walks"]["candidates_of_blocked_classes"] > 10
    assert summary["walks"]["candidates_tested"] > summary["walks"]["walks"] > 0
    assert len({j.tenant for j in fast.jobs.values()} | set(fast.org_use)) > 50


class _CountedRuns(dict):
    def __init__(self, runs: dict) -> None:
        super().__init__(runs)
        self.reads = 0

    def __getitem__(self, key):
        self.reads += 1
        return super().__getitem__(key)


def _slack(run) -> int:
    return max(1000, int(run.estimate_s * 100))


def _check_release_list(cell: Cell) -> None:
    """The release list walks the ends a full sort gives, with every slice filed
    at its run's current static end (a start report re-files it); the late
    slices (filed at or before now) are kept as time passes their ends, so a
    read looks up only the runs of slices that became late since the last read
    and of those capped at their hard limit, and no other."""
    now = cell.now_ms
    ends = cell.release_list()
    for end, node_id, gpus, key in ends:
        run = cell.runs[key]
        assert end == run.started_ms + int(run.estimate_s * 1000) and len(run.held[node_id]) == gpus
    kept_at = cell.late_slices(ends).at
    newly = sum(1 for end, *_ in ends if kept_at < end <= now)
    capped = sum(
        1
        for end, _, _, key in ends
        if end <= now and cell.runs[key].limit_ms - _slack(cell.runs[key]) <= now
    )
    runs = cell.runs
    cell.runs = counted = _CountedRuns(runs)
    try:
        naive = naive_releases(cell)
        assert list(cell.releases()) == naive
    finally:
        cell.runs = runs
    assert counted.reads == newly + capped
    late = cell.late_slices(ends)  # kept exactly: what a rebuild at now would hold
    assert late.at == now and late.by_slack == sorted(
        (_slack(runs[key]), node, gpus, key) for end, node, gpus, key in ends if end <= now
    )
    # a sticky reservation's walk reads its nodes' slices only, in the same order
    nodes = sorted(cell.index.nodes)
    for some in (tuple(nodes[::3]), cell.reservation_nodes, ()):
        assert cell.releases_on(some) == [r for r in naive if r[1] in some]


class _LateRun:
    def __init__(self, job: str, estimate_s: float, limit_ms: int) -> None:
        self.key, self.estimate_s, self.limit_ms = (job, 1), estimate_s, limit_ms

    def late_slack_ms(self) -> int:
        return _slack(self)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 900), st.integers(0, 400_000)), min_size=1, max_size=40),
    st.lists(st.integers(0, 500_000), min_size=1, max_size=6),
    st.data(),
)
def test_late_slices_read_in_projected_order_at_any_later_time(specs, nows, data) -> None:
    # runs past their estimate, some near their hard limit: whatever now, the
    # kept order is what projecting every slice afresh and sorting gives
    # (capped ones at their limit, or now + 1 once it passed), and drops keep it so
    late = LateSlices(0)
    runs = {}
    for i, (estimate, limit) in enumerate(specs):
        run = _LateRun(f"j{i:03d}", float(estimate), limit)
        runs[run.key] = run
        late.add(run, f"n{i % 5}", 1 + i % 3)
    for now in sorted(nows):
        if runs and data.draw(st.booleans()):
            key = data.draw(st.sampled_from(sorted(runs)))
            i = int(key[0][1:])
            late.drop(key, f"n{i % 5}", 1 + i % 3)
            del runs[key]
        naive = sorted(
            (
                max(now + 1, min(run.limit_ms, now + _slack(run))),  # Run.projected_end_ms, late
                f"n{int(key[0][1:]) % 5}",
                1 + int(key[0][1:]) % 3,
                key,
            )
            for key, run in runs.items()
        )
        assert list(late.ordered(now, runs)) == naive


@pytest.mark.slow
def test_a_cell_from_an_older_snapshot_rebuilds_its_release_list() -> None:
    # A snapshot from before slices were re-filed on start holds ``_release_list``
    # (maybe with slices filed before their run started): the list is rebuilt on
    # first use, even when that use is a release, and decides as the live cell.
    tape, config, _ = _tape(150, 6, 3.0, CellConfig())
    live, naive = Cell(config, "sim"), NaiveCell(config, "sim")
    half = len(tape) // 2
    for i, event in enumerate(tape[:half]):
        live.apply(event, f"sim:{i + 1}")
        naive.apply(event, f"sim:{i + 1}")
    state = pickle.loads(pickle.dumps(live)).__dict__
    state["_release_list"] = state.pop("_release_ends")
    state["_release_filed"] = state.pop("_release_ends_filed")
    restored = Cell.__new__(Cell)
    restored.__setstate__(state)
    for i, event in enumerate(tape[half:], half):
        out = restored.apply(event, f"sim:{i + 1}")
        assert out == naive.apply(event, f"sim:{i + 1}"), f"outputs differ at input {i}"
    assert "_release_list" not in restored.__dict__


@pytest.mark.slow
def test_a_cell_from_a_snapshot_without_status_rows_counts_them_on_first_read() -> None:
    # rows are kept only once read; a snapshot from before them (or before any
    # publish) builds them from the jobs and runs, then keeps them as it folds
    tape, config, _ = _tape(150, 6, 3.0, CellConfig())
    live = Cell(config, "sim")
    half = len(tape) // 2
    for i, event in enumerate(tape[:half]):
        live.apply(event, f"sim:{i + 1}")
    state = pickle.loads(pickle.dumps(live)).__dict__
    state.pop("_status_rows", None)
    restored = Cell.__new__(Cell)
    restored.__setstate__(state)
    assert restored.queue_depths() == naive_queue_depths(restored) != ()
    for i, event in enumerate(tape[half:], half):
        restored.apply(event, f"sim:{i + 1}")
        assert restored.queue_depths() == naive_queue_depths(restored), f"at input {i}"


# -- 2. the heaps against the scan -------------------------------------------------
OPS = st.lists(
    st.tuples(
        st.sampled_from(["push", "remove", "start", "end", "offset", "exhaust", "pick", "pass"]),
        st.integers(0, 11),
        st.integers(1, 9),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.sampled_from([0.0, 50.0]))
def test_fair_heaps_pick_what_the_scan_picks(ops, credit) -> None:
    trees = (FairTree(credit), NaiveFairTree(credit))
    paths = [(f"t{i % 2}", f"o{i % 4}", f"u{i}") for i in range(12)]
    weights = [(1.0 + i % 2, 1.0 + (i % 3) / 2, 1.0) for i in range(12)]
    queued: list[list[str]] = [[] for _ in range(12)]
    charged: list[list[float]] = [[] for _ in range(12)]
    n = 0
    for op, k, amount in ops:
        leaves = [t.leaf(paths[k], weights[k]) for t in trees]
        if op == "push":
            n += 1
            queued[k].append(f"j{n}")
            for leaf, tree in zip(leaves, trees):
                tree.push(leaf, f"j{n}", float(amount))
        elif op == "remove" and queued[k]:
            job = queued[k].pop(0)
            for leaf, tree in zip(leaves, trees):
                tree.remove(leaf, job, float(amount))
        elif op == "start":
            charged[k].append(amount * 10.0)
            for leaf, tree in zip(leaves, trees):
                tree.charge_start(leaf, amount * 10.0)
        elif op == "end" and charged[k]:
            cost = charged[k].pop(0)
            for leaf, tree in zip(leaves, trees):
                tree.charge_end(leaf, cost, cost * amount / 5)
        elif op == "offset":
            for leaf, tree in zip(leaves, trees):
                tree.offset(leaf, float(amount))
        elif op == "exhaust":
            for leaf, tree in zip(leaves, trees):
                tree.exhaust(leaf if amount % 2 else leaf.parent)
        elif op == "pick":
            picked = [tree.pick() for tree in trees]
            assert [p and p.name for p in picked] == [picked[1] and picked[1].name] * 2
        elif op == "pass":
            for tree in trees:
                tree.end_pass()
        usages = [
            [leaf.usage for leaf in (t.leaf(p, w) for p, w in zip(paths, weights))] for t in trees
        ]
        assert usages[0] == usages[1]
    _check_heaps(trees[0].root, trees[0].exhausted)


def _check_heaps(flow, exhausted) -> None:
    """Every backlogged, not exhausted child has exactly one live entry, keyed
    by its current virtual time, or below it by pass offsets not yet re-keyed
    (``FairTree.offset``: then its flow carries an offset); the settled heap
    holds every backlogged child."""
    live = {id(e[3]): e for e in flow.heap if e[3].stamp == e[2]}
    settled = {id(e[3]): e for e in flow.settled if e[3].sstamp == e[2]}
    for child in flow.active.values():
        assert id(child) in settled
        assert settled[id(child)][0] == (child.usage - child.inflight) / child.weight
        if child not in exhausted:
            key = (child.usage + child.offset) / child.weight
            assert live[id(child)][0] == key or (child.offset > 0 and live[id(child)][0] <= key)
        _check_heaps(child, exhausted)
    assert all(child.queued for child in (e[3] for e in live.values()))


# -- 3. the cost model, in counts ------------------------------------------------------
class _CountingHeapq:
    def __init__(self) -> None:
        self.ops = 0

    def heappush(self, heap, item) -> None:
        self.ops += 1
        fairshare_heapq.heappush(heap, item)

    def heappop(self, heap):
        self.ops += 1
        return fairshare_heapq.heappop(heap)

    def heapreplace(self, heap, item):
        self.ops += 1
        return fairshare_heapq.heapreplace(heap, item)

    def heapify(self, heap) -> None:
        self.ops += len(heap)
        fairshare_heapq.heapify(heap)


fairshare_heapq = fairshare.heapq


def _ops_per_pick(n: int, monkeypatch) -> float:
    counter = _CountingHeapq()
    tree = FairTree()
    leaves = [tree.leaf(("paid", f"o{i}", "u"), (1.0, 1.0, 1.0)) for i in range(n)]
    for i, leaf in enumerate(leaves):
        tree.push(leaf, f"j{i}", 100.0)
        tree.charge_start(leaf, float(i % 97))
    monkeypatch.setattr(fairshare, "heapq", counter)
    picks = 2000
    for _ in range(picks // 200):
        tree.begin_pass()
        for _ in range(200):
            leaf = tree.pick()
            tree.offset(leaf, 100.0)  # a job that did not fit: the walk moves on
        tree.end_pass()
    monkeypatch.setattr(fairshare, "heapq", fairshare_heapq)
    return counter.ops / picks


def test_a_pick_costs_log_n_heap_operations(monkeypatch) -> None:
    small, large = _ops_per_pick(64, monkeypatch), _ops_per_pick(8192, monkeypatch)
    # n grew 128x; a scan would cost 128x more, heap work grows with log n at most
    assert large <= small * math.log2(8192) / math.log2(64) + 4


def _one_free_gpu_under(tenants: int) -> Cell:
    """One 8-GPU node, 7 GPUs held by a long job, then ``tenants`` tenants'
    2-GPU jobs queued (none fits the free GPU); passes test 256 candidates."""
    config = CellConfig(status_interval_s=0, estimate_interval_s=0, backfill_depth=256)
    cell = Cell(config, "c")
    cell.apply(
        ev.NodeRegistered(event_id="r", ts_ms=0, node_id="n0", incarnation=1, cell="c", gpus=8)
    )
    cell.apply(ev.Tick(event_id="t0", ts_ms=1000, cell="c", now_ms=1000))
    small = ev.JobSpec(job_id="s", tenant="x", tier="paid", gpus=7, gpus_per_node=7, estimate_s=1e5)
    cell.apply(ev.JobAdmitted(event_id="a", ts_ms=0, spec=small))
    for i in range(tenants):
        spec = ev.JobSpec(
            job_id=f"q{i}", tenant=f"t{i}", tier="paid", gpus=2, gpus_per_node=2, estimate_s=60
        )
        cell.apply(ev.JobAdmitted(event_id=f"a{i}", ts_ms=0, spec=spec))
    return cell


@pytest.mark.slow
def test_a_pass_searches_each_shape_once(monkeypatch) -> None:
    # 2,000 tenants, each a 2-GPU job: none fits on the 1 free GPU
    cell = _one_free_gpu_under(2000)
    searches = []
    find = cell.index.find
    monkeypatch.setattr(cell.index, "find", lambda *a: searches.append(a) or find(*a))
    cell.apply(ev.Tick(event_id="t1", ts_ms=2000, cell="c", now_ms=2000))
    assert cell.queued_count == 2000
    assert len(searches) <= 2  # one per distinct (shape, reservation) key, not 256


def test_config_lookups_do_not_scan() -> None:
    class Unscannable(tuple):
        def __iter__(self):
            raise AssertionError("scanned")

    tenants = tuple(TenantConfig(f"t{i}", weight=1 + i % 3) for i in range(20_000))
    config = CellConfig(tenants=tenants)
    object.__setattr__(config, "tenants", Unscannable(tenants))
    object.__setattr__(config, "tiers", Unscannable(config.tiers))
    assert config.tenant("t19999").weight == 1 + 19999 % 3
    assert config.tenant("nobody").name == "nobody"
    assert config.tier("paid").rank == 2 and config.tier("nope") is None
    assert config.retry_budget("hung") == 1


def _cell_of_nodes(nodes: int, **config) -> Cell:
    """A cell of ``nodes`` 8-GPU nodes, its clock at 1 s."""
    cell = Cell(CellConfig(status_interval_s=0, estimate_interval_s=0, **config), "c")
    for n in range(nodes):
        cell.apply(
            ev.NodeRegistered(
                event_id=f"r{n}", ts_ms=0, node_id=f"n{n}", incarnation=1, cell="c", gpus=8
            )
        )
    cell.apply(ev.Tick(event_id="t0", ts_ms=1000, cell="c", now_ms=1000))
    return cell


def _tick_counting_tests(monkeypatch, cell: Cell) -> tuple[list, list]:
    """The outputs of a Tick at 2 s, and the jobs its pass tested (``try_start``)."""
    tried: list = []
    start = cell.try_start
    monkeypatch.setattr(
        cell, "try_start", lambda job, *a, **k: tried.append(job) or start(job, *a, **k)
    )
    return cell.apply(ev.Tick(event_id="t1", ts_ms=2000, cell="c", now_ms=2000)), tried


@pytest.mark.slow
def test_a_pass_stops_once_nothing_left_can_start(monkeypatch) -> None:
    # 1 GPU free, 2,000 queued 2-GPU jobs, every reservation slot taken: the walk
    # tests no candidate at all (the bounds say none fits), and decides as a full walk
    def build() -> Cell:
        cell = _cell_of_nodes(4, backfill_depth=256, reservations=4)  # every slot taken
        for n in range(4):
            spec = ev.JobSpec(
                job_id=f"s{n}", tenant="x", tier="paid", gpus=7, gpus_per_node=7, estimate_s=1e5
            )
            cell.apply(ev.JobAdmitted(event_id=f"s{n}", ts_ms=0, spec=spec))
        for i in range(2000):
            spec = ev.JobSpec(
                job_id=f"q{i}", tenant=f"t{i}", tier="paid", gpus=2, gpus_per_node=2, estimate_s=60
            )
            cell.apply(ev.JobAdmitted(event_id=f"a{i}", ts_ms=0, spec=spec))
        return cell

    outputs = []
    for stop in (True, False):
        cell = build()
        if not stop:
            monkeypatch.setattr(cell, "nothing_fits", lambda full: False)
            monkeypatch.setattr(cell, "every_class_blocked", lambda memo: False)
        out, tried = _tick_counting_tests(monkeypatch, cell)
        outputs.append(out)
        assert cell.reservation_job and len(cell.more_reservations()) == 3
        if stop:
            # the holder, and the jobs that take the further reservations
            assert len(tried) <= cell.config.reservations, len(tried)
        else:
            assert len(tried) > 100  # the walk it replaces
    assert outputs[0] == outputs[1]


def _two_blocked_classes_cell(depth: int = 256, gang_tenant: str = "g") -> Cell:
    """Two nodes run tenant x's long jobs, the third is free but reserved for a
    3-node gang until they end; queued, one per tenant, alternately: 8-GPU jobs
    that would run past that shadow time (the reserved node is barred to them)
    and 2-node jobs short enough to use it (but one node is too few). A walk
    tests ``depth`` candidates at most; the gang is ``gang_tenant``'s."""
    # arrival order within a user's queue: the candidates' order is the scenario
    cell = _cell_of_nodes(3, backfill_depth=depth, reservations=1, size_order_gpu_s_per_s=0)
    for n in range(2):
        spec = ev.JobSpec(
            job_id=f"s{n}", tenant="x", tier="paid", gpus=8, gpus_per_node=8, estimate_s=1e4
        )
        cell.apply(ev.JobAdmitted(event_id=f"s{n}", ts_ms=1000, spec=spec))
    spec = ev.JobSpec(
        job_id="gang", tenant=gang_tenant, tier="paid", gpus=24, gpus_per_node=8, estimate_s=60
    )
    cell.apply(ev.JobAdmitted(event_id="g", ts_ms=1000, spec=spec))
    cell.apply(ev.Tick(event_id="t0b", ts_ms=1500, cell="c", now_ms=1500))  # it reserves
    for i in range(300):
        long_one = i % 2 == 0
        spec = ev.JobSpec(
            job_id=f"q{i}",
            tenant=f"t{i}",
            tier="paid",
            gpus=8 if long_one else 16,
            gpus_per_node=8,
            estimate_s=2e4 if long_one else 60,
        )
        cell.apply(ev.JobAdmitted(event_id=f"a{i}", ts_ms=1000, spec=spec))
    return cell


def test_a_walk_stops_once_every_class_of_queued_job_is_proven_blocked(monkeypatch) -> None:
    # (``_two_blocked_classes_cell``) Per smallest need the bounds mix the 8-GPU
    # jobs' one node with the 2-node jobs' short estimate and cannot prove that
    # nothing fits; one search per class can. The walk stops after
    # QUIET_BEFORE_PROOF candidates and decides as the whole walk does.
    outputs = []
    for proof in (True, False):
        cell = _two_blocked_classes_cell()
        assert cell.reservation_job == "gang" and cell.index.free_total == 8
        if not proof:
            monkeypatch.setattr(cell, "every_class_blocked", lambda memo: False)
        proven = cell.counters.get("walk_proofs_held", 0)  # the admissions' passes too
        out, tried = _tick_counting_tests(monkeypatch, cell)
        outputs.append(out)
        assert not cell.nothing_fits(True)  # the bounds alone do not stop this walk
        if proof:
            assert len(tried) <= walkproofs.QUIET_BEFORE_PROOF + 3, len(tried)
            assert cell.counters["walk_proofs_held"] == proven + 1
        else:
            assert len(tried) > 100  # the walk it replaces
    assert outputs[0] == outputs[1]


def test_after_a_failed_proof_a_blocked_class_fails_without_a_search(monkeypatch) -> None:
    # As above, plus one job that does fit: a short 8-GPU job of tenant x, whose
    # running jobs put it last in the fair order, behind 300 candidates of the
    # two blocked classes; the walk spends its 256 tests before reaching it. So
    # the proof fails, but it found both other classes blocked, and the walk
    # tests their candidates without searching (``PassMemo.class_blocked``),
    # deciding as the walk that searches each one.
    def build() -> Cell:
        cell = _two_blocked_classes_cell()
        spec = ev.JobSpec(  # a class of its own (cpus), ends before the shadow time
            job_id="fits", tenant="x", tier="paid", gpus=8, gpus_per_node=8, estimate_s=60, cpus=1
        )
        cell.apply(ev.JobAdmitted(event_id="f", ts_ms=1000, spec=spec))
        return cell

    outputs = []
    for skip in (True, False):
        cell = build()
        assert cell.reservation_job == "gang" and cell.index.free_total == 8
        if not skip:
            monkeypatch.setattr(walkproofs.PassMemo, "class_blocked", lambda m, c, j: False)
        failed = cell.counters.get("walk_proofs_failed", 0)
        tests = cell.counters.get("walk_tests", 0)
        out, tried = _tick_counting_tests(monkeypatch, cell)
        outputs.append(out)
        assert cell.jobs["fits"].state == JobState.QUEUED  # never reached: the walk is idle
        assert cell.counters["walk_tests"] - tests == 256  # the whole budget, either way
        if skip:
            assert cell.counters["walk_proofs_failed"] == failed + 1
            assert len(tried) <= walkproofs.QUIET_BEFORE_PROOF + 3, len(tried)
        else:
            assert len(tried) == 257  # the holder, then each candidate searched (or in the memo)
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("depth", [300, 301])
def test_a_walk_read_ahead_stops_exactly_where_its_budget_ends(monkeypatch, depth) -> None:
    # As above: the proof fails (the short 8-GPU job fits), and the candidates
    # the walk would then fail on are read off the fair order and taken at once
    # (``WalkProofs.blocked_prefix``), not walked. The fitting job is the 301st
    # candidate (the 300 of the blocked classes first; the holder, tenant x's
    # too, is passed over uncounted just before it), so a walk of 300 tests
    # ends just before it and one of 301 starts it: a read one candidate too
    # short or too long decides otherwise than the walk, which the same cell
    # walks with the read turned off.
    def run(read: bool) -> tuple:
        cell = _two_blocked_classes_cell(depth, gang_tenant="x")
        spec = ev.JobSpec(
            job_id="fits", tenant="x", tier="paid", gpus=8, gpus_per_node=8, estimate_s=60, cpus=1
        )
        cell.apply(ev.JobAdmitted(event_id="f", ts_ms=1000, spec=spec))
        if not read:
            monkeypatch.setattr(cell, "blocked_prefix", lambda *a: ([], 0))
        taken: list[tuple[list, int]] = []
        prefix = cell.blocked_prefix
        monkeypatch.setattr(
            cell, "blocked_prefix", lambda *a: taken.append(prefix(*a)) or taken[-1]
        )
        tests = cell.counters.get("walk_tests", 0)
        skips = cell.counters.get("walk_class_skips", 0)
        out, tried = _tick_counting_tests(monkeypatch, cell)
        started = cell.jobs["fits"].state != JobState.QUEUED
        assert started == (depth == 301)
        if read:  # every candidate after the proof's, at once
            assert len(taken) == 1
            prefix_taken, counted = taken[0]
            assert counted > depth - 2 * walkproofs.QUIET_BEFORE_PROOF
            assert len(tried) <= walkproofs.QUIET_BEFORE_PROOF + 3 + started, len(tried)
            assert (prefix_taken[-1][1] == "gang") == started  # the holder, just before "fits"
        return (
            out,
            cell.counters["walk_tests"] - tests,
            cell.counters["walk_class_skips"] - skips,
        )

    runs = [run(True), run(False)]
    assert runs[0] == runs[1]  # the same outputs and the same counts of tests


def _further_holder_on_n2(f_gpus: int) -> Harness:
    """Tenant x's long jobs fill the two 8-GPU nodes, M the 4-GPU node n2 for
    100 s; the gang G holds the first reservation, and F (``f_gpus``, 50 s) a
    further one on n2, free once M ends. n3's one free GPU fits nobody."""
    config = CellConfig(status_interval_s=0, estimate_interval_s=0, reservations=2)
    h = Harness(config=config, nodes=2)
    h.register("n2", gpus=4, rail="rail-1")
    h.register("n3", gpus=1, rail="rail-1")  # free, too small for all: passes run
    for job_id in ("L0", "L1"):
        h.submit(job_id, tenant="x", gpus=8, estimate_s=1e4, tier="paid")
    h.submit("M", tenant="f", gpus=4, per_node=4, estimate_s=100, tier="paid")
    h.start_all()
    h.submit("G", tenant="g", gpus=16, per_node=8, estimate_s=60, tier="paid")
    h.submit("F", tenant="f", gpus=f_gpus, per_node=f_gpus, estimate_s=50, tier="paid")
    h.tick(1)
    assert h.cell.reservation_job == "G" and list(h.cell.more_reservations()) == ["F"]
    return h


def test_the_classes_proof_searches_a_further_holder_on_its_own_nodes(monkeypatch) -> None:
    # F holds a further reservation on the 4-GPU node n2, free again once M
    # ends. The queued 4-GPU jobs of F's class may not use n2 (they run past its
    # shadow time), but F may: the proof must search F itself, or it would stop
    # the walk before the fair order reaches F (its tenant has used more).
    def run(proof: bool) -> tuple[list, list[bool]]:
        held: list[bool] = []
        prove = Cell.every_class_blocked
        monkeypatch.setattr(
            Cell,
            "every_class_blocked",
            (lambda c, m: held.append(prove(c, m)) or held[-1]) if proof else (lambda c, m: False),
        )
        h = _further_holder_on_n2(4)
        for i in range(20):
            h.submit(f"Q{i}", tenant=f"q{i}", gpus=4, per_node=4, estimate_s=1e5, tier="paid")
        h.complete(("M", 1))
        h.tick(1)
        assert [s.spec.job_id for s in h.assigned()][-1] == "F"
        return h.log, held

    with_proof, held = run(True)
    assert False in held  # F could start: the proof did not hold
    assert with_proof == run(False)[0]


def test_a_class_found_blocked_is_searched_again_once_a_further_holder_starts(
    monkeypatch,
) -> None:
    # F holds a further reservation on the 4-GPU node n2, free once M ends; the
    # queued 2-GPU jobs run past its shadow time, so the proof finds their
    # class blocked (F itself fits: the proof fails). The walk reaches F after
    # nine of them and starts it on half of n2: its reservation is gone, and
    # the next 2-GPU job fits the other half. The blocked classes are
    # forgotten as the walk places (``PassMemo.reservations_changed``).
    def run(skip: bool) -> list:
        if not skip:
            monkeypatch.setattr(walkproofs.PassMemo, "class_blocked", lambda m, c, j: False)
        h = _further_holder_on_n2(2)
        for i in range(20):
            for k in range(2):
                h.submit(
                    f"Q{i}.{k}", tenant=f"q{i}", gpus=2, per_node=2, estimate_s=1e5, tier="paid"
                )
        h.complete(("M", 1))
        failed = h.cell.counters.get("walk_proofs_failed", 0)
        h.tick(1)
        started = [s.spec.job_id for s in h.assigned()]
        assert started[-2:] == ["F", "Q0.1"]
        if skip:
            assert h.cell.counters["walk_proofs_failed"] > failed  # the blocked class was known
        return h.log

    assert run(True) == run(False)


def test_a_skipped_walk_wakes_when_a_reservation_gains_slack(monkeypatch) -> None:
    # A gang holds both nodes until its blockers end at ~t+1000s; a 50 s job
    # may use n1's 4 free GPUs only if it ends by the shadow time. With 40 s
    # left it does not, and idle walks are skipped; once the blockers outlive
    # their estimates the shadow moves to now + 100 s and it fits: that walk
    # must run (and decide as the oracle, which never skips one).
    from tests.support import core_harness

    def play(naive: bool) -> tuple[list, int | None]:
        monkeypatch.setattr(core_harness, "Cell", NaiveCell if naive else Cell)
        h = core_harness.Harness(nodes=2, nodes_per_rail=2)
        h.submit("a", gpus=8, estimate_s=1000)
        h.submit("b", gpus=4, estimate_s=1000)
        h.start_all()
        h.submit("gang", gpus=16, per_node=8)
        assigned_at = None
        while h.now_ms < 1_030_000:
            out = h.tick(1.0)
            if h.now_ms % 10_000 == 0:
                for node_id in ("n0", "n1"):
                    out += h.heartbeat(node_id)
            if h.now_ms == 960_000:
                out += h.submit("x", gpus=4, estimate_s=50)
            if assigned_at is None and any(
                type(o) is ev.JobAssigned and o.job_id == "x" for o in out
            ):
                assigned_at = h.now_ms
        assert h.cell.reservation_job == "gang"
        return h.log, assigned_at

    (fast, fast_at), (naive, naive_at) = play(False), play(True)
    assert fast_at is not None and 1_000_000 < fast_at <= 1_002_000
    assert fast == naive and fast_at == naive_at


def test_the_walk_asks_every_job_that_may_preempt_even_under_a_default_guarantee(
    monkeypatch,
) -> None:
    # The walk asks maybe_preempt only about jobs preempt_sensitive names; a
    # tenant with no entry of its own gets the default tenant's guarantee, and
    # under it reclaims GPUs from a borrower (2 GPUs free, it needs 8).
    from tests.support import core_harness

    config = CellConfig(
        status_interval_s=0,
        estimate_interval_s=0,
        heartbeat_timeout_s=1000,
        tenants=(TenantConfig("lender"),),
        default_tenant=TenantConfig("*", reserved_gpus=8),
    )
    for cls in (Cell, NaiveCell):
        monkeypatch.setattr(core_harness, "Cell", cls)
        h = core_harness.Harness(nodes=1, config=config)
        h.submit(
            "borrow",
            tenant="lender",
            gpus=6,
            preemptible=True,
            checkpoint_interval_s=30,
            estimate_s=3600,
        )
        h.start_all()
        h.tick(100)
        h.heartbeat("n0")
        h.submit("mine", tenant="newco", gpus=8)
        out = h.tick(1)
        assert [o.job_id for o in out if type(o) is ev.CheckpointRun] == ["borrow"], cls


def test_a_repeated_heartbeat_classifies_no_gpu_and_keeps_states_exact(monkeypatch) -> None:
    # The same health samples again cost O(1) (no GPU classified); a change, a
    # GPU still recovering or a placement's warm model since makes a full fold,
    # and every GPU state, streak and warm model then is what the scan gives.
    from framespool.processors.core import nodes

    calls = [0]

    def counted(sample, config, _inner=nodes.classify):
        calls[0] += 1
        return _inner(sample, config)

    monkeypatch.setattr(nodes, "classify", counted)
    config = CellConfig(status_interval_s=0, estimate_interval_s=0)
    fast, naive = Cell(config, "c"), NaiveCell(config, "c")
    ok = tuple(ev.GpuHealth(index=i, warm_models=("m",)) for i in range(8))
    hot = (ev.GpuHealth(index=3, temperature_c=99.0), *ok[:3], *ok[4:])
    cold = (*ok[:5], ev.GpuHealth(index=5), *ok[6:])
    plan = [ok] * 20 + [hot] * 3 + [ok] * 12 + [cold] + [cold] * 10 + [ok] * 3
    t = 0
    for cell in (fast, naive):
        cell.apply(
            ev.NodeRegistered(event_id="r", ts_ms=0, node_id="n0", incarnation=1, cell="c", gpus=8)
        )
    per_beat = []
    for k, samples in enumerate(plan):
        t += 1000
        tick = ev.Tick(event_id=f"t{k}", ts_ms=t, cell="c", now_ms=t)
        beat = ev.NodeHeartbeat(
            event_id=f"h{k}", ts_ms=t, node_id="n0", incarnation=1, gpus=samples
        )
        before = calls[0]
        assert fast.apply(tick, f"p{k}a") == naive.apply(tick, f"p{k}a")
        out = fast.apply(beat, f"p{k}b")
        per_beat.append(calls[0] - before)
        assert out == naive.apply(beat, f"p{k}b"), k
        a, b = fast.index.nodes["n0"], naive.index.nodes["n0"]
        assert (a.gpu_state, a.warm) == (b.gpu_state, b.warm), k
        if k == 30:  # a placement warms another model: the next beat must fold again
            a.warm[0] = b.warm[0] = "other"
    # the first fold classifies 8 GPUs, a repeat none; a change folds once; the
    # hot GPU's recovery (5 healthy samples) folds in full until it is OK again;
    # the warm model a placement changed refolds once
    full = {0, 20, 23, 24, 25, 26, 27, 31, 35, 46}
    assert per_beat == [8 if k in full else 0 for k in range(len(plan))]
    # the owed healthy streaks are paid before the next full fold reads them
    owed = [n + 2 for n in fast.index.nodes["n0"].healthy_streak]  # two repeats since
    assert owed == naive.index.nodes["n0"].healthy_streak
    fast.apply(
        ev.NodeHeartbeat(event_id="h", ts_ms=t + 1, node_id="n0", incarnation=1, gpus=hot), "x"
    )
    naive.apply(
        ev.NodeHeartbeat(event_id="h", ts_ms=t + 1, node_id="n0", incarnation=1, gpus=hot), "x"
    )
    assert fast.index.nodes["n0"].healthy_streak == naive.index.nodes["n0"].healthy_streak


def test_an_offer_counts_no_gpu_of_any_node(monkeypatch) -> None:
    # CellOffer's free GPUs come off the placement index and its healthy GPUs
    # from list.count: no per-GPU Python scan, and the values the scan gives
    from framespool.processors.core.model import Node

    config = CellConfig(status_interval_s=0, estimate_interval_s=0)
    fast, naive = Cell(config, "c"), NaiveCell(config, "c")
    for cell in (fast, naive):
        for n in range(6):
            cell.apply(
                ev.NodeRegistered(
                    event_id=f"r{n}",
                    ts_ms=0,
                    node_id=f"n{n}",
                    incarnation=1,
                    cell="c",
                    gpus=8,
                    gpu_type="h100" if n % 2 else "a100",
                )
            )
        cell.apply(ev.Tick(event_id="t0", ts_ms=1000, cell="c", now_ms=1000))
        for i in range(5):
            spec = ev.JobSpec(job_id=f"j{i}", tenant="t", tier="paid", gpus=3, estimate_s=600)
            cell.apply(ev.JobAdmitted(event_id=f"a{i}", ts_ms=0, spec=spec))
        hot = tuple(ev.GpuHealth(index=i, temperature_c=99.0 if i < 2 else 40.0) for i in range(8))
        cell.apply(
            ev.NodeHeartbeat(event_id="h", ts_ms=1500, node_id="n1", incarnation=1, gpus=hot)
        )
    expected = naive.offer_fields()
    assert expected["free_gpus"] < 48  # some placed, some unhealthy

    def scanned(self):
        raise AssertionError("scanned a node's GPUs")

    monkeypatch.setattr(Node, "free_count", scanned)
    assert fast.offer_fields() == expected


def _full_cell(nodes: int, jobs: int, model: str = "m") -> Cell:
    """``nodes`` 8-GPU nodes filled by ``jobs`` 1-GPU runs of ``model`` (started)."""
    cell = Cell(CellConfig(status_interval_s=0, estimate_interval_s=0), "c")
    for n in range(nodes):
        cell.apply(
            ev.NodeRegistered(
                event_id=f"r{n}", ts_ms=0, node_id=f"n{n}", incarnation=1, cell="c", gpus=8
            )
        )
    cell.apply(ev.Tick(event_id="t0", ts_ms=1000, cell="c", now_ms=1000))
    for i in range(jobs):
        spec = ev.JobSpec(
            job_id=f"f{i}",
            tenant=f"t{i % 7}",
            tier="paid",
            gpus=1,
            gpus_per_node=1,
            estimate_s=100 + 10 * i,
            model=model,
        )
        cell.apply(ev.JobAdmitted(event_id=f"f{i}", ts_ms=0, spec=spec))
    cell.apply(ev.Tick(event_id="t1", ts_ms=2000, cell="c", now_ms=2000))
    return cell


def test_a_reservation_walk_asks_about_each_node_once(monkeypatch) -> None:
    # 4 nodes, 31 one-GPU runs ending one by one: a whole-node gang's
    # reservation walks 31 releases but asks its node filter about 4 nodes
    cell = _full_cell(4, 31)
    assert cell.index.free_total == 1 and len(cell.release_list()) == 31
    asked: list[str] = []
    earliest_fit = cell.index.earliest_fit

    def counted(per_node, nodes_needed, releases, ok):
        return earliest_fit(
            per_node, nodes_needed, releases, lambda node: asked.append(node.node_id) or ok(node)
        )

    monkeypatch.setattr(cell.index, "earliest_fit", counted)
    gang = ev.JobSpec(
        job_id="g", tenant="big", tier="paid", gpus=32, gpus_per_node=8, estimate_s=60
    )
    cell.apply(ev.JobAdmitted(event_id="g", ts_ms=0, spec=gang))
    cell.apply(ev.Tick(event_id="t2", ts_ms=3000, cell="c", now_ms=3000))
    assert cell.reservation_job == "g" and len(cell.reservation_nodes) == 4
    assert asked and len(asked) == len(set(asked)) <= 4, asked


def test_a_search_that_finds_nothing_skips_the_warm_scan(monkeypatch) -> None:
    # 64 nodes, each with 7 GPUs busy and 1 free GPU warm with the model: a
    # 1-GPU search that no node passes finds nothing after one node-filter call
    # per free node, and never looks at a node's warm GPUs
    index = NodeIndex()
    for n in range(64):
        node = Node(f"n{n}", 1, 8, "H100", "rail-0", 0.0, 0.0, 0)
        node.owner[:7] = [(f"busy{n}", 1)] * 7
        index.add(node)
        index.mark_warm(node, (7,), "m")
    assert index.free_total == 64 and len(index.warm_nodes["m"]) == 64
    warm_looks = []
    warm_free = index._warm_free
    monkeypatch.setattr(
        index, "_warm_free", lambda node, model: warm_looks.append(node) or warm_free(node, model)
    )
    asked = []
    found = index.find(1, 1, "m", lambda node: asked.append(node) and False)
    assert found is None and not warm_looks and len(asked) == 64
    # with one node allowed, the warm scan runs and picks it as a warm node
    found = index.find(1, 1, "m", lambda node: node.node_id == "n5")
    assert found is not None and found.slices[0].node_id == "n5" and len(warm_looks) == 1
    assert found.reason == "bin-pack: warm model"


def test_gang_liveness_looks_at_the_gangs_only_when_a_report_may_have_lapsed() -> None:
    # Both members of a running gang report every 5 s and a Tick comes every
    # second: with a 15 s lease the Tick looks at the gangs about every 10 s
    # (when the oldest report it knows of may have lapsed), not every second;
    # a member that then falls silent still ends the gang within the lease.
    from tests.support.core import started_gang
    from tests.support.core_harness import Harness

    h = Harness(CellConfig(status_interval_s=0, estimate_interval_s=0, report_lease_s=15), nodes=2)
    started_gang(h)
    looks: list[int] = []

    class Counted(dict):
        def __iter__(self):
            looks.append(h.now_ms)
            return super().__iter__()

    h.cell.gang_runs = Counted(h.cell.gang_runs)
    for second in range(60):
        if second % 5 == 0:
            h.heartbeat("n0")
            h.heartbeat("n1")
        h.tick(1)
    assert 1 <= len(looks) <= 7, looks
    silent_since = h.now_ms
    out: list = []
    while not any(type(o) is ev.JobRequeued for o in out):
        if (h.now_ms - silent_since) % 5000 == 0:
            h.heartbeat("n0")  # n1 says nothing more
        out = h.tick(1)
        assert h.now_ms - silent_since <= 16_000, "the silent member went unnoticed"


def _count_shape_reads(monkeypatch, cell: Cell, caller: str) -> list[str]:
    """The ids of the jobs whose shapes ``caller`` reads from now on, in order."""
    reads: list[str] = []
    shapes_of = cell.shapes_of

    def counted(job):
        if sys._getframe(1).f_code.co_name == caller:
            reads.append(job.job_id)
        return shapes_of(job)

    monkeypatch.setattr(cell, "shapes_of", counted)
    return reads


def test_a_walk_reads_a_jobs_shapes_once_not_per_pass(monkeypatch) -> None:
    # 1 GPU free, 300 tenants' 2-GPU jobs queued: every full pass tests 256 of
    # them; their shapes (and the spec's part of each search key) are built
    # once per job, so later passes read no job's shapes but the reservations'
    cell = _one_free_gpu_under(300)
    for job in cell.jobs.values():  # as a job from an older snapshot: no cache slot set
        del job.fit
    cell.apply(ev.Tick(event_id="t1", ts_ms=2000, cell="c", now_ms=2000))
    uncached = sum(getattr(job, "fit", None) is None for job in cell.jobs.values())
    assert uncached <= len(cell.jobs) - 256  # the pass tested 256 candidates
    builds = _count_shape_reads(monkeypatch, cell, "fit_shapes")
    tested = []
    start = cell.try_start
    monkeypatch.setattr(cell, "try_start", lambda j, *a, **k: tested.append(j) or start(j, *a, **k))
    for t in range(2, 6):
        cell.apply(ev.Tick(event_id=f"t{t}", ts_ms=1000 * t, cell="c", now_ms=1000 * t))
    assert cell.queued_count == 300
    # four more passes of 256 candidates: only jobs no pass had tested yet build
    assert len(builds) <= uncached, len(builds)
    assert len(tested) >= 256, len(tested)  # the passes did walk


def test_a_jobs_bound_key_is_built_once_and_old_snapshot_jobs_build_theirs(monkeypatch) -> None:
    # the queue bounds' key of a job (queuebounds.py) is read at enqueue, at
    # dequeue and by the admission's fit check: its shapes are read for it once
    cell = _one_free_gpu_under(5)
    for i in range(2):  # as jobs from an older snapshot: no cache slot set
        del cell.jobs[f"q{i}"].bounds
    builds = _count_shape_reads(monkeypatch, cell, "bound_key")
    cell.apply(ev.CancelJob(event_id="x", ts_ms=1500, job_id="s", tenant="x"))
    # the node lists no run: the cancelled one's GPUs are given back
    cell.apply(ev.NodeHeartbeat(event_id="h", ts_ms=1600, node_id="n0", incarnation=1))
    cell.apply(ev.Tick(event_id="t1", ts_ms=2000, cell="c", now_ms=2000))
    # the long job's GPUs are back: four 2-GPU jobs start, each dequeued by the
    # key it was queued with; the two slot-less ones built theirs, once
    assert cell.queued_count == 1
    bounds = cell.queue_bounds()
    assert bounds.size == 1 and bounds.need == {2: 1}
    assert sorted(builds) == ["q0", "q1"], builds


def _old_format(index: NodeIndex) -> NodeIndex:
    """``index`` as a snapshot from before the warm index would restore it."""
    state = pickle.loads(pickle.dumps(index)).__dict__
    for name in ("warm_stamp", "stamp_node", "warm_of", "warm_buckets", "warm_cuts"):
        del state[name]
    state["warm_nodes"] = {m: dict.fromkeys(nodes) for m, nodes in state["warm_nodes"].items()}
    restored = NodeIndex.__new__(NodeIndex)
    restored.__setstate__(state)
    return restored


_MODELS = ("m0", "m1", "m2")


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), window=st.sampled_from([1, 2, 64]))
def test_warm_index_places_as_the_warm_scan(data, window) -> None:
    # The bucketed warm index picks the node the scan of a model's first
    # WARM_SCAN_LIMIT * 8 warm nodes picked, under random takes, frees, warm
    # loads, health-written warm models, drains and re-registrations; a window
    # of 8 or 16 nodes makes the window's edge matter with few nodes, and a
    # restore from an old snapshot rebuilds the index in the same warm order.
    from tests.support.core_oracle import NaiveNodeIndex

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("framespool.processors.core.placement.WARM_SCAN_LIMIT", window)
        count = data.draw(st.integers(4, 24), label="nodes")
        fast, naive = NodeIndex(), NaiveNodeIndex()
        incarnation = {}

        def add(index: NodeIndex, n: int) -> None:
            index.add(Node(f"n{n}", incarnation.get(n, 1), 8, "H100", "r0", 0.0, 0.0, 0))

        for n in range(count):
            add(fast, n)
            add(naive, n)
        for step in range(data.draw(st.integers(1, 60), label="steps")):
            op = data.draw(
                st.sampled_from(
                    ["take", "free", "warm", "health", "state", "rereg", "find", "restore"]
                )
            )
            n = data.draw(st.integers(0, count - 1))
            if op == "restore":
                fast = _old_format(fast)
                continue
            if op == "find":
                k = data.draw(st.sampled_from([1, 2, 4, 8]))
                model = data.draw(st.sampled_from(_MODELS))
                barred = data.draw(st.sets(st.integers(0, count - 1), max_size=count))
                names = {f"n{b}" for b in barred}

                def ok(node: Node, names: set = names) -> bool:
                    return node.node_id not in names

                got, want = fast.find(k, 8, model, ok), naive.find(k, 8, model, ok)
                assert got == want, (step, k, model)
                continue
            if op == "rereg":
                incarnation[n] = incarnation.get(n, 1) + 1
                for index in (fast, naive):
                    index.forget_bucket(f"n{n}")
                    add(index, n)
                continue
            gpus = tuple(sorted(data.draw(st.sets(st.integers(0, 7), min_size=1, max_size=8))))
            model = data.draw(st.sampled_from(_MODELS))
            state = data.draw(st.sampled_from([NodeState.UP, NodeState.DRAINING]))
            for index in (fast, naive):
                node = index.nodes[f"n{n}"]
                if op == "take":
                    for i in gpus:
                        node.owner[i] = node.owner[i] or ("run", step)
                elif op == "free":
                    for i in gpus:
                        node.owner[i] = None
                elif op == "warm":
                    index.mark_warm(node, gpus, model)
                elif op == "health":
                    node.warm[gpus[0]] = model  # a heartbeat's warm model, not via mark_warm
                else:
                    node.state = state
                index.refresh(node)
            assert fast.bucket_of == naive.bucket_of
        for model in _MODELS:
            for k in (1, 2, 4, 8):
                assert fast.find(k, 8, model, lambda node: True) == naive.find(
                    k, 8, model, lambda node: True
                )


def test_the_warm_window_ends_where_the_scan_stopped() -> None:
    # Twelve nodes warm with "m" in order n0..n11 and a window of 8: the warm
    # preference sees n0..n7 only. With just n10 free among them, the search
    # takes the best-fit node (not n10 as a warm one), as the scan did; once n3
    # leaves the warm set, the window reaches n8 (still not n10); with n5 free
    # too, n5 wins as warm.
    from tests.support.core_oracle import NaiveNodeIndex

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("framespool.processors.core.placement.WARM_SCAN_LIMIT", 1)
        for index in (NodeIndex(), NaiveNodeIndex()):
            for n in range(12):
                node = Node(f"n{n}", 1, 8, "H100", "r0", 0.0, 0.0, 0)
                node.owner[:] = [("busy", n)] * 8
                index.add(node)
                index.mark_warm(node, (0,), "m")
            cold = Node("c", 1, 8, "H100", "r0", 0.0, 0.0, 0)
            cold.owner[1:] = [("busy", 99)] * 7
            index.add(cold)  # one free GPU, cold: the best fit for 1 GPU
            n10 = index.nodes["n10"]
            n10.owner[0] = None
            index.refresh(n10)
            found = index.find(1, 8, "m", lambda node: True)
            assert found is not None and found.slices[0].node_id == "c", type(index)
            index.mark_warm(index.nodes["n3"], (0,), "other")
            found = index.find(1, 8, "m", lambda node: True)
            assert found is not None and found.slices[0].node_id == "c", type(index)
            n5 = index.nodes["n5"]
            n5.owner[0] = None
            index.refresh(n5)
            found = index.find(1, 8, "m", lambda node: True)
            assert found is not None and found.slices[0].node_id == "n5"
            assert found.reason == "bin-pack: warm model"


def test_config_memos_answer_as_computed_and_an_older_pickle_loads() -> None:
    # ``may_preempt`` answers as the expression it memoises, for configured and
    # default tenants; a config pickled before the memo field existed (its
    # state short of the memo and of the fields after it, ``late``) loads
    # equal in every field it has and works.
    from framespool.processors.core.config import TierConfig

    tiers = (
        TierConfig("gold", 1.0, rank=0, sla_wait_s=10, may_preempt=True),
        TierConfig("bronze", 1.0, rank=1, sla_wait_s=600),
    )
    config = CellConfig(
        tiers=tiers,
        tenants=(TenantConfig("owed", reserved_gpus=4), TenantConfig("plain")),
    )
    cases = [("gold", "plain"), ("bronze", "owed"), ("bronze", "plain"), ("bronze", "stranger")]
    want = [True, True, False, False]
    assert [config.may_preempt(t, n) for t, n in cases] == want
    assert [config.may_preempt(t, n) for t, n in cases] == want  # from the memo
    assert not config.any_caps()
    capped = CellConfig(tenants=(TenantConfig("few", user_max_running=2),))
    assert capped.any_caps()
    assert CellConfig(default_tenant=TenantConfig("*", max_gpus=8)).any_caps()
    names = [f.name for f in fields(CellConfig)]
    later = names[names.index("model_load_s") :]  # every field added after the memos
    for memos in (1, 2):  # pickled before ``_any_caps``, before ``_may_preempt`` too
        for cfg in (config, capped):
            old = CellConfig.__new__(CellConfig)
            old.__setstate__(cfg.__getstate__()[: -len(later) - memos])
            assert all(
                getattr(old, f.name) == getattr(cfg, f.name)
                for f in fields(CellConfig)
                if f.compare and f.name not in later
            )
            assert old.any_caps() == cfg.any_caps()
            assert [old.may_preempt(t, n) for t, n in cases] == [
                cfg.may_preempt(t, n) for t, n in cases
            ]


def test_status_rows_follow_a_queued_job_that_its_reservation_reshapes() -> None:
    # an elastic job blocked behind two busy nodes: its reservation picks the
    # 8-GPU shape that finishes first, and the queued GPUs its row shows follow
    h = Harness(nodes=2)
    h.submit("long", gpus=8, estimate_s=1000)
    h.submit("short", gpus=7, estimate_s=100)  # one GPU free: the pass runs
    h.start_all()
    h.cell.queue_depths()  # the rows are kept from here on
    shapes = (ev.Shape(gpus=8, gpus_per_node=8, estimate_s=300),)
    h.submit("e", tenant="el", gpus=16, per_node=8, estimate_s=100, shapes=shapes)
    h.tick(1)
    job = h.cell.jobs["e"]
    assert h.cell.reservation_job == "e" and job.shape[0] == 8
    [row] = [r for r in h.cell.queue_depths() if r.tenant == "el"]
    assert (row.queued, row.queued_gpus) == (1, 8)
    assert h.cell.queue_depths() == naive_queue_depths(h.cell)


def test_a_late_run_ends_in_a_cell_that_has_not_kept_its_late_ends_yet() -> None:
    # a restored snapshot from before the late ends were kept (or a cell whose
    # release list was rebuilt) builds them on first use: when that use is a
    # late run giving its GPUs back, they are built before the slice leaves
    h = Harness(nodes=1, config=CellConfig(heartbeat_timeout_s=1000, report_lease_s=1000))
    h.submit("late", gpus=2, estimate_s=10)
    h.submit("waits", gpus=8, estimate_s=10)
    h.start_all()
    h.tick(30)  # past the estimate: the slice is late
    h.cell.__dict__.pop("_late_slices", None)
    out = h.complete(("late", 1))
    assert (
        any(type(o) is ev.JobCompleted for o in out)
        and not h.cell.late_slices(h.cell.release_list()).filed
    )
    assert list(h.cell.releases()) == naive_releases(h.cell)
