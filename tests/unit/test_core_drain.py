"""A cell's offer to admission and the drain of jobs it cannot run (issue #9).

Pure core tests (``framespool.processors.core.drain``), a property test of one
cell with drains on, and a property test of admission routing over two cells
whose nodes come and go: no job routed to a cell whose fresh offer cannot host
it, and every job ends in exactly one cell's queue or with one terminal event.
"""

from __future__ import annotations

import pickle
from collections import Counter, deque
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.admission import (
    AdmissionConfig,
    AdmissionState,
    CellCommand,
    offer_groups,
)
from framespool.processors.core.drain import can_host, job_fits, largest_job
from framespool.schemas import events as ev
from framespool.schemas.states import JobState, NodeState
from tests.support.core import action, play
from tests.support.core_harness import TERMINAL, Harness, InvariantBroken

DRAIN = CellConfig(status_interval_s=0, estimate_interval_s=0, drain_grace_s=60)


def of(out: list, cls: type) -> list:
    return [o for o in out if isinstance(o, cls)]


def go_silent(h: Harness, seconds: float, keep: tuple[str, ...] = ()) -> list:
    """Tick ``seconds`` one at a time; only the nodes in ``keep`` heartbeat."""
    out: list = []
    for _ in range(int(seconds)):
        for node_id in keep:
            out += h.heartbeat(node_id)
        out += h.tick(1)
    return out


# -- the arithmetic -------------------------------------------------------------
def test_can_host_counts_nodes_big_enough_for_the_per_node_size():
    groups = (("A100", 8, 1), ("H100", 4, 2), ("H100", 8, 2))
    assert can_host(groups, 16, 8, "H100")  # two 8-GPU H100 nodes
    assert not can_host(groups, 24, 8, "H100")
    assert can_host(groups, 16, 4, "H100")  # four nodes with at least 4
    assert can_host(groups, 24, 8, "")  # any type: the A100 node too
    assert not can_host(groups, 16, 16, "")
    assert largest_job(groups, "H100") == 16 and largest_job(groups) == 24
    assert largest_job((("H100", 8, 100),)) == 64  # never past the per-job limit
    spec = ev.JobSpec(
        job_id="j",
        tenant="t",
        gpus=16,
        gpus_per_node=8,
        shapes=(ev.Shape(gpus=32, gpus_per_node=8, estimate_s=1),),
    )
    assert job_fits(groups, spec, every_shape=False) and not job_fits(groups, spec, True)


# -- offers ---------------------------------------------------------------------
def test_a_cell_offers_its_shapes_and_queued_work_on_the_status_cadence():
    config = CellConfig(status_interval_s=5, estimate_interval_s=0)
    h = Harness(config, nodes=3, gpus=8)
    h.submit("big", gpus=24, per_node=8, estimate_s=100, tier="paid")
    h.submit("small", gpus=1, estimate_s=50, tier="free")
    h.submit("wait", gpus=8, estimate_s=10, tier="free")  # "big" holds all 24 GPUs
    out = h.tick(5)
    offers = of(out, ev.CellOffer)
    assert len(offers) == 1 and of(out, ev.CellStatus)
    o = offers[0]
    assert o.cell == "cell-0" and o.capacity_gpus == 24
    [h100] = o.gpu_types
    assert (h100.gpu_type, h100.healthy_gpus, h100.largest_job) == ("H100", 24, 24)
    assert h100.groups == (ev.NodeGroup(gpus=8, nodes=3),)
    ahead = {t.tier: t.queued_gpu_s for t in o.tiers}
    # the queued 1 x 50 + 8 x 10 GPU-seconds of "free" are ahead of free and batch, not paid
    assert ahead["paid"] == 0 and ahead["free"] == 130 and ahead["batch"] == 130
    assert o.free_gpus == 0 and o.running_gpu_s == 24 * 100 - 24 * 5
    assert not of(h.tick(1), ev.CellOffer)  # next one 5 s later
    assert of(h.tick(4), ev.CellOffer)
    off = Harness(CellConfig(status_interval_s=0, estimate_interval_s=0))
    assert not of(off.tick(60), ev.CellOffer)


