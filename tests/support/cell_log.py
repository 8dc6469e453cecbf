"""A log built in memory for the tools' unit tests (this module holds no tests).

:class:`CellLog` plays one cell exactly as the processors would write it: a
``SubmitJob`` on commands (all tenants on partition 0), folded by the admission
processor's own fold (``AdmissionRefold``) into its ``JobAdmitted`` on job-events
and the scheduler topic, and every scheduler input folded by the scheduler's own
fold (``Refold``), whose outputs become the job-events and assignments records.
Agents are played by hand (``start_all``, ``complete``...).
"""

from __future__ import annotations

from typing import Any

from framespool.log import Record
from framespool.processors.core import CellConfig
from framespool.processors.routing import payload
from framespool.processors.tools.history import AdmissionRefold, LogContents, Refold
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue

T0 = 1_800_000_000_000


def record(topic: str, partition: int, offset: int, event: Any, key: str = "") -> Record:
    return Record(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key.encode() or None,
        value=codec.encode(event),
    )


class CellLog:
    def __init__(self, config: CellConfig | None = None, partition: int = 0) -> None:
        self.config = config or CellConfig(status_interval_s=0, estimate_interval_s=0)
        self.refold = Refold(partition, self.config)
        self.admission = AdmissionRefold(0)
        self.partition = partition
        self.cell = f"cell-{partition}"
        self.now = T0
        self.scheduler: list[Record] = []
        self.job_events: list[Record] = []
        self.assignments: list[Record] = []
        self.commands: list[Record] = []
        self.starts: dict[tuple[str, int], list[ev.StartRun]] = {}
        self.started: set[tuple[str, int]] = set()
        self.incarnation: dict[str, int] = {}
        self.outputs: list[tuple[int, Any]] = []  # (input offset, output event)

    # -- writing the log -------------------------------------------------------
    def emit(self, topic: str, partition: int, event: Any) -> None:
        target = self.job_events if topic == catalogue.JOB_EVENTS.name else self.assignments
        offset = sum(1 for r in target if r.partition == partition)
        target.append(record(topic, partition, offset, event))

    def feed(self, event: Any) -> list[Any]:
        rec = record(
            catalogue.SCHEDULER.name, self.partition, len(self.scheduler), event, self.cell
        )
        self.scheduler.append(rec)
        outs = self.refold.step(rec)
        for out in outs:
            if out.event is None:
                continue
            self.emit(out.topic, out.partition, out.event)
            self.outputs.append((rec.offset, out.event))
            if isinstance(out.event, ev.StartRun):
                key = (out.event.spec.job_id, out.event.run)
                self.starts.setdefault(key, []).append(out.event)
        return [o.event for o in outs if o.event is not None]

    def tick(self, seconds: float = 1.0) -> list[Any]:
        self.now += int(seconds * 1000)
        return self.feed(
            ev.Tick(
                event_id=f"clock:{self.cell}:{self.now}",
                ts_ms=self.now,
                cell=self.cell,
                now_ms=self.now,
            )
        )

    def register(self, node: str, gpus: int = 8, rail: str = "rail-0") -> list[Any]:
        self.incarnation[node] = self.incarnation.get(node, 0) + 1
        return self.feed(
            ev.NodeRegistered(
                event_id=f"reg:{node}:{self.incarnation[node]}",
                ts_ms=self.now,
                node_id=node,
                incarnation=self.incarnation[node],
                cell=self.cell,
                gpus=gpus,
                rail=rail,
            )
        )

    def admit(
        self,
        job_id: str,
        gpus: int = 1,
        per_node: int = 8,
        tenant: str = "acme",
        estimate_s: float = 60.0,
        **spec: Any,
    ) -> list[Any]:
        body = ev.JobSpec(
            job_id=job_id,
            tenant=tenant,
            gpus=gpus,
            gpus_per_node=per_node,
            estimate_s=estimate_s,
            **spec,
        )
        submit = ev.SubmitJob(event_id=f"{job_id}/submit", ts_ms=self.now, spec=body)
        (admitted,) = self.command(submit, tenant)
        assert admitted.cell == self.cell, f"admission routed {job_id} to {admitted.cell}"
        return self.feed(admitted)

    def cancel(self, job_id: str, tenant: str = "acme") -> list[Any]:
        cancel = ev.CancelJob(
            event_id=f"{job_id}/cancel", ts_ms=self.now, job_id=job_id, tenant=tenant
        )
        return [out for forwarded in self.command(cancel, tenant) for out in self.feed(forwarded)]

    def command(self, command: Any, tenant: str) -> list[Any]:
        """Append ``command`` to commands and fold it with admission; its job-events
        outputs are written, its scheduler-topic ones returned for :meth:`feed`."""
        rec = record(catalogue.COMMANDS.name, 0, len(self.commands), command, tenant)
        self.commands.append(rec)
        outs = self.admission.step(rec)
        for out in outs:
            if out.topic == catalogue.JOB_EVENTS.name:
                self.emit(out.topic, out.partition, out.event)
        return [payload(o.event) for o in outs if o.topic == catalogue.SCHEDULER.name]

    def report(
        self,
        cls: type,
        job_id: str,
        run: int,
        node: str,
        incarnation: int | None = None,
        **fields: Any,
    ) -> list[Any]:
        return self.feed(
            cls(
                event_id=f"{cls.__name__}:{job_id}:{run}:{node}:{len(self.scheduler)}",
                ts_ms=self.now,
                job_id=job_id,
                run=run,
                node_id=node,
                incarnation=incarnation or self.incarnation[node],
                **fields,
            )
        )

    def heartbeat(
        self, node: str, runs: tuple[tuple[str, int], ...] = (), incarnation: int | None = None
    ) -> list[Any]:
        return self.feed(
            ev.NodeHeartbeat(
                event_id=f"hb:{node}:{len(self.scheduler)}",
                ts_ms=self.now,
                node_id=node,
                incarnation=incarnation or self.incarnation[node],
                runs=tuple(ev.RunReport(job_id=j, run=r, step_rate=1.0) for j, r in runs),
            )
        )

    # -- playing the agents ----------------------------------------------------
    def start_all(self) -> None:
        for key, starts in list(self.starts.items()):
            if key not in self.started:
                self.started.add(key)
                self.report(ev.RunStarted, key[0], key[1], starts[0].node_id)

    def heartbeat_all(self) -> None:
        """Every node reports the runs the cell placed on it (well-behaved agents)."""
        for node_id, node in self.refold.cell.index.nodes.items():
            if node.state != "DOWN":
                self.heartbeat(node_id, tuple(dict.fromkeys(o for o in node.owner if o)))

    def current_run(self, job_id: str) -> int:
        return max(r for j, r in self.starts if j == job_id)

    def complete(self, job_id: str) -> list[Any]:
        run = self.current_run(job_id)
        node = self.starts[(job_id, run)][0].node_id
        return self.report(ev.RunCompleted, job_id, run, node, artifact_uri=f"mem://{job_id}")

    # -- reading it back -------------------------------------------------------
    def contents(self) -> LogContents:
        return LogContents(
            scheduler=list(self.scheduler),
            job_events=list(self.job_events),
            assignments=list(self.assignments),
            commands=list(self.commands),
            committed={
                "scheduler": {self.partition: len(self.scheduler)},
                "admission": {0: len(self.commands)},
            },
        )


def clean_history(config: CellConfig | None = None) -> CellLog:
    """Two 8-GPU nodes; four jobs (one a 16-GPU gang that must wait); all complete.
    Without ``config``, the cell publishes no CellStatus and no estimates."""
    log = CellLog(config)
    log.tick()
    log.register("n0", rail="rail-0")
    log.register("n1", rail="rail-0")
    log.admit("a", gpus=4)
    log.admit("b", gpus=8)
    log.admit("gang", gpus=16, per_node=8, tenant="studio")
    log.admit("d", gpus=2, tenant="studio")
    log.tick()
    log.start_all()
    log.tick(5)
    log.heartbeat_all()
    log.complete("a")
    log.complete("b")
    log.complete("d")
    log.tick()
    log.start_all()
    log.tick(5)
    log.heartbeat_all()
    log.tick(5)
    log.complete("gang")
    log.heartbeat_all()
    log.tick()
    return log


def codes(explanation: dict) -> list[str]:
    """The blockers' codes of an audit's explanation (from test_tools_audit*.py)."""
    return [b["code"] for b in explanation["blockers"]]
