"""The imperative shell of ``framespool chaos``: a stack, a workload, faults, a report.

Theory of operation
-------------------
:class:`ChaosRun` owns one embedded :class:`~framespool.stack.Stack` and three
threads of its own besides the caller's:

1. a :class:`Watcher` that follows ``job-events`` (terminal events, node
   states, every cell's last ``CellStatus``), every cell's partition of the
   scheduler topic (recent agent reports, to duplicate) and ``dead-letter``;
2. a submitter that POSTs each planned job at its time (idempotency key
   ``chaos-<seed>-<index>``, retried on connection errors);
3. the caller's thread, which runs the fault actions at their times, restarts
   agents whose node left service without a fault of ours, or whose process
   died (an operator's job), and decides when the run is over. A node of a
   ``down_agent`` fault is left alone until the fault's ``heal_check``: its
   agent must re-register by itself, and the report says whether it did. The
   nodes of an ``empty_cell`` fault stay dead until its restart, whatever else
   ends meanwhile.

The stack runs ``cells`` cells and ``schedulers`` scheduler instances
(``scheduler-<i>``) sharing them through their consumer group, with shared
snapshots in ``<data-dir>/shared-snapshots`` (so a taken-over cell starts from
its last published state, and a resumed zombie is fenced by owner epoch).

The plan and the accounting (:mod:`framespool.chaos.plan`,
:mod:`framespool.chaos.accounting`) are on the purity list; this module
only does what they say and reads the log back.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from framespool.agents import faults as node_faults
from framespool.broker import free_port
from framespool.chaos import accounting, malformed, takeover
from framespool.chaos import plan as chaos
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.states import NodeState
from framespool.schemas.topics import Topics
from framespool.stack import Process, Stack, StackConfig

if TYPE_CHECKING:
    from framespool.log import Producer, Record

log = logging.getLogger(__name__)

OUT_OF_SERVICE = (NodeState.DOWN, NodeState.DEGRADED, NodeState.DRAINING)
SUPERVISOR_GRACE_S = 3.0
SUPERVISOR_MIN_GAP_S = 15.0
WEDGE_PATIENCE_S = 30.0  # a wedge with no generator to hit is retried this long, then skipped


@dataclass
class ChaosConfig:
    jobs: int = 100
    seed: int = 1
    time_scale: float = 10.0
    nodes: int = 6
    gpus_per_node: int = 8
    data_dir: Path | None = None
    timeout_s: float | None = None  # default: from the plan's expected length
    cells: int = 2
    schedulers: int = 2
    shared_snapshots: bool = True
    settle_s: float = 30.0
    stall_s: float = 180.0  # no job ended this long (all submitted): give up
    timing: chaos.Timing = field(default_factory=chaos.Timing)
    broker: str = "kafka"  # "tansu": in memory, so no kill_broker faults
    say: Callable[[str], None] = lambda line: None


class Watcher(threading.Thread):
    """Follows job-events, the cells' scheduler partitions and dead-letter from offset 0."""

    def __init__(self, bootstrap: str, topics: Topics = catalogue, cells: int = 1) -> None:
        super().__init__(name="chaos-watcher", daemon=True)
        from framespool.log import LogConsumer

        self._jobs = LogConsumer(bootstrap)
        self._jobs.assign(topics.JOB_EVENTS.name, range(topics.JOB_EVENTS.partitions), 0)
        self._sched = LogConsumer(bootstrap)
        self._sched.assign(topics.SCHEDULER.name, range(cells), 0)
        self._dead = LogConsumer(bootstrap)
        self._dead.assign(topics.DEAD_LETTER.name, range(topics.DEAD_LETTER.partitions), 0)
        self.lock = threading.Lock()
        self.terminal: set[str] = set()
        self.node_state: dict[str, tuple[str, float, str]] = {}  # node -> (state, since, why)
        self.incarnation: dict[str, int] = {}  # node -> the incarnation its last state named
        self.busy_gpus: dict[str, int] = {}  # cell -> GPUs its last CellStatus shows in use
        self.queued: dict[str, int] = {}  # cell -> jobs its last CellStatus shows queued
        self.statuses: Counter[str] = Counter()  # cell -> CellStatus records seen
        self.recent: deque[Record] = deque(maxlen=600)  # agent-report records
        self.dead_values: set[bytes] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        from framespool.schemas import codec

        while not self.stopping.is_set():
            try:
                jobs = self._jobs.consume(500, 0.05)
                sched = self._sched.consume(500, 0.02)
                dead = self._dead.consume(500, 0.02)
            except Exception as e:  # a broker hiccup must not end the watch
                log.warning("chaos watcher: %s", e)
                time.sleep(0.5)
                continue
            with self.lock:
                for rec in jobs:
                    try:
                        event = codec.decode(rec.value)
                    except Exception:
                        continue
                    if isinstance(event, ev.TERMINAL_EVENTS):
                        self.terminal.add(event.job_id)
                    elif isinstance(event, ev.NodeStateChanged) and event.gpu < 0:
                        self.node_state[event.node_id] = (
                            event.state,
                            time.monotonic(),
                            event.reason,
                        )
                        self.incarnation[event.node_id] = event.incarnation
                    elif isinstance(event, ev.CellStatus):
                        self.busy_gpus[event.cell] = sum(
                            1 for n in event.nodes for g in n.gpus if g.job_id
                        )
                        self.queued[event.cell] = sum(q.queued for q in event.queues)
                        self.statuses[event.cell] += 1
                for rec in sched:
                    try:
                        event = codec.decode(rec.value)
                    except Exception:
                        continue
                    if isinstance(event, accounting.AGENT_REPORTS):
                        self.recent.append(rec)
                self.dead_values.update(r.value for r in dead if r.value is not None)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        for c in (self._jobs, self._sched, self._dead):
            c.close()


