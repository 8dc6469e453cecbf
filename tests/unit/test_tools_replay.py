"""replay: the re-fold against the emitted records, on in-memory logs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from framespool.log import Record
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig
from framespool.processors.tools.history import Until, parse_until
from framespool.processors.tools.replay import DIFFERING, MISSING, UNEXPECTED, replay
from framespool.schemas import codec, positions
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from tests.support.cell_log import T0, CellLog, clean_history, record


def emitted_index(records: list[Record], event_id: str) -> int:
    return next(i for i, r in enumerate(records) if codec.decode(r.value).event_id == event_id)


def cell_outputs(records: list[Record]) -> list[int]:
    """Indexes of the records that are a cell's outputs (not the admission's)."""
    return [
        i for i, r in enumerate(records) if positions.parse_cell(codec.decode(r.value).event_id)
    ]


def test_a_clean_log_replays_without_divergence():
    log = clean_history()
    report = replay(log.contents(), log.config)
    assert report.ok, report.render()
    c = report.counts
    assert c["inputs"] == len(log.scheduler) and c["outputs"] == len(log.outputs)
    assert c["matched"] == c["outputs"] and c["missing"] == c["unexpected"] == 0
    assert report.to_dict()["first_divergence"] is None


def test_identical_redeliveries_are_fine():
    log = clean_history()
    contents = log.contents()
    contents.job_events += [contents.job_events[i] for i in cell_outputs(contents.job_events)[:3]]
    report = replay(contents, log.config)
    assert report.ok and report.counts["duplicates"] == 3


def test_replay_pinpoints_the_first_differing_position():
    log = clean_history()
    contents = log.contents()
    assignments = [(off, o) for off, o in log.outputs if isinstance(o, ev.JobAssigned)]
    (k, first), (later, second) = assignments[1], assignments[3]
    i = emitted_index(contents.job_events, first.event_id)
    tampered = replace(first, reason="made up")
    contents.job_events[i] = replace(contents.job_events[i], value=codec.encode(tampered))
    j = emitted_index(contents.job_events, second.event_id)  # a later one goes missing
    del contents.job_events[j]
    report = replay(contents, log.config)
    assert not report.ok
    d = report.first
    assert (d.kind, d.position, d.event_id) == (DIFFERING, f"cell-0@{k}", first.event_id)
    assert d.expected == first and d.emitted == tampered and d.fields == ["reason"]
    assert isinstance(d.input, ev.JobAdmitted)
    assert report.counts["differing"] == 1 and report.counts["missing"] == 1
    kinds = [(x["kind"], x["position"]) for x in report.to_dict()["divergences"]]
    assert kinds == [(DIFFERING, f"cell-0@{k}"), (MISSING, f"cell-0@{later}")]
    text = report.render()
    assert f"emitted output differs at cell-0@{k}" in text and "differing fields: reason" in text


def test_an_output_on_another_partition_is_a_divergence():
    log = clean_history()
    contents = log.contents()
    i = cell_outputs(contents.job_events)[2]
    contents.job_events[i] = replace(
        contents.job_events[i], partition=contents.job_events[i].partition + 1
    )
    report = replay(contents, log.config)
    assert report.first.kind == DIFFERING and report.first.fields == ["(partition)"]


def test_missing_counts_only_below_the_committed_offset():
    log = clean_history()
    contents = log.contents()
    last_input = len(log.scheduler) - 1
    completed = next(
        o for off, o in log.outputs if isinstance(o, ev.JobCompleted) and o.job_id == "gang"
    )
    off = positions.parse_cell(completed.event_id)[1]
    del contents.job_events[emitted_index(contents.job_events, completed.event_id)]
    contents.committed = {"scheduler": {0: off}}  # that input is not committed yet
    report = replay(contents, log.config)
    assert report.ok and report.counts["pending"] == 1
    contents.committed = {"scheduler": {0: last_input + 1}}
    report = replay(contents, log.config)
    assert [(d.kind, d.position) for d in report.divergences] == [(MISSING, f"cell-0@{off}")]


def test_an_output_the_fold_never_made_is_unexpected_and_later_ones_are_beyond():
    log = clean_history()
    contents = log.contents()
    forged = ev.JobCompleted(event_id="cell-0@3/7", ts_ms=T0, job_id="a", run=1)
    future = ev.JobCompleted(
        event_id=f"cell-0@{len(log.scheduler) + 5}/0", ts_ms=T0, job_id="a", run=1
    )
    n = len(contents.job_events)
    contents.job_events += [
        record(catalogue.JOB_EVENTS.name, 0, n, forged),
        record(catalogue.JOB_EVENTS.name, 0, n + 1, future),
    ]
    report = replay(contents, log.config)
    (d,) = report.divergences
    assert (d.kind, d.position, d.index, d.emitted) == (UNEXPECTED, "cell-0@3", 7, forged)
    assert report.counts["beyond"] == 1


def test_until_an_offset_stops_the_replay_there():
    log = clean_history()
    report = replay(log.contents(), log.config, until=Until(offset=6))
    assert report.ok and report.counts["inputs"] == 7
    assert report.counts["beyond"] > 0


def test_until_a_time_stops_before_the_first_tick_past_it():
    log = clean_history()
    report = replay(log.contents(), log.config, until=Until(time_ms=T0 + 2000))
    ticks = [r for r in log.scheduler if isinstance(codec.decode(r.value), ev.Tick)]
    assert report.counts["inputs"] == ticks[2].offset  # ticks at T0+1 s, T0+2 s, then past
    assert report.ok


def test_a_different_policy_diverges():
    log = clean_history()
    other = CellConfig(status_interval_s=5.0, estimate_interval_s=0)  # CellStatus every 5 s
    report = replay(log.contents(), other)
    assert not report.ok and report.first.kind == MISSING
    assert report.first.expected.__class__ is ev.CellStatus


@pytest.mark.parametrize(
    "text, until",
    [
        ("42", Until(offset=42)),  # an input offset
        ("1800000000000", Until(time_ms=T0)),  # epoch ms
        ("2027-01-15T08:00:00Z", Until(time_ms=T0)),  # ISO-8601 (T0 is this instant)
        ("2027-01-15T08:00:00+00:00", Until(time_ms=T0)),
        ("2027-01-15T08:00:00", Until(time_ms=T0)),  # naive times are UTC
    ],
)
def test_parse_until(text, until):
    assert parse_until(text) == until


def test_parse_until_refuses_nonsense():
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_until("yesterday")


# --------------------------------------------------------------------------
# Admission: the commands topic re-folded with the admission core
# --------------------------------------------------------------------------
def admission_outputs(records: list[Record]) -> list[int]:
    """Indexes of the records that are admission's outputs."""
    return [
        i
        for i, r in enumerate(records)
        if positions.parse_admission(codec.decode(r.value).event_id)
    ]


