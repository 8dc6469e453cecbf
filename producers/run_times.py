"""How long a model's jobs really run, learned from the job views the API sees, so
that a tenant's own ``estimate_s`` cannot shrink its backlog at submit.

The predicted-wait limit (``framespool.processors.core.offers``) places a new
job behind what its tenant already has waiting and running, each job counted
at the new job's GPU-seconds. Those come from ``estimate_s``, the tenant's
word: 10,000 queued jobs that each claim 1 ms weigh nothing, and the limit is
bypassed. So the estimate is floored by what the model's jobs took:

1. Every terminal job view the projection publishes with a start and an end
   (``finished_ms - started_ms``, the first start: a preempted job counts its
   requeues too, which only errs on the long side) is a sample of its tenant
   and model version, once per job; the last ``SAMPLES`` per pair are kept.
2. ``floor_s(tenant, model)``: the tenant's own median for the model when it
   has ``MIN_SAMPLES``; else the median of the tenants' medians (each tenant
   one vote: no tenant's flood of long jobs raises it for the others) when
   ``MIN_SAMPLES`` tenants have one; else 0 (nothing learned: the estimate
   stands).

Memory: at most ``MAX_PAIRS`` (tenant, model) pairs (the least recently fed
forgotten first) of ``SAMPLES`` floats, and ``MAX_SEEN`` job ids. Per view
O(1); per submit O(models' tenants) when the tenant has too few samples.
In memory: a restarted API learns again from the jobs that end after it.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from typing import Any

from framespool.projections.jobs import JobView

SAMPLES = 32
MIN_SAMPLES = 3
MAX_PAIRS = 10_000
MAX_SEEN = 100_000


class RunTimes:
    def __init__(self, max_pairs: int = MAX_PAIRS) -> None:
        self._max_pairs = max_pairs
        # (tenant, model) -> its latest run times (s), least recently fed first
        self._runs: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def __call__(self, job_id: str, view: Any) -> None:
        """A published job view (``PublishTap``'s observer)."""
        if (
            not isinstance(view, JobView)
            or not view.terminal
            or view.started_ms <= 0
            or view.finished_ms <= view.started_ms
            or job_id in self._seen
        ):
            return
        self._seen[job_id] = None
        if len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        key = (view.tenant, f"{view.model}@{view.model_version}")
        runs = self._runs.pop(key, None) or deque(maxlen=SAMPLES)
        runs.append((view.finished_ms - view.started_ms) / 1000)
        self._runs[key] = runs
        if len(self._runs) > self._max_pairs:
            self._runs.popitem(last=False)

    def floor_s(self, tenant: str, model: str) -> float:
        """The run time ``tenant``'s estimate for ``model`` (``name@version``) is
        not trusted below (theory of operation, 2)."""
        own = self._runs.get((tenant, model))
        if own is not None and len(own) >= MIN_SAMPLES:
            return statistics.median(own)
        votes = [
            statistics.median(runs)
            for (_, m), runs in self._runs.items()
            if m == model and len(runs) >= MIN_SAMPLES
        ]
        return statistics.median(votes) if len(votes) >= MIN_SAMPLES else 0.0
