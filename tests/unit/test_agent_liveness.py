"""Self-healing decisions (pure): when a node declared DOWN registers again, and how
its ledger keeps the old incarnation's runs fenced."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from framespool.agents.ledger import Action, RunLedger, RunState
from framespool.agents.liveness import BACKOFF_S, STABLE_S, Heal, Liveness
from framespool.schemas.events import NodeStateChanged
from framespool.schemas.states import GpuState, NodeState
from tests.support.agents import start, stop

NODE = "node-a"


def changed(state=NodeState.DOWN, inc=7, *, node=NODE, gpu=-1, eid="e1"):
    return NodeStateChanged(
        event_id=eid,
        ts_ms=0,
        node_id=node,
        incarnation=inc,
        state=state,
        gpu=gpu,
        reason="no heartbeat for 6.0s",
    )


def test_a_down_of_the_current_incarnation_reregisters_at_once():
    live = Liveness(NODE, 7, now_s=100.0)
    verdict = live.on_node_state(changed(), now_s=110.0)
    assert verdict.action is Heal.REREGISTER
    assert verdict.not_before_s == 110.0
    assert "incarnation 7" in verdict.reason and "no heartbeat" in verdict.reason


def test_other_nodes_gpus_states_and_incarnations_are_ignored():
    live = Liveness(NODE, 7)
    for event in (
        changed(node="node-b"),
        changed(gpu=3, state=GpuState.FAILED),
        changed(state=NodeState.UP),
        changed(state=NodeState.DRAINING),
        changed(inc=6),  # an older registration's DOWN: healed already
        changed(inc=8),  # not this process's registration
    ):
        assert live.on_node_state(event, 1.0).action is Heal.IGNORE, event
    assert live.heals == 0


def test_one_reregistration_per_down_declaration():
    live = Liveness(NODE, 7)
    assert live.on_node_state(changed(eid="a"), 1.0).action is Heal.REREGISTER
    # the same declaration redelivered, or a second DOWN before the registration
    assert live.on_node_state(changed(eid="a"), 1.1).action is Heal.IGNORE
    assert live.on_node_state(changed(eid="b"), 1.2).action is Heal.IGNORE
    live.registered(8, 2.0)
    # after it: the old incarnation's DOWN is history
    assert live.on_node_state(changed(eid="a"), 3.0).action is Heal.IGNORE
    assert live.heals == 1


def test_a_node_declared_down_again_soon_backs_off_exponentially_up_to_the_cap():
    live = Liveness(NODE, 1, now_s=0.0)
    now, waits = 0.0, []
    for inc in range(1, 12):
        verdict = live.on_node_state(changed(inc=inc, eid=str(inc)), now)
        assert verdict.action is Heal.REREGISTER
        waits.append(verdict.not_before_s - now)
        now = verdict.not_before_s
        live.registered(inc + 1, now)
    assert waits[0] == 0.0
    assert waits[1:4] == [BACKOFF_S[0], 2 * BACKOFF_S[0], 4 * BACKOFF_S[0]]
    assert max(waits) == BACKOFF_S[1] and waits[-1] == BACKOFF_S[1]


def test_backoff_resets_after_a_stable_registration():
    live = Liveness(NODE, 1)
    live.on_node_state(changed(inc=1), 0.0)
    live.registered(2, 0.0)
    assert live.on_node_state(changed(inc=2), 1.0).not_before_s == BACKOFF_S[0]
    live.registered(3, 2.0)
    later = 2.0 + STABLE_S
    assert live.on_node_state(changed(inc=3), later).not_before_s == later


@given(st.lists(st.tuples(st.integers(1, 5), st.sampled_from(["DOWN", "UP"])), max_size=40))
def test_never_two_reregistrations_of_one_incarnation(events):
    live = Liveness(NODE, 1)
    healed: list[int] = []
    now = 0.0
    for inc, state in events:
        now += 1.0
        verdict = live.on_node_state(changed(state=state, inc=inc), now)
        if verdict.action is Heal.REREGISTER:
            assert inc == live.incarnation and inc not in healed
            healed.append(inc)
            live.registered(inc + 1, verdict.not_before_s)
    assert healed == sorted(healed)


# -- the ledger across a re-registration ---------------------------------------------
def test_reincarnate_stops_old_runs_and_fences_the_old_incarnation():
    ledger = RunLedger(NODE, 7)
    assert ledger.decide(start("job-1", 1)).action is Action.LAUNCH
    assert ledger.decide(start("job-2", 3, gpus=(1,))).action is Action.LAUNCH
    ledger.started("job-1", 1)
    over = ledger.reincarnate(8, "node declared DOWN as incarnation 7")
    assert over == (("job-1", 1), ("job-2", 3))
    assert all(e.state is RunState.STOPPING for e in ledger.active())
    assert ledger.entry("job-1", 1).stop_reason == "node declared DOWN as incarnation 7"
    # an instruction still addressed to the old incarnation changes nothing
    late = ledger.decide(start("job-3", 1, inc=7, eid="late"))
    assert late.action is Action.IGNORE and "stale incarnation 7" in late.reason
    # the new incarnation's reconciliation still finds an old run to stop
    assert ledger.decide(stop("job-1", 1, inc=8)).action is Action.IGNORE  # already stopping
    # a job's epoch only moves forward across incarnations
    stale = ledger.decide(start("job-2", 2, inc=8, eid="older-run"))
    assert stale.action is Action.IGNORE and "stale run 2" in stale.reason
    assert ledger.decide(start("job-2", 4, inc=8)).action is Action.LAUNCH


def test_reincarnate_only_moves_forward():
    ledger = RunLedger(NODE, 7)
    for bad in (6, 7):
        try:
            ledger.reincarnate(bad, "x")
        except ValueError as e:
            assert "must exceed 7" in str(e)
        else:
            raise AssertionError(f"incarnation {bad} accepted")
    assert ledger.incarnation == 7