def test_admission_replays_an_honest_log_output_for_output():
    log = clean_history()
    report = replay(log.contents(), log.config)
    assert report.ok, report.render()
    a = report.admission_counts
    # four SubmitJobs, each a JobAdmitted on job-events and on the cell's partition
    assert (a["inputs"], a["outputs"], a["matched"]) == (4, 8, 8)
    assert a["missing"] == a["unexpected"] == a["differing"] == 0
    assert report.admission["admission-0"]["last_offset"] == 3
    assert report.to_dict()["admission"]["counts"]["matched"] == 8
    assert "admission: replayed 4 commands" in report.render()


def test_a_tampered_admission_decision_is_pinpointed():
    log = clean_history()
    contents = log.contents()
    i = admission_outputs(contents.job_events)[1]  # the second command's JobAdmitted
    honest = codec.decode(contents.job_events[i].value)
    tampered = replace(honest, spec=replace(honest.spec, tenant="mallory"))
    contents.job_events[i] = replace(contents.job_events[i], value=codec.encode(tampered))
    report = replay(contents, log.config)
    assert not report.ok
    d = report.first
    assert (d.kind, d.position, d.index) == (DIFFERING, "admission-0@1", 0)
    assert (d.topic, d.event_id) == (catalogue.JOB_EVENTS.name, honest.event_id)
    assert d.expected == honest and d.emitted == tampered and d.fields == ["spec"]
    assert isinstance(d.input, ev.SubmitJob) and d.input.spec.job_id == honest.spec.job_id
    assert "emitted output differs at admission-0@1 output #0" in report.render()
    assert report.counts["differing"] == 0  # the cells' own replay is not blamed


