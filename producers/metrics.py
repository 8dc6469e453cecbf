"""Prometheus metrics of the API process: its own requests, and the read models it serves.

Four kinds of figure, each from where it is true:

- counted by the API's handlers (requests, submits, SSE clients, rate-limit
  refusals): ordinary ``Counter``/``Gauge``/``Histogram`` objects;
- read from the views at scrape time (queue depth per tier and tenant, GPUs
  busy/free/degraded/down per cell, nodes per state): ``ViewCollector`` asks
  the store for the cluster view, so the figures are exactly what
  ``GET /v1/cluster`` answers;
- counters the projection parts keep (records folded, dead-lettered, webhooks
  delivered/failed, slow SSE clients dropped, records not folded yet per
  topic, callback host lookups skipped for a bound): ``ProjectionCollector``
  reads them at scrape time;
- submit -> assigned latency: ``AssignmentObserver`` looks at every job view
  the projection publishes and observes, once per job, the first
  ``JobAssigned`` entry's time minus the job's ``created_ms``.

Metrics of the processors and agents are theirs to expose, not the API's.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from framespool.projections import cluster as cluster_view
from framespool.projections.jobs import JobView

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    4 * 3600.0,
    24 * 3600.0,
)
OBSERVED_JOBS_MAX = 100_000  # job ids remembered so a job's assignment is observed once


class Metrics:
    """The API's registry and the metrics its handlers update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "framespool_api_requests_total",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "framespool_api_request_seconds",
            "HTTP request latency",
            ["route"],
            registry=self.registry,
        )
        self.submits = Counter(
            "framespool_api_submits_total",
            "Jobs submitted",
            ["tier", "outcome"],
            registry=self.registry,
        )
        self.sse_clients = Gauge(
            "framespool_api_sse_clients", "Open SSE streams", registry=self.registry
        )
        self.rate_limited = Counter(
            "framespool_api_rate_limited_total",
            "Requests refused with 429 by the per-tenant rate limit",
            ["tenant"],
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "framespool_api_connections_refused_total",
            "Connections answered 429 and closed: their address held max_connections_per_peer",
            registry=self.registry,
        )
        self.unadmitted = Gauge(
            "framespool_api_unadmitted_jobs",
            "Jobs this API accepted whose admission the log has not shown back yet",
            registry=self.registry,
        )
        self.oldest_unadmitted = Gauge(
            "framespool_api_oldest_unadmitted_seconds",
            "Age of the oldest job this API accepted whose admission the log has not "
            "shown back yet (the submit path's health: admission, cells, job-events, "
            "this API's fold)",
            registry=self.registry,
        )
        self.submit_to_assigned = Histogram(
            "framespool_job_submit_to_assigned_seconds",
            "Time from a job's submission to its first assignment (queue wait), by tier",
            ["tier"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def watch_admission(self, watch: AdmissionWatch) -> None:
        """Read the two admission gauges off ``watch`` at each scrape."""
        self.unadmitted.set_function(lambda: float(len(watch)))
        self.oldest_unadmitted.set_function(watch.oldest_s)


class ViewCollector:
    """Cluster figures from the store's cluster view, read at scrape time."""

    def __init__(self, load_cluster: Callable[[], cluster_view.ClusterView]) -> None:
        self._load = load_cluster

    def collect(self) -> Iterable[Metric]:
        view = self._load()
        gpus = GaugeMetricFamily(
            "framespool_gpus",
            "GPUs per cell by state (busy, free, degraded, down)",
            labels=["cell", "state"],
        )
        nodes = GaugeMetricFamily(
            "framespool_nodes", "Nodes per cell by state", labels=["cell", "state"]
        )
        queued = GaugeMetricFamily(
            "framespool_queue_jobs", "Queued jobs by tier and tenant", labels=["tier", "tenant"]
        )
        queued_gpus = GaugeMetricFamily(
            "framespool_queue_gpus",
            "GPUs asked for by queued jobs, by tier and tenant",
            labels=["tier", "tenant"],
        )
        running = GaugeMetricFamily(
            "framespool_running_gpus",
            "GPUs running jobs, by tier and tenant",
            labels=["tier", "tenant"],
        )
        depth: dict[tuple[str, str], list[int]] = {}
        for name in sorted(view.cells):
            cell = view.cells[name]
            counts: dict[str, int] = {b: 0 for b in cluster_view.GPU_BUCKETS}
            node_states: dict[str, int] = {}
            for node in cell.nodes:
                node_states[node.state] = node_states.get(node.state, 0) + 1
                for gpu in node.gpus:
                    counts[cluster_view.gpu_bucket(node, gpu)] += 1
            for bucket, n in counts.items():
                gpus.add_metric([name, bucket], n)
            for state, n in sorted(node_states.items()):
                nodes.add_metric([name, state], n)
            for q in cell.queues:
                row = depth.setdefault((q.tier, q.tenant), [0, 0, 0])
                row[0] += q.queued
                row[1] += q.queued_gpus
                row[2] += q.running_gpus
        for (tier, tenant), (jobs, want, run) in sorted(depth.items()):
            queued.add_metric([tier, tenant], jobs)
            queued_gpus.add_metric([tier, tenant], want)
            running.add_metric([tier, tenant], run)
        updated = GaugeMetricFamily(
            "framespool_cluster_view_updated_seconds",
            "Event time of the newest cluster status folded",
        )
        updated.add_metric([], view.updated_ms / 1000)
        return [gpus, nodes, queued, queued_gpus, running, updated]


class ProjectionCollector:
    """Counters the projection consumer, webhook dispatcher and SSE hub keep.

    ``parts`` are objects found among the API's background tasks (see
    ``projection_parts``); an absent part contributes nothing.
    """

    def __init__(self, parts: Iterable[Any], hub: Any = None, lookups: Any = None) -> None:
        self._parts = list(parts)
        self._hub = hub
        self._lookups = lookups  # the API's submit-time CallbackLookups, if any

    def collect(self) -> Iterable[Metric]:
        out: list[Metric] = []
        for part in self._parts:
            counters = getattr(part, "counters", None)
            if counters is not None:
                for name, help_text in (
                    ("records", "Records the projection read"),
                    ("applied", "Events the projection folded"),
                    ("skipped_replays", "Records at or below the stored offset (replays)"),
                    ("dead_lettered", "Records the projection sent to dead-letter"),
                    ("commits", "Store batches the projection committed"),
                ):
                    family = CounterMetricFamily(f"framespool_projection_{name}", help_text)
                    family.add_metric([], getattr(counters, name, 0))
                    out.append(family)
            behind = getattr(part, "behind", None)
            if isinstance(behind, dict):
                gauge = GaugeMetricFamily(
                    "framespool_projection_behind_records",
                    "Records on the log the projection has not folded yet, per topic "
                    "(from its consumer's latest Fetch)",
                    labels=["topic"],
                )
                for topic, n in sorted(behind.items()):
                    gauge.add_metric([topic], n)
                out.append(gauge)
            if hasattr(part, "delivered") and hasattr(part, "failed"):
                hooks = CounterMetricFamily(
                    "framespool_webhook_deliveries",
                    "Webhook deliveries by final outcome",
                    labels=["outcome"],
                )
                hooks.add_metric(["delivered"], part.delivered)
                hooks.add_metric(["failed"], part.failed)
                out.append(hooks)
        skipped = CounterMetricFamily(
            "framespool_callback_lookups_skipped",
            "Callback host lookups not made for a per-tenant or total bound (submit: the "
            "check is left to delivery; webhook: the attempt is retried later)",
            labels=["where"],
        )
        sources = [("submit", self._lookups)]
        sources += [("webhook", getattr(p, "lookups", None)) for p in self._parts]
        for where, lookups in sources:
            if lookups is not None:
                skipped.add_metric([where], lookups.skipped)
        if skipped.samples:
            out.append(skipped)
        if self._hub is not None and hasattr(self._hub, "dropped_total"):
            dropped = CounterMetricFamily(
                "framespool_sse_dropped_clients", "SSE clients dropped for not keeping up"
            )
            dropped.add_metric([], self._hub.dropped_total)
            out.append(dropped)
        return out


def projection_parts(background: Iterable[Callable[..., Any]]) -> list[Any]:
    """The objects behind background runs given as bound methods (``consumer.run``)."""
    parts = []
    for run in background:
        owner = getattr(run, "__self__", None)
        if owner is not None and owner not in parts:
            parts.append(owner)
    return parts


class AssignmentObserver:
    """Observes submit -> first assignment once per job from the views the projection publishes."""

    def __init__(self, histogram: Histogram, max_jobs: int = OBSERVED_JOBS_MAX) -> None:
        self._histogram = histogram
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._max = max_jobs

    def __call__(self, job_id: str, view: Any) -> None:
        if not isinstance(view, JobView) or job_id in self._seen or view.run < 1:
            return
        first = next((e for e in view.timeline if e.type == "JobAssigned"), None)
        if first is None or view.created_ms <= 0:
            return  # assigned before the bounded timeline's window: not measurable
        self._seen[job_id] = None
        if len(self._seen) > self._max:
            self._seen.popitem(last=False)
        self._histogram.labels(view.tier or "unknown").observe(
            max(0.0, (first.ts_ms - view.created_ms) / 1000)
        )


class AdmissionWatch:
    """Jobs this API accepted that the log has not shown back yet.

    A job counts from just before its ``SubmitJob`` is written until the
    projection publishes its view with a first timeline entry (``JobAdmitted``
    or ``JobRejected``, read from job-events). The oldest one's age
    (``framespool_api_oldest_unadmitted_seconds``) is the health of the whole
    submit path: admission, the scheduler topic's cells, job-events and this
    API's own fold. It grows whichever of them stops, a projection consumer
    that stops fetching included, which the lag watch cannot see (its
    watermarks come from its own fetches). Cost: one dict insert per accepted
    submit, one dict lookup per published view, O(1) per scrape; at most
    ``max_jobs`` remembered (the oldest forgotten first)."""

    def __init__(self, clock: Callable[[], float], max_jobs: int = OBSERVED_JOBS_MAX) -> None:
        self._clock = clock
        self._pending: OrderedDict[str, float] = OrderedDict()
        self._max = max_jobs

    def writing(self, job_id: str) -> None:
        """The API is about to write the job's ``SubmitJob``."""
        if job_id not in self._pending:
            self._pending[job_id] = self._clock()
            if len(self._pending) > self._max:
                self._pending.popitem(last=False)

    def not_written(self, job_id: str) -> None:
        """Its ``SubmitJob`` could not be written: nothing to wait for."""
        self._pending.pop(job_id, None)

    def __call__(self, job_id: str, view: Any) -> None:
        if job_id in self._pending and isinstance(view, JobView) and view.timeline:
            del self._pending[job_id]

    def oldest_s(self) -> float:
        """Seconds the oldest job not shown back yet has waited (0: none)."""
        if not self._pending:
            return 0.0
        return max(0.0, self._clock() - next(iter(self._pending.values())))

    def __len__(self) -> int:
        return len(self._pending)


class PublishTap:
    """Calls ``observer(key, item)`` for everything published on a hub, then publishes.

    The projection consumer publishes every changed job view to the SSE hub;
    the tap lets the API see them without a subscription per job.
    ``remove()`` restores the hub.
    """

    def __init__(self, hub: Any, observer: Callable[[str, Any], None]) -> None:
        self._hub = hub
        self._original: Callable[[str, Any], int] = hub.publish
        self._own = "publish" in vars(hub)  # an earlier tap's wrapper, or the class's method

        def publish(key: str, item: Any) -> int:
            try:
                observer(key, item)
            except Exception:  # a metric must never stop a view from reaching its clients
                log.exception("metrics observer failed on %s", key)
            return self._original(key, item)

        self._wrapper: Callable[[str, Any], int] | None = publish
        hub.publish = publish

    def remove(self) -> None:
        """Restore the hub, unless another tap was put on top of this one since."""
        if self._wrapper is not None and self._hub.publish is self._wrapper:
            if self._own:
                self._hub.publish = self._original
            else:
                del self._hub.publish
        self._wrapper = None
