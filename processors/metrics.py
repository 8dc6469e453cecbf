"""Prometheus metrics of a processor instance, read from its runner's counters.

``python -m framespool.processors ... --metrics-port P`` serves them on 127.0.0.1:P/metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

HELP = {
    "batches": "input batches folded",
    "records": "input records consumed",
    "produced": "output records produced (delivered before the commit)",
    "quiet": "polls that returned nothing",
    "skipped": "input records at or below the snapshot offset (already folded)",
    "dead_letters": "records sent to the dead-letter topic",
    "snapshots": "state+offset snapshots written",
    "commit_failures": "offset commits that failed",
    "fenced": "partitions dropped because another instance claimed them (zombie fencing)",
    "gaps": "input ranges gone from the log (retention) before a snapshot covered them",
}


class RunnerCollector:
    """Exposes ``Counters`` as ``framespool_processor_<name>_total{role,instance,topic}``."""

    def __init__(self, runner: Any, role: str) -> None:
        self.runner = runner
        self.role = role

    def collect(self) -> Iterator[Any]:
        counters = self.runner.counters
        labels = ["role", "instance", "topic"]
        values = [self.role, self.runner.instance, self.runner.input_topic.name]
        for f in fields(counters):
            family = CounterMetricFamily(
                f"framespool_processor_{f.name}", HELP.get(f.name, f.name), labels=labels
            )
            family.add_metric(values, float(getattr(counters, f.name)))
            yield family
        assigned = GaugeMetricFamily(
            "framespool_processor_assigned", "1 once this instance holds partitions", labels=labels
        )
        assigned.add_metric(values, 1.0 if self.runner.assigned.is_set() else 0.0)
        yield assigned


def serve(collector: Any, port: int) -> Any:
    """Serve ``collector`` on 127.0.0.1:port; returns the HTTP server (``shutdown()``)."""
    registry = CollectorRegistry()
    registry.register(collector)
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return server