def test_admission_outputs_missing_forged_or_pending_are_told_apart():
    log = clean_history()
    contents = log.contents()
    i = admission_outputs(contents.job_events)[2]
    gone = codec.decode(contents.job_events[i].value)
    del contents.job_events[i]
    forged = ev.JobRejected(
        event_id="admission-0@0/1", ts_ms=T0, job_id="a", tenant="acme", reason="forged"
    )
    later = ev.JobRejected(
        event_id="admission-0@9/0", ts_ms=T0, job_id="zz", tenant="acme", reason="later"
    )
    n = len(contents.job_events)
    contents.job_events += [
        record(catalogue.JOB_EVENTS.name, 0, n, forged),
        record(catalogue.JOB_EVENTS.name, 0, n + 1, later),  # a command not read yet
    ]
    report = replay(contents, log.config)
    kinds = [
        (d.kind, d.position, d.event_id)
        for d in sorted(report.divergences, key=lambda d: d.sort_key())
    ]
    assert kinds == [
        (UNEXPECTED, "admission-0@0", "admission-0@0/1"),
        (MISSING, "admission-0@2", gone.event_id),
    ]
    # the same command not yet committed by admission: pending, not missing
    contents.committed = {**contents.committed, "admission": {0: 2}}
    report = replay(contents, log.config)
    assert [d.kind for d in report.divergences] == [UNEXPECTED]
    assert report.admission_counts["pending"] == 1


def test_another_admission_policy_diverges():
    log = clean_history()
    strict = AdmissionConfig(tiers=("interactive",))  # the jobs' tier is unknown to it
    report = replay(log.contents(), log.config, admission_config=strict)
    assert not report.ok
    d = report.first
    assert d.position == "admission-0@0" and d.kind in (DIFFERING, MISSING)
    assert any(isinstance(x.expected, ev.JobRejected) for x in report.divergences)


def test_a_replay_of_chosen_cells_leaves_admission_out():
    log = clean_history()
    contents = log.contents()
    i = admission_outputs(contents.job_events)[0]
    del contents.job_events[i]
    assert not replay(contents, log.config).ok
    report = replay(contents, log.config, cells=[0])
    assert report.ok and report.admission == {} and not report.admission_counts


def test_a_forwarded_cancel_is_replayed_and_a_tampered_one_caught_on_the_scheduler_topic():
    log = CellLog()
    log.tick()
    log.register("n0")
    log.admit("a", gpus=8)
    log.admit("b", gpus=8)  # waits behind a
    out = log.cancel("b")
    assert [type(o).__name__ for o in out if isinstance(o, ev.JobCancelled)] == ["JobCancelled"]
    report = replay(log.contents(), log.config)
    assert report.ok, report.render()
    a = report.admission_counts
    assert (a["inputs"], a["outputs"], a["matched"]) == (3, 5, 5)
    contents = log.contents()
    i = next(
        i
        for i, r in enumerate(contents.scheduler)
        if isinstance(codec.decode(r.value), ev.CancelJob)
    )
    honest = codec.decode(contents.scheduler[i].value)
    tampered = replace(honest, job_id="a")
    contents.scheduler[i] = replace(contents.scheduler[i], value=codec.encode(tampered))
    report = replay(contents, log.config)
    d = report.first
    assert (d.kind, d.position, d.index, d.topic) == (
        DIFFERING,
        "admission-0@2",
        0,
        catalogue.SCHEDULER.name,
    )
    assert d.expected == honest and d.emitted == tampered and d.fields == ["job_id"]
    assert isinstance(d.input, ev.CancelJob)