def test_an_offer_counts_only_up_nodes_and_healthy_gpus():
    config = CellConfig(status_interval_s=1, estimate_interval_s=0, heartbeat_timeout_s=10)
    h = Harness(config, nodes=2, gpus=8)
    out = go_silent(h, 12, keep=("n0",))  # n1 goes DOWN
    assert h.cell.index.nodes["n1"].state == NodeState.DOWN
    last = of(out, ev.CellOffer)[-1]
    assert last.gpu_types[0].groups == (ev.NodeGroup(gpus=8, nodes=1),)
    assert last.gpu_types[0].largest_job == 8


# -- drain ----------------------------------------------------------------------
def test_a_cell_whose_nodes_all_go_down_drains_after_the_grace_not_before():
    h = Harness(DRAIN, nodes=2, gpus=8)
    h.submit("run", gpus=16, per_node=8)  # placed on both nodes
    h.submit("j1", gpus=8, per_node=8)
    h.submit("j2", gpus=1, tenant="t1")
    assert {j.state for j in h.cell.jobs.values()} == {JobState.ASSIGNED, JobState.QUEUED}
    out = go_silent(h, 12)  # both nodes DOWN after 10 s; "run" is requeued
    assert all(n.state == NodeState.DOWN for n in h.cell.index.nodes.values())
    assert of(out, ev.JobRequeued) and not of(out, ev.JobRerouted)
    out = go_silent(h, 50)
    assert not of(out, ev.JobRerouted)  # not before the grace
    out = go_silent(h, 30)
    moved = of(out, ev.JobRerouted)
    assert sorted(m.job_id for m in moved) == ["j1", "j2", "run"]
    m = next(m for m in moved if m.job_id == "run")
    assert m.from_cell == "cell-0" and m.spec == h.admitted["run"] and m.run == 1
    assert "no UP nodes that can run 16 GPU(s)" in m.reason and "60s drain grace" in m.reason
    # gone from the cell as a cancelled queued job would be, but not finished
    cell = h.cell
    assert not cell.jobs and cell.queued_count == 0 and not cell.finished.get("j1")
    assert all(t.backlog == 0 and t.queued == 0 for t in cell.fair.root.children.values())
    assert all(u.queued == 0 for u in cell.org_use.values())
    assert all(u.queued == 0 for u in cell.user_use.values())
    assert not cell.unplaceable and set(cell.rerouted) == {"j1", "j2", "run"}
    assert cell.counters["rerouted"] == 3


def test_a_node_back_within_the_grace_keeps_the_job():
    h = Harness(DRAIN, nodes=2, gpus=8)
    h.submit("run", gpus=8, per_node=8)
    h.submit("wide", gpus=16, per_node=8)  # needs both nodes
    go_silent(h, 20, keep=("n0",))  # n1 DOWN: "wide" cannot run here now
    assert "wide" in h.cell.unplaceable  # seen at a check (every 1/8 of the grace)
    go_silent(h, 30, keep=("n0",))
    h.register("n1", 8)
    out = go_silent(h, 60, keep=("n0", "n1"))
    assert not of(out, ev.JobRerouted) and "wide" in h.cell.jobs


def test_a_rerouted_job_takes_its_runs_and_checkpoint_to_the_next_cell():
    h = Harness(DRAIN, nodes=1, gpus=8)
    h.submit("ck", gpus=8, per_node=8, checkpoint_interval_s=10)
    h.start_all()
    h.report(ev.RunCheckpointed, "ck", 1, "n0", checkpoint_uri="mem://ck/1", progress=0.4)
    out = go_silent(h, 100)  # n0 DOWN: requeued from its checkpoint, then rerouted
    [moved] = of(out, ev.JobRerouted)
    assert (moved.run, moved.resume_from) == (1, "mem://ck/1")
    # the next cell (here a fresh one) goes on from there
    other = Harness(DRAIN, nodes=1, gpus=8)
    other.admitted["ck"] = moved.spec
    out = other.feed(
        ev.JobAdmitted(
            event_id="admission-0@5/0",
            ts_ms=other.now_ms,
            spec=moved.spec,
            cell="cell-0",
            run=moved.run,
            resume_from=moved.resume_from,
        )
    )
    [assigned] = of(out, ev.JobAssigned)
    assert (assigned.run, assigned.resume_from) == (2, "mem://ck/1")
    [start] = of(out, ev.StartRun)
    assert (start.run, start.resume_from) == (2, "mem://ck/1")


