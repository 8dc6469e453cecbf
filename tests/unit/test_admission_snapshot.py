"""The admission state's snapshot: a state resumed from its pickle at any point of
a command script decides exactly as the one that never stopped."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core.admission import AdmissionConfig, AdmissionState
from tests.support.admission import T0, cancel, submit

command = st.one_of(
    st.tuples(
        st.just("submit"),
        st.integers(0, 30),  # job
        st.integers(0, 3),  # tenant
        st.none() | st.integers(0, 6),  # idempotency key
        st.integers(0, 400),  # ms after the previous command
    ),
    st.tuples(st.just("cancel"), st.integers(0, 30), st.integers(0, 3), st.none(), st.just(0)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(command, min_size=1, max_size=60), st.data())
def test_a_state_resumed_from_its_snapshot_decides_as_the_one_that_never_stopped(script, data):
    config = AdmissionConfig(cells=("cell-0", "cell-1"), idempotency_horizon_s=2)
    commands, ts = [], T0
    for kind, job, tenant, key, gap in script:
        ts += gap
        if kind == "submit":
            k = None if key is None else f"k{key}"
            commands.append(submit(f"j{job}", tenant=f"t{tenant}", ts=ts, key=k))
        else:
            commands.append(cancel(f"j{job}", tenant=f"t{tenant}", ts=ts))
    cut = data.draw(st.integers(0, len(commands)))
    straight = AdmissionState(config)
    expected = [straight.apply(c, f"p@{i}") for i, c in enumerate(commands)]
    resumed = AdmissionState(config)
    got = [resumed.apply(c, f"p@{i}") for i, c in enumerate(commands[:cut])]
    resumed = pickle.loads(pickle.dumps(resumed, protocol=pickle.HIGHEST_PROTOCOL))
    got += [resumed.apply(c, f"p@{i}") for i, c in enumerate(commands[cut:], cut)]
    assert got == expected
    assert resumed.jobs == straight.jobs and resumed.keys == straight.keys
    assert list(resumed.expiry) == list(straight.expiry)
