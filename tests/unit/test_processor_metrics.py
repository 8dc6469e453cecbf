"""Processor counters are exposed to Prometheus, scraped over HTTP."""

from __future__ import annotations

import threading
import urllib.request
from types import SimpleNamespace

from framespool.broker import free_port
from framespool.processors.app import Counters
from framespool.processors.metrics import RunnerCollector, serve


def test_counters_are_served_as_prometheus_metrics():
    assigned = threading.Event()
    assigned.set()
    runner = SimpleNamespace(
        counters=Counters(records=42, dead_letters=3),
        instance="a",
        input_topic=SimpleNamespace(name="framespool.scheduler"),
        assigned=assigned,
    )
    port = free_port()
    server = serve(RunnerCollector(runner, "scheduler"), port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert (
        'framespool_processor_records_total{instance="a",role="scheduler",'
        'topic="framespool.scheduler"} 42.0'
    ) in body
    assert 'framespool_processor_dead_letters_total{' in body and "} 3.0" in body
    assert 'framespool_processor_assigned{' in body
    runner.counters.records = 50  # live: read at scrape time
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "} 50.0" in body
    server.shutdown()
    server.server_close()


def test_agent_gauges_are_served():
    from framespool.bootstrap import AgentCollector

    agent = SimpleNamespace(
        node_id="node-0", incarnation=7, _runs={("j", 1): None}, probe=SimpleNamespace(count=8)
    )
    port = free_port()
    server = serve(AgentCollector(agent), port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    server.shutdown()
    server.server_close()
    assert 'framespool_agent_runs{node="node-0"} 1.0' in body
    assert 'framespool_agent_incarnation{node="node-0"} 7.0' in body
