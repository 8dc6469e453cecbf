"""Snapshot columns (``framespool.processors.core.columns``) and the admission state's
snapshot form: what goes in comes out, and a state resumed from a snapshot decides
exactly as the one that never stopped."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from framespool.processors.core.admission import AdmissionConfig, AdmissionState
from framespool.processors.core.columns import (
    pack_optional_strings,
    pack_repeated,
    pack_strings,
    unpack_optional_strings,
    unpack_repeated,
    unpack_strings,
)
from tests.support.admission import T0, cancel, submit

texts = st.text(max_size=12)  # any code point, "\x00" and the empty string included


@given(st.lists(texts, max_size=40))
def test_strings_round_trip(values):
    assert unpack_strings(pickle.loads(pickle.dumps(pack_strings(values)))) == values


@given(st.lists(st.none() | texts, max_size=40))
def test_optional_strings_round_trip(values):
    packed = pickle.loads(pickle.dumps(pack_optional_strings(values)))
    assert unpack_optional_strings(packed) == values


@given(st.lists(st.none() | st.sampled_from(["a", "b", ""]), max_size=40))
def test_repeated_values_round_trip(values):
    packed = pickle.loads(pickle.dumps(pack_repeated(values)))
    assert unpack_repeated(packed) == values


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
