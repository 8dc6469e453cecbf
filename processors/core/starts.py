"""Placing one job: the shape that finishes earliest, on nodes it may use.

Theory of operation
-------------------
``try_start`` tries the job's shapes (``shapes_of``: the spec's own and its
elastic ones, each with its estimated run time) and places it, through
``commit`` (``allocations.py``), in the one with the shortest estimate that
finds nodes; a shape no shorter than the best found is not searched. A
non-preemptible job may not borrow other entities' idle guarantees: it could
never be reclaimed (``guarantees_allow``). The search is ``NodeIndex.find`` (``placement.py``:
best fit, warm nodes for the model first, a gang inside one rail group
when one fits it), over
the nodes ``node_filter`` lets the job use:

- a claimant (``claim_only``) only its own claim's nodes; nobody else's claim;
- no node of a reservation whose shadow time the job would run past, unless
  the job outranks its holder (``reserved_for_others``); the first
  reservation's holder is bound by none;
- the GPU type it asks for, CPU and memory left per node, and no node where
  a breaker bars its model version (``breakers.py``).

With ``pack_by_end_s`` set, a single-node job goes to the partly used node
whose drain it extends least (``by_end`` gives the search its expected end,
``drain_ms`` each node's).

In a walk (``memo``) every search is keyed by ``fit_key``: everything the
search and the filter decide by, so equal keys give equal answers within a
pass and one that found no nodes is not made again (``PassMemo``,
``walkproofs.py``). The part of a key the spec fixes is built once per job
and kept on it (``fit_shapes``); outside a walk nothing is cached on the job,
so a refused start leaves the cell as it was.

Cost model
----------
Per shape tried: O(1) for its key (the spec part cached on the job) and the
memo lookups, plus, when the search is new, ``NodeIndex.find``: O(F) calls of
the filter for F nodes with free GPUs, each O(1) dict reads (a breaker's,
``breaker_bars``, too). Building a filter costs O(claimed nodes) for the
claims and O(reservations + reserved nodes) for the nodes reserved for others
(a walk reads the latter from its memo). ``by_end`` is O(1); the search asks
``drain_ms``, O(GPUs per node), per partly used node that fits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.states import RunPhase

from .model import Job, Node
from .placement import EndPacking, Placement
from .walkproofs import PassMemo

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell


class Starts:
    # -- placing one job --------------------------------------------------------
    def try_start(
        self: Cell,
        job: Job,
        why: str,
        holder: bool = False,
        claim_only: bool = False,
        memo: PassMemo | None = None,
    ) -> bool:
        """Place ``job`` in the shape that finishes earliest, if any fits.
        ``memo``: the pass's memo of searches that found no nodes (and of the
        nodes reserved for others, ``PassMemo``), for a job that holds no claim
        and no reservation: a search whose ``fit_key`` found no nodes earlier in
        the pass is not made again. Per shape: O(1) for the key (its spec part
        cached on the job, ``fit_shapes``) and the memo lookups, plus the search
        when new."""
        if holder or claim_only:
            memo = None
        best: tuple[Placement, tuple[int, int, float]] | None = None
        spec = job.spec
        # outside a walk nothing is cached on the job (a refused start leaves the
        # state as it was)
        shapes = (
            self.fit_shapes(job)
            if memo is not None
            else tuple((g, p, e, ()) for g, p, e in self.shapes_of(job))
        )
        for gpus, per_node, estimate, fixed in shapes:
            if best is not None and estimate >= best[1][2]:
                continue
            if not spec.preemptible and not self.guarantees_allow(job, gpus):
                continue
            if memo is not None:
                placement = self.memo_search(job, gpus, per_node, estimate, fixed, memo)
            else:
                ok = self.node_filter(job, estimate, holder, claim_only)
                placement = self.index.find(gpus, per_node, spec.model, ok, self.by_end(estimate))
            if placement is not None:
                best = (placement, (gpus, per_node, estimate))
        if best is None:
            return False
        return self.commit(job, best[0], best[1], why)

    def by_end(self: Cell, estimate_s: float) -> EndPacking | None:
        """What ``index.find`` needs to place a job of ``estimate_s`` by its
        expected end (``CellConfig.pack_by_end_s``), or None when that is off.
        O(1); the search asks ``drain_ms`` per partly used node that fits."""
        grain_s = getattr(self.config, "pack_by_end_s", 0.0)
        if not grain_s:
            return None
        return (self.now_ms + int(estimate_s * 1000), max(1, int(grain_s * 1000)), self.drain_ms)

    def drain_ms(self: Cell, node: Node) -> int:
        """When the runs holding GPUs of ``node`` are expected to have left it:
        the latest of their projected ends (``Run.projected_end_ms``; a run
        already stopping, or none, counts as now). O(GPUs per node)."""
        now = self.now_ms
        latest = now
        runs = self.runs
        seen = None
        for key in node.owner:
            if key is None or key == seen:
                continue
            seen = key
            run = runs.get(key)
            if run is None or run.phase == RunPhase.STOPPING:
                continue
            end = run.projected_end_ms(now)
            if end > latest:
                latest = end
        return latest

    def fit_shapes(self: Cell, job: Job) -> tuple[tuple[int, int, float, tuple], ...]:
        """``shapes_of(job)``, each shape with the part of its ``fit_key`` the
        spec fixes: built once per job (its spec never changes), not per test."""
        try:
            fit = job.fit
        except AttributeError:  # a job from a snapshot taken before the cache
            fit = None
        if fit is None:
            spec = job.spec
            fixed = (spec.gpus, spec.gpus_per_node, spec.cpus, spec.mem_gb, spec.gpu_type)
            fit = job.fit = tuple((g, p, e, (g, p, *fixed)) for g, p, e in self.shapes_of(job))
        return fit

    def fit_key(
        self: Cell, fixed: tuple, spec: ev.JobSpec, reserved: tuple, estimate: float = 0.0
    ) -> tuple:
        """Everything ``index.find`` and ``node_filter`` decide by, for a job that
        holds no claim and no reservation: its shape and the spec's demands
        (``fixed``, from ``fit_shapes``), the model when a breaker may bar nodes,
        the nodes reserved for others (``reserved_for_others``), the claims and
        ``index.freed``: equal keys, equal answers (within a pass, where claims
        and the reservation only ever exclude more nodes)."""
        return (
            fixed,
            # a half-open breaker admits probes by tenant and estimate (breakers.py)
            (
                (f"{spec.model}@{spec.model_version}", spec.tenant, estimate <= self._probe_max_s())
                if self.breakers
                else ""
            ),
            reserved,
            len(self.claims),
            self.index.freed,
        )

    def node_filter(
        self: Cell,
        job: Job,
        estimate_s: float,
        holder: bool,
        claim_only: bool,
        reserved: tuple[str, ...] | None = None,
    ) -> Callable[[Node], bool]:
        """``reserved``: ``reserved_for_others`` for the job, when known."""
        spec = job.spec
        model_version = f"{spec.model}@{spec.model_version}"
        breakers = self.breakers
        claimed = self.claimed_nodes(job.job_id)
        own_claim = self.claims.get(job.job_id, ((), 0))[0]
        if reserved is None:
            reserved = self.reserved_for_others(job.job_id, estimate_s, holder)
        per_node_cpu = spec.cpus / max(1, -(-spec.gpus // spec.gpus_per_node))
        per_node_mem = spec.mem_gb / max(1, -(-spec.gpus // spec.gpus_per_node))

        def ok(node: Node) -> bool:
            node_id = node.node_id
            if claim_only and node_id not in own_claim:
                return False
            if node_id in claimed or node_id in reserved:
                return False
            if spec.gpu_type and node.gpu_type != spec.gpu_type:
                return False
            if breakers and self.breaker_bars(job, estimate_s, model_version, node):
                return False
            if node.cpus and node.cpus - node.cpus_used < per_node_cpu:
                return False
            if node.mem_gb and node.mem_gb - node.mem_used < per_node_mem:
                return False
            return True

        return ok
