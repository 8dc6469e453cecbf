"""The pure admission core: idempotency (bounded by a horizon), validation, routing to cells."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest

from framespool.processors.core.admission import (
    INVALID_TIER,
    NO_MATCHING_CELL,
    AdmissionConfig,
    AdmissionState,
    CellCommand,
    rendezvous,
)
from framespool.schemas import events as ev
from tests.support.admission import T0, cancel, submit


def test_submit_is_admitted_to_a_cell_with_ids_from_the_position():
    state = AdmissionState()
    out = state.apply(submit("j1"), "admission-0@7")
    assert len(out) == 1
    admitted = out[0]
    assert isinstance(admitted, ev.JobAdmitted)
    assert admitted.event_id == "admission-0@7/0"
    assert admitted.ts_ms == T0
    assert admitted.cell == "cell-0"
    assert admitted.spec.job_id == "j1"


def test_repeated_job_id_produces_nothing_new():
    state = AdmissionState()
    state.apply(submit("j1"), "p@0")
    out = state.apply(submit("j1"), "p@1")
    assert [type(o) for o in out] == [ev.ReportIgnored]
    assert out[0].subject == "j1"
    assert "already admitted to cell-0" in out[0].reason
    assert out[0].source_event_id == "cmd-j1"


def test_repeated_idempotency_key_with_another_job_id_is_ignored():
    state = AdmissionState()
    state.apply(submit("j1", key="k"), "p@0")
    out = state.apply(submit("j2", key="k"), "p@1")
    assert [type(o) for o in out] == [ev.ReportIgnored]
    assert "idempotency key 'k' was already used for job j1" in out[0].reason
    # the same key under another tenant is another job
    other = state.apply(submit("j3", tenant="globex", key="k"), "p@2")
    assert [type(o) for o in other] == [ev.JobAdmitted]


def test_a_rejected_job_stays_rejected():
    state = AdmissionState()
    first = state.apply(submit("j1", tier="platinum"), "p@0")
    assert [(type(o), o.reason) for o in first] == [(ev.JobRejected, INVALID_TIER)]
    again = state.apply(submit("j1"), "p@1")
    assert [type(o) for o in again] == [ev.ReportIgnored]
    assert "already rejected" in again[0].reason


def test_unknown_tier_is_rejected_naming_the_tiers():
    out = AdmissionState().apply(submit("j1", tier="platinum"), "p@0")
    assert out[0].reason == INVALID_TIER
    assert "'platinum'" in out[0].detail and "interactive" in out[0].detail


def test_a_burst_is_admitted_whole_admission_does_not_rate_limit():
    # Limits are synchronous (the API's 429 at submit time); whatever reached
    # the log is queued, so 5,000 submits in one millisecond are all admitted.
    state = AdmissionState()
    outs = [state.apply(submit(f"b{i}", tenant="seed"), f"p@{i}") for i in range(5000)]
    assert all([type(o) for o in out] == [ev.JobAdmitted] for out in outs)
    assert state.counters == {"admitted": 5000}


def test_decisions_and_keys_expire_after_the_horizon_of_command_time():
    state = AdmissionState(AdmissionConfig(idempotency_horizon_s=60))
    state.apply(submit("j1", key="k1"), "p@0")
    # within the horizon: a repeat of the id or the key is ignored
    assert type(state.apply(submit("j1", ts=T0 + 59_000), "p@1")[0]) is ev.ReportIgnored
    assert type(state.apply(submit("jx", ts=T0 + 59_000, key="k1"), "p@2")[0]) is ev.ReportIgnored
    # a command past the horizon advances time: j1 and k1 are forgotten
    later = state.apply(submit("j2", ts=T0 + 60_001), "p@3")
    assert [type(o) for o in later] == [ev.JobAdmitted]
    assert "j1" not in state.jobs and ("acme", "k1") not in state.keys
    assert list(state.jobs) == ["j2"] and len(state.expiry) == 1
    assert type(state.apply(submit("jy", ts=T0 + 60_002, key="k1"), "p@4")[0]) is ev.JobAdmitted


def test_an_older_timestamp_does_not_move_time_backwards():
    state = AdmissionState(AdmissionConfig(idempotency_horizon_s=60))
    state.apply(submit("j1", ts=T0), "p@0")
    state.apply(submit("j2", ts=T0 - 3_600_000), "p@1")  # another API instance's clock
    assert state.clock_ms == T0 and set(state.jobs) == {"j1", "j2"}
    # j2 was decided at the state's clock, not its own stale time: it is not
    # forgotten at once, and leaves with j1
    state.apply(submit("j3", ts=T0 + 30_000), "p@2")
    assert set(state.jobs) == {"j1", "j2", "j3"}
    state.apply(submit("j4", ts=T0 + 60_001), "p@3")
    assert set(state.jobs) == {"j3", "j4"}


def test_cancel_of_an_expired_decision_still_reaches_the_jobs_cell():
    config = AdmissionConfig(
        cells=("cell-0", "cell-1", "cell-2"),
        cell_gpu_types={"cell-0": ("H100",)},
        idempotency_horizon_s=60,
    )
    state = AdmissionState(config)
    cell = state.apply(submit("j1", gpu_type="H100"), "p@0")[0].cell
    state.apply(submit("j2", ts=T0 + 120_000), "p@1")  # j1 expires
    out = state.apply(cancel("j1", ts=T0 + 121_000), "p@2")
    assert out and all(isinstance(o, CellCommand) for o in out)
    assert cell in [o.cell for o in out]
    assert [o.command.event_id for o in out] == [f"p@2/{i}" for i in range(len(out))]


@pytest.mark.slow
def test_state_stays_flat_over_100k_submits_and_replays_byte_identically():
    # 100,000 submits at 100/s from 50 tenants with a 60 s horizon: the state
    # holds about a horizon's worth, and its snapshot stops growing.
    config = AdmissionConfig(cells=("cell-0", "cell-1"), idempotency_horizon_s=60)
    state = AdmissionState(config)
    sizes = {}
    for i in range(100_000):
        command = submit(f"job-{i}", tenant=f"t{i % 50}", ts=T0 + 10 * i, key=f"k-{i}")
        state.apply(command, f"p@{i}")
        if i + 1 in (20_000, 50_000, 100_000):
            sizes[i + 1] = len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    assert len(state.jobs) == len(state.keys) == len(state.expiry) <= 6_001
    assert max(sizes.values()) <= 1.05 * min(sizes.values()), sizes
    # expiry is driven by command time only: a replay gives the same bytes
    again = AdmissionState(config)
    for i in range(100_000):
        command = submit(f"job-{i}", tenant=f"t{i % 50}", ts=T0 + 10 * i, key=f"k-{i}")
        again.apply(command, f"p@{i}")
    assert pickle.dumps(again) == pickle.dumps(state)


def test_routing_is_stable_and_spread():
    cells = ("cell-0", "cell-1", "cell-2")
    config = AdmissionConfig(cells=cells)
    one, two = AdmissionState(config), AdmissionState(config)
    placed = Counter()
    for i in range(3000):
        a = one.apply(submit(f"job-{i}"), f"p@{i}")[0]
        b = two.apply(submit(f"job-{i}"), f"q@{i}")[0]
        assert a.cell == b.cell == rendezvous(f"job-{i}", cells)
        placed[a.cell] += 1
    assert set(placed) == set(cells)
    assert all(800 < n < 1200 for n in placed.values()), placed


def test_adding_a_cell_moves_only_jobs_to_the_new_cell():
    before = ("cell-0", "cell-1", "cell-2")
    after = before + ("cell-3",)
    moved = [
        j
        for j in (f"job-{i}" for i in range(2000))
        if rendezvous(j, before) != rendezvous(j, after)
    ]
    assert moved and all(rendezvous(j, after) == "cell-3" for j in moved)
    assert len(moved) < 700  # about a quarter


def test_gpu_type_routes_to_matching_cells_only():
    config = AdmissionConfig(
        cells=("cell-0", "cell-1", "cell-2"),
        cell_gpu_types={"cell-0": ("H100",), "cell-1": ("A100", "L40S")},
    )
    state = AdmissionState(config)
    for i in range(60):
        assert state.apply(submit(f"h{i}", gpu_type="H100"), f"p@{i}")[0].cell in (
            "cell-0",
            "cell-2",
        )
        assert state.apply(submit(f"a{i}", gpu_type="L40S"), f"q@{i}")[0].cell in (
            "cell-1",
            "cell-2",
        )


def test_no_cell_for_the_gpu_type_is_rejected_naming_the_offered_types():
    config = AdmissionConfig(
        cells=("cell-0", "cell-1"), cell_gpu_types={"cell-0": ("H100",), "cell-1": ("A100",)}
    )
    out = AdmissionState(config).apply(submit("j", gpu_type="B200"), "p@0")[0]
    assert out.reason == NO_MATCHING_CELL
    assert "'B200'" in out.detail and "A100, H100" in out.detail


def test_cancel_is_forwarded_to_the_jobs_cell():
    config = AdmissionConfig(cells=("cell-0", "cell-1", "cell-2"))
    state = AdmissionState(config)
    cell = state.apply(submit("j1"), "p@0")[0].cell
    out = state.apply(cancel("j1", ts=T0 + 5), "p@1")
    assert len(out) == 1 and isinstance(out[0], CellCommand)
    assert out[0].cell == cell
    forwarded = out[0].command
    assert isinstance(forwarded, ev.CancelJob)
    assert (forwarded.event_id, forwarded.ts_ms, forwarded.job_id, forwarded.tenant) == (
        "p@1/0",
        T0 + 5,
        "j1",
        "acme",
    )


@pytest.mark.parametrize(
    "setup, command, reason",
    [
        ([], cancel("nope"), "unknown job"),
        ([submit("j1")], cancel("j1", tenant="globex"), "another tenant"),
        ([submit("j1", tier="gold")], cancel("j1"), "rejected at admission"),
    ],
)
def test_cancel_that_cannot_be_forwarded_is_recorded(setup, command, reason):
    state = AdmissionState()
    for i, c in enumerate(setup):
        state.apply(c, f"s@{i}")
    out = state.apply(command, "p@9")
    assert [type(o) for o in out] == [ev.ReportIgnored]
    assert reason in out[0].reason and out[0].subject == command.job_id


def test_unknown_command_type_is_recorded():
    tick = ev.Tick(event_id="t", ts_ms=T0, cell="cell-0", now_ms=T0)
    out = AdmissionState().apply(tick, "p@0")
    assert [type(o) for o in out] == [ev.ReportIgnored]
    assert "unknown command type Tick" in out[0].reason


def test_state_survives_pickling_and_replays_identically():
    config = AdmissionConfig(cells=("cell-0", "cell-1"), idempotency_horizon_s=1)
    commands = [
        submit(f"j{i}", tenant=f"t{i % 2}", ts=T0 + 100 * i, key=f"k{i % 7}") for i in range(40)
    ] + [cancel(f"j{i}", tenant=f"t{i % 2}") for i in range(0, 40, 3)]
    straight = AdmissionState(config)
    expected = [straight.apply(c, f"p@{i}") for i, c in enumerate(commands)]
    resumed = AdmissionState(config)
    got = []
    for i, c in enumerate(commands):
        if i == 20:
            resumed = pickle.loads(pickle.dumps(resumed))
        got.append(resumed.apply(c, f"p@{i}"))
    assert got == expected


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cells": ()}, "at least one cell"),
        ({"cells": ("cell-0", "cell-0")}, "twice"),
        ({"cell_gpu_types": {"cell-9": ("H100",)}}, "cell-9"),
    ],
)
def test_config_refuses_impossible_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdmissionConfig(**kwargs)


@pytest.mark.parametrize("horizon", [0, -1, float("nan"), float("inf")])
def test_horizon_must_be_finite_and_positive(horizon):
    # NaN and inf would keep every decided id for ever (nothing compares past them)
    with pytest.raises(ValueError, match="idempotency_horizon_s"):
        AdmissionConfig(idempotency_horizon_s=horizon)
