"""A two-cell world on one log where a cell drains and its jobs reroute: the
scenario the reroute tests and the Compose ACL test fold (``drained_world``)."""

from __future__ import annotations

from typing import Any

from framespool.log import Record, partition_for_key
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig
from framespool.processors.tools.history import AdmissionRefold, LogContents, Refold
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue

T0 = 1_800_000_000_000
CELLS = ("cell-0", "cell-1")
CELL_CONFIG = CellConfig(status_interval_s=5, estimate_interval_s=0, drain_grace_s=20)
ADMISSION = AdmissionConfig(cells=CELLS)


class TwoCells:
    """Admission over every commands partition and two cells, records in, records out."""

    def __init__(self) -> None:
        self.topics: dict[tuple[str, int], list[Record]] = {}
        self.admission = {
            p: AdmissionRefold(p, ADMISSION) for p in range(catalogue.COMMANDS.partitions)
        }
        self.cells = {p: Refold(p, CELL_CONFIG) for p in range(len(CELLS))}
        self.read: dict[tuple[str, int], int] = {}
        self.now = T0
        self.alive: dict[str, tuple[str, int]] = {}  # node -> (cell, incarnation)
        self.paused = False  # True: admission stops reading (its offsets stay where they are)

    def append(self, topic: str, partition: int, key: str, value: bytes) -> None:
        log = self.topics.setdefault((topic, partition), [])
        log.append(Record(topic, partition, len(log), key.encode(), value))

    def put(self, event: Any, topic: str, partition: int, key: str) -> None:
        self.append(topic, partition, key, codec.encode(event))
        self.pump()

    def pump(self) -> None:
        moved = True
        while moved:
            moved = False
            for (topic, p), records in list(self.topics.items()):
                start = self.read.get((topic, p), 0)
                if start == len(records):
                    continue
                if topic == catalogue.COMMANDS.name:
                    if self.paused:
                        continue
                    fold: Any = self.admission[p]
                elif topic == catalogue.SCHEDULER.name:
                    fold = self.cells[p]
                else:
                    self.read[(topic, p)] = len(records)
                    continue
                for record in records[start:]:
                    for out in fold.step(record):
                        assert out.partition is not None, out  # no dead letters here
                        self.append(out.topic, out.partition, out.key.decode(), out.value)
                self.read[(topic, p)] = len(records)
                moved = True

    # -- the outside world ----------------------------------------------------
    def submit(self, job_id: str, tenant: str = "acme", **spec: Any) -> None:
        body = ev.JobSpec(job_id=job_id, tenant=tenant, estimate_s=60, **spec)
        partition = partition_for_key(tenant, catalogue.COMMANDS.partitions)
        command = ev.SubmitJob(event_id=f"api:{job_id}", ts_ms=self.now, spec=body)
        self.put(command, catalogue.COMMANDS.name, partition, tenant)

    def register(self, cell: int, node: str, gpus: int = 8) -> None:
        inc = self.alive.get(node, ("", 0))[1] + 1
        self.alive[node] = (CELLS[cell], inc)
        event = ev.NodeRegistered(
            event_id=f"reg:{node}:{inc}",
            ts_ms=self.now,
            node_id=node,
            incarnation=inc,
            cell=CELLS[cell],
            gpus=gpus,
        )
        self.put(event, catalogue.SCHEDULER.name, cell, CELLS[cell])

    def tick(self, seconds: int, dead: tuple[str, ...] = ()) -> None:
        for _ in range(seconds):
            self.now += 1000
            for p, cell in enumerate(CELLS):
                for node, (home, inc) in self.alive.items():
                    if home == cell and node not in dead:
                        beat = ev.NodeHeartbeat(
                            event_id=f"hb:{node}:{self.now}",
                            ts_ms=self.now,
                            node_id=node,
                            incarnation=inc,
                        )
                        self.append(catalogue.SCHEDULER.name, p, cell, codec.encode(beat))
                tick = ev.Tick(
                    event_id=f"clock:{cell}:{self.now}", ts_ms=self.now, cell=cell, now_ms=self.now
                )
                self.append(catalogue.SCHEDULER.name, p, cell, codec.encode(tick))
            self.pump()

    # -- reading ----------------------------------------------------------------
    def records(self, topic: str) -> list[Record]:
        return [r for (t, _), rs in sorted(self.topics.items()) for r in rs if t == topic]

    def events(self, topic: str, cls: type | None = None) -> list[Any]:
        out = [codec.decode(r.value) for r in self.records(topic)]
        return [e for e in out if cls is None or isinstance(e, cls)]

    def contents(self) -> LogContents:
        committed = {
            "scheduler": {
                p: len(self.topics.get((catalogue.SCHEDULER.name, p), [])) for p in (0, 1)
            },
            "admission": {
                p: self.read.get((catalogue.COMMANDS.name, p), 0)
                for p in range(catalogue.COMMANDS.partitions)
            },
        }
        return LogContents(
            scheduler=self.records(catalogue.SCHEDULER.name),
            job_events=self.records(catalogue.JOB_EVENTS.name),
            assignments=self.records(catalogue.ASSIGNMENTS.name),
            commands=self.records(catalogue.COMMANDS.name),
            committed=committed,
        )


def drained_world() -> TwoCells:
    """cell-0 has one 8-GPU node, cell-1 four; a 32-GPU job, then cell-0's agent dies."""
    w = TwoCells()
    w.register(0, "a0")
    for i in range(4):
        w.register(1, f"b{i}")
    w.tick(6)  # both cells offer
    w.submit("big", gpus=32, gpus_per_node=8)
    w.submit("hold", gpus=8, gpus_per_node=8, tenant="globex")  # fills cell-1's spare room
    for i in range(3):
        w.submit(f"small{i}", gpus=8, gpus_per_node=8, tenant="initech")
    w.tick(40, dead=("a0",))  # a0 DOWN after 10 s; cell-0's queue drains after 20 s more
    return w