def test_the_drain_grace_knob_off_keeps_jobs_forever():
    h = Harness(CellConfig(status_interval_s=0, estimate_interval_s=0), nodes=1, gpus=8)
    h.submit("j1", gpus=8, per_node=8)
    h.submit("j2", gpus=8, per_node=8)
    assert not of(go_silent(h, 600), ev.JobRerouted)
    assert set(h.cell.jobs) == {"j1", "j2"}


def test_a_cell_that_never_had_nodes_drains_what_it_was_sent():
    h = Harness(DRAIN, nodes=0)
    h.submit("j1", gpus=4, per_node=4)
    out = go_silent(h, 59)
    assert not of(out, ev.JobRerouted)
    out = go_silent(h, 10)
    assert [m.job_id for m in of(out, ev.JobRerouted)] == ["j1"]


def test_a_redelivered_admission_after_a_reroute_is_ignored_and_a_later_one_admits():
    h = Harness(DRAIN, nodes=0)
    spec = ev.JobSpec(job_id="j1", tenant="t0", gpus=1)
    h.admitted["j1"] = spec
    first = ev.JobAdmitted(event_id="a@1/0", ts_ms=h.now_ms, spec=spec, cell="cell-0")
    h.feed(first)
    go_silent(h, 70)
    assert "j1" in h.cell.rerouted
    out = h.feed(first)  # the same admission, re-delivered
    assert [type(o) for o in out] == [ev.ReportIgnored]
    assert "rerouted away from cell-0" in out[0].reason and "j1" not in h.cell.jobs
    cancel = ev.CancelJob(event_id="c", ts_ms=h.now_ms, job_id="j1", tenant="t0")
    out = h.feed(cancel)
    assert "cancel refused: job was rerouted away" in out[0].reason
    h.register("n0", 8)
    back = ev.JobAdmitted(event_id="a@9/0", ts_ms=h.now_ms, spec=spec, cell="cell-0")
    out = h.feed(back)  # routed back here after another cell gave it up
    assert of(out, ev.JobQueued) or of(out, ev.JobAssigned)
    assert "j1" in h.cell.jobs and "j1" not in h.cell.rerouted


def test_drain_state_survives_a_snapshot_and_an_old_snapshot_gets_it_empty():
    h = Harness(DRAIN, nodes=0)
    h.submit("j1")
    go_silent(h, 10)
    copy = pickle.loads(pickle.dumps(h.cell))
    assert copy.unplaceable == h.cell.unplaceable and copy.host_sig == h.cell.host_sig
    for name in ("unplaceable", "rerouted", "host_sig", "last_offer_ms", "last_drain_ms"):
        del h.cell.__dict__[name]
    old = pickle.loads(pickle.dumps(h.cell))
    assert old.unplaceable == {} and old.rerouted == {} and old.host_sig is None


def test_rerouted_ids_are_forgotten_after_the_finished_horizon():
    config = CellConfig(
        status_interval_s=0, estimate_interval_s=0, drain_grace_s=10, finished_horizon_s=100
    )
    h = Harness(config, nodes=0)
    h.submit("j1")
    go_silent(h, 20)
    assert "j1" in h.cell.rerouted
    go_silent(h, 120)
    assert "j1" not in h.cell.rerouted