def chaos_stack(
    data_dir: Path,
    nodes: int = 2,
    gpus_per_node: int = 8,
    time_scale: float = 10.0,
    timing: chaos.Timing = chaos.Timing(),
    cells: int = 1,
    schedulers: int = 1,
    shared_snapshots: bool = False,
    broker: str = "kafka",
) -> Stack:
    """An embedded stack configured as the drill runs it: no admission rate limit, the
    timing's leases (and, with several cells, its drain grace), simulated GPUs whose
    faults follow ``agents/<node>/faults.json``, ``cells`` cells shared by
    ``schedulers`` instances, with shared snapshots in ``<data_dir>/shared-snapshots``
    if asked (the drill asks)."""
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    env: dict[str, str] = {}
    if shared_snapshots:
        shared = data_dir / "shared-snapshots"
        shutil.rmtree(shared, ignore_errors=True)  # the log they were cut from is gone
        env["FRAMESPOOL_SHARED_SNAPSHOTS"] = str(shared)
    config_path = data_dir / "chaos-processors.json"
    scheduler = timing.scheduler_config()
    if cells > 1:  # the stack's own default (60 s) would make an emptied cell's fault long
        scheduler["drain_grace_s"] = timing.drain_grace_s
    config_path.write_text(
        json.dumps({"admission": {"rate": {"rate_per_s": 0}}, "scheduler": scheduler})
    )
    return Stack(
        StackConfig(
            data_dir=data_dir,
            port=free_port(),
            nodes=nodes,
            cells=cells,
            schedulers=schedulers,
            gpus_per_node=gpus_per_node,
            time_scale=time_scale,
            processor_config=config_path,
            extra_env=env,
            broker=broker,
            fresh=True,  # a drill reads its log from offset 0: its own log only
        )
    )


def restart_process(stack: Stack, name: str) -> Process:
    """Stop the stack's process ``name`` (SIGTERM, or reap it if it is dead) and start
    it again with the same command line, in the same place in ``stack.processes``."""
    i, old = next((i, p) for i, p in enumerate(stack.processes) if p.name == name)
    if old.alive():
        node_faults.resume(old.popen.pid)  # a stopped process cannot act on SIGTERM
        old.stop(grace_s=10.0)
    else:
        old.popen.wait(5)
        old.log.close()
    stack.processes[i] = Process(name, list(old.argv), stack.log_dir, stack.process_env())
    return stack.processes[i]


