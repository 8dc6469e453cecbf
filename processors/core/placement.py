"""Where a gang goes: bin-packing single-node jobs, rail-local multi-node gangs.

Theory of operation
-------------------
Schedulable nodes sit in buckets by their count of free healthy GPUs. A job
that fits on one node takes the fullest node that still fits it (best fit), so
whole nodes stay free for 8-GPU and multi-node gangs; among equally good
candidates a node whose GPUs already hold the job's model weights wins (no
multi-gigabyte load), but a whole free node is not broken for warmth while a
partly used node fits (on the genai workload whole-node jobs queued behind
small runs spread one per node: paid light-job p90 wait 70.4 -> 56.3 s,
utilization under backlog 0.959 -> 0.961). With ``CellConfig.pack_by_end_s``
(off by default) a single-node job goes by its expected end first
(``_single_by_end``): of the partly used nodes that fit, the one whose drain
it extends least, then the best fit, so long small runs gather on the nodes
that already run long and a node whose runs end soon drains for whole-node
work (genai: idle GPU-time under backlog 650 k -> 464 k GPU-s, most of it in
the hour after arrivals stop, when only whole-node jobs queue). A multi-node gang of ``n`` nodes x ``g`` GPUs is placed
inside one rail group (InfiniBand leaf) when any rail has ``n`` fitting nodes,
preferring the rail that fits tightest; otherwise it spans rails and says so.

A placement is all-or-nothing: ``find`` only reads; the caller commits the
whole placement in one step. Every scan is in a deterministic order (bucket,
then insertion order of nodes).

The warm preference looks at a model's first ``WARM_SCAN_LIMIT * 8`` warm
nodes (in the order they became warm) and takes the fullest that fits. It
was a scan of those nodes' buckets, ~470 lookups (37 us) per placement on a
2,000-node cell with eight models: a fifth of the light bench. The index now
keeps, per model and free count, the warm nodes' stamps (a counter taken when
a node joins the model's warm set, so stamp order is warm order) in sorted
lists, maintained where a node's bucket or warm set changes (``refresh``,
``mark_warm``, ``forget_bucket``: O(models warm on the node * (log n + the
list's memmove))). A search reads the buckets from ``k`` up and stops at the
first stamp past the window's last (``_warm_cut``, cached until the model's
warm set loses a node), so it decides exactly as the scan did
(``tests/support/core_oracle.py`` keeps the scan).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from itertools import islice

from framespool.schemas.events import NodeSlice

from .model import _GPU_OK, Node

NodeFilter = Callable[[Node], bool]
# ``(the job's expected end ms, the grain in ms, node -> when its runs are
# expected to have left it)``: placement by expected end (``NodeIndex.find``)
EndPacking = tuple[int, int, Callable[[Node], int]]

WARM_SCAN_LIMIT = 64


@dataclass(frozen=True, slots=True)
class Placement:
    slices: tuple[NodeSlice, ...]
    reason: str


class NodeIndex:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.buckets: dict[int, dict[str, None]] = {}  # free count -> nodes
        self.bucket_of: dict[str, int] = {}
        # model -> node -> stamp, in the order nodes became warm (stamps increase)
        self.warm_nodes: dict[str, dict[str, int]] = {}
        self.free_total = 0
        self.max_gpus = 0
        self.freed = 0  # bumped whenever a node gains free GPUs: memos of "no fit" expire
        self._init_warm_buckets()

    def _init_warm_buckets(self) -> None:
        """The warm index (module doc): derived from ``warm_nodes`` and ``bucket_of``."""
        self.warm_stamp = 0  # the next stamp
        self.stamp_node: dict[int, str] = {}
        self.warm_of: dict[str, dict[str, int]] = {}  # node -> model -> stamp
        # model -> free count -> sorted stamps of the model's warm nodes in that bucket
        self.warm_buckets: dict[str, dict[int, list[int]]] = {}
        self.warm_cuts: dict[str, int] = {}  # model -> stamp of its window's last node
        for model, warm in self.warm_nodes.items():
            for node_id in list(warm):
                del warm[node_id]
                self._join_warm(model, node_id)

    def __setstate__(self, state: dict) -> None:
        """A snapshot from before the warm index (``warm_nodes`` of None values)
        gets it rebuilt, in the same warm order."""
        self.__dict__.update(state)
        if "warm_buckets" not in state:
            self._init_warm_buckets()

    def _join_warm(self, model: str, node_id: str) -> None:
        stamp = self.warm_stamp
        self.warm_stamp += 1
        self.warm_nodes.setdefault(model, {})[node_id] = stamp
        self.stamp_node[stamp] = node_id
        self.warm_of.setdefault(node_id, {})[model] = stamp
        free = self.bucket_of.get(node_id)
        if free is not None:
            insort(self.warm_buckets.setdefault(model, {}).setdefault(free, []), stamp)

    def _leave_warm(self, model: str, node_id: str) -> None:
        stamp = self.warm_nodes[model].pop(node_id)
        del self.stamp_node[stamp]
        del self.warm_of[node_id][model]
        self.warm_cuts.pop(model, None)
        free = self.bucket_of.get(node_id)
        if free is not None:
            stamps = self.warm_buckets[model][free]
            del stamps[bisect_left(stamps, stamp)]

    def _move_warm(self, node_id: str, old: int | None, new: int | None) -> None:
        """Re-file a node's warm stamps from bucket ``old`` to ``new`` (None: none)."""
        for model, stamp in self.warm_of.get(node_id, {}).items():
            by_free = self.warm_buckets.setdefault(model, {})
            if old is not None:
                stamps = by_free[old]
                del stamps[bisect_left(stamps, stamp)]
            if new is not None:
                insort(by_free.setdefault(new, []), stamp)

    def _warm_cut(self, model: str, warm: dict[str, int]) -> int:
        """The stamp of the last node inside the model's warm window (its first
        ``WARM_SCAN_LIMIT * 8`` warm nodes). O(1) while cached; else O(window),
        in C, once per change of the window (a node leaving the warm set)."""
        scan = WARM_SCAN_LIMIT * 8
        if len(warm) <= scan:
            return self.warm_stamp
        cut = self.warm_cuts.get(model)
        if cut is None:
            cut = self.warm_cuts[model] = next(islice(warm.values(), scan - 1, None))
        return cut

    # -- bookkeeping ---------------------------------------------------------
    def add(self, node: Node) -> None:
        self.nodes[node.node_id] = node
        self.max_gpus = max(self.max_gpus, node.total)
        self.refresh(node)

    def refresh(self, node: Node) -> None:
        """Re-file a node after its GPUs, health or state changed."""
        old = self.bucket_of.pop(node.node_id, None)
        if old is not None:
            del self.buckets[old][node.node_id]
            self.free_total -= old
        new = None
        if node.schedulable:
            free = node.free_count()
            if old is None or free > old:
                # more free GPUs, or a node that held none in a bucket may be
                # back in service (its releases count for reservations again)
                self.freed += 1
            if free > 0:
                self.buckets.setdefault(free, {})[node.node_id] = None
                self.bucket_of[node.node_id] = free
                self.free_total += free
                new = free
        if old != new and node.node_id in self.warm_of:
            self._move_warm(node.node_id, old, new)

    def forget_bucket(self, node_id: str) -> None:
        """Take a node out of the buckets (it is being replaced)."""
        old = self.bucket_of.pop(node_id, None)
        if old is not None:
            del self.buckets[old][node_id]
            self.free_total -= old
            if node_id in self.warm_of:
                self._move_warm(node_id, old, None)

    def mark_warm(self, node: Node, gpus: tuple[int, ...], model: str) -> None:
        """These GPUs now hold ``model``'s weights (one model per GPU): the node
        joins that model's warm set and leaves the sets of models it no longer holds."""
        evicted = {node.warm[i] for i in gpus if node.warm[i] and node.warm[i] != model}
        for i in gpus:
            node.warm[i] = model
        node_id = node.node_id
        for old in sorted(evicted):
            if old not in node.warm and node_id in self.warm_nodes.get(old, ()):
                self._leave_warm(old, node_id)
        if node_id not in self.warm_nodes.get(model, ()):
            self._join_warm(model, node_id)

    def largest_free(self, barred: Collection[str] = ()) -> int:
        """The most free healthy GPUs on any one schedulable node not in ``barred``.
        Cost: O(max GPUs per node + len(barred))."""
        for free in range(self.max_gpus, 0, -1):
            bucket = self.buckets.get(free)
            if bucket and (not barred or any(n not in barred for n in bucket)):
                return free
        return 0

    def count_free(self, need: int, enough: int, barred: Collection[str] = ()) -> int:
        """Schedulable nodes not in ``barred`` with at least ``need`` free GPUs,
        counted up to ``enough``. Cost: O(max GPUs per node + enough + len(barred))."""
        count = 0
        for free in range(self.max_gpus, need - 1, -1):
            for node_id in self.buckets.get(free, ()):
                if node_id not in barred:
                    count += 1
                    if count >= enough:
                        return count
        return count

    # -- search --------------------------------------------------------------
    def find(
        self,
        gpus: int,
        per_node: int,
        model: str,
        ok: NodeFilter,
        by_end: EndPacking | None = None,
    ) -> Placement | None:
        """Nodes for a job of ``gpus`` GPUs, at most ``per_node`` a node.
        ``by_end``: a single-node job goes by its expected end
        (``_single_by_end``) instead of best fit alone."""
        if gpus > self.free_total:
            return None
        if gpus <= per_node:
            if by_end is not None:
                return self._single_by_end(gpus, model, ok, by_end)
            return self._single(gpus, model, ok)
        return self._gang(-(-gpus // per_node), per_node, gpus, model, ok)

    def _single(self, k: int, model: str, ok: NodeFilter) -> Placement | None:
        """The fullest node with ``k`` free GPUs that ``ok`` accepts, a node warm
        with ``model`` first (among its first ``WARM_SCAN_LIMIT * 8`` warm
        nodes: the fullest that fits, the earliest warm among equals).

        Cost: O(F) ``ok`` calls up to the first best-fit node; only when one
        exists, the warm search (a warm node is one of those fitting nodes, so
        with none there is no warm one either: a search that finds nothing,
        most of them in a backlog, skips it): O(max GPUs per node) buckets and
        one ``ok`` per warm node of a bucket passed over (module doc)."""
        fit: Node | None = None
        nodes = self.nodes
        for free in range(k, self.max_gpus + 1):
            bucket = self.buckets.get(free)
            if not bucket:
                continue
            for node_id in bucket:
                node = nodes[node_id]
                if ok(node):
                    fit = node
                    break
            if fit is not None:
                break
        if fit is None:
            return None
        # a whole free node is kept whole for a model's warmth only where the
        # best fit is a whole node too (whole nodes stay free for 8-GPU jobs)
        fit_part = self.bucket_of[fit.node_id] < fit.total
        warm = self.warm_nodes.get(model)
        if warm:
            by_free = self.warm_buckets.get(model, {})
            cut = self._warm_cut(model, warm)
            stamp_node = self.stamp_node
            for free in range(k, self.max_gpus + 1):
                for stamp in by_free.get(free, ()):
                    if stamp > cut:
                        break  # past the window: so are the rest of this bucket
                    node = nodes[stamp_node[stamp]]
                    if fit_part and free == node.total:
                        continue
                    if ok(node) and self._warm_free(node, model) > 0:
                        return Placement((self._slice(node, k, model),), "bin-pack: warm model")
        free = self.bucket_of[fit.node_id]
        why = "bin-pack: whole node" if free == fit.total == k else "bin-pack: best fit"
        return Placement((self._slice(fit, k, model),), why)

    def _single_by_end(
        self, k: int, model: str, ok: NodeFilter, by_end: EndPacking
    ) -> Placement | None:
        """The partly used node with ``k`` free GPUs that ``ok`` accepts whose
        drain the job extends least (``CellConfig.pack_by_end_s``): a long
        run joins runs that end late, and a node whose runs end soon stays
        drainable for whole-node work. Ranked by the extension ``max(0, end
        - drain)`` in whole grains (rounded down), then a warm GPU of
        ``model`` (as ``_single`` prefers one), then free GPUs (best fit),
        then bucket order; a whole free node (its drain is
        now: the largest extension) only when no partly used node fits, the
        first in bucket order, as ``_single`` takes it.

        Cost: O(F) ``ok`` and ``drain`` calls for the F partly used nodes
        with ``k`` or more free GPUs (``drain`` reads a node's runs: O(GPUs
        per node)), where ``_single`` stops at its first fit; only a search
        that finds a node pays it, one per placement."""
        end_ms, grain_ms, drain = by_end
        nodes = self.nodes
        best: tuple[int, int, int] | None = None
        chosen: Node | None = None
        for free in range(k, self.max_gpus + 1):
            bucket = self.buckets.get(free)
            if not bucket:
                continue
            for node_id in bucket:
                node = nodes[node_id]
                if free == node.total:
                    continue  # whole free nodes last (below)
                if not ok(node):
                    continue
                late = max(0, end_ms - drain(node)) // grain_ms
                rank = (late, 0 if self._warm_free(node, model) else 1, free)
                if best is None or rank < best:
                    best, chosen = rank, node
        if chosen is not None:
            why = "bin-pack: by expected end" + ("; warm model" if best and not best[1] else "")
            return Placement((self._slice(chosen, k, model),), why)
        return self._single(k, model, ok)

    def _gang(self, n: int, g: int, total: int, model: str, ok: NodeFilter) -> Placement | None:
        by_rail: dict[str, list[Node]] = {}
        fitting: list[Node] = []
        for free in range(g, self.max_gpus + 1):
            for node_id in self.buckets.get(free, ()):
                node = self.nodes[node_id]
                if not ok(node):
                    continue
                fitting.append(node)
                members = by_rail.setdefault(node.rail, [])
                members.append(node)
                if len(members) == n:
                    return Placement(
                        self._gang_slices(members, g, total, model),
                        f"gang: {n} nodes in rail {node.rail}",
                    )
        if len(fitting) >= n:
            return Placement(
                self._gang_slices(fitting[:n], g, total, model),
                f"gang: {n} nodes spanning rails (no rail had {n} fitting nodes)",
            )
        return None

    def _gang_slices(
        self, nodes: list[Node], g: int, total: int, model: str
    ) -> tuple[NodeSlice, ...]:
        slices = []
        left = total
        for node in nodes:
            take = min(g, left)
            slices.append(self._slice(node, take, model))
            left -= take
        return tuple(slices)

    @staticmethod
    def _warm_free(node: Node, model: str) -> int:
        """1 if a free healthy GPU of ``node`` holds ``model``'s weights, else 0.
        O(GPUs warm with the model): the C-level ``index`` finds them."""
        warm = node.warm
        i = -1
        try:
            while True:
                i = warm.index(model, i + 1)
                if node.owner[i] is None and node.gpu_state[i] == _GPU_OK:
                    return 1
        except ValueError:
            return 0

    @staticmethod
    def _slice(node: Node, k: int, model: str) -> NodeSlice:
        free = node.free_gpus()
        free.sort(key=lambda i: (node.warm[i] != model, i))
        return NodeSlice(node_id=node.node_id, gpus=tuple(sorted(free[:k])))

    # -- what-if: when would a shape fit? -------------------------------------
    def earliest_fit(
        self,
        per_node: int,
        nodes_needed: int,
        releases: Iterable[tuple[int, str, int, object]],
        ok: NodeFilter,
    ) -> tuple[int, tuple[str, ...]] | None:
        """Walk future releases ``(time_ms, node_id, gpus, run)`` in time order and
        return when ``nodes_needed`` nodes will each have ``per_node`` free GPUs,
        with those nodes. None if never (e.g. not enough healthy nodes).

        Cost: O(F + K) for F nodes with free GPUs and the K releases read, with
        ``ok`` asked at most once per node (nothing it reads changes during the
        walk), not once per release (a node holding several runs recurs in the
        list), and only of a node that could count: one that fits now, or one
        a release reaches (a node with too few free GPUs that no release read
        reaches cannot be among the answer's, so it is never asked about: most
        of a fragmented cell's for a whole-node gang)."""
        free = dict(self.bucket_of)  # a node's free GPUs, counted once asked about
        ready: dict[str, None] = {}
        nodes = self.nodes
        usable: dict[str, bool] = {}  # node -> ok: nothing ``ok`` reads changes meanwhile
        for node_id, count in free.items():
            if count >= per_node:
                fits = usable[node_id] = ok(nodes[node_id])
                if fits:
                    ready[node_id] = None
        if len(ready) >= nodes_needed:
            return 0, tuple(list(ready)[:nodes_needed])
        for time_ms, node_id, gpus, _ in releases:
            good = usable.get(node_id)
            if good is None:  # not asked yet (too few free GPUs, or none)
                released = nodes.get(node_id)
                good = usable[node_id] = (
                    released is not None and released.schedulable and ok(released)
                )
            if not good:
                continue
            free[node_id] = free.get(node_id, 0) + gpus
            if free[node_id] >= per_node and node_id not in ready:
                ready[node_id] = None
                if len(ready) >= nodes_needed:
                    return time_ms, tuple(list(ready)[:nodes_needed])
        return None
