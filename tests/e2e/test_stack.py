"""The whole embedded stack, through its CLI and HTTP API.

One stack per module (starting it takes seconds): broker, processors (two
scheduler instances sharing the cells), clock, API with projections, and four
agents with 8 simulated GPUs each, in two rails of one cell. The demo generator runs sped up.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from framespool.broker import free_port
from framespool.producers.client import ApiError, Client
from framespool.stack import Stack, StackConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def stack_config(tmp_path_factory) -> StackConfig:
    return StackConfig(
        data_dir=tmp_path_factory.mktemp("stack"),
        port=free_port(),
        nodes=4,
        cells=1,  # one 32-GPU cell: the gang and cancel tests need all four nodes in it
        gpus_per_node=8,
        time_scale=20.0,
        allow_private_webhooks=True,
    )


def client(stack: Stack, tenant: int = 0) -> Client:
    return Client(stack.api_url, stack.tenant_keys[tenant]["api_key"], timeout_s=30)


def wait_state(c: Client, job_id: str, states: set[str], timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    job = {}
    while time.monotonic() < deadline:
        job = c.status(job_id)
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"{job_id} stuck in {job.get('state')}: {json.dumps(job)[:2000]}")


def submit(c: Client, **kw) -> str:
    body = {
        "prompt": "a red fox running through fresh snow",
        "model": "demo",
        "params": {"duration_s": 1, "fps": 4, "resolution": "128x72", "seed": 7},
    }
    body.update(kw)
    return c.submit(**body)["job_id"]


def test_submit_runs_to_completed_with_downloadable_artifact(stack):
    c = client(stack)
    job_id = submit(c)
    job = wait_state(c, job_id, {"COMPLETED", "FAILED"})
    assert job["state"] == "COMPLETED", job
    url = c.result(job_id)["url"]
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read()
    assert body[:6] in (b"GIF89a", b"GIF87a") and len(body) > 100
    tampered = url.replace("sig=", "sig=0")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(tampered, timeout=10)
    assert refused.value.code == 403


def test_eight_gpu_job_and_sixteen_gpu_two_node_gang(stack):
    c = client(stack)
    eight = submit(c, gpus=8, gpus_per_node=8)
    gang = submit(c, gpus=16, gpus_per_node=8)
    for job_id, nodes in ((eight, 1), (gang, 2)):
        job = wait_state(c, job_id, {"COMPLETED", "FAILED"})
        assert job["state"] == "COMPLETED", job
        assert len(job["nodes"]) == nodes


def test_cancel_queued_and_running_jobs_releases_gpus(stack):
    c = client(stack)
    running = submit(
        c,
        gpus=8,
        gpus_per_node=8,
        params={"duration_s": 60, "fps": 8, "resolution": "128x72", "seed": 1},
    )
    wait_state(c, running, {"RUNNING"})
    c.cancel(running)
    job = wait_state(c, running, {"CANCELLED"})
    assert job["state"] == "CANCELLED"
    # a job that cannot fit (32 GPUs while others run) waits queued, and is cancelled there
    blocker = submit(
        c,
        gpus=32,
        gpus_per_node=8,
        params={"duration_s": 60, "fps": 8, "resolution": "128x72", "seed": 2},
    )
    wait_state(c, blocker, {"QUEUED", "ASSIGNED", "RUNNING"})
    c.cancel(blocker)
    assert wait_state(c, blocker, {"CANCELLED"})["state"] == "CANCELLED"
    # every GPU is free again once the agents confirm the stops: read off cell
    # statuses published after the cancel (cells publish them every few seconds,
    # so an older one may predate the runs and show 0 busy without proving it)
    since_ms = int(time.time() * 1000)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = c.cluster(detail=False)
        fresh = bool(view["cells"]) and all(cell["ts_ms"] > since_ms for cell in view["cells"])
        if fresh and view["totals"].get("busy", 1) == 0:
            break
        time.sleep(0.5)
    assert fresh and view["totals"].get("busy") == 0, view
    # this stack's generators only (their output paths are under its data dir);
    # each agent reaps its run's process group after the stop, so allow it a moment
    deadline = time.monotonic() + 15
    while True:
        generators = subprocess.run(
            ["pgrep", "-f", f"framespool.agents.demo_generator.*{stack.data_dir}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if not generators or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert generators == []


def test_sse_streams_progress_and_resumes_after_reconnect(stack):
    c = client(stack)
    job_id = submit(c, params={"duration_s": 4, "fps": 8, "resolution": "128x72", "seed": 3})
    first = []
    for event in c.watch(job_id):
        first.append(event)
        if len(first) == 3:
            break
    rest = list(c.watch(job_id, last_event_id=int(first[-1]["id"])))
    ids = [int(e["id"]) for e in first + rest]
    assert ids == sorted(set(ids)), "events repeated or out of order after resume"
    assert any(e["event"] == "RunProgress" for e in rest)
    assert rest[-1]["data"]["state"] == "COMPLETED"


def test_idempotent_resubmit_returns_the_same_job(stack):
    c = client(stack)
    body = {"prompt": "same twice", "model": "demo"}
    a = c.submit(idempotency_key="idem-1", **body)
    b = c.submit(idempotency_key="idem-1", **body)
    assert a["job_id"] == b["job_id"]
    with pytest.raises(ApiError) as conflict:
        c.submit(idempotency_key="idem-1", prompt="different", model="demo")
    assert conflict.value.status == 409


def test_tenants_cannot_see_or_cancel_each_others_jobs(stack):
    a, b = client(stack, 0), client(stack, 1)
    job_id = submit(a)
    for call in (b.status, b.cancel):
        with pytest.raises(ApiError) as hidden:
            call(job_id)
        assert hidden.value.status == 404
    assert job_id not in [j["job_id"] for j in b.jobs()["jobs"]]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "", "model": "demo"}, "prompt"),
        ({"prompt": "x", "model": "demo", "gpus": 0}, "gpus"),
        ({"prompt": "x", "model": "demo", "gpus": 12, "gpus_per_node": 8}, "gpus_per_node"),
        ({"prompt": "x", "model": "demo", "params": {"fps": 1000}}, "params.fps"),
    ],
)
def test_invalid_bodies_are_refused_naming_the_field(stack, body, field):
    with pytest.raises(ApiError) as refused:
        client(stack).submit(**body)
    assert 400 <= refused.value.status < 500
    assert refused.value.field == field


def test_webhook_delivered_with_valid_signature(stack):
    received = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((dict(self.headers), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        c = client(stack)
        job_id = submit(c, callback_url=f"http://127.0.0.1:{server.server_port}/hook")
        wait_state(c, job_id, {"COMPLETED"})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            b'"COMPLETED"' in body for _, body in received
        ):
            time.sleep(0.2)
    finally:
        server.shutdown()
    assert received, "no webhook delivered"
    # the tenant's own webhook secret, shown to it once in stack.json
    info = json.loads((stack.data_dir / "stack.json").read_text())
    secret = info["tenants"][0]["webhook_secret"]
    for headers, body in received:
        sig = {
            k: v for k, v in (p.split("=", 1) for p in headers["Framespool-Signature"].split(","))
        }
        expected = hmac.new(
            secret.encode(), f"{sig['t']}.".encode() + body, hashlib.sha256
        ).hexdigest()
        assert hmac.compare_digest(sig["v1"], expected)
    ids = [h["Framespool-Event-Id"] for h, _ in received]
    assert len(ids) == len(set(ids))


def test_cli_submit_and_status_against_the_stack(stack):
    base = [sys.executable, "-m", "framespool.cli"]
    conn = ["--data-dir", str(stack.data_dir), "--json"]
    out = subprocess.run(
        base + ["submit", "--prompt", "cli fox", *conn], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    job_id = json.loads(out.stdout)["job_id"]
    wait_state(client(stack), job_id, {"COMPLETED"})
    out = subprocess.run(
        base + ["status", job_id, *conn], capture_output=True, text=True, timeout=60
    )
    assert json.loads(out.stdout)["state"] == "COMPLETED"
    bad = subprocess.run(
        base + ["status", "nope", *conn], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "404" in bad.stderr