def _expire_head(contents, cut: int):
    """The scheduler partition's records at or below ``cut`` gone, as retention does."""
    contents.scheduler = [r for r in contents.scheduler if r.offset > cut]
    return contents


def _state_at(log, contents, offset: int):
    """The cell as the processor snapshots it after folding inputs 0..offset."""
    import pickle

    from framespool.processors.tools.history import Refold

    refold = Refold(0, log.config)
    for r in sorted(contents.scheduler, key=lambda r: r.offset):
        if r.offset > offset:
            break
        refold.step(r)
    return pickle.loads(pickle.dumps(refold.cell))  # as the shared store returns it


def test_a_cell_whose_head_expired_is_replayed_from_its_snapshot():
    log = clean_history()
    full = log.contents()
    cut = len(log.scheduler) // 2
    state = _state_at(log, full, cut)
    contents = _expire_head(log.contents(), cut)
    report = replay(contents, log.config, starts={0: (state, cut)})
    assert report.ok, report.render()
    c = report.counts
    assert c["inputs"] == len(log.scheduler) - cut - 1
    assert c["before_snapshot"] > 0 and c["unexpected"] == 0
    assert report.cells["cell-0"]["from_snapshot"] == cut
    assert f"from its snapshot at offset {cut}" in report.render()
    # what follows the snapshot is still checked: a tampered later output diverges
    late = [o for off, o in log.outputs if off > cut and isinstance(o, ev.JobAssigned)][0]
    i = emitted_index(contents.job_events, late.event_id)
    tampered = replace(late, reason="made up")
    contents.job_events[i] = replace(contents.job_events[i], value=codec.encode(tampered))
    assert replay(contents, log.config, starts={0: (state, cut)}).first.kind == DIFFERING


def test_an_expired_head_without_a_snapshot_is_unprovable_not_a_divergence():
    log = clean_history()
    cut = len(log.scheduler) // 2
    contents = _expire_head(log.contents(), cut)
    report = replay(contents, log.config)
    assert not report.ok and report.divergences == []
    assert "cell-0" in report.unprovable and "head expired" in report.unprovable["cell-0"]
    assert "NOT PROVEN" in report.render()
    # a snapshot older than the log's first stored input cannot bridge the gap
    state = _state_at(log, log.contents(), cut - 5)
    assert "cell-0" in replay(contents, log.config, starts={0: (state, cut - 5)}).unprovable


def test_the_cli_loads_the_cells_snapshot_only_where_the_head_expired(tmp_path):
    import argparse
    import pickle

    from framespool.commands.replay import snapshot_starts
    from framespool.processors.shared_snapshots import DirSharedSnapshots, SnapshotMeta

    log = clean_history()
    cut = len(log.scheduler) // 2
    state = _state_at(log, log.contents(), cut)
    store = DirSharedSnapshots(tmp_path / "shared")
    name = log.contents().topics.SCHEDULER.name
    epoch = store.claim(name, 0, "scheduler-0")
    store.publish(SnapshotMeta(name, 0, cut, epoch, "scheduler-0"), pickle.dumps(state))
    args = argparse.Namespace(
        snapshots=str(tmp_path / "shared"), from_snapshot=False, data_dir=None
    )
    assert snapshot_starts(args, log.contents(), None) == {}  # the whole log is there
    expired = _expire_head(log.contents(), cut)
    (loaded, offset) = snapshot_starts(args, expired, None)[0]
    assert offset == cut and loaded.cell_id == "cell-0"
    assert replay(expired, log.config, starts={0: (loaded, offset)}).ok
    args.from_snapshot = True
    assert set(snapshot_starts(args, log.contents(), None)) == {0}
