"""replay, verify and audit against a real embedded stack, through the CLI.

One small stack (two 8-GPU agents) runs a few jobs to completion; the tools
must then find no divergence and no violation, and audit must explain an
assignment. A forged second terminal event on job-events must make verify
fail, naming the job.
"""

from __future__ import annotations

import json
import time

import pytest

import framespool.cli as cli
from framespool.broker import free_port
from framespool.log import LogProducer, partition_for_key, read_all
from framespool.producers.client import Client
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas.topics import JOB_EVENTS
from framespool.stack import StackConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def stack_config(tmp_path_factory) -> StackConfig:
    return StackConfig(
        data_dir=tmp_path_factory.mktemp("tools-stack"),
        port=free_port(),
        nodes=4,  # two cells of two nodes: the 16-GPU gang fits in either
        gpus_per_node=8,
        time_scale=50.0,
        cells=2,
    )


@pytest.fixture
def framespool(stack, monkeypatch, capsys):
    """``framespool <command> ... --data-dir <stack> --json`` -> (exit status, parsed JSON)."""
    monkeypatch.setattr(
        cli, "COMMANDS", tuple(dict.fromkeys((*cli.COMMANDS, "replay", "audit", "verify")))
    )

    def run(*argv: str) -> tuple[int, dict]:
        capsys.readouterr()
        status = cli.main([*argv, "--data-dir", str(stack.data_dir), "--json"])
        out = capsys.readouterr().out
        return status, json.loads(out)

    return run


def finish(client: Client, job_ids: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    for job_id in job_ids:
        while (state := client.status(job_id)["state"]) not in (
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "REJECTED",
        ):
            assert time.monotonic() < deadline, f"{job_id} stuck in {state}"
            time.sleep(0.1)
        assert state == "COMPLETED", client.status(job_id)


def test_replay_verify_and_audit_on_a_real_log_then_a_forged_terminal(stack, framespool):
    acme = Client(stack.api_url, stack.tenant_keys[0]["api_key"], timeout_s=30)
    studio = Client(stack.api_url, stack.tenant_keys[1]["api_key"], timeout_s=30)
    jobs = [
        acme.submit(prompt="one", model="noop", gpus=1)["job_id"],
        acme.submit(prompt="eight", model="noop", gpus=8)["job_id"],
        studio.submit(
            prompt="demo",
            model="demo",
            gpus=1,
            params={"duration_s": 1, "fps": 4, "resolution": "128x72"},
        )["job_id"],
    ]
    finish(acme, jobs[:2])
    finish(studio, jobs[2:])
    # the gang last: nothing is placed after it (see the ledger on gang completions)
    jobs.append(studio.submit(prompt="gang", model="noop", gpus=16, gpus_per_node=8)["job_id"])
    finish(studio, jobs[3:])

    status, replayed = framespool("replay")
    assert status == 0, replayed["first_divergence"]
    counts = replayed["counts"]
    assert counts["matched"] >= 4 * 3 and counts.get("missing", 0) == 0
    assert counts.get("unexpected", 0) == 0 and counts.get("differing", 0) == 0
    # admission re-folded too, under the config the stack's processors ran with
    admission = replayed["admission"]["counts"]
    # its inputs: the 4 submits and the cells' offers, which decide nothing themselves
    assert admission["inputs"] > 4 and admission["outputs"] == admission["matched"] == 2 * 4
    assert {"cell-0", "cell-1"} <= set(replayed["cells"])

    status, verified = framespool("verify")
    assert status == 0, verified["violations"]
    assert verified["jobs"]["COMPLETED"] == 4
    assert set(verified["fairness"]["tenants"]) >= {"acme", "studio"}

    status, audited = framespool("audit", jobs[3])
    assert status == 0 and audited["state"] == "COMPLETED"
    (assigned,) = [e for e in audited["timeline"] if e["type"] == "JobAssigned"]
    assert "gang: 2 nodes" in assigned["summary"] and assigned["event"]["reason"]
    kinds = [e["type"] for e in audited["timeline"]]
    assert kinds[0] == "SubmitJob" and "JobCompleted" in kinds
    assert kinds.count("StartRun") == 2 and "RunCompleted" in kinds

    # a forged second terminal event for a completed job
    bootstrap = stack.bootstrap_servers
    (done,) = [
        e
        for e in map(
            lambda r: codec.decode(r.value), read_all(bootstrap, JOB_EVENTS.name, timeout_s=10)
        )
        if isinstance(e, ev.JobCompleted) and e.job_id == jobs[0]
    ]
    forged = ev.JobFailed(
        event_id="forged-terminal-1",
        ts_ms=done.ts_ms,
        job_id=jobs[0],
        run=done.run,
        reason="forged",
    )
    with LogProducer(bootstrap) as producer:
        producer.produce(
            JOB_EVENTS.name,
            jobs[0],
            codec.encode(forged),
            partition_for_key(jobs[0], JOB_EVENTS.partitions),
        )
    status, verified = framespool("verify")
    assert status == 1
    assert verified["violation_counts"] == {"duplicate_terminal": 1}
    (violation,) = verified["violations"]
    assert violation["subject"] == jobs[0] and "forged-terminal-1" in violation["detail"]
    status, replayed = framespool("replay")  # not a scheduler output: replay is unaffected
    assert status == 0
