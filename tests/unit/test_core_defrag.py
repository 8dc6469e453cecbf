"""Defragmentation for a waiting whole-node job (``CellConfig.defrag_after_s``,
reservation.py ``defragment``): a small checkpointable run alone on a node
moves to idle GPUs elsewhere so the reservation's holder starts now instead
of at its shadow time (issue 34). The first test fails when the knob is
ignored or the move is broken; the second pins what is never moved."""

from __future__ import annotations

from framespool.processors.core import CellConfig
from framespool.schemas import events as ev
from tests.support.core import of
from tests.support.core_harness import Harness


def _fragmented(defrag_after_s: float, small_preemptible: bool = True) -> Harness:
    """n0 holds only "small" (1 GPU, two hours), n1 and n2 a 7-GPU run each
    (an hour): 7 + 1 + 1 GPUs idle, no node has 8 free."""
    config = CellConfig(
        status_interval_s=0,
        estimate_interval_s=0,
        heartbeat_timeout_s=100_000,
        report_lease_s=100_000,
        defrag_after_s=defrag_after_s,
    )
    h = Harness(config, nodes=3)
    h.submit("a", gpus=7, estimate_s=3600.0)
    h.submit("b", gpus=7, estimate_s=3600.0)
    h.submit(
        "small",
        gpus=1,
        estimate_s=7200.0,
        preemptible=small_preemptible,
        checkpoint_interval_s=60.0 if small_preemptible else 0.0,
    )
    h.submit("c", gpus=7, estimate_s=3600.0)
    h.start_all()
    nodes = {s.spec.job_id: s.node_id for s in h.assigned()}
    assert nodes == {"a": "n0", "b": "n1", "small": "n0", "c": "n2"}
    h.complete(("a", 1))
    h.tick(120)  # "small" has run long enough to be preempted
    return h


def test_a_small_run_moves_so_a_whole_node_job_starts_now():
    h = _fragmented(defrag_after_s=300.0)
    h.submit("whole", gpus=8, estimate_s=600.0)
    h.tick(1)  # its pass reserves n1 (freed first) for it
    assert h.cell.reservation_job == "whole" and h.cell.reservation_nodes == ("n1",)
    out = h.tick(1)
    [ask] = of(out, ev.CheckpointRun)
    assert ask.job_id == "small" and ask.node_id == "n0"
    assert h.cell.claims["whole"][0] == ("n0",)
    h.report(ev.RunCheckpointed, "small", 1, "n0", checkpoint_uri="mem://small/ck1")
    h.report(ev.RunStopped, "small", 1, "n0")
    out = h.tick(1)
    starts = {s.spec.job_id: s.node_id for s in of(out, ev.StartRun)}
    assert starts["whole"] == "n0"
    assert starts["small"] in ("n1", "n2")  # on a GPU that idled


def test_off_or_unmovable_nothing_moves():
    for h in (_fragmented(defrag_after_s=0.0), _fragmented(300.0, small_preemptible=False)):
        h.submit("whole", gpus=8, estimate_s=600.0)
        out = h.tick(1) + h.tick(1)
        assert h.cell.reservation_job == "whole"
        assert not of(out, ev.CheckpointRun)
        assert "whole" not in h.cell.claims
