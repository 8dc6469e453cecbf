"""An operator's first day (issue #32), through ``framespool up --config`` and the API.

One stack started with the worked example of docs/operator.md
(``docs/examples/operator.toml``): two cells of one 8-GPU node each.

1. The generator declared in its ``[[profiles]]`` (``docs/examples/flipbook.py``,
   which framespool has never seen) runs a job that names no model to
   COMPLETED, and its output is the job's result.
2. ``GET /v1/models`` lists it with its defaults; the tenants reach every tier.
3. hobby (``max_gpus = 8``) holds its quota in one cell; its next job waits
   "held by quota" though the other cell has free GPUs (the quota counts
   across cells).
4. With both nodes busy, a job shows its position (>= 1) and a specific reason.
5. A tenant added with ``framespool tenants add`` submits at once: no restart.
"""

from __future__ import annotations

import json
import urllib.request
from functools import partial
from pathlib import Path

import pytest

from framespool import cli
from framespool.broker import free_port
from framespool.producers.client import Client
from framespool.stack import Stack, StackConfig
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

wait_for = partial(wait_until, every_s=0.3)

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "operator.toml"
TIERS = {"interactive", "enterprise", "paid", "free", "batch"}
HOLD = {"duration_s": 100}  # the built-in hold: 100 s at time scale 20 = 5 s of wall time
PAGES = {"pages": 40, "seconds_per_page": 0.2}  # a flip-book of 8 s


@pytest.fixture(scope="module")
def stack_config(tmp_path_factory) -> StackConfig:
    return StackConfig(
        data_dir=tmp_path_factory.mktemp("day-one"),
        port=free_port(),
        nodes=2,
        cells=2,
        schedulers=1,
        time_scale=20.0,
        processor_config=EXAMPLE,
    )


def clients(stack: Stack) -> dict[str, Client]:
    """One client per tenant (its first user's key)."""
    out: dict[str, Client] = {}
    for t in stack.tenant_keys:
        out.setdefault(t["name"], Client(stack.api_url, t["api_key"], timeout_s=30))
    return out


def state_of(c: Client, job_id: str, states: set[str]) -> dict | None:
    job = c.status(job_id)
    return job if job["state"] in states else None


def test_a_generator_declared_in_the_config_runs_and_its_output_is_the_result(stack):
    acme = clients(stack)["acme"]
    models = acme.models()
    flip = next(m for m in models["models"] if m["name"] == "flipbook")
    assert models["default_model"] == "flipbook" and flip["default"]
    assert flip["gpus"] == {"min": 1, "max": 8, "default": 1} and flip["checkpoints"]
    prompt = "a fox flipping through the snow"
    job_id = acme.submit(prompt=prompt, params={"pages": 4, "seconds_per_page": 0.05})["job_id"]
    job = wait_for(lambda: state_of(acme, job_id, {"COMPLETED", "FAILED"}), what="flipbook")
    assert job["state"] == "COMPLETED", job
    assert job["model"] == "flipbook" and job["gpus"] == 1
    with urllib.request.urlopen(acme.result(job_id)["url"], timeout=10) as resp:
        body = resp.read().decode()
    assert body.startswith(prompt) and "page 4/4" in body


def test_the_tenants_reach_every_tier(stack):
    reachable = set()
    for c in clients(stack).values():
        models = c.models()
        names = [m["name"] for m in models["models"]]
        model = "noop" if "noop" in names else models["default_model"]
        for tier in models["tiers"]:
            c.submit(prompt="tier check", model=model, tier=tier, params={"pages": 1})
            reachable.add(tier)
    assert reachable == TIERS


def test_quota_and_busy_gpus_are_the_reasons_a_job_is_told(stack):
    c = clients(stack)
    hobby, acme, studio = c["hobby"], c["acme"], c["studio"]
    # hobby's quota (8 GPUs) held by one job in its home cell
    # (hobby may run flipbook and demo only: GET /v1/models)
    held = hobby.submit(prompt="hold", gpus=8, params=PAGES, estimate_s=100)
    wait_for(lambda: state_of(hobby, held["job_id"], {"RUNNING"}), what="hobby's job running")
    quota = hobby.submit(prompt="more", gpus=4, params=PAGES, estimate_s=100)
    job = wait_for(
        lambda: state_of(hobby, quota["job_id"], {"QUEUED"}), what="hobby's second job queued"
    )
    assert job["reason_code"] == "quota", job
    assert job["reason"].startswith("held by quota: organisation hobby holds 8 of its 8 GPUs")
    assert job["position"] >= 1
    # the other cell: acme fills it; then studio's job waits for GPUs
    busy = acme.submit(prompt="busy", model="hold", gpus=8, params=HOLD, estimate_s=100)
    wait_for(lambda: state_of(acme, busy["job_id"], {"RUNNING"}), what="acme's hold")
    waiting = studio.submit(prompt="wait", model="hold", gpus=8, params=HOLD, estimate_s=100)
    job = wait_for(
        lambda: state_of(studio, waiting["job_id"], {"QUEUED"}), what="studio's job queued"
    )
    assert job["position"] >= 1 and job["reason_code"] in {"gpus", "fair_share"}, job
    assert "8 GPU(s)" in job["reason"] and "hobby" not in job["reason"]
    assert job["wait_p50_s"] is not None and job["wait_p90_s"] is not None
    for client, job_id in ((hobby, quota["job_id"]), (studio, waiting["job_id"])):
        done = wait_for(
            lambda c=client, j=job_id: state_of(c, j, {"COMPLETED"}), 180, "the waiters"
        )
        assert done["reason_code"] is None


def test_a_tenant_added_while_the_stack_runs_submits_at_once(stack, capsys):
    data = ["--data-dir", str(stack.data_dir), "--json"]
    add = ["tenants", "add", "newco", "--tiers", "batch,free", "--user", "ann"]
    assert cli.main(add + data) == 0
    key = json.loads(capsys.readouterr().out)["keys"][0]["api_key"]
    newco = Client(stack.api_url, key, timeout_s=30)

    def accepted():
        try:
            return newco.submit(prompt="hello", model="noop")
        except Exception:
            return None

    job = wait_for(accepted, 15, "the new tenant's first submit")
    done = wait_for(lambda: state_of(newco, job["job_id"], {"COMPLETED"}), what="its job")
    assert done["tier"] == "batch" and done["user"] == "ann"