# -- one cell, drains on: the core's invariants still hold -----------------------
class DrainHarness(Harness):
    """The core harness, counting a reroute as the job's end in this cell, and
    checking queue accounting after every step."""

    def __init__(self) -> None:
        self.rerouted: Counter = Counter()
        super().__init__(CellConfig(status_interval_s=0, estimate_interval_s=0, drain_grace_s=20))

    def check(self, event: Any, out: list[Any]) -> None:
        super().check(event, out)
        cell = self.cell
        for o in out:
            if isinstance(o, ev.JobRerouted):
                self.rerouted[o.job_id] += 1
                if self.rerouted[o.job_id] > 1 or self.terminal[o.job_id]:
                    raise InvariantBroken(f"{o.job_id} left the cell twice: {o}")
        queued = [j for j in cell.jobs.values() if j.state == JobState.QUEUED]
        tiers = cell.fair.root.children.values()
        if cell.queued_count != len(queued) or sum(t.queued for t in tiers) != len(queued):
            raise InvariantBroken(f"queue count {cell.queued_count} != {len(queued)} queued")
        if abs(sum(t.backlog for t in tiers) - sum(j.cost for j in queued)) > 1e-6:
            raise InvariantBroken("fair-share backlog differs from the queued jobs' cost")
        if sum(u.queued for u in cell.org_use.values()) != len(queued):
            raise InvariantBroken("tenant queued counts differ from the queue")
        if set(cell.rerouted) & set(cell.jobs):
            raise InvariantBroken("a job both live and rerouted")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(action, min_size=20, max_size=120))
def test_with_drains_every_job_ends_once_or_leaves_once(actions):
    h = DrainHarness()
    play(h, actions)
    h.drain()
    assert set(h.terminal) | set(h.rerouted) == set(h.admitted)
    assert not set(h.terminal) & set(h.rerouted)


# -- two cells and admission ------------------------------------------------------
CELLS = ("cell-0", "cell-1")


