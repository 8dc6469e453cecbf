"""Issue #33, 10: reasons the scheduler writes reach tenants (job views, the cluster
view); one tenant's job ids never appear in what another tenant reads."""

from __future__ import annotations

from framespool.processors.core import CellConfig
from framespool.schemas import events as ev
from tests.support.core_harness import Harness


def test_a_node_taken_down_by_one_runs_stop_names_no_job_to_the_others():
    h = Harness(
        nodes=1,
        config=CellConfig(
            status_interval_s=0,
            estimate_interval_s=0,
            heartbeat_timeout_s=1e9,
            report_lease_s=1e9,
            stop_lease_s=60,
        ),
    )
    h.submit("job_mallory_secret", tenant="mallory", gpus=4, estimate_s=600)
    h.submit("job_victim", tenant="victim", gpus=4, estimate_s=600)
    h.start_all()
    h.feed(
        ev.CancelJob(
            event_id=h.next_id(), ts_ms=h.now_ms, job_id="job_mallory_secret", tenant="mallory"
        )
    )
    out = []
    for _ in range(7):  # the StopRun is never confirmed: the node goes DOWN
        out += h.tick(10)
    requeued = [o for o in out if isinstance(o, ev.JobRequeued) and o.job_id == "job_victim"]
    down = [o for o in out if isinstance(o, ev.NodeStateChanged) and o.state == "DOWN"]
    assert requeued and down
    assert all("job_mallory_secret" not in o.reason for o in requeued + down)
