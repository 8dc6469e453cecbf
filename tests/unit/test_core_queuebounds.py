"""QueueBounds: the queue-wide minima a pass stops on are those of the queued multiset."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core.queuebounds import QueueBounds

job = st.tuples(
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 8),
    st.sampled_from([1.0, 2.5, 30.0, 600.0, 3600.0]),
    st.integers(0, 4),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), job), max_size=200))
def test_bounds_are_the_minima_of_the_queued_jobs(ops) -> None:
    bounds, queued = QueueBounds(), []
    for add, key in ops:
        if add or not queued:
            bounds.add(*key)
            queued.append(key)
        else:
            key = queued.pop(len(queued) // 2)
            bounds.remove(*key)
        assert bounds.size == len(queued)
        assert bounds.sensitive == sum(k[4] for k in queued)
        assert bounds.min_need() == min((k[0] for k in queued), default=0)
        for need in {k[0] for k in queued}:
            same = [k for k in queued if k[0] == need]
            assert bounds.fewest_nodes(need) == min(k[1] for k in same)
            assert bounds.estimate[need].min() == min(k[2] for k in same)
            assert min(bounds.rank[need]) == min(k[3] for k in same)
        # stale heap entries stay bounded however often values come and go
        for counts in bounds.estimate.values():
            assert len(counts.heap) <= 2 * len(counts.counts) + 33