class World:
    """Admission and two cells wired as the shells wire them, delivering every
    output synchronously in log order; agents heartbeat unless killed."""

    def __init__(self, sizes: tuple[int, int]) -> None:
        self.now_ms = 1_000
        self.admission = AdmissionState(AdmissionConfig(cells=CELLS, offer_stale_s=15))
        config = CellConfig(
            status_interval_s=5, estimate_interval_s=0, drain_grace_s=20, heartbeat_timeout_s=10
        )
        self.cells = {c: Cell(config, c) for c in CELLS}
        self.commands: deque = deque()
        self.scheduler: dict[str, deque] = {c: deque() for c in CELLS}
        self.nodes: dict[str, dict[str, int]] = {c: {} for c in CELLS}  # node -> incarnation
        self.alive: set[str] = set()
        self.seq = 0
        self.terminal: Counter = Counter()
        self.submitted: set[str] = set()
        self.routed_badly: list[str] = []
        for cell, n in zip(CELLS, sizes, strict=True):
            for i in range(n):
                self.register(cell, f"{cell}-n{i}")
        self.tick(1)

    def eid(self) -> str:
        self.seq += 1
        return f"w{self.seq}"

    def register(self, cell: str, node_id: str) -> None:
        inc = self.nodes[cell].get(node_id, 0) + 1
        self.nodes[cell][node_id] = inc
        self.alive.add(node_id)
        self.scheduler[cell].append(
            ev.NodeRegistered(
                event_id=self.eid(),
                ts_ms=self.now_ms,
                node_id=node_id,
                incarnation=inc,
                cell=cell,
                gpus=8,
            )
        )
        self.settle()

    def submit(self, job_id: str, tenant: str, gpus: int, per_node: int) -> None:
        self.submitted.add(job_id)
        spec = ev.JobSpec(
            job_id=job_id, tenant=tenant, gpus=gpus, gpus_per_node=per_node, estimate_s=30
        )
        self.commands.append(ev.SubmitJob(event_id=self.eid(), ts_ms=self.now_ms, spec=spec))
        self.settle()

    def tick(self, seconds: int) -> None:
        for _ in range(seconds):
            self.now_ms += 1000
            for cell in CELLS:
                for node_id, inc in self.nodes[cell].items():
                    if node_id in self.alive:
                        node = self.cells[cell].index.nodes.get(node_id)
                        held = dict.fromkeys(o for o in (node.owner if node else ()) if o)
                        runs = tuple(ev.RunReport(job_id=j, run=r) for j, r in held)
                        self.scheduler[cell].append(
                            ev.NodeHeartbeat(
                                event_id=self.eid(),
                                ts_ms=self.now_ms,
                                node_id=node_id,
                                incarnation=inc,
                                runs=runs,
                            )
                        )
                self.scheduler[cell].append(
                    ev.Tick(event_id=self.eid(), ts_ms=self.now_ms, cell=cell, now_ms=self.now_ms)
                )
            self.settle()

    def settle(self) -> None:
        while self.commands or any(self.scheduler.values()):
            if self.commands:
                command = self.commands.popleft()
                for o in self.admission.apply(command, self.eid()):
                    self.deliver(o, "admission")
            for cell in CELLS:
                while self.scheduler[cell]:
                    event = self.scheduler[cell].popleft()
                    for o in self.cells[cell].apply(event, self.eid()):
                        self.deliver(o, cell)

    def deliver(self, o: Any, source: str) -> None:
        if isinstance(o, ev.JobAdmitted):
            # a fresh offer with UP nodes is binding; one with none is "unknown"
            fresh = self.admission._live_offers((o.cell,))
            if o.cell in fresh and not job_fits(offer_groups(fresh[o.cell]), o.spec, True):
                self.routed_badly.append(f"{o.spec.job_id} -> {o.cell}")
            self.scheduler[o.cell].append(o)
        elif isinstance(o, CellCommand):
            self.scheduler[o.cell].append(o.command)
        elif isinstance(o, (ev.CellOffer, ev.JobRerouted)):
            self.commands.append(o)
        elif isinstance(o, ev.StartRun):
            pass  # agents run nothing; leases requeue what they never start
        if isinstance(o, TERMINAL):
            self.terminal[o.job_id] += 1


world_action = st.one_of(
    st.tuples(
        st.just("submit"),
        st.integers(0, 2),
        st.sampled_from([(1, 8), (8, 8), (16, 8), (24, 8), (32, 8), (4, 4)]),
    ),
    st.tuples(st.just("tick"), st.integers(1, 30)),
    st.tuples(st.just("kill"), st.integers(0, 1), st.integers(0, 3)),
    st.tuples(st.just("revive"), st.integers(0, 1), st.integers(0, 3)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.tuples(st.integers(0, 2), st.integers(1, 4)), st.lists(world_action, min_size=5, max_size=40)
)
def test_routing_never_picks_a_cell_that_cannot_host_and_every_job_lives_once(sizes, actions):
    w = World(sizes)
    n = 0
    for a in actions:
        if a[0] == "submit":
            n += 1
            w.submit(f"j{n}", f"t{a[1]}", *a[2])
        elif a[0] == "tick":
            w.tick(a[1])
        else:
            cell = CELLS[a[1]]
            nodes = sorted(w.nodes[cell])
            if not nodes:
                continue
            node_id = nodes[a[2] % len(nodes)]
            if a[0] == "kill":
                w.alive.discard(node_id)
            elif node_id not in w.alive:
                w.register(cell, node_id)
    w.tick(60)  # past every grace and lease
    assert not w.routed_badly, w.routed_badly
    assert all(c == 1 for c in w.terminal.values()), w.terminal
    holders: dict[str, list[str]] = {}
    for cell_id, cell in w.cells.items():
        for job_id in cell.jobs:
            holders.setdefault(job_id, []).append(cell_id)
    assert all(len(h) == 1 for h in holders.values()), holders
    # every job is live in one cell or ended; none is lost between cells
    assert set(holders) | set(w.terminal) == w.submitted
    assert not set(holders) & set(w.terminal)
