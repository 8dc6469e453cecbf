"""One agent process hosting several nodes: each keeps its own incarnation, ledger and
fencing; a record reaches only the node it is keyed for (in-memory producer, no broker)."""

from __future__ import annotations

import asyncio

from framespool.agents.agent import NodeAgent
from framespool.agents.gpus import SimulatedProbe
from framespool.agents.host import AgentHost, host_group
from framespool.agents.ledger import Action
from framespool.log import Record, partition_for_key
from framespool.log.memory import MemoryProducer
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.states import NodeState

CELLS = {"node-a": "cell-0", "node-b": "cell-1", "node-c": "cell-0"}
INCARNATIONS = {"node-a": 5, "node-b": 9, "node-c": 12}


def hosted(tmp_path) -> tuple[AgentHost, dict[str, NodeAgent], MemoryProducer]:
    agents = {
        node: NodeAgent(
            node,
            cell,
            "unused:9092",
            None,
            SimulatedProbe(2, "H100", seed=1),
            {},
            tmp_path / node,
            incarnation=INCARNATIONS[node],
        )
        for node, cell in CELLS.items()
    }
    producer = MemoryProducer()

    async def open_all() -> None:
        for agent in agents.values():
            await agent.open(producer)

    asyncio.run(open_all())
    return AgentHost(list(agents.values()), "unused:9092"), agents, producer


def stop_cmd(node: str, incarnation: int, job: str, eid: str) -> ev.StopRun:
    return ev.StopRun(
        event_id=eid, ts_ms=1, node_id=node, incarnation=incarnation, job_id=job, run=1
    )


def record(key: str | None, event, offset: int = 0, topic: str = "assignments") -> Record:
    return Record(topic, 0, offset, key.encode() if key else None, codec.encode(event), ())


def sent(producer: MemoryProducer, kind: type) -> list:
    return [
        e
        for e in (codec.decode(s.value) for s in producer.on(catalogue.SCHEDULER.name))
        if isinstance(e, kind)
    ]


def test_each_node_registers_its_own_incarnation_in_its_own_cell(tmp_path):
    host, agents, producer = hosted(tmp_path)
    regs = {r.node_id: r for r in sent(producer, ev.NodeRegistered)}
    assert {n: (r.incarnation, r.cell) for n, r in regs.items()} == {
        n: (INCARNATIONS[n], CELLS[n]) for n in CELLS
    }
    assert {n: a.ledger.incarnation for n, a in agents.items()} == INCARNATIONS
    assert host.assignment_partitions == sorted(
        {partition_for_key(n, catalogue.ASSIGNMENTS.partitions) for n in CELLS}
    )
    assert host.group_id == host_group(list(CELLS)) != host_group(["node-a"])


def test_a_record_for_node_b_never_reaches_node_a(tmp_path):
    host, agents, producer = hosted(tmp_path)
    decided: dict[str, list[str]] = {n: [] for n in agents}
    for node, agent in agents.items():
        real = agent.ledger.decide

        def spy(cmd, node=node, real=real):
            decided[node].append(cmd.event_id)
            return real(cmd)

        agent.ledger.decide = spy
    records = [
        record("node-b", stop_cmd("node-b", 9, "job-1", "for-b")),
        record("node-x", stop_cmd("node-x", 1, "job-2", "for-x")),  # not hosted here
        record("node-a", stop_cmd("node-a", 9, "job-3", "b-incarnation-to-a")),
        record("node-c", stop_cmd("node-c", 12, "job-4", "for-c")),
    ]
    asyncio.run(host.dispatch(records))
    assert decided == {
        "node-a": ["b-incarnation-to-a"],
        "node-b": ["for-b"],
        "node-c": ["for-c"],
    }
    # node A fenced B's incarnation by its own; B and C answered with their own
    assert any("unknown incarnation 9" in why for _, why in agents["node-a"].ledger.ignored)
    stopped = {(s.node_id, s.incarnation, s.job_id) for s in sent(producer, ev.RunStopped)}
    assert stopped == {("node-b", 9, "job-1"), ("node-c", 12, "job-4")}


