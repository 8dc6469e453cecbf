"""``FairTree.upcoming`` reads the rest of a pass in which every candidate fails
(``WalkProofs.blocked_prefix``): it must name the very jobs, in the very order,
that ``pick`` and ``offset`` give one by one, from any point of a pass."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core.fairshare import FairTree, Flow
from framespool.processors.core.scheduling import Scheduling

paths = st.tuples(
    st.sampled_from(["t1", "t2", "t3"]),
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.sampled_from(["u1", "u2", "u3"]),
)
# few distinct costs, usages and weights: keys tie often, and ties go by activation order
costs = st.sampled_from([1.0, 2.0, 3.0, 0.1, 0.2, 0.7, 64.0])


def walk(tree: FairTree, cursors: dict, budget: int, cost: dict[str, float], steps: int) -> list:
    """What ``Scheduling._walk`` does with the fair order when nothing starts:
    pick a leaf, take its next candidate (a snapshot of its first ``budget``
    jobs), charge it to the pass, exhaust the leaf at its last."""
    taken = []
    for _ in range(steps):
        leaf = tree.pick()
        if leaf is None:
            break
        cursor = cursors.get(leaf)
        if cursor is None:
            cursor = cursors[leaf] = [Scheduling.candidates(leaf, budget), 0]
        ids, at = cursor
        cursor[1] = at + 1
        taken.append((cost[ids[at]], ids[at], leaf))
        tree.offset(leaf, cost[ids[at]])
        if at + 1 == len(ids):
            tree.exhaust(leaf)
    return taken


@settings(max_examples=300, deadline=None)
@given(
    jobs=st.lists(st.tuples(paths, costs, st.booleans()), min_size=1, max_size=60),
    usage=st.lists(st.tuples(paths, st.sampled_from([0.0, 1.0, 2.0, 5.0, 0.3])), max_size=20),
    weights=st.dictionaries(
        st.sampled_from(["t1", "t2", "a", "b", "c", "u1"]), st.sampled_from([0.5, 1.0, 2.0, 3.0])
    ),
    budget=st.integers(1, 12),
    before=st.integers(0, 40),
    limit=st.integers(1, 80),
    capped=st.lists(st.tuples(paths, st.booleans()), max_size=3),
    sized=st.booleans(),
)
def test_upcoming_is_what_pick_and_offset_give(
    jobs, usage, weights, budget, before, limit, capped, sized
):
    """``sized``: leaves serve their jobs by a key (size order), not by arrival."""
    tree = FairTree()

    def leaf_of(path: tuple[str, str, str]) -> Flow:
        return tree.leaf(path, tuple(weights.get(name, 1.0) for name in path))

    cost: dict[str, float] = {}
    for n, (path, job_cost, requeued) in enumerate(jobs):
        cost[f"j{n}"] = job_cost
        key = (n % 7) + job_cost if sized else None  # admission time + cost / rate
        tree.push(leaf_of(path), f"j{n}", job_cost, requeued=requeued, key=key)
    for path, used in usage:
        tree.charge_start(leaf_of(path), used)
    tree.begin_pass()
    cursors: dict = {}
    walk(tree, cursors, budget, cost, before)  # the pass so far
    for path, org in capped:  # a cap exhausts a user's or an organisation's flow
        leaf = leaf_of(path)
        tree.exhaust(leaf.parent if org else leaf)

    read = tree.upcoming(
        lambda leaf, n: Scheduling.untaken(cursors, leaf, budget, n), cost.__getitem__, limit
    )
    assert read == walk(tree, cursors, budget, cost, limit)
    tree.end_pass()


def test_upcoming_changes_nothing():
    tree = FairTree()
    for n, path in enumerate([("t1", "a", "u1"), ("t1", "b", "u1"), ("t2", "c", "u1")] * 2):
        tree.push(tree.leaf(path, (1.0, 1.0, 1.0)), f"j{n}", 1.0 + n)
    tree.begin_pass()
    before = [tree.pick()]
    state = [(f.name, f.offset, f.stamp) for f in tree.root.children.values()]
    tree.upcoming(lambda leaf, n: list(leaf.queue)[:n], lambda job_id: 1.0, 10)
    assert [(f.name, f.offset, f.stamp) for f in tree.root.children.values()] == state
    assert tree.pick() is before[0]


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 30), st.sampled_from([1.0, 5.0, 0.5]), st.booleans()),
        max_size=60,
    )
)
def test_a_sized_leaf_serves_requeued_first_then_by_key(ops):
    """``leaf_jobs``: requeued jobs in arrival order, then the rest by (key,
    id), whatever the order of pushes and removals."""
    from framespool.processors.core.fairshare import leaf_jobs

    tree = FairTree()
    leaf = tree.leaf(("t", "o", "u"), (1.0, 1.0, 1.0))
    live: dict[str, tuple[bool, float]] = {}
    for n, (slot, key, requeued) in enumerate(ops):
        job = f"j{slot}"
        if job in live:
            assert tree.remove(leaf, job, 1.0)
            del live[job]
        else:
            tree.push(leaf, job, 1.0, requeued=requeued, key=key + n)
            live[job] = (requeued, key + n)
    requeued = [j for j, (r, _) in live.items() if r]
    rest = sorted((k, j) for j, (r, k) in live.items() if not r)
    assert list(leaf_jobs(leaf)) == requeued + [j for _, j in rest]
    assert leaf.queued == len(live)
