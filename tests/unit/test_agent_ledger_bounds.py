"""The agent ledger's memory is bounded: a node that runs many more jobs in its
lifetime than the limits (scaled down here, so the test is quick) remembers a
fixed number of event ids and fencing epochs."""

from __future__ import annotations

from framespool.agents import ledger as ledger_module
from framespool.agents.ledger import Action, RunLedger
from tests.support.agents import INC, NODE, start, stop


def test_a_long_lived_node_forgets_old_events_and_finished_jobs_epochs(monkeypatch):
    max_jobs, max_events = 500, 2_000
    monkeypatch.setattr(ledger_module, "MAX_JOBS", max_jobs)
    monkeypatch.setattr(ledger_module, "MAX_SEEN_EVENTS", max_events)
    ledger = RunLedger(NODE, INC)
    ledger.decide(start("long-runner", 1))  # active the whole time: never forgotten
    for i in range(20_000):
        assert ledger.decide(start(f"job-{i}", 1)).action is Action.LAUNCH
        ledger.finished(f"job-{i}", 1)
        ledger.forget_finished()
        ledger.decide(stop(f"job-{i}", 1, eid=f"late-stop-{i}"))  # a duplicate-ish stop
    assert len(ledger._seen_events) <= max_events
    assert len(ledger._event_order) == len(ledger._seen_events)
    assert len(ledger._highest_run) <= max_jobs
    assert len(ledger._seen_runs) <= max_jobs + 1
    assert "long-runner" in ledger._highest_run, "an active run's epoch is kept"
    # fencing still holds for recent jobs
    assert ledger.decide(start("job-19999", 1, eid="again")).action is Action.IGNORE
    assert ledger.decide(start("long-runner", 1, eid="again-2")).action is Action.IGNORE


def test_ignored_refusals_keep_only_the_recent(monkeypatch):
    monkeypatch.setattr(ledger_module, "MAX_IGNORED", 10)
    ledger = RunLedger(NODE, INC)
    for i in range(100):
        ledger.decide(start("j", 1, inc=INC + 1, eid=f"e{i}"))  # unknown incarnation
    assert 10 <= len(ledger.ignored) <= 20
    assert ledger.ignored[-1][0] == "e99"