def test_one_heartbeat_pass_beats_for_every_node_with_its_own_incarnation(tmp_path):
    host, agents, producer = hosted(tmp_path)
    for agent in host.agents:
        agent.beat()
    beats = [
        (s.partition, codec.decode(s.value))
        for s in producer.on(catalogue.SCHEDULER.name)
        if isinstance(codec.decode(s.value), ev.NodeHeartbeat)
    ]
    assert sorted((b.node_id, b.incarnation, p) for p, b in beats) == [
        ("node-a", 5, 0),
        ("node-b", 9, 1),
        ("node-c", 12, 0),
    ]


def test_a_down_declaration_heals_only_its_node(tmp_path):
    """The DOWN arrives on the node's assignments partition (the host reads no job-events)."""
    host, agents, producer = hosted(tmp_path)

    def down(node: str, inc: int, eid: str, gpu: int = -1) -> Record:
        event = ev.NodeStateChanged(
            event_id=eid, ts_ms=1, node_id=node, incarnation=inc, state=NodeState.DOWN, gpu=gpu
        )
        return record(node, event, topic=catalogue.ASSIGNMENTS.name)

    async def scenario() -> None:
        await host.dispatch(
            [
                down("node-b", 9, "d1"),
                down("node-b", 9, "d1"),  # redelivered: one re-registration
                down("node-a", 4, "d0"),  # an older incarnation of A: healed long ago
                down("node-c", 12, "dg", gpu=1),  # one GPU of C: not a node DOWN
                down("node-x", 1, "dx"),  # not hosted
            ]
        )
        for _ in range(100):
            if agents["node-b"].incarnation == 10 and not agents["node-b"].healing:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert {n: a.incarnation for n, a in agents.items()} == {
        "node-a": 5,
        "node-b": 10,
        "node-c": 12,
    }
    assert agents["node-b"].ledger.incarnation == 10
    assert not producer.on(catalogue.DEAD_LETTER.name)  # a node's state belongs there
    assert not hasattr(host, "event_partitions")  # no job-events reader any more
    regs = [(r.node_id, r.incarnation) for r in sent(producer, ev.NodeRegistered)]
    assert regs.count(("node-b", 10)) == 1 and ("node-a", 6) not in regs
    # the old incarnation's instructions are fenced from now on
    decision = agents["node-b"].ledger.decide(stop_cmd("node-b", 9, "job-9", "late"))
    assert decision.action is Action.IGNORE and "stale incarnation 9" in decision.reason


def test_an_agent_process_is_given_one_node_or_a_list_of_simulated_ones():
    import argparse

    import pytest

    from framespool.bootstrap import node_specs

    def args(**kw):
        base = dict(node=None, nodes=None, cell="cell-0", rail="rail-0", simulated=True)
        return argparse.Namespace(**{**base, **kw})

    assert node_specs(args(node="n0", cell="cell-3")) == [("n0", "cell-3", "rail-0")]
    assert node_specs(args(nodes="n0@cell-1/rail-2,n1@cell-0,n2")) == [
        ("n0", "cell-1", "rail-2"),
        ("n1", "cell-0", "rail-0"),
        ("n2", "cell-0", "rail-0"),
    ]
    for bad, words in (
        (args(), "exactly one of --node"),
        (args(node="n0", nodes="n1"), "exactly one of --node"),
        (args(nodes="n0,n0"), "distinct"),
        (args(nodes="n0,n1", simulated=False), "one agent per real GPU node"),
    ):
        with pytest.raises(SystemExit, match=words):
            node_specs(bad)


def test_a_heartbeat_lists_the_runs_held_less_those_whose_final_report_is_queued(tmp_path):
    """A heartbeat produced behind a run's final report must not list the run: the
    scheduler would read it as "running but not assigned here" and send a StopRun."""
    from types import SimpleNamespace

    _, agents, _ = hosted(tmp_path)
    agent = agents["node-a"]

    def execution(job: str, ending: bool):
        report = ev.RunReport(job_id=job, run=1, step_rate=0.0, progress=0.5)
        return SimpleNamespace(ending=ending, report=lambda: report)

    agent._runs = {("job-1", 1): execution("job-1", False), ("job-2", 1): execution("job-2", True)}
    assert [r.job_id for r in agent.heartbeat().runs] == ["job-1"]
