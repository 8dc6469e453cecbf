"""The cluster fold: latest CellStatus per cell, node patches, breakers, totals."""

from __future__ import annotations

import json

from framespool.projections import cluster
from framespool.projections.serde import cell_from_dict, cell_to_dict
from framespool.schemas.events import BreakerTripped, NodeStateChanged, Tick
from tests.support.projections import cell_status


def test_latest_status_per_cell_is_the_view_and_totals_add_up():
    view = cluster.apply(None, cell_status("cell-0", 1_000, busy=3))
    view = cluster.apply(view, cell_status("cell-1", 1_000, busy=8))
    t = cluster.totals(view)
    assert t == {"busy": 11, "free": 21, "degraded": 0, "down": 0, "total": 32, "nodes": 4}
    view = cluster.apply(view, cell_status("cell-0", 2_000, busy=0))
    assert cluster.totals(view)["busy"] == 8


def test_older_or_duplicate_status_is_a_no_op():
    new = cluster.apply(None, cell_status("cell-0", 2_000, busy=1))
    assert cluster.apply(new, cell_status("cell-0", 1_000, busy=7)) is new
    assert cluster.apply(new, cell_status("cell-0", 2_000, busy=1)) is new


def test_queue_depths_are_summed_per_tier_and_tenant():
    view = cluster.apply(None, cell_status("cell-0", 1_000, busy=2))
    view = cluster.apply(view, cell_status("cell-1", 1_000, busy=1))
    q = cluster.queue_depths(view)
    assert q["by_tier"]["free"] == {"queued": 8, "queued_gpus": 8, "running_gpus": 3}
    assert q["by_tenant"]["globex"]["queued_gpus"] == 16


def test_node_and_gpu_state_changes_patch_the_view():
    view = cluster.apply(None, cell_status("cell-0", 1_000, busy=0))
    down = NodeStateChanged(
        event_id="n1",
        ts_ms=1_500,
        node_id="cell-0-node-1",
        incarnation=1,
        state="DOWN",
        reason="missed heartbeats",
    )
    view = cluster.apply(view, down)
    assert cluster.totals(view)["down"] == 8
    degraded = NodeStateChanged(
        event_id="n2",
        ts_ms=1_600,
        node_id="cell-0-node-0",
        incarnation=1,
        state="degraded",
        gpu=3,
        reason="thermal",
    )
    view = cluster.apply(view, degraded)
    assert cluster.totals(view) == {
        "busy": 0,
        "free": 7,
        "degraded": 1,
        "down": 8,
        "total": 16,
        "nodes": 2,
    }
    stale = NodeStateChanged(
        event_id="n0", ts_ms=10, node_id="cell-0-node-0", incarnation=1, state="DOWN"
    )
    assert cluster.apply(view, stale) is view


def test_draining_node_counts_free_gpus_as_degraded():
    view = cluster.apply(None, cell_status("cell-0", 1_000, nodes=1, busy=2))
    view = cluster.apply(
        view,
        NodeStateChanged(
            event_id="d", ts_ms=2_000, node_id="cell-0-node-0", incarnation=1, state="DRAINING"
        ),
    )
    assert cluster.totals(view) == {
        "busy": 2,
        "free": 0,
        "degraded": 6,
        "down": 0,
        "total": 8,
        "nodes": 1,
    }


def test_breakers_keep_the_latest_and_show_expiry():
    b = BreakerTripped(
        event_id="b",
        ts_ms=1_000,
        model_version="demo:2",
        scope="gpu_type",
        key="A100",
        until_ms=5_000,
        reason="3 failures in 10 min",
    )
    view = cluster.apply(None, b)
    doc = cluster.to_dict(view, now_ms=2_000)
    assert doc["breakers"][0]["active"] is True
    assert cluster.to_dict(view, now_ms=6_000)["breakers"][0]["active"] is False


def test_unrelated_events_are_no_ops_and_document_is_json():
    view = cluster.apply(None, cell_status())
    assert cluster.apply(view, Tick(event_id="t", ts_ms=1, cell="cell-0", now_ms=1)) is view
    doc = json.loads(json.dumps(cluster.to_dict(view)))
    assert doc["totals"]["busy"] == 3 and doc["cells"][0]["nodes"][0]["gpus"][0]["bucket"] == "busy"
    assert "nodes" not in cluster.to_dict(view, detail=False)["cells"][0]


def test_cell_serde_round_trips():
    cell = cluster.apply(None, cell_status()).cells["cell-0"]
    assert cell_from_dict(json.loads(json.dumps(cell_to_dict(cell)))) == cell
