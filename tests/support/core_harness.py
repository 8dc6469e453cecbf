"""A test harness around one Cell: feeds events, plays the agents, and checks
the invariants (docs/design.md#invariants) after every single step."""

from __future__ import annotations

from collections import Counter
from typing import Any

from framespool.processors.core import Cell, CellConfig
from framespool.schemas import events as ev
from framespool.schemas.states import NodeState, RunPhase

TERMINAL = (ev.JobCompleted, ev.JobFailed, ev.JobCancelled, ev.JobRejected)


class InvariantBroken(AssertionError):
    pass


def state_digest(cell: Cell) -> tuple:
    """Everything a report could change; equal digests mean nothing changed."""
    return (
        tuple((j, job.state, job.run, job.checkpoint) for j, job in cell.jobs.items()),
        tuple(sorted(cell.finished.items())),
        tuple((k, r.phase, tuple(r.held.items())) for k, r in cell.runs.items()),
        tuple(
            (n.node_id, n.incarnation, n.state, tuple(n.owner), tuple(n.gpu_state))
            for n in cell.index.nodes.values()
        ),
        cell.queued_count,
    )


class Harness:
    def __init__(
        self,
        config: CellConfig | None = None,
        nodes: int = 4,
        gpus: int = 8,
        nodes_per_rail: int = 2,
    ) -> None:
        self.cell = Cell(config or CellConfig(status_interval_s=0, estimate_interval_s=0))
        self.seq = 0
        self.now_ms = 0
        self.log: list[Any] = []  # every output, in order
        self.inputs: list[Any] = []
        self.terminal = Counter()
        self.admitted: dict[str, ev.JobSpec] = {}
        self.incarnation: dict[str, int] = {}
        self.tick(1.0)  # the cell's clock starts with its first Tick
        for i in range(nodes):
            self.register(f"n{i}", gpus, rail=f"rail-{i // nodes_per_rail}")

    # -- inputs ----------------------------------------------------------------
    def next_id(self) -> str:
        self.seq += 1
        return f"in-{self.seq}"

    def feed(self, event: Any) -> list[Any]:
        self.inputs.append(event)
        out = self.cell.apply(event)
        self.log.extend(out)
        self.check(event, out)
        return out

    def register(self, node_id: str, gpus: int = 8, rail: str = "rail-0") -> list[Any]:
        inc = self.incarnation.get(node_id, 0) + 1
        self.incarnation[node_id] = inc
        return self.feed(
            ev.NodeRegistered(
                event_id=self.next_id(),
                ts_ms=self.now_ms,
                node_id=node_id,
                incarnation=inc,
                cell="cell-0",
                gpus=gpus,
                rail=rail,
            )
        )

    def tick(self, seconds: float) -> list[Any]:
        self.now_ms += int(seconds * 1000)
        return self.feed(
            ev.Tick(event_id=self.next_id(), ts_ms=self.now_ms, cell="cell-0", now_ms=self.now_ms)
        )

    def submit(
        self,
        job_id: str,
        tenant: str = "t0",
        gpus: int = 1,
        per_node: int = 8,
        estimate_s: float = 60.0,
        tier: str = "free",
        **extra: Any,
    ) -> list[Any]:
        spec = ev.JobSpec(
            job_id=job_id,
            tenant=tenant,
            tier=tier,
            gpus=gpus,
            gpus_per_node=per_node,
            estimate_s=estimate_s,
            **extra,
        )
        self.admitted[job_id] = spec
        return self.feed(ev.JobAdmitted(event_id=self.next_id(), ts_ms=self.now_ms, spec=spec))

    def heartbeat(self, node_id: str, runs=None, gpus=(), incarnation=None) -> list[Any]:
        if runs is None:
            runs = tuple(
                ev.RunReport(job_id=k[0], run=k[1], step_rate=1.0) for k in self.runs_on(node_id)
            )
        return self.feed(
            ev.NodeHeartbeat(
                event_id=self.next_id(),
                ts_ms=self.now_ms,
                node_id=node_id,
                incarnation=incarnation or self.incarnation[node_id],
                gpus=gpus,
                runs=runs,
            )
        )

    def report(
        self, cls: type, job_id: str, run: int, node_id: str, incarnation=None, **fields: Any
    ) -> list[Any]:
        return self.feed(
            cls(
                event_id=self.next_id(),
                ts_ms=self.now_ms,
                job_id=job_id,
                run=run,
                node_id=node_id,
                incarnation=incarnation or self.incarnation.get(node_id, 1),
                **fields,
            )
        )

    def runs_on(self, node_id: str) -> list[tuple[str, int]]:
        node = self.cell.index.nodes.get(node_id)
        if node is None:
            return []
        return list(dict.fromkeys(o for o in node.owner if o is not None))

    # -- invariants ------------------------------------------------------------
    def check(self, event: Any, out: list[Any]) -> None:
        cell = self.cell
        # 1. no GPU in two runs; capacity never exceeded; owners agree with runs
        seen: dict[tuple[str, int], tuple] = {}
        for key, run in cell.runs.items():
            for node_id, gpus in run.held.items():
                node = cell.index.nodes[node_id]
                for i in gpus:
                    if (node_id, i) in seen:
                        raise InvariantBroken(
                            f"GPU {node_id}:{i} in {seen[(node_id, i)]} and {key}"
                        )
                    if not 0 <= i < node.total:
                        raise InvariantBroken(f"GPU {node_id}:{i} beyond capacity")
                    seen[(node_id, i)] = key
        for node in cell.index.nodes.values():
            for i, owner in enumerate(node.owner):
                if owner is not None and seen.get((node.node_id, i)) != owner:
                    raise InvariantBroken(
                        f"owner of {node.node_id}:{i} is {owner}, no run holds it"
                    )
        # 2. gangs all-or-nothing: one JobAssigned with the whole gang, StartRun per node
        for o in out:
            if isinstance(o, ev.JobAssigned):
                spec = self.admitted[o.job_id]
                shapes = [(spec.gpus, spec.gpus_per_node)] + [
                    (s.gpus, s.gpus_per_node) for s in spec.shapes
                ]
                total = sum(len(s.gpus) for s in o.placement)
                if (total,) not in [(g,) for g, _ in shapes] or total != o.gpus:
                    raise InvariantBroken(f"partial gang {o}")
                per_node = dict(shapes)[total]
                if any(len(s.gpus) > per_node for s in o.placement):
                    raise InvariantBroken(f"gang over gpus_per_node {o}")
                starts = [
                    s
                    for s in out
                    if isinstance(s, ev.StartRun) and s.spec.job_id == o.job_id and s.run == o.run
                ]
                if sorted(s.node_id for s in starts) != sorted(p.node_id for p in o.placement):
                    raise InvariantBroken(f"StartRun set differs from placement {o}")
                key = (o.job_id, o.run)
                for piece in o.placement:
                    node = cell.index.nodes[piece.node_id]
                    if node.state != NodeState.UP:
                        raise InvariantBroken(f"{o.job_id} placed on {node.state} node")
                    for i in piece.gpus:
                        if key in cell.runs and node.owner[i] != key:
                            raise InvariantBroken(
                                f"{o.job_id} placed on GPU {piece.node_id}:{i} "
                                f"owned by {node.owner[i]}"
                            )
            if isinstance(o, TERMINAL):
                self.terminal[o.job_id] += 1
                if self.terminal[o.job_id] > 1:
                    raise InvariantBroken(f"second terminal event for {o.job_id}: {o}")
        # 3. gangs start together: no member computes (RUNNING/EXITING, or a BeginRun
        #    sent) before every member holds its GPUs and said so
        for key, run in cell.runs.items():
            gang = run.gang
            if gang is None or run.phase in (RunPhase.ASSIGNED, RunPhase.STOPPING):
                continue
            if set(gang.ready) != set(gang.members) or set(run.held) != set(gang.members):
                raise InvariantBroken(
                    f"gang {key} is {run.phase} with ready {list(gang.ready)}, "
                    f"held {list(run.held)}, members {gang.members}"
                )
        for o in out:
            if isinstance(o, ev.BeginRun):
                run = cell.runs.get((o.job_id, o.run))
                if run is None or run.gang is None or set(run.gang.ready) != set(run.gang.members):
                    raise InvariantBroken(f"BeginRun before every member was ready: {o}")
        # 4. a terminal job holds no queue slot and no live run
        for job_id in cell.finished:
            if job_id in cell.jobs:
                raise InvariantBroken(f"{job_id} both live and finished")

    # -- playing the agents -----------------------------------------------------
    def assigned(self) -> list[ev.StartRun]:
        return [o for o in self.log if isinstance(o, ev.StartRun)]

    def live_runs(self) -> list[tuple[str, int]]:
        return [
            k
            for k, r in self.cell.runs.items()
            if r.phase != RunPhase.STOPPING
            and self.cell.jobs.get(k[0]) is not None
            and self.cell.jobs[k[0]].run == k[1]
        ]

    def start_all(self) -> None:
        """Every member of every assigned run reports it holds its GPUs."""
        for key in self.live_runs():
            run = self.cell.runs[key]
            for node_id in list(run.held):
                if run.phase == RunPhase.ASSIGNED:
                    self.report(ev.RunStarted, key[0], key[1], node_id)

    def complete(self, key: tuple[str, int]) -> list[Any]:
        run = self.cell.runs[key]
        return self.report(
            ev.RunCompleted,
            key[0],
            key[1],
            next(iter(run.held)),
            artifact_uri=f"mem://{key[0]}/{key[1]}",
        )

    def confirm_stops(self) -> None:
        for key, run in list(self.cell.runs.items()):
            if run.phase == RunPhase.STOPPING:
                for node_id in list(run.held):
                    self.report(ev.RunStopped, key[0], key[1], node_id)

    def drain(self, max_rounds: int = 1000) -> None:
        """Play well-behaved agents until every job is terminal."""
        for _ in range(max_rounds):
            if not self.cell.jobs:
                return
            self.start_all()
            self.confirm_stops()
            for key in self.live_runs():
                if self.cell.runs[key].phase == "running":
                    self.complete(key)
            for node_id in list(self.cell.index.nodes):
                node = self.cell.index.nodes[node_id]
                if node.state == NodeState.DOWN:
                    self.register(node_id, node.total, node.rail)
                else:
                    self.heartbeat(
                        node_id, gpus=tuple(ev.GpuHealth(index=i) for i in range(node.total))
                    )
            self.tick(5.0)  # long enough for breakers (30 min) to cool down
        raise AssertionError(f"jobs never drained: {list(self.cell.jobs)[:5]}")
