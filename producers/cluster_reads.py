"""``GET /v1/cluster`` at fleet scale, without one tenant's polling stalling the API.

Theory of operation
-------------------
The cluster document names every GPU of every cell (10,000 at the mission's
scale, about 850 kB with ``detail``), and a tenant sees only its own jobs on
it. Built naively per request, one call cost ~300 ms of the API's event loop
at 10 cells x 125 nodes x 8 GPUs (decoding the stored cell documents, then a
store read per GPU's job to ask whose it is), so one tenant calling it in a
loop, within its rate limit, would stall every tenant's status, submits and
progress streams. Four things make it cheap:

1. **The view comes from memory.** The projection consumer that runs with the
   app keeps the cluster view it committed last (``ProjectionConsumer.cluster``;
   a fold replaces it, never changes it in place); only without one (tests)
   is the store read.
2. **Whose a job is, is remembered.** A job's tenant never changes, so
   ``tenant_of`` keeps job id -> tenant for the jobs on the map, read from the
   store once per job (misses are not kept: a view may appear later); it is
   pruned to the jobs on the current map when it outgrows them.
3. **Documents are kept per generation.** The body sent to (tenant, detail,
   which breakers are active now) is kept until the cells or breakers of the
   view change (a new generation: every cell status, a few a second at fleet
   scale); a repeat within a generation is a dict read.
4. **Unchanged documents are not sent again.** Each body has an entity tag (a
   digest of its bytes, made once per render); a poll that sends it back in
   ``If-None-Match`` gets 304 and no body, so a dashboard polling the map of
   a quiet fleet (``Cache-Control: no-cache``: browsers revalidate) moves a
   few hundred bytes, not the whole map.

Cost: per request O(1) for a repeat within a generation; otherwise O(GPUs on
the map) dict work and one JSON encoding, plus a store read per job not seen
before. Memory: one generation's bodies (at most ``max_bodies``, oldest
dropped) and one tenant per job on the map.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable

from framespool.projections import cluster as cluster_view
from framespool.projections.cluster import ClusterView

MAX_BODIES = 512  # documents kept for one generation of the view
PRUNE_SLACK = 1024  # owners kept beyond twice the jobs on the map before a prune


class ClusterReads:
    """The rendered cluster documents of the current generation, and job owners."""

    def __init__(self, max_bodies: int = MAX_BODIES) -> None:
        self.max_bodies = max_bodies
        self._cells: object = None  # the generation: the view's cells and breakers dicts
        self._breakers: object = None
        self._bodies: OrderedDict[tuple, tuple[bytes, str]] = OrderedDict()
        self._tenant_of: dict[str, str] = {}
        self._prune_at = PRUNE_SLACK  # owners kept before the next prune
        self.rendered = 0  # documents built (not served from the generation's cache)

    def body(
        self,
        view: ClusterView,
        now_ms: int,
        tenant: str,
        detail: bool,
        lookup: Callable[[str], str | None],
    ) -> tuple[bytes, str]:
        """The JSON document for ``tenant`` and its entity tag; ``lookup(job_id)``
        is a job's tenant from the store (None: unknown)."""
        if view.cells is not self._cells or view.breakers is not self._breakers:
            self._cells, self._breakers = view.cells, view.breakers
            self._bodies.clear()
            self._prune(view)
        active = tuple(b.until_ms > now_ms for _, b in sorted(view.breakers.items()))
        key = (tenant, detail, active)
        cached = self._bodies.get(key)
        if cached is not None:
            return cached
        owners = self._tenant_of

        def owns_job(job_id: str) -> bool:
            owner = owners.get(job_id)
            if owner is None:
                owner = lookup(job_id)
                if owner is None:
                    return False
                owners[job_id] = owner
            return owner == tenant

        doc = cluster_view.to_dict(view, now_ms, detail=detail, tenant=tenant, owns_job=owns_job)
        body = json.dumps(doc).encode()
        rendered = (body, '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"')
        self.rendered += 1
        self._bodies[key] = rendered
        if len(self._bodies) > self.max_bodies:
            self._bodies.popitem(last=False)
        return rendered

    def _prune(self, view: ClusterView) -> None:
        """Forget the owners of jobs no longer on the map once the owners kept
        outgrow twice the jobs on it at the last prune (amortized O(1) per job
        seen; nothing per generation until then)."""
        if len(self._tenant_of) <= self._prune_at:
            return
        on_map = {
            g.job_id
            for cell in view.cells.values()
            for node in cell.nodes
            for g in node.gpus
            if g.job_id
        }
        self._tenant_of = {j: t for j, t in self._tenant_of.items() if j in on_map}
        self._prune_at = 2 * len(on_map) + PRUNE_SLACK
