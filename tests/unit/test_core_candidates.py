"""The walk's snapshot of a leaf's first jobs (``Scheduling.candidates``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from framespool.processors.core.fairshare import Flow
from framespool.processors.core.scheduling import Scheduling


@given(
    requeued=st.lists(st.text(min_size=1, max_size=3), unique=True, max_size=5),
    queued=st.lists(st.text(min_size=1, max_size=3), unique=True, max_size=5),
    limit=st.integers(-3, 12),
)
def test_candidates_are_the_first_jobs_requeued_first_and_at_least_one(requeued, queued, limit):
    leaf = Flow("u", 1.0, None)
    leaf.requeued.update(dict.fromkeys(requeued))
    leaf.queue.update(dict.fromkeys(j for j in queued if j not in leaf.requeued))
    order = list(leaf.requeued) + list(leaf.queue)
    got = list(Scheduling.candidates(leaf, limit))
    # a spent budget (limit <= 0) still yields the head of the leaf
    assert got == order[: max(1, limit)]
