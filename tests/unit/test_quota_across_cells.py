"""A tenant's quota counts across all cells, not once per cell (issue #32).

Each cell enforces quotas and caps on the work it holds; admission sends every
job of a quota-bound tenant to one cell, its quota home (admission's theory of
operation, 3e). These knob tests run admission and two cells as the shells wire
them: with the routing knob off (no ``quota_tenants``) the tenant gets its
quota once per cell, twice in all; with it on, once.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from framespool.processors.config_file import admission_config, cell_config, tenant_entries
from framespool.processors.core import Cell, CellConfig
from framespool.processors.core.admission import AdmissionConfig, AdmissionState, CellCommand
from framespool.processors.core.config import TenantConfig
from framespool.schemas import events as ev

CELLS = ("cell-0", "cell-1")
QUOTA = 8


class TwoCells:
    """Admission and two cells of two 8-GPU nodes, every output delivered at once."""

    def __init__(self, admission: AdmissionConfig, tenants: tuple[TenantConfig, ...]) -> None:
        self.now_ms = 1_000
        self.admission = AdmissionState(admission)
        config = CellConfig(
            status_interval_s=1,
            estimate_interval_s=0,
            tenants=tenants,
            heartbeat_timeout_s=1e9,
            report_lease_s=1e9,
            start_lease_s=1e9,
        )
        self.cells = {c: Cell(config, c) for c in CELLS}
        self.commands: deque = deque()
        self.inputs: dict[str, deque] = {c: deque() for c in CELLS}
        self.seq = 0
        self.peak: dict[str, int] = {}  # tenant -> most GPUs it held at once, all cells
        for cell in CELLS:
            for i in range(2):
                self.inputs[cell].append(
                    ev.NodeRegistered(
                        event_id=self.eid(),
                        ts_ms=self.now_ms,
                        node_id=f"{cell}-n{i}",
                        incarnation=1,
                        cell=cell,
                        gpus=8,
                    )
                )
        self.tick(2)

    def eid(self) -> str:
        self.seq += 1
        return f"w{self.seq}"

    def submit(self, job_id: str, tenant: str, gpus: int = 4) -> None:
        spec = ev.JobSpec(
            job_id=job_id, tenant=tenant, gpus=gpus, gpus_per_node=gpus, estimate_s=600
        )
        self.commands.append(ev.SubmitJob(event_id=self.eid(), ts_ms=self.now_ms, spec=spec))
        self.settle()

    def tick(self, seconds: int) -> None:
        for _ in range(seconds):
            self.now_ms += 1000
            for cell in CELLS:
                self.inputs[cell].append(
                    ev.Tick(event_id=self.eid(), ts_ms=self.now_ms, cell=cell, now_ms=self.now_ms)
                )
            self.settle()

    def settle(self) -> None:
        while self.commands or any(self.inputs.values()):
            if self.commands:
                for o in self.admission.apply(self.commands.popleft(), self.eid()):
                    self.deliver(o)
            for cell in CELLS:
                while self.inputs[cell]:
                    for o in self.cells[cell].apply(self.inputs[cell].popleft(), self.eid()):
                        self.deliver(o)
            for tenant, gpus in self.held().items():
                self.peak[tenant] = max(self.peak.get(tenant, 0), gpus)

    def deliver(self, o: Any) -> None:
        if isinstance(o, ev.JobAdmitted):
            self.inputs[o.cell].append(o)
        elif isinstance(o, CellCommand):
            self.inputs[o.cell].append(o.command)
        elif isinstance(o, (ev.CellOffer, ev.JobRerouted)):
            self.commands.append(o)

    def held(self) -> dict[str, int]:
        """GPUs each tenant's runs hold now, over both cells."""
        out: dict[str, int] = {}
        for cell in self.cells.values():
            for run in cell.runs.values():
                tenant = cell.jobs[run.job_id].tenant
                out[tenant] = out.get(tenant, 0) + run.gpus
        return out

    def cells_of(self, tenant: str) -> set[str]:
        return {
            name
            for name, cell in self.cells.items()
            for job in cell.jobs.values()
            if job.tenant == tenant
        }


def flood(world: TwoCells, tenant: str, jobs: int = 8) -> None:
    """``jobs`` 4-GPU jobs, a second apart: offers show the queue as it grows."""
    for i in range(jobs):
        world.submit(f"{tenant}-{i}", tenant)
        world.tick(1)
    world.tick(5)


CAPPED = (TenantConfig("capped", max_gpus=QUOTA),)


def test_without_the_quota_home_a_tenant_gets_its_quota_once_per_cell():
    """The control: routing by wait spreads the capped tenant's backlog over both
    cells, and each cell grants it the whole quota."""
    world = TwoCells(AdmissionConfig(cells=CELLS), CAPPED)
    flood(world, "capped")
    assert world.cells_of("capped") == set(CELLS)
    assert world.peak["capped"] == 2 * QUOTA


def test_with_the_quota_home_a_tenant_gets_its_quota_once_across_cells():
    world = TwoCells(AdmissionConfig(cells=CELLS, quota_tenants=("capped",)), CAPPED)
    flood(world, "capped")
    assert len(world.cells_of("capped")) == 1
    assert world.peak["capped"] == QUOTA
    assert world.admission.counters.get("quota_spills", 0) == 0


def test_a_tenant_without_a_quota_still_spreads_by_wait():
    world = TwoCells(AdmissionConfig(cells=CELLS, quota_tenants=("capped",)), CAPPED)
    flood(world, "free-spirit")
    assert world.cells_of("free-spirit") == set(CELLS)
    assert world.peak["free-spirit"] == 32


def test_a_default_tenant_cap_binds_every_tenant_to_its_home():
    world = TwoCells(
        AdmissionConfig(cells=CELLS, quota_default=True), (TenantConfig("*", max_gpus=QUOTA),)
    )
    world.cells = {
        c: Cell(CellConfig(status_interval_s=1, estimate_interval_s=0, default_tenant=t), c)
        for c, t in zip(CELLS, [TenantConfig("*", max_gpus=QUOTA)] * 2)
    }
    for cell in CELLS:
        for i in range(2):
            world.inputs[cell].append(
                ev.NodeRegistered(
                    event_id=world.eid(),
                    ts_ms=world.now_ms,
                    node_id=f"{cell}-n{i}",
                    incarnation=1,
                    cell=cell,
                    gpus=8,
                )
            )
    world.tick(2)
    flood(world, "anyone")
    assert len(world.cells_of("anyone")) == 1 and world.peak["anyone"] == QUOTA


@pytest.mark.parametrize(
    "table, bound",
    [
        ('name = "a"\nmax_gpus = 8', True),
        ('name = "a"\nmax_running = 2', True),
        ('name = "a"\nuser_max_gpus = 4', True),
        ('name = "a"\nmax_queued = 100', True),
        ('name = "a"\nweight = 3', False),
    ],
)
def test_the_deployment_file_binds_exactly_the_tenants_with_a_quota(tmp_path, table, bound):
    from framespool.processors.config_file import read_config_file

    path = tmp_path / "deploy.toml"
    path.write_text(f'[admission]\ncells = ["cell-0", "cell-1"]\n[[tenants]]\n{table}\n')
    doc = read_config_file(path)
    assert admission_config(doc).quota_bound("a") is bound
    assert cell_config(doc).tenant("a") == tenant_entries(doc)[0].scheduling()
