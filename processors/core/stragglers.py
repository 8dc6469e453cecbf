"""Stragglers: when a slow run is evidence against its node, and how a node
degraded on that evidence comes back.

A run's step rate depends on what its job asked for (resolution, duration,
the demo generator's ``seconds_per_step``): a tenant chooses it. So a slow
run says little about the node it ran on, and nothing one tenant submits may
be enough to take a node out of service.

Theory of operation
-------------------
1. Reference rates. Every ``straggler_interval_s`` the cell files, per model
   version, each tenant's median step rate over its running runs (at least 3)
   and the median of those tenant medians (at least 3 tenants: each tenant one
   vote, so no tenant's flood of fast or slow runs moves it). A run is judged
   against its own tenant's median where there is one, else against the
   tenants' median: another tenant's runs never make it look slow.
2. Sightings. A run slower than ``straggler_ratio`` x its reference for
   ``straggler_strikes`` reports in a row is a sighting against each node it
   runs on, filed per tenant (``Cell.node_slow``: node -> tenant -> when).
   The run is left where it is: one sighting is as likely the job as the node.
3. Degrading. A node with sightings from ``straggler_tenants`` distinct
   tenants within ``straggler_window_s`` is DEGRADED (no new work) and its
   straggling runs are checkpointed and moved. Set ``straggler_tenants`` to 1
   for a single-tenant cell.
4. Probation. A node degraded for stragglers goes back UP after
   ``straggler_probation_s`` of cell time (``Cell.straggler_degraded``), its
   sightings forgotten: new work is its probe. Degraded again within
   ``straggler_probation_max_s`` of its last degradation, it waits twice as
   long (at most ``straggler_probation_max_s``). Re-registering starts it
   afresh. A node a snapshot from before this rule left DEGRADED for
   stragglers is put on probation at the first Tick.

Every step is a function of the folded events (rates from heartbeats, time
from Ticks), iterated in insertion order: replay gives the same decisions.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, insort
from typing import TYPE_CHECKING

from framespool.schemas.causes import RunCause
from framespool.schemas.states import NodeState

from .health import is_straggler
from .model import Node, Run

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

MIN_RATES = 3  # runs (of a tenant) or tenants (of a model) a median needs


def knob(cell: Cell, name: str, default: float) -> float:
    """A straggler knob; a config pickled before it existed has the default."""
    return getattr(cell.config, name, default)


class Stragglers:
    # state added after snapshots existed: an older pickle has none of it
    def slow_sightings(self: Cell) -> dict[str, dict[str, int]]:
        """node id -> tenant -> when its last straggler there was sighted (ms)."""
        return self.__dict__.setdefault("node_slow", {})

    def straggler_degraded(self: Cell) -> dict[str, tuple[int, int, int]]:
        """node id -> (back UP at ms, degradations in a row, last degraded ms)."""
        return self.__dict__.setdefault("straggler_nodes", {})

    # -- 1. reference rates ------------------------------------------------------
    def refresh_medians(self: Cell) -> None:
        """File the reference rates (theory of operation, 1) from the rates kept
        sorted per model and tenant as runs report them (``rate_lists``): only
        the models whose rates changed since the last refresh are recomputed,
        each in O(tenants log tenants) (the median of each tenant's sorted list
        is O(1), the tenants' median a sort of their votes), where a rebuild
        from every run's rate was O(runs) per refresh: ~11 ms each, 12 % of the
        bench core backlog replay (``full_medians`` is that rebuild, kept as the
        tests' oracle and for a model that ever saw a NaN rate, whose median
        depends on the order the rates arrived in). The same values as the
        rebuild: ``statistics.median`` sorts too, and takes the middle or the
        mean of the middle two exactly as ``_median_sorted`` does."""
        lists = self.rate_lists()
        dirty: dict[str, None] = self.__dict__.setdefault("_rates_dirty", {})
        if "_median_keys" not in self.__dict__:  # medians filed by a full rebuild
            self.model_median.clear()
            dirty.update(dict.fromkeys(lists))
        filed: dict[str, list] = self.__dict__.setdefault("_median_keys", {})
        medians = self.model_median
        for model in dirty:
            for key in filed.pop(model, ()):
                del medians[key]
            by_tenant = lists.get(model)
            if model in self.__dict__.get("_rates_nan", ()):
                found_medians = self._model_medians_scan(model)
            elif not by_tenant:
                lists.pop(model, None)
                continue
            else:
                found_medians = {}
                votes = []
                for tenant, found in by_tenant.items():
                    median = _median_sorted(found)
                    if len(found) >= MIN_RATES:
                        found_medians[(model, tenant)] = median
                    votes.append(median)
                if len(votes) >= MIN_RATES:
                    found_medians[model] = statistics.median(votes)
            medians.update(found_medians)
            filed[model] = list(found_medians)
        dirty.clear()

    def full_medians(self: Cell) -> dict:
        """The reference rates rebuilt from every run's rate: O(runs)."""
        medians: dict = {}
        for model in self.model_rates:
            medians.update(self._model_medians_scan(model))
        return medians

    def _model_medians_scan(self: Cell, model: str) -> dict:
        medians: dict = {}
        by_tenant: dict[str, list[float]] = {}
        for key, rate in self.model_rates.get(model, {}).items():
            run = self.runs.get(key)
            if run is not None:
                by_tenant.setdefault(run.tenant, []).append(rate)
        votes = []
        for tenant, found in by_tenant.items():
            if len(found) >= MIN_RATES:
                medians[(model, tenant)] = statistics.median(found)
            votes.append(statistics.median(found))
        if len(votes) >= MIN_RATES:
            medians[model] = statistics.median(votes)
        return medians

    def rate_lists(self: Cell) -> dict[str, dict[str, list[float]]]:
        """model version -> tenant -> its running runs' last step rates, sorted;
        kept by ``note_rate`` and ``forget_rate``. Built from ``model_rates`` on
        first use (a new cell, or one restored from a snapshot taken before
        the lists were kept), every model then due for a refresh."""
        lists: dict[str, dict[str, list[float]]] | None = self.__dict__.get("_rate_lists")
        if lists is None:
            lists = {}
            self._rate_lists = lists
            dirty = self.__dict__.setdefault("_rates_dirty", {})
            for model, rates in self.model_rates.items():
                dirty[model] = None
                for key, rate in rates.items():
                    run = self.runs.get(key)
                    if run is not None:
                        self._file_rate(lists, model, run.tenant, None, rate)
        return lists

    def note_rate(self: Cell, run: Run, rate: float) -> None:
        """``run`` reports ``rate``: O(log runs of its tenant and model) plus the
        sorted list's memmove."""
        rates = self.model_rates.setdefault(run.model_version, {})
        lists = self.rate_lists()
        self._file_rate(lists, run.model_version, run.tenant, rates.get(run.key), rate)
        rates[run.key] = rate
        self.__dict__.setdefault("_rates_dirty", {})[run.model_version] = None

    def forget_rate(self: Cell, run: Run) -> None:
        """``run`` is over: its rate no longer counts. Same cost as ``note_rate``."""
        rates = self.model_rates.get(run.model_version)
        if not rates or run.key not in rates:
            return
        lists = self.rate_lists()
        self._file_rate(lists, run.model_version, run.tenant, rates.pop(run.key), None)
        self.__dict__.setdefault("_rates_dirty", {})[run.model_version] = None

    def _file_rate(
        self: Cell,
        lists: dict[str, dict[str, list[float]]],
        model: str,
        tenant: str,
        old: float | None,
        new: float | None,
    ) -> None:
        by_tenant = lists.setdefault(model, {})
        found = by_tenant.setdefault(tenant, [])
        if old is not None:
            if old != old:  # NaN: not in the sorted list (it sorts nowhere)
                pass
            else:
                del found[bisect_left(found, old)]
        if new is not None:
            if new != new:
                self.__dict__.setdefault("_rates_nan", {})[model] = None
            else:
                insort(found, new)
        if not found:
            del by_tenant[tenant]

    def reference_rate(self: Cell, run: Run) -> float:
        """What ``run``'s step rate is judged against (theory of operation, 1); 0: none."""
        medians = self.model_median
        return medians.get((run.model_version, run.tenant)) or medians.get(run.model_version, 0.0)

    # -- 2 and 3. sightings, degrading --------------------------------------------
    def note_step_rate(self: Cell, node: Node, run: Run, rate: float) -> None:
        """O(1) (O(tenants sighted on the node) at a sighting). A run that reports
        the rate it reported last, not a straggler then or now, changes nothing."""
        reference = self.reference_rate(run)
        straggling = is_straggler(rate, reference, self.config)
        if rate == run.step_rate and not straggling and not run.slow_strikes:
            return
        run.step_rate = rate
        self.note_rate(run, rate)
        if not straggling:
            run.slow_strikes = 0
            return
        run.slow_strikes += 1
        if run.slow_strikes < self.config.straggler_strikes:
            return
        if run.slow_strikes == self.config.straggler_strikes:
            self._count("straggler_sightings")
        sighted = self.slow_sightings().setdefault(node.node_id, {})
        sighted.pop(run.tenant, None)
        sighted[run.tenant] = self.now_ms  # latest last: pruning stops at the first fresh one
        window_start = self.now_ms - int(knob(self, "straggler_window_s", 1800.0) * 1000)
        for tenant in [t for t, ms in sighted.items() if ms <= window_start]:
            del sighted[tenant]
        needed = int(knob(self, "straggler_tenants", 2))
        if len(sighted) < needed or node.state != NodeState.UP:
            return
        self.degrade_for_stragglers(node, run, rate, reference, len(sighted))

    def degrade_for_stragglers(
        self: Cell, node: Node, run: Run, rate: float, reference: float, tenants: int
    ) -> None:
        degraded = self.straggler_degraded()
        _, in_a_row, last_ms = degraded.get(node.node_id, (0, 0, -1))
        ceiling_s = knob(self, "straggler_probation_max_s", 7200.0)
        if last_ms < 0 or self.now_ms - last_ms > ceiling_s * 1000:
            in_a_row = 0
        in_a_row += 1
        probation_s = min(
            ceiling_s, knob(self, "straggler_probation_s", 600.0) * 2 ** (in_a_row - 1)
        )
        degraded[node.node_id] = (self.now_ms + int(probation_s * 1000), in_a_row, self.now_ms)
        self._count("straggler_degraded")
        # no job ids: this reason is on the cluster view every tenant reads
        self.set_node_state(
            node,
            NodeState.DEGRADED,
            f"straggler: runs of {tenants} tenants below "
            f"{self.config.straggler_ratio:g}x their model's median step rate within "
            f"{knob(self, 'straggler_window_s', 1800.0):.0f}s (latest {rate:.2f} vs "
            f"{reference:.2f} steps/s); probation {probation_s:.0f}s",
        )
        for other in self.runs_on(node):
            if other.slow_strikes >= self.config.straggler_strikes:
                self.move_run(
                    other, f"checkpoint-and-move: straggler on {node.node_id}", RunCause.STRAGGLER
                )

    # -- 4. probation ---------------------------------------------------------------
    def end_straggler_probations(self: Cell) -> None:
        """On Tick: O(nodes degraded for stragglers)."""
        degraded = self.__dict__.get("straggler_nodes")
        if degraded is None:  # a snapshot from before probation: adopt its degraded nodes
            degraded = self.straggler_degraded()
            until = self.now_ms + int(knob(self, "straggler_probation_s", 600.0) * 1000)
            for held in self.index.nodes.values():
                if held.state == NodeState.DEGRADED and held.state_reason.startswith("straggler"):
                    degraded[held.node_id] = (until, 1, self.now_ms)
        if not degraded:
            return
        for node_id, (until_ms, in_a_row, last_ms) in list(degraded.items()):
            node = self.index.nodes.get(node_id)
            if node is None or node.state != NodeState.DEGRADED:
                # DOWN, DRAINING or re-registered meanwhile: nothing of ours to undo,
                # but the backoff stays until it ages out
                if self.now_ms - last_ms > knob(self, "straggler_probation_max_s", 7200.0) * 1000:
                    del degraded[node_id]
                continue
            if until_ms > self.now_ms:
                continue
            degraded[node_id] = (until_ms, in_a_row, last_ms)
            self.slow_sightings().pop(node_id, None)
            self.set_node_state(
                node,
                NodeState.UP,
                f"probation: back in service after {(self.now_ms - last_ms) / 1000:.0f}s "
                "degraded for stragglers; its next runs are the probe",
            )

    def forget_stragglers(self: Cell, node_id: str) -> None:
        """A node registered again (new incarnation): no old evidence against it."""
        self.__dict__.get("node_slow", {}).pop(node_id, None)
        self.__dict__.get("straggler_nodes", {}).pop(node_id, None)


def _median_sorted(values: list[float]) -> float:
    """``statistics.median`` of an already sorted, non-empty list."""
    n = len(values)
    i = n // 2
    if n % 2:
        return values[i]
    return (values[i - 1] + values[i]) / 2
