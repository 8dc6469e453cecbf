"""``FairTree.work_ahead`` with a ``LevelIndex`` cache (a publish of estimates)
answers as the plain scan of every backlogged sibling does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core.fairshare import FairTree

flows = st.tuples(
    st.sampled_from(["t1", "t2", "t3"]),
    st.sampled_from(["a", "b", "c", "d", "e", "f"]),
    st.sampled_from(["u1", "u2"]),
)


@settings(max_examples=200, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(flows, st.floats(1, 10_000), st.floats(0, 50_000)), min_size=1, max_size=40
    ),
    weights=st.dictionaries(st.sampled_from(["t1", "t2", "t3", "a", "b", "c"]), st.floats(0.1, 8)),
    ahead=st.lists(st.floats(0, 100_000), min_size=1, max_size=8),
)
def test_the_indexed_work_ahead_is_the_scan(jobs, weights, ahead):
    tree = FairTree()
    leaves = []
    for n, (path, cost, used) in enumerate(jobs):
        leaf = tree.leaf(path, (weights.get(path[0], 1.0), weights.get(path[1], 1.0), 1.0))
        tree.push(leaf, f"j{n}", cost)
        tree.charge_start(leaf, used)  # usage spreads the virtual times
        leaves.append(leaf)
    levels: dict = {}
    for leaf in leaves:
        for own in ahead:
            below_scan: list[float] = []
            below_index: list[float] = []
            scan = tree.work_ahead(leaf, own, below_scan)
            indexed = tree.work_ahead(leaf, own, below_index, levels)
            assert indexed == pytest.approx(scan, rel=1e-9, abs=1e-6)
            assert below_index == pytest.approx(below_scan, rel=1e-9, abs=1e-6)
