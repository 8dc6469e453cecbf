"""Issue 35: ``FairTree.offset_picked`` (a walk's candidate charged to the pass
with its heap entries re-keyed at once) leads the fair order exactly where the
lazy ``offset`` does: the plain version is the oracle."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core.fairshare import FairTree

_JOBS = st.lists(
    st.tuples(
        st.sampled_from(["t0", "t1", "t2"]),
        st.sampled_from(["o0", "o1", "o2", "o3"]),
        st.sampled_from(["u0", "u1", "u2"]),
        st.sampled_from([0.0, 1.0, 8.0, 100.0, 3600.0, 28800.0]),
    ),
    min_size=1,
    max_size=60,
)


def _walk(jobs, charges, steps, picked_offset):
    tree = FairTree()
    leaves = {}
    for i, (tier, org, user, cost) in enumerate(jobs):
        weights = (1.0 + (tier == "t0"), 1.0 + (org == "o1"), 1.0)
        leaf = leaves[(tier, org, user)] = tree.leaf((tier, org, user), weights)
        tree.push(leaf, f"j{i}", cost)
    for path, charge in zip(sorted(leaves), charges):
        tree.charge_start(leaves[path], charge)
    order = []
    for _ in range(2):  # two passes: the second starts from the first's re-filing
        tree.begin_pass()
        left = {leaf: list(leaf.queue) for leaf in leaves.values()}
        for _ in range(steps):
            leaf = tree.pick()
            if leaf is None:
                break
            job = left[leaf].pop(0)
            order.append(job)
            cost = jobs[int(job[1:])][3]
            (tree.offset_picked if picked_offset else tree.offset)(leaf, cost)
            if not left[leaf]:
                tree.exhaust(leaf)
        tree.end_pass()
    return order


@settings(max_examples=200, deadline=None)
@given(
    jobs=_JOBS,
    charges=st.lists(st.sampled_from([0.0, 5.0, 50.0, 1e4]), max_size=36),
    steps=st.integers(1, 80),
)
def test_property_offset_picked_orders_as_offset(jobs, charges, steps):
    assert _walk(jobs, charges, steps, True) == _walk(jobs, charges, steps, False)
