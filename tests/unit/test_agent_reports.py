"""What an agent reports: dedupable ids, valid events, monotonic incarnations."""

from __future__ import annotations

from framespool.agents import reports
from framespool.agents.agent import next_incarnation
from framespool.agents.gpus import SimulatedProbe
from framespool.schemas.codec import decode, encode
from framespool.schemas.events import RunReport


def test_lifecycle_reports_have_deterministic_ids():
    a = reports.completed("n1", 5, "job", 2, 1, "s3://b/k", "ab", 3)
    b = reports.completed("n1", 5, "job", 2, 999, "s3://b/k", "ab", 3)
    assert a.event_id == b.event_id == "n1:job:2:completed"
    assert reports.failed("n1", 5, "job", 2, 1, "hung", "r").event_id == "n1:job:2:failed"
    assert reports.stopped("n1", 5, "job", 2, 1, "r").event_id == "n1:job:2:stopped"
    assert reports.started("n1", 5, "job", 2, 1).event_id == "n1:job:2:started"
    assert (
        reports.checkpointed("n1", 5, "job", 2, 1, "u", 7, 0.5).event_id == "n1:job:2:checkpoint-7"
    )


def test_every_report_encodes_and_carries_its_fencing_fields():
    events = [
        reports.registered(
            node_id="n1",
            incarnation=1796000000000,
            cell="cell-1",
            gpus=8,
            gpu_type="H100",
            rail="rail-2",
            cpus=96.0,
            mem_gb=1024.0,
            ts_ms=1,
        ),
        reports.heartbeat(
            event_id="hb",
            node_id="n1",
            incarnation=3,
            ts_ms=1,
            gpus=SimulatedProbe(2).sample(),
            runs=[RunReport(job_id="j", run=2, step_rate=1.5)],
        ),
        reports.started("n1", 3, "j", 2, 1),
        reports.progress(
            event_id="p",
            node_id="n1",
            job_id="j",
            run=2,
            ts_ms=1,
            progress=1.2,
            step=5,
            total_steps=5,
        ),
        reports.checkpointed("n1", 3, "j", 2, 1, "local://jobs/j/runs/2/checkpoints/5", 5, 0.5),
        reports.completed("n1", 3, "j", 2, 1, "s3://b/jobs/j/runs/2/output/o.gif", "00" * 32, 10),
        reports.failed("n1", 3, "j", 2, 1, "generator_error", "x" * 5000, 3),
        reports.stopped("n1", 3, "j", 2, 1, "preempted"),
    ]
    for event in events:
        assert decode(encode(event)) == event
    assert events[3].progress == 1.0  # clamped
    assert len(events[6].reason) == 2000
    for event in events[2:]:
        assert (event.job_id, event.run) == ("j", 2)


def test_incarnation_grows_across_restarts_and_is_persisted(tmp_path):
    first = next_incarnation(tmp_path)
    second = next_incarnation(tmp_path)
    assert second > first > 1_700_000_000_000  # ms since epoch, at least
    (tmp_path / "incarnation").write_text(str(second + 10**9))  # clock went backwards
    assert next_incarnation(tmp_path) == second + 10**9 + 1
    assert next_incarnation(tmp_path, requested=5) == 5
    assert next_incarnation(tmp_path) == second + 10**9 + 2  # a pinned one does not lower the floor
