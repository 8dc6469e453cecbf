"""The core as it was before its hot paths were indexed: linear scans kept as a
test oracle. ``NaiveCell`` must decide exactly as ``Cell`` does, output event
for output event (``test_core_costmodel.py``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import islice

from framespool.processors.core import Cell, CellConfig, placement
from framespool.processors.core.config import TenantConfig, TierConfig
from framespool.processors.core.fairshare import FairTree, Flow
from framespool.processors.core.model import Node
from framespool.processors.core.placement import NodeIndex, Placement
from framespool.schemas import events as ev
from framespool.schemas.states import JobState, NodeState


@dataclass(frozen=True, slots=True)
class NaiveConfig(CellConfig):
    def tier(self, name: str) -> TierConfig | None:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        return None

    def tenant(self, name: str) -> TenantConfig:
        from dataclasses import replace

        for tenant in self.tenants:
            if tenant.name == name:
                return tenant
        return replace(self.default_tenant, name=name)

    def retry_budget(self, failure_class: str) -> int:
        for name, budget in self.retries:
            if name == failure_class:
                return budget
        return self.default_retries


def naive_config(config: CellConfig) -> NaiveConfig:
    from dataclasses import fields

    return NaiveConfig(**{f.name: getattr(config, f.name) for f in fields(config) if f.init})


class NaiveFairTree(FairTree):
    """Scans every backlogged child per level; pass offsets in a dict."""

    def __init__(self, idle_credit_gpu_s: float = 0.0) -> None:
        super().__init__(idle_credit_gpu_s)
        self.offsets: dict[int, float] = {}

    def _file(self, flow: Flow) -> None:  # no heaps
        pass

    def _clamp_on_return(self, flow: Flow) -> None:
        siblings = flow.parent.active
        if not siblings:
            return
        floor = min(s.settled_vt() for s in siblings.values()) * flow.weight - self.idle_credit
        if flow.usage - flow.inflight < floor:
            flow.usage = floor + flow.inflight

    def end_pass(self) -> None:
        self.offsets = {}
        self.exhausted = {}

    def offset(self, leaf: Flow, gpu_seconds: float) -> None:
        for flow in leaf.chain():
            self.offsets[id(flow)] = self.offsets.get(id(flow), 0.0) + gpu_seconds

    def offset_picked(self, leaf: Flow, gpu_seconds: float) -> None:
        self.offset(leaf, gpu_seconds)  # no heaps to re-key

    def pick(self) -> Flow | None:
        offsets, exhausted = self.offsets, self.exhausted
        flow = self.root
        while flow.active:
            best = None
            best_vt = 0.0
            for child in flow.active.values():
                if child in exhausted:
                    continue
                vt = (child.usage + offsets.get(id(child), 0.0)) / child.weight
                if best is None or vt < best_vt:
                    best, best_vt = child, vt
            if best is None:
                exhausted[flow] = None
                if flow.parent is None:
                    return None
                flow = self.root
                continue
            flow = best
        return flow if flow is not self.root else None


class NaiveNodeIndex(NodeIndex):
    def _single(self, k, model, ok) -> Placement | None:
        """The warm preference as a scan of the model's first warm nodes in warm order."""
        fit: Node | None = None
        for free in range(k, self.max_gpus + 1):
            for node_id in self.buckets.get(free, ()):
                if ok(self.nodes[node_id]):
                    fit = self.nodes[node_id]
                    break
            if fit is not None:
                break
        if fit is None:
            return None
        best: Node | None = None
        fit_part = self.bucket_of[fit.node_id] < fit.total
        for node_id in islice(self.warm_nodes.get(model, ()), placement.WARM_SCAN_LIMIT * 8):
            free = self.bucket_of.get(node_id, 0)
            node = self.nodes[node_id]
            if (
                free >= k
                and not (fit_part and free == node.total)
                and ok(node)
                and self._warm_free(node, model) > 0
                and (best is None or free < self.bucket_of[best.node_id])
            ):
                best = node
        if best is not None:
            return Placement((self._slice(best, k, model),), "bin-pack: warm model")
        free = self.bucket_of[fit.node_id]
        why = "bin-pack: whole node" if free == fit.total == k else "bin-pack: best fit"
        return Placement((self._slice(fit, k, model),), why)


class NaiveCell(Cell):
    def __init__(self, config: CellConfig | None = None, cell_id: str = "cell-0") -> None:
        super().__init__(naive_config(config or CellConfig()), cell_id)
        self.fair = NaiveFairTree(self.config.idle_credit_gpu_s)
        self.index = NaiveNodeIndex()

    def try_start(self, job, why, holder=False, claim_only=False, memo=None) -> bool:
        return super().try_start(job, why, holder, claim_only, None)

    def releases(self):
        return naive_releases(self)

    def releases_on(self, node_ids):  # a sticky reservation's: filtered from the full sort
        return [r for r in naive_releases(self) if r[1] in node_ids]

    def queue_depths(self):  # count every job and run, every publish
        return naive_queue_depths(self)

    def preempt_sensitive(self, job) -> bool:  # ask maybe_preempt about every candidate
        return True

    def apply_health(self, node, samples) -> None:  # classify every sample, every heartbeat
        self.health_seen.clear()
        super().apply_health(node, samples)

    def free_by_type(self):  # count every node's free GPUs
        free: Counter[str] = Counter()
        for node in self.index.nodes.values():
            if node.state == NodeState.UP:
                free[node.gpu_type] += node.free_count()
        return free

    def expire_gang_members(self) -> None:  # look at every gang on every Tick
        self.__dict__.pop("_gang_seen_floor", None)
        super().expire_gang_members()

    def walk_signature(self, full: bool):  # never skip a walk
        return None

    def nothing_fits(self, full: bool) -> bool:  # never stop a walk early
        return False

    def every_class_blocked(self, memo) -> bool:  # nor on the classes' proof
        return False

    def guarantees_allow(self, job, gpus: int) -> bool:
        unused = 0
        for tenant in self.config.tenants:
            if tenant.reserved_gpus and tenant.name != job.tenant:
                used = self.org_use.get(tenant.name)
                unused += max(0, tenant.reserved_gpus - (used.gpus if used else 0))
        for tier in self.config.tiers:
            if tier.reserved_gpus and tier.name != job.tier:
                unused += max(0, tier.reserved_gpus - self.tier_use.get(tier.name, 0))
        return self.index.free_total - unused >= gpus


def naive_queue_depths(cell: Cell) -> tuple[ev.QueueDepth, ...]:
    """Per (tier, tenant) of every live job or run, counted afresh."""
    depth: dict[tuple[str, str], list[int]] = {}
    for job in cell.jobs.values():
        row = depth.setdefault((job.tier, job.tenant), [0, 0, 0])
        if job.state == JobState.QUEUED:
            row[0] += 1
            row[1] += job.shape[0]
    for run in cell.runs.values():
        row = depth.setdefault((run.tier, run.tenant), [0, 0, 0])
        row[2] += sum(len(g) for g in run.held.values())
    return tuple(
        ev.QueueDepth(tier=tier, tenant=tenant, queued=q, queued_gpus=qg, running_gpus=rg)
        for (tier, tenant), (q, qg, rg) in sorted(depth.items())
    )


def naive_releases(cell: Cell) -> list[tuple[int, str, int, tuple[str, int]]]:
    """Every held slice's projected end, sorted afresh."""
    releases = []
    for run in cell.runs.values():
        end = run.projected_end_ms(cell.now_ms)
        for node_id, gpus in run.held.items():
            releases.append((end, node_id, len(gpus), run.key))
    releases.sort()
    return releases