class LogTail:
    """Every record of some topics from offset 0, decoded where possible; for tests
    and post-mortems that wait for a fault's consequences.

    The topics are read by one consumer each, so one poll may have read further
    into one topic than another: an event seen on job-events need not come with
    the scheduler-topic report that caused it. :meth:`wait_for` therefore ends
    with :meth:`catch_up`, after which everything appended to any tailed topic
    before the awaited event was seen is in :attr:`events` too
    (``docs/broker-notes.md#reading-several-topics``).
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Topics = catalogue,
        names: tuple[str, ...] = (
            "JOB_EVENTS",
            "SCHEDULER",
            "PROGRESS",
            "DEAD_LETTER",
            "ASSIGNMENTS",
        ),
    ) -> None:
        from framespool.log import LogConsumer

        self._bootstrap = bootstrap
        self._consumers = []
        self._next: dict[tuple[str, int], int] = {}  # the offset to take next per partition
        for name in names:
            topic = getattr(topics, name)
            consumer = LogConsumer(bootstrap)
            consumer.assign(topic.name, range(topic.partitions), 0)
            self._consumers.append(consumer)
            self._next.update({(topic.name, p): 0 for p in range(topic.partitions)})
        self.records: list[Any] = []
        self.events: list[Any] = []

    def _take(self, rec: Any) -> None:
        from framespool.schemas import codec

        tp = (rec.topic, rec.partition)
        if rec.offset < self._next[tp]:
            return  # already taken by catch_up
        self._next[tp] = rec.offset + 1
        self.records.append(rec)
        try:
            self.events.append(codec.decode(rec.value))
        except Exception:
            pass

    def poll(self) -> None:
        for consumer in self._consumers:
            for rec in consumer.consume(1000, 0.02):
                self._take(rec)

    def catch_up(self, timeout_s: float = 30.0) -> None:
        """Take every record appended to the tailed topics before this call.

        A fresh reader fetches from where each partition was left to its high
        watermark (:func:`framespool.log.read_to_end`); the tail's own consumers
        later skip what it took. Cost: one consumer and a Fetch round or two.
        """
        from framespool.log import read_to_end

        found = read_to_end(self._bootstrap, dict(self._next), timeout_s)
        for records in found.values():
            for rec in records:
                self._take(rec)

    def of(self, cls: type, **fields: Any) -> list[Any]:
        return [
            e
            for e in self.events
            if isinstance(e, cls) and all(getattr(e, k, None) == v for k, v in fields.items())
        ]

    def first(self, cls: type, **fields: Any) -> Any:
        found = self.of(cls, **fields)
        return found[0] if found else None

    def wait_for(
        self, predicate: Callable[[LogTail], Any], timeout_s: float = 30.0, what: str = ""
    ) -> Any:
        """Poll until ``predicate`` holds, then :meth:`catch_up` and return its value
        (re-taken after the catch-up where it still holds). Raises ``TimeoutError``
        naming ``what`` and the event kinds seen after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            result = predicate(self)
            if result:
                self.catch_up()
                return predicate(self) or result
            if time.monotonic() > deadline:
                kinds = Counter(type(e).__name__ for e in self.events)
                raise TimeoutError(
                    f"no {what or predicate} within {timeout_s:.0f}s; seen {dict(kinds)}"
                )
            time.sleep(0.1)

    def close(self) -> None:
        for consumer in self._consumers:
            consumer.close()

    def __enter__(self) -> LogTail:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ChaosRun:
    # the stack, the watcher and the producer of the drill: run() makes them before
    # any step that reads them runs
    stack: Stack
    watcher: Watcher
    producer: Producer

    def __init__(self, config: ChaosConfig) -> None:
        self.config = c = config
        self.plans = chaos.build_workload(c.seed, c.jobs, c.time_scale)
        self.span_s = chaos.expected_span_s(self.plans, c.nodes * c.gpus_per_node)
        self.faults = chaos.build_schedule(
            c.seed,
            c.jobs,
            c.nodes,
            c.gpus_per_node,
            max(20.0, 0.7 * self.span_s),
            c.timing,
            c.cells,
            c.schedulers,
            durable_broker=c.broker == "kafka",
        )
        self.actions = chaos.actions_of(self.faults, c.timing)
        self.timeout_s = c.timeout_s or max(300.0, 3 * self.span_s + 120)
        self.data_dir = Path(c.data_dir or tempfile.mkdtemp(prefix="framespool-chaos-")).resolve()
        self.job_ids: dict[int, str] = {}
        self.roles: dict[str, str] = {}
        self.submit_errors: list[str] = []
        self.fault_log: list[dict[str, Any]] = []
        self.injected: list[malformed.Malformed] = []
        self.wedged: set[str] = set()
        self.held: set[str] = set()  # nodes a fault of ours has out of service
        self.gpu_faults: dict[str, dict[str, dict]] = {}
        self.last_restart: dict[str, float] = {}
        self.supervisor_restarts: list[dict[str, Any]] = []
        self.heal_from: dict[int, int] = {}  # down_agent fault -> incarnation when paused
        self.instances: dict[int, str] = {}  # scheduler fault -> the instance it hit
        self.nodes_hit: dict[int, str] = {}  # agent fault -> the node it hit
        self.emptied: set[str] = set()  # nodes an empty_cell fault holds dead
        self.wedge_first: dict[int, float] = {}  # wedge fault -> its planned time
        self.checkpointing: dict[str, bool] = {}  # job -> it checkpoints
        self.t0 = 0.0

    # -- the run ------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        c = self.config
        self.stack = chaos_stack(
            self.data_dir,
            c.nodes,
            c.gpus_per_node,
            c.time_scale,
            c.timing,
            c.cells,
            c.schedulers,
            c.shared_snapshots,
            broker=c.broker,
        )
        started = time.monotonic()
        c.say(
            f"chaos: {len(self.plans)} jobs, {len(self.faults)} faults "
            f"({len(self.actions)} actions), expected ~{self.span_s:.0f} s; data in "
            f"{self.data_dir}"
        )
        with self.stack:
            from framespool.log import LogProducer

            bootstrap = self.stack.bootstrap_servers
            self.watcher = Watcher(bootstrap, cells=c.cells)
            self.watcher.start()
            self.producer = LogProducer(bootstrap)
            try:
                finished = self._drive()
                self._settle()
                cluster = self._cluster_view()
            finally:
                self.watcher.stop()
                self.producer.close(10)
            report = self._report(bootstrap)
            report["cluster_view"] = cluster
            report["finished_before_timeout"] = finished
        report["wall_s"] = round(time.monotonic() - started, 1)
        (self.data_dir / "chaos-report.json").write_text(json.dumps(report, indent=2, default=str))
        return report

    def _drive(self) -> bool:
        """Submit, inject, supervise; True when everything ended before the timeout."""
        self.t0 = time.monotonic()
        submitter = threading.Thread(target=self._submit_all, name="chaos-submitter", daemon=True)
        submitter.start()
        pending = list(self.actions)
        next_note = 10.0
        last_done, progress_at = -1, 0.0
        while True:
            now = time.monotonic() - self.t0
            while pending and pending[0].at_s <= now:
                retry = self._do(pending.pop(0))
                if retry is not None:
                    pending = sorted([*pending, retry], key=lambda x: x.sort_key)
            self._supervise(now)
            with self.watcher.lock:
                done = sum(1 for j in self.job_ids.values() if j in self.watcher.terminal)
            if done != last_done:
                last_done, progress_at = done, now
            if not submitter.is_alive() and not pending and done == len(self.job_ids):
                return True
            stalled = (
                not submitter.is_alive() and not pending and now - progress_at > self.config.stall_s
            )
            if now > self.timeout_s or stalled:
                why = f"no job ended for {self.config.stall_s:.0f} s" if stalled else "timeout"
                self.config.say(
                    f"chaos: {why} after {now:.0f} s; {done}/{len(self.job_ids)} "
                    f"jobs terminal, {len(pending)} actions left"
                )
                for action in pending:  # recoveries still run: resume, heal, restart
                    if action.op in ("resume", "unecc", "unthrottle", "restart", "heal_check"):
                        self._do(action)
                return False
            if now >= next_note:
                next_note += 10.0
                self.config.say(
                    f"chaos: t={now:.0f}s submitted {len(self.job_ids)}/"
                    f"{len(self.plans)} terminal {done} actions left {len(pending)}"
                )
            time.sleep(0.1)

    def _settle(self) -> None:
        """Wait until every cell shows no GPU held and every malformed record is
        dead-lettered."""
        deadline = time.monotonic() + self.config.settle_s
        cells = self.stack.cell_ids
        with self.watcher.lock:
            seen = {cell: self.watcher.statuses[cell] for cell in cells}
        while time.monotonic() < deadline:
            with self.watcher.lock:
                fresh = all(self.watcher.statuses[cell] > seen[cell] for cell in cells)
                idle = all(self.watcher.busy_gpus.get(cell) == 0 for cell in cells)
                dead = all(m.value in self.watcher.dead_values for m in self.injected)
            if fresh and idle and dead:
                return
            time.sleep(0.2)

    def _cluster_view(self, timeout_s: float = 10.0) -> dict:
        """The API's cluster totals once they show no GPU busy (or after ``timeout_s``).

        The API folds cell statuses with its own consumer, a few milliseconds to a
        fetch wait behind the watcher that :meth:`_settle` waited on, so its view is
        polled rather than read once.
        """
        import urllib.request

        req = urllib.request.Request(
            f"{self.stack.api_url}/v1/cluster?detail=0",
            headers={"Authorization": f"Bearer {self.stack.tenant_keys[0]['api_key']}"},
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    totals = json.loads(resp.read()).get("totals", {})
            except (OSError, ValueError) as e:
                totals = {"error": str(e)}
            if totals.get("busy") == 0 or time.monotonic() > deadline:
                return totals
            time.sleep(0.2)

    # -- submissions ----------------------------------------------------------------
    def _submit_all(self) -> None:
        from framespool.producers.client import ApiError, Client

        clients = [
            Client(self.stack.api_url, t["api_key"], timeout_s=30) for t in self.stack.tenant_keys
        ]
        for plan in self.plans:
            delay = self.t0 + plan.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            key = f"chaos-{self.config.seed}-{plan.index}"
            for attempt in range(5):
                try:
                    job = clients[plan.tenant % len(clients)].submit(
                        idempotency_key=key, **plan.body
                    )
                    self.roles[job["job_id"]] = plan.role
                    self.checkpointing[job["job_id"]] = plan.body["checkpoint_interval_s"] > 0
                    self.job_ids[plan.index] = job["job_id"]
                    break
                except ApiError as e:
                    if e.status < 500 or attempt == 4:
                        self.submit_errors.append(f"job {plan.index}: {e}")
                        break
                except (OSError, urllib.error.URLError) as e:
                    if attempt == 4:
                        self.submit_errors.append(f"job {plan.index}: {e}")
                time.sleep(1.0)

    # -- faults ----------------------------------------------------------------------
    def _process(self, name: str) -> tuple[int, Process]:
        for i, p in enumerate(self.stack.processes):
            if p.name == name:
                return i, p
        raise KeyError(name)

    def _restart(self, name: str) -> None:
        restart_process(self.stack, name)

    def _write_gpu_faults(self, node: str) -> None:
        state = self.gpu_faults.setdefault(node, {"throttle": {}, "ecc": {}})
        node_faults.write_gpu_faults(
            self.data_dir / "agents" / node,
            throttle=set(state["throttle"].values()),
            ecc={g: (0, 1) for g in state["ecc"].values()},
        )

    def _do(self, a: chaos.Action) -> chaos.Action | None:
        """Carry out one step and log it; or return it, later, to be tried again (a
        wedge that finds no generator running, e.g. while a cell is emptied)."""
        detail = ""
        ok = True
        node = self._node(a)
        agent = f"agent-{node}"
        instance = "" if node or a.kind not in chaos.SCHEDULER_FAULTS else self._instance(a)
        nodes: list[str] = []
        cell = ""
        try:
            if a.kind == chaos.EMPTY_CELL:
                cell = a.target
                nodes = self._cell_nodes(cell)
                detail = self._empty_cell(a, cell, nodes)
            elif a.kind == chaos.KILL_BROKER and a.op == "crash":
                _, p = self._process("broker")
                os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait(5)
                detail = f"broker (pid {p.popen.pid}) killed"
            elif a.kind == chaos.KILL_BROKER:
                self._restart("broker")
                detail = "broker restarted on the same log"
            elif a.op == "crash" and node:
                self.held.add(node)
                _, p = self._process(agent)
                killed = node_faults.crash_node(p.popen.pid)
                p.popen.wait(5)
                detail = f"killed with {len(killed)} generator(s)"
            elif a.op == "crash":
                _, p = self._process(instance)
                os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait(5)
                detail = f"{instance} (pid {p.popen.pid}) killed"
            elif a.op == "restart":
                self._restart(agent if node else instance)
                if node:
                    self.last_restart[node] = time.monotonic()
            elif a.op == "pause" and instance:
                _, p = self._process(instance)
                os.kill(p.popen.pid, signal.SIGSTOP)
                detail = f"{instance} (pid {p.popen.pid}) stopped"
            elif a.op == "pause":
                self.held.add(node)
                _, p = self._process(agent)
                detail = f"{len(node_faults.generators(p.popen.pid))} generator(s) left running"
                if a.kind == chaos.DOWN_AGENT:
                    with self.watcher.lock:
                        self.heal_from[a.fault_id] = self.watcher.incarnation.get(node, 0)
                    detail += f"; incarnation {self.heal_from[a.fault_id]}"
                node_faults.pause(p.popen.pid)
            elif a.op == "resume":
                node_faults.resume(self._process(agent if node else instance)[1].popen.pid)
            elif a.op == "heal_check":
                detail = self._heal_check(a, node)
            elif a.op in ("ecc", "unecc", "throttle", "unthrottle"):
                what = "ecc" if a.op.endswith("ecc") else "throttle"
                faults = self.gpu_faults.setdefault(node, {"throttle": {}, "ecc": {}})[what]
                if a.op.startswith("un"):
                    faults.pop(a.fault_id, None)
                else:
                    faults[a.fault_id] = a.gpu
                    if what == "ecc":
                        self.held.add(node)
                self._write_gpu_faults(node)
                detail = f"GPU {a.gpu}"
            elif a.op == "duplicate":
                detail = self._duplicate(a)
            elif a.op == "malformed":
                detail = self._malformed(a)
            elif a.op == "wedge":
                detail = self._wedge(a)
                ok = detail.startswith("wedged")
                first = self.wedge_first.setdefault(a.fault_id, a.at_s)
                now = time.monotonic() - self.t0
                if not ok and now - first < WEDGE_PATIENCE_S:
                    return replace(a, at_s=round(now + 2.0, 3))
        except Exception as e:  # one failed action must not end the drill
            ok, detail = False, f"failed: {e!r}"
            log.exception("chaos action %s failed", a)
        if a.final and node and node not in self.emptied:
            self.held.discard(node)
        entry = {
            "t_s": round(time.monotonic() - self.t0, 2),
            "t_ms": int(time.time() * 1000),
            "fault_id": a.fault_id,
            "kind": a.kind,
            "op": a.op,
            "node": node,
            "target": node or instance or cell,
            "ok": ok,
            "detail": detail,
        }
        if nodes:
            entry["nodes"] = nodes
        self.fault_log.append(entry)
        if node and node != a.target:
            entry["detail"] = f"(planned {a.target}: busier node) {detail}".rstrip()
        self.config.say(
            f"chaos: t={entry['t_s']:.1f}s {a.kind} #{a.fault_id} {a.op} "
            f"{entry['target'] or a.target} {entry['detail']}".rstrip()
        )
        return None

    def _cell_of(self, node: str) -> str:
        return f"cell-{int(node.removeprefix('node-')) % self.config.cells}"

    def _cell_nodes(self, cell: str) -> list[str]:
        """The nodes of ``cell`` (node ``i`` is in cell ``i mod cells``)."""
        index = int(cell.removeprefix("cell-"))
        return [f"node-{i}" for i in range(index, self.config.nodes, self.config.cells)]

    def _empty_cell(self, a: chaos.Action, cell: str, nodes: list[str]) -> str:
        """An ``empty_cell`` step: ``crash`` SIGKILLs every agent of the cell and its
        generators and holds the nodes (the supervisor, and the end of another
        fault on one of them, leave them dead); ``restart`` starts them again. The
        watcher's last ``CellStatus`` of the cell says how many jobs were queued
        there (the report reads the log instead)."""
        with self.watcher.lock:
            queued = self.watcher.queued.get(cell, 0)
        if a.op == "crash":
            self.held.update(nodes)
            self.emptied.update(nodes)
            killed = 0
            for node in nodes:
                _, p = self._process(f"agent-{node}")
                if p.alive():
                    killed += len(node_faults.crash_node(p.popen.pid))
                    p.popen.wait(5)
            return f"{', '.join(nodes)} killed with {killed} generator(s); {queued} queued"
        for node in nodes:
            self._restart(f"agent-{node}")
            self.last_restart[node] = time.monotonic()
            self.held.discard(node)
            self.emptied.discard(node)
        return f"{', '.join(nodes)} restarted; {queued} queued"

    def _node(self, a: chaos.Action) -> str:
        """The node a node fault hits: the planned one, or for an agent fault (when
        injected, kept for its later steps) a busier node of the same cell that no
        fault holds or is planned to hold meanwhile (:func:`chaos.pick_node`): the
        plan's limits per cell and in all still hold."""
        if not a.target.startswith("node-"):
            return ""
        if a.kind not in chaos.PROCESS_FAULTS:
            return a.target
        if a.fault_id not in self.nodes_hit:
            try:
                self.nodes_hit[a.fault_id] = self._pick_node(a)
            except Exception:  # looking around must not cost the fault: the planned node
                log.exception("chaos: cannot pick a node for %s", a)
                self.nodes_hit[a.fault_id] = a.target
        return self.nodes_hit[a.fault_id]

    def _pick_node(self, a: chaos.Action) -> str:
        c = self.config
        fault = next(f for f in self.faults if f.fault_id == a.fault_id)
        end = fault.at_s + chaos.node_fault_length_s(fault.kind, fault.duration_s, c.timing)
        index = int(a.target.removeprefix("node-"))
        busy: dict[str, tuple[int, int]] = {}
        for i in range(index % c.cells, c.nodes, c.cells):  # the nodes of its cell
            node = f"node-{i}"
            planned_meanwhile = any(
                f.target == node
                and f.fault_id != fault.fault_id
                and f.kind in chaos.NODE_FAULTS
                and f.at_s < end
                and fault.at_s < f.at_s + chaos.node_fault_length_s(f.kind, f.duration_s, c.timing)
                for f in self.faults
            )
            if node != a.target and (node in self.held or planned_meanwhile):
                continue
            _, p = self._process(f"agent-{node}")
            if not p.alive():
                continue
            gens = node_faults.generators(p.popen.pid)
            busy[node] = (sum(1 for g in gens if self.checkpointing.get(g.job_id)), len(gens))
        return chaos.pick_node(a.target, busy)

    def _instance(self, a: chaos.Action) -> str:
        """The scheduler instance a scheduler fault hits: the planned one, or (target
        ``scheduler``) one that owns a cell now, by its log, picked with the seed and
        kept for the fault's later steps."""
        if a.target.startswith("scheduler-"):
            return a.target
        if a.fault_id not in self.instances:
            names = [p.name for p in self.stack.processes if p.name.startswith("scheduler-")]
            now = int(time.time() * 1000)
            emptied = {int(self._cell_of(node).removeprefix("cell-")) for node in self.emptied}
            owners, spare = [], []
            for p in self.stack.processes:
                if p.name in names and p.alive():
                    changes = takeover.ownership_changes(read_lines(p.log_path), p.name)
                    owned = takeover.owned_at(changes, p.name, now) or set()
                    if any(q < self.config.cells for q in owned):
                        owners.append(p.name)
                        if not owned & emptied:
                            spare.append(p.name)
            # an instance that owns no emptied cell, if any: that cell keeps draining
            rng = random.Random(f"scheduler/{self.config.seed}/{a.fault_id}")
            self.instances[a.fault_id] = rng.choice(
                sorted(spare) or sorted(owners) or sorted(names)
            )
        return self.instances[a.fault_id]

    def _heal_check(self, a: chaos.Action, node: str) -> str:
        """A ``down_agent`` fault's last step: say whether the agent re-registered by
        itself. Nothing is restarted here: from now on the supervisor may, and the
        report counts that as not healed."""
        with self.watcher.lock:
            state, _, why = self.watcher.node_state.get(node, (NodeState.UP, 0.0, ""))
            now = self.watcher.incarnation.get(node, 0)
        before = self.heal_from.get(a.fault_id, 0)
        healed = state == NodeState.UP and now > before
        return (
            f"{'self-healed' if healed else 'not healed'}: {state}, incarnation "
            f"{before} -> {now}" + (f" ({why})" if why and not healed else "")
        )

    def _duplicate(self, a: chaos.Action) -> str:
        rng = random.Random(f"duplicate/{self.config.seed}/{a.fault_id}")
        with self.watcher.lock:
            recent = list(self.watcher.recent)
        # A re-delivered heartbeat counts as a sign of life (the fold has no way to
        # tell it is old): those of nodes we hold out of service are left out, or
        # they would hide the very fault we inject.
        recent = [r for r in recent if not self._heartbeat_of_held(r)]
        picked = rng.sample(recent, min(a.count, len(recent)))
        rng.shuffle(picked)  # reordered as well as repeated
        from framespool.schemas import codec

        kinds = Counter(codec.event_type_name(r.value) for r in picked)
        for r in picked:
            self.producer.produce(r.topic, r.key, r.value, r.partition, list(r.headers) or None)
        self.producer.flush(10)
        return f"{len(picked)} re-produced: " + ", ".join(
            f"{k} {n}" for k, n in sorted(kinds.items())
        )

    def _heartbeat_of_held(self, record: Any) -> bool:
        from framespool.schemas import codec

        try:
            e = codec.decode(record.value)
        except Exception:
            return False
        return isinstance(e, ev.NodeHeartbeat) and e.node_id in self.held

    def _malformed(self, a: chaos.Action) -> str:
        node = f"node-{a.fault_id % self.config.nodes}"
        records = malformed.malformed_records(catalogue, node, f"{self.config.seed}-{a.fault_id}")
        for m in records:
            self.producer.produce(m.topic, m.key, m.value, m.partition, [("chaos", b"malformed")])
        self.producer.flush(10)
        self.injected.extend(records)
        return f"{len(records)} records on {len({m.topic for m in records})} topics"

    def _wedge(self, a: chaos.Action) -> str:
        rng = random.Random(f"wedge/{self.config.seed}/{a.fault_id}")
        candidates = []
        for p in self.stack.processes:
            node = p.name.removeprefix("agent-")
            if p.name.startswith("agent-") and p.alive() and node not in self.held:
                candidates += [
                    g
                    for g in node_faults.generators(p.popen.pid)
                    if self.roles.get(g.job_id) == chaos.NORMAL and g.job_id not in self.wedged
                ]
        if not candidates:
            return "skipped: no generator running"
        g = rng.choice(sorted(candidates, key=lambda g: (g.job_id, g.run, g.pid)))
        node_faults.wedge(g)
        self.wedged.add(g.job_id)
        return f"wedged {g.job_id} run {g.run} (pid {g.pid})"

    def _supervise(self, now: float) -> None:
        """Restart an agent whose node is out of service, or whose process died, without
        a fault of ours (an operator's fallback). Nodes a fault holds are left alone,
        a ``down_agent``'s until its ``heal_check``: restarting it sooner would hide
        whether it heals itself."""
        with self.watcher.lock:
            states = dict(self.watcher.node_state)
        for i in range(self.config.nodes):
            node = f"node-{i}"
            if node in self.held:
                continue
            if time.monotonic() - self.last_restart.get(node, -1e9) < SUPERVISOR_MIN_GAP_S:
                continue
            state, since, why = states.get(node, (NodeState.UP, 0.0, ""))
            dead = not self._process(f"agent-{node}")[1].alive()
            if dead or (state in OUT_OF_SERVICE and time.monotonic() - since > SUPERVISOR_GRACE_S):
                why = "agent process exited" if dead else f"{state}: {why}"
                self._restart(f"agent-{node}")
                self.last_restart[node] = time.monotonic()
                entry = {
                    "t_s": round(now, 2),
                    "t_ms": int(time.time() * 1000),
                    "kind": "supervisor",
                    "node": node,
                    "detail": why,
                }
                self.supervisor_restarts.append(entry)
                self.fault_log.append({**entry, "fault_id": 0, "op": "restart", "ok": True})
                self.config.say(f"chaos: t={now:.1f}s supervisor restarts {node} ({why})")

    # -- the report ----------------------------------------------------------------
    def _report(self, bootstrap: str) -> dict[str, Any]:
        from framespool.log import read_all
        from framespool.schemas import codec

        def decoded(topic: str) -> list[tuple[int | None, Any]]:
            """(producer timestamp, event) of each decodable record of ``topic``."""
            out = []
            for rec in read_all(bootstrap, topic, timeout_s=120):
                try:
                    out.append((rec.timestamp_ms, codec.decode(rec.value)))
                except Exception:  # the malformed records we injected
                    pass
            return out

        stamped = decoded(catalogue.JOB_EVENTS.name)
        job_events = [e for _, e in stamped]
        scheduler = [e for _, e in decoded(catalogue.SCHEDULER.name)]  # every cell's inputs
        dump(
            self.data_dir / "chaos-job-events.jsonl",
            (
                e
                for e in accounting.cell_ordered(job_events)
                if not isinstance(e, (ev.CellStatus, ev.JobWaitEstimated))
            ),
        )
        dump(
            self.data_dir / "chaos-scheduler.jsonl",
            (e for e in scheduler if not isinstance(e, ev.Tick)),
        )
        dead = read_all(bootstrap, catalogue.DEAD_LETTER.name, timeout_s=60)
        submitted = [self.job_ids[i] for i in sorted(self.job_ids)]
        config_path = self.data_dir / "processors-config.json"  # as the stack ran them
        if not config_path.exists():
            config_path = self.data_dir / "chaos-processors.json"
        verdict, verify_summary = run_verify(bootstrap, config_path)
        report = accounting.account(
            job_events,
            scheduler,
            dead,
            submitted,
            self.roles,
            self.injected,
            self.fault_log,
            self.wedged,
            self.config.time_scale,
            verdict=verdict,
            timing=self.config.timing,
        )
        c = self.config
        changes = [
            change
            for p in self.stack.processes
            if p.name.startswith("scheduler-")
            for change in takeover.ownership_changes(read_lines(p.log_path), p.name)
        ]
        rows = takeover.takeovers(self.fault_log, changes, takeover.cell_outputs(stamped), c.cells)
        report.update(takeover.takeover_summary(rows))
        first_fault = min(
            (e["t_ms"] for e in self.fault_log if e["kind"] in chaos.SCHEDULER_FAULTS),
            default=int(time.time() * 1000),
        )
        report["cell_owners_before_first_takeover"] = {
            name: sorted(
                q for q in takeover.owned_at(changes, name, first_fault) or () if q < c.cells
            )
            for name in sorted({change.instance for change in changes})
        }
        report["self_healing"] = takeover.self_healing(self.fault_log, job_events)
        report["config"] = {
            "jobs": c.jobs,
            "seed": c.seed,
            "time_scale": c.time_scale,
            "nodes": c.nodes,
            "cells": c.cells,
            "schedulers": c.schedulers,
            "shared_snapshots": c.shared_snapshots,
            "gpus_per_node": c.gpus_per_node,
            "data_dir": str(self.data_dir),
            "timing": asdict(c.timing),
        }
        report["submit_errors"] = self.submit_errors
        report["faults_injected"] = self._injected_counts()
        report["faults_skipped"] = [
            f"{e['kind']} #{e['fault_id']}: {e['detail']}" for e in self.fault_log if not e["ok"]
        ]
        report["supervisor_restarts"] = len(self.supervisor_restarts)
        report["fault_log"] = self.fault_log
        report["verify"] = verify_summary
        return report

    def _injected_counts(self) -> dict[str, int]:
        first_ops = {"crash", "pause", "ecc", "throttle", "duplicate", "malformed", "wedge"}
        counts = Counter(
            e["kind"]
            for e in self.fault_log
            if e.get("op") in first_ops and e["ok"] and e["kind"] != "supervisor"
        )
        roles = Counter(self.roles.values())
        if roles.get(chaos.CRASH):
            counts[chaos.CRASH_GENERATOR] = roles[chaos.CRASH]
        if roles.get(chaos.HANG):
            counts[chaos.HANG_GENERATOR] = roles[chaos.HANG]
        return dict(sorted(counts.items()))


def read_lines(path: Path) -> list[str]:
    """A process's log, one string per line (none if it cannot be read)."""
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def dump(path: Path, events: Any) -> None:
    """Decoded events as JSON lines, for a post-mortem once the in-memory broker is gone."""
    with open(path, "w") as out:
        for e in events:
            out.write(json.dumps({"type": type(e).__name__, **asdict(e)}, default=str) + "\n")


def run_verify(bootstrap: str, config_path: Path) -> tuple[Any, dict]:
    """``framespool.processors.tools.verify`` over the same log: the one judge of the
    log invariants (``accounting.invariants`` reads its report). Returns the report
    (None if verify failed) and its summary for the JSON report."""
    from framespool.processors.config_file import load_cell_config
    from framespool.processors.tools.reader import read_log
    from framespool.processors.tools.verify import verify

    try:
        report = verify(read_log(bootstrap, timeout_s=120), load_cell_config(config_path))
    except Exception as e:  # the tool failing is reported, not taken for a verdict
        log.exception("verify failed")
        return None, {"ok": None, "error": repr(e)}
    doc = report.to_dict()
    return report, {
        "ok": report.ok,
        "violation_counts": doc["violation_counts"],
        "violations": doc["violations"][:20],
        "warnings": doc["warnings"][:20],
        "jobs": doc["jobs"],
        "summary": report.render(limit=10),
    }
