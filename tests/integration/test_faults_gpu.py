"""GPU faults through the agent's fault file: ECC moves work off the node.

An uncorrectable ECC error written to ``agents/<node>/faults.json`` reaches
the scheduler in the next heartbeat: the GPU is failed, the node drains, and a
checkpointing run on it is checkpointed and moved to the other node, resuming
from that checkpoint. Once the file is cleared and the agent restarted (the
GPU "replaced"), the node registers again and is UP.
"""

from __future__ import annotations

import pytest

from framespool.agents import faults
from framespool.chaos.drill import LogTail, chaos_stack, restart_process
from framespool.producers.client import Client
from framespool.schemas import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_ecc_error_drains_the_node_and_moves_its_run_from_a_checkpoint(tmp_path):
    with chaos_stack(tmp_path, nodes=2) as stack, LogTail(stack.bootstrap_servers) as tail:
        c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
        job = c.submit(
            prompt="sparks",
            model="demo",
            estimate_s=14,
            checkpoint_interval_s=5,
            gpus=2,
            params={
                "steps": 60,
                "seconds_per_step": 2,
                "duration_s": 1,
                "fps": 4,
                "resolution": "64x64",
            },
        )["job_id"]
        started = tail.wait_for(lambda t: t.first(ev.RunStarted, job_id=job, run=1), 20, "run 1")
        node = started.node_id
        gpu = tail.first(ev.JobAssigned, job_id=job, run=1).placement[0].gpus[0]
        faults.write_gpu_faults(stack.data_dir / "agents" / node, ecc={gpu: (0, 1)})

        def failed_gpu(t: LogTail):
            return [
                e
                for e in t.of(ev.NodeStateChanged, node_id=node)
                if e.gpu == gpu and e.state == "failed"
            ]

        (change,) = tail.wait_for(failed_gpu, 10, "the GPU failed")
        assert "uncorrectable ECC" in change.reason
        requeued = tail.wait_for(
            lambda t: t.first(ev.JobRequeued, job_id=job, run=1), 20, "the move"
        )
        assert requeued.reason.startswith(f"checkpoint-and-move: node {node} draining")
        assert requeued.resume_from and requeued.retries_left > 0
        second = tail.wait_for(lambda t: t.first(ev.JobAssigned, job_id=job, run=2), 10, "run 2")
        assert [s.node_id for s in second.placement] != [node]
        assert tail.wait_for(lambda t: t.first(ev.JobCompleted, job_id=job), 40).run == 2

        faults.write_gpu_faults(stack.data_dir / "agents" / node)  # the GPU is replaced
        restart_process(stack, f"agent-{node}")
        tail.wait_for(
            lambda t: [
                e
                for e in t.of(ev.NodeStateChanged, node_id=node)
                if e.gpu < 0 and e.state == "UP" and e.incarnation > started.incarnation
            ],
            20,
            "node UP again",
        )
