"""Knob tests (issue #10) for two policies that had none: admission by
predicted wait (``TierConfig.max_predicted_wait_s``) and the preemption churn
limit on a preemption that needs several victims at once. Each has a control
that changes the outcome, so a broken knob fails its test."""

from __future__ import annotations

from dataclasses import replace

from framespool.processors.core import CellConfig
from framespool.schemas import events as ev
from tests.unit.core_harness import Harness
from tests.unit.test_core_knobs import asked, cfg, of


def with_tier_limit(tier: str, limit_s: float, **kw) -> CellConfig:
    config = cfg(**kw)
    tiers = tuple(
        replace(t, max_predicted_wait_s=limit_s) if t.name == tier else t for t in config.tiers
    )
    return replace(config, tiers=tiers)


# -- admission by predicted wait ----------------------------------------------------


def busy_cell(config: CellConfig) -> Harness:
    """One 8-GPU node running one 8-GPU job estimated at an hour, so a new
    8-GPU job is told about an hour."""
    h = Harness(nodes=1, config=config)
    h.submit("long", gpus=8, tier="paid", estimate_s=3600)
    h.start_all()
    h.tick(10)
    return h


def test_a_job_predicted_to_wait_past_its_tier_limit_is_rejected_with_the_reason():
    h = busy_cell(with_tier_limit("free", 600))
    out = h.submit("late", gpus=8, tier="free", estimate_s=60)
    rejected = of(out, ev.JobRejected)
    assert [r.job_id for r in rejected] == ["late"] and not of(out, ev.JobQueued)
    assert rejected[0].reason == "predicted_wait"
    detail = rejected[0].detail
    # the wait, the tier, its limit, and what to do about it
    assert "predicted wait 3590s" in detail and "free tier limit of 600s" in detail
    assert "retry later or use a higher tier" in detail
    assert "late" not in h.cell.jobs  # nothing queued, nothing held


def test_the_predicted_wait_limit_binds_only_its_own_tier_and_only_past_the_limit():
    """Controls: the same job in a tier without a limit, or under a limit above
    its predicted wait, or while the node is free, is queued."""
    h = busy_cell(with_tier_limit("free", 600))
    assert of(h.submit("paid", gpus=8, tier="paid", estimate_s=60), ev.JobQueued)
    h = busy_cell(with_tier_limit("free", 7200))
    assert of(h.submit("late", gpus=8, tier="free", estimate_s=60), ev.JobQueued)
    h = busy_cell(with_tier_limit("free", 0))  # 0 = never reject on predicted wait
    assert of(h.submit("late", gpus=8, tier="free", estimate_s=60), ev.JobQueued)
    h = Harness(nodes=1, config=with_tier_limit("free", 1))
    out = h.submit("now", gpus=8, tier="free", estimate_s=60)  # starts now: wait 0
    assert of(out, ev.JobQueued) and not of(out, ev.JobRejected)


# -- churn limit on a multi-victim preemption ---------------------------------------


def small_batch_cell(**kw) -> Harness:
    """One node full of eight 1-GPU checkpointable batch runs, started at t=1."""
    h = Harness(nodes=1, config=cfg(min_run_before_preempt_s=0, **kw))
    for i in range(8):
        h.submit(
            f"b{i}",
            tenant=f"t{i}",
            gpus=1,
            tier="batch",
            preemptible=True,
            checkpoint_interval_s=30,
            estimate_s=3600,
        )
    h.start_all()
    return h


def test_a_preemption_needing_more_victims_than_the_churn_limit_allows_takes_none():
    """An 8-GPU interactive job needs all eight 1-GPU runs to leave. With 4
    preemptions a minute it may not take four and wait for the rest (churn for
    nothing): it takes none, every minute, while the limit stays below 8."""
    h = small_batch_cell(preemptions_per_minute=4)
    h.tick(100)
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    for _ in range(5):
        assert asked(h.tick(30)) == []
    assert h.cell.preempt_times == []
    assert all(h.cell.runs[(f"b{i}", 1)].phase == "running" for i in range(8))
    # the job says why it waits: the churn limit, not "no capacity"
    assert h.cell.jobs["hurry"].reason.startswith("waiting: preemption churn limit reached")
    assert "needs 8 victims, 4 of 4 a minute left" in h.cell.jobs["hurry"].reason


def test_a_multi_victim_preemption_within_the_limit_takes_all_its_victims_at_once():
    """Control: the same cell with room for eight victims asks all eight at once."""
    h = small_batch_cell(preemptions_per_minute=8)
    h.tick(100)
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    seen = []
    for _ in range(5):
        seen += asked(h.tick(30))
    assert seen == [f"b{i}" for i in range(8)]
    assert len(h.cell.preempt_times) == 8


def test_victims_already_taken_this_minute_count_against_a_multi_victim_preemption():
    """Room is what is left of the minute's limit: with 8 a minute and 2 already
    taken, an 8-victim preemption waits for the window to slide, then goes."""
    h = small_batch_cell(preemptions_per_minute=8)
    h.tick(100)
    h.cell.preempt_times = [h.now_ms - 1000, h.now_ms - 1000]  # two victims a second ago
    h.submit("hurry", gpus=8, tier="interactive", estimate_s=30)
    assert asked(h.tick(10)) == []  # 6 of room < 8 victims
    assert "needs 8 victims, 6 of 8 a minute left" in h.cell.jobs["hurry"].reason
    assert asked(h.tick(10)) == []
    seen = []
    for _ in range(4):
        seen += asked(h.tick(15))  # the two leave the window 60 s after they were taken
    assert seen == [f"b{i}" for i in range(8)]
