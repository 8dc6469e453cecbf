"""HTTP API handlers with aiohttp's test client, a recording producer and the in-memory store."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import pytest

from framespool.log.memory import MemoryProducer
from framespool.projections import cluster
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.store import Batch
from framespool.schemas import codec
from framespool.schemas.events import CancelJob, JobAdmitted, JobQueued, SubmitJob
from framespool.schemas.topics import COMMANDS
from tests.support.api import BOB, BODY, api, auth, run
from tests.support.projections import cell_status, lifecycle, records_for


def test_submit_writes_a_command_and_the_job_is_immediately_visible(tmp_path):
    async def go():
        async with api(tmp_path) as c:
            r = await c.client.post("/v1/jobs", json=BODY, headers=auth())
            assert r.status == 202, await r.text()
            body = await r.json()
            assert (
                body["state"] == "SUBMITTED" and body["status_url"] == f"/v1/jobs/{body['job_id']}"
            )
            assert r.headers["Location"] == body["status_url"]
            [sent] = c.producer.on(COMMANDS.name)
            assert sent.key == "acme"
            cmd = codec.decode(sent.value)
            assert isinstance(cmd, SubmitJob) and cmd.spec.job_id == body["job_id"]
            assert (cmd.spec.tenant, cmd.spec.user, cmd.spec.tier) == ("acme", "alice", "free")
            assert cmd.spec.params["resolution"] == "1280x720"
            got = await c.client.get(body["status_url"], headers=auth())
            assert got.status == 200
            job = await got.json()
            assert job["state"] == "SUBMITTED" and job["prompt"] == BODY["prompt"]

    run(go())


def test_idempotent_resubmit_returns_the_same_job_and_a_changed_body_conflicts(tmp_path):
    async def go():
        async with api(tmp_path) as c:
            h = {**auth(), "Idempotency-Key": "fox-1"}
            first = await (await c.client.post("/v1/jobs", json=BODY, headers=h)).json()
            again = await c.client.post("/v1/jobs", json=BODY, headers=h)
            assert again.status == 200 and (await again.json())["job_id"] == first["job_id"]
            assert len(c.commands(SubmitJob)) == 1
            assert c.commands(SubmitJob)[0].idempotency_key == "fox-1"
            # the projection moved on (admitted, queued): still the same job
            spec = c.commands(SubmitJob)[0].spec
            c.fold_in(
                [
                    JobAdmitted(event_id="adm", ts_ms=2, spec=spec, cell="cell-0"),
                    JobQueued(
                        event_id="q", ts_ms=3, job_id=spec.job_id, tenant="acme", tier="free"
                    ),
                ]
            )
            again = await c.client.post("/v1/jobs", json=BODY, headers=h)
            assert again.status == 200 and (await again.json())["state"] == "QUEUED"
            changed = await c.client.post("/v1/jobs", json={**BODY, "prompt": "a cat"}, headers=h)
            assert changed.status == 409
            err = (await changed.json())["error"]
            assert err["code"] == "idempotency_key_reused" and err["field"] == "Idempotency-Key"
            other = await c.client.post(
                "/v1/jobs", json=BODY, headers={**auth(BOB), "Idempotency-Key": "fox-1"}
            )
            assert other.status == 202 and (await other.json())["job_id"] != first["job_id"]
            concurrent = await asyncio.gather(
                *(
                    c.client.post(
                        "/v1/jobs", json=BODY, headers={**auth(), "Idempotency-Key": "k2"}
                    )
                    for _ in range(5)
                )
            )
            ids = {(await r.json())["job_id"] for r in concurrent}
            assert len(ids) == 1 and len(c.commands(SubmitJob)) == 3

    run(go())


def test_a_job_the_projection_stored_first_is_answered_with_the_projections_state(tmp_path):
    """The provisional view is inserted after SubmitJob is delivered; if the
    projection folded the job's first events in between, the 202 names the
    state it stored (not SUBMITTED) and the stored view is kept."""

    async def go():
        async with api(tmp_path) as c:
            send = c.producer.send

            async def send_then_fold(topic, key, value, partition=None, headers=None):
                delivered = await send(topic, key, value, partition, headers)
                spec = codec.decode(value).spec
                c.fold_in(
                    [
                        JobAdmitted(event_id="adm", ts_ms=2, spec=spec, cell="cell-0"),
                        JobQueued(
                            event_id="q", ts_ms=3, job_id=spec.job_id, tenant="acme", tier="free"
                        ),
                    ]
                )
                return delivered

            c.producer.send = send_then_fold
            r = await c.client.post("/v1/jobs", json=BODY, headers=auth())
            assert r.status == 202, await r.text()
            body = await r.json()
            assert body["state"] == "QUEUED"
            assert c.store.get(body["job_id"]).state == "QUEUED"

    run(go())


def test_tenant_isolation(tmp_path):
    async def go():
        async with api(tmp_path) as c:
            job = await (await c.client.post("/v1/jobs", json=BODY, headers=auth())).json()
            url = job["status_url"]
            for method, path in (
                ("GET", url),
                ("DELETE", url),
                ("GET", url + "/result"),
                ("GET", url + "/events"),
            ):
                r = await c.client.request(method, path, headers=auth(BOB))
                assert r.status == 404, (method, path)
                assert (await r.json())["error"]["code"] == "job_not_found"
            unknown = await c.client.get("/v1/jobs/job_nope", headers=auth(BOB))
            assert (
                await unknown.json()
                == await (await c.client.get("/v1/jobs/job_nope", headers=auth(BOB))).json()
            )
            assert (await (await c.client.get("/v1/jobs", headers=auth(BOB))).json())["jobs"] == []
            assert c.commands(CancelJob) == []
            r = await c.client.get("/v1/jobs?tenant=acme", headers=auth(BOB))
            assert r.status == 403

    run(go())


@pytest.mark.parametrize(
    "body,status,field",
    [
        ({**BODY, "prompt": ""}, 422, "prompt"),
        ({**BODY, "gpus": 100}, 422, "gpus"),
        ({**BODY, "params": {"fps": 120}}, 422, "params.fps"),
        ({**BODY, "tier": "enterprise"}, 403, "tier"),  # Bob's tenant has only "free"
        ({**BODY, "callback_url": "http://10.0.0.1/h"}, 422, "callback_url"),
    ],
)
def test_invalid_bodies_name_the_field(tmp_path, body, status, field):
    async def go():
        async with api(tmp_path) as c:
            r = await c.client.post("/v1/jobs", json=body, headers=auth(BOB))
            assert r.status == status
            err = (await r.json())["error"]
            assert err["field"] == field and err["message"]
            assert c.producer.sent == []

    run(go())


def test_malformed_unauthenticated_and_oversized_requests(tmp_path):
    async def go():
        async with api(tmp_path, max_body_bytes=1024) as c:
            r = await c.client.post("/v1/jobs", data=b"{nope", headers=auth())
            assert r.status == 400 and (await r.json())["error"]["code"] == "malformed_json"
            r = await c.client.post("/v1/jobs", json=BODY)
            assert r.status == 401 and (await r.json())["error"]["code"] == "unauthenticated"
            r = await c.client.post("/v1/jobs", json=BODY, headers=auth("acme-key.wrong"))
            assert r.status == 401
            r = await c.client.post("/v1/jobs", json={**BODY, "prompt": "x" * 2000}, headers=auth())
            assert r.status == 413 and (await r.json())["error"]["code"] == "body_too_large"
            r = await c.client.post(
                "/v1/jobs", json=BODY, headers={**auth(), "Idempotency-Key": "has space"}
            )
            assert r.status == 422
            r = await c.client.get("/nowhere")
            assert r.status == 404 and "error" in await r.json()

    run(go())


def test_log_unavailable_is_503_and_stores_nothing(tmp_path):
    async def go():
        async with api(tmp_path) as c:
            c.producer.fail_with = RuntimeError("broker down")
            r = await c.client.post("/v1/jobs", json=BODY, headers=auth())
            assert r.status == 503
            assert (await (await c.client.get("/v1/jobs", headers=auth())).json())["jobs"] == []

    run(go())


def test_cancel_writes_a_command_and_terminal_jobs_conflict(tmp_path):
    async def go():
        async with api(tmp_path) as c:
            job = await (await c.client.post("/v1/jobs", json=BODY, headers=auth())).json()
            r = await c.client.delete(job["status_url"], headers=auth())
            assert r.status == 202 and (await r.json())["cancel_requested"] is True
            [cancel] = c.commands(CancelJob)
            assert cancel.job_id == job["job_id"] and cancel.tenant == "acme"
            events = lifecycle(job["job_id"])
            c.fold_in(events)
            r = await c.client.delete(job["status_url"], headers=auth())
            assert r.status == 409 and (await r.json())["error"]["code"] == "job_terminal"

    run(go())


def test_listing_filters_by_state_and_pages(tmp_path):
    async def go():
        async with api(tmp_path) as c:
            for i in range(5):
                c.fold_in(
                    lifecycle(f"job-{i}", ts0=1_000 + i, outcome="COMPLETED" if i % 2 else "FAILED")
                )
            page = await (await c.client.get("/v1/jobs?limit=2", headers=auth())).json()
            assert [j["job_id"] for j in page["jobs"]] == ["job-4", "job-3"]
            rest = await (
                await c.client.get(
                    f"/v1/jobs?limit=10&cursor={page['next_cursor']}", headers=auth()
                )
            ).json()
            assert [j["job_id"] for j in rest["jobs"]] == ["job-2", "job-1", "job-0"]
            done = await (await c.client.get("/v1/jobs?state=completed", headers=auth())).json()
            assert [j["job_id"] for j in done["jobs"]] == ["job-3", "job-1"]
            for q, field in (
                ("state=BOGUS", "state"),
                ("limit=0", "limit"),
                ("limit=x", "limit"),
                ("cursor=abc", "cursor"),
            ):
                r = await c.client.get(f"/v1/jobs?{q}", headers=auth())
                assert r.status == 422 and (await r.json())["error"]["field"] == field

    run(go())


def test_result_is_a_signed_expiring_url_and_tampering_is_refused(tmp_path):
    async def go():
        async with api(tmp_path, result_url_ttl_s=60) as c:
            job_id = "job-r"
            events = lifecycle(job_id)
            c.fold_in(events[:4])
            r = await c.client.get(f"/v1/jobs/{job_id}/result", headers=auth())
            assert r.status == 409 and (await r.json())["error"]["code"] == "not_completed"
            c.fold_in(events)
            video = tmp_path / "video.mp4"
            video.write_bytes(b"\x00\x00\x00\x18ftypmp42 fake video")
            c.artifacts.put_file(c.store.get(job_id).artifact_uri.removeprefix("local://"), video)
            r = await c.client.get(f"/v1/jobs/{job_id}/result", headers=auth())
            assert r.status == 200
            result = await r.json()
            parts = urlsplit(result["url"])
            path_q = f"{parts.path}?{parts.query}"
            got = await c.client.get(path_q)  # no API key: the URL is the auth
            assert got.status == 200 and await got.read() == video.read_bytes()
            tampered = path_q.replace("sig=", "sig=0")
            assert (await c.client.get(tampered)).status == 403
            other = path_q.replace("video.mp4", "other.mp4")
            assert (await c.client.get(other)).status == 403
            longer = path_q.replace("expires=", "expires=9")
            assert (await c.client.get(longer)).status == 403
            c.now[0] += 61
            expired = await c.client.get(path_q)
            assert (
                expired.status == 403 and (await expired.json())["error"]["code"] == "bad_signature"
            )
            redirect = await c.client.get(
                f"/v1/jobs/{job_id}/result?redirect=1", headers=auth(), allow_redirects=False
            )
            assert redirect.status == 302 and "/v1/artifacts/" in redirect.headers["Location"]

    run(go())


def test_cluster_health_metrics_and_openapi(tmp_path):
    async def go():
        async with api(tmp_path, operator_key="ops-key") as c:
            cv = cluster.apply(None, cell_status("cell-0", 1_000, busy=3))
            c.store.commit(Batch(cells=dict(cv.cells)))
            doc = await (await c.client.get("/v1/cluster", headers=auth())).json()
            assert doc["totals"]["busy"] == 3 and doc["queues"]["by_tier"]["free"]["queued"] == 4
            assert (await c.client.get("/v1/cluster")).status == 401
            assert (await (await c.client.get("/healthz")).json())["status"] == "ok"
            await c.client.post("/v1/jobs", json=BODY, headers=auth())
            text = await (
                await c.client.get("/metrics", headers={"Authorization": "Bearer ops-key"})
            ).text()
            assert 'framespool_api_submits_total{outcome="accepted",tier="free"} 1.0' in text
            assert "framespool_api_requests_total" in text and "framespool_api_sse_clients" in text
            spec = await (await c.client.get("/openapi.json")).json()
            assert "/v1/jobs/{job_id}/events" in spec["paths"]

    run(go())


def test_background_tasks_start_and_stop_with_the_app(tmp_path):
    stopped = []

    async def go():
        flags = {"ran": False}

        async def worker():
            flags["ran"] = True
            try:
                await asyncio.sleep(3600)
            finally:
                stopped.append(True)

        async with api(tmp_path, background=(worker,)) as c:
            await asyncio.sleep(0.01)
            assert flags["ran"]
            assert (await c.client.get("/healthz")).status == 200
        assert stopped == [True]

    run(go())


def test_projection_consumer_wires_into_the_app(tmp_path):
    async def go():
        async with api(tmp_path) as c:
            consumer = ProjectionConsumer(
                c.store, hub=c.config.hub, dead_letter_sender=MemoryProducer()
            )
            job = await (await c.client.post("/v1/jobs", json=BODY, headers=auth())).json()
            cmd = c.commands(SubmitJob)[0]
            admitted = JobAdmitted(event_id="adm", ts_ms=2, spec=cmd.spec, cell="cell-0")
            await consumer.handle(records_for([admitted]))
            view = await (await c.client.get(job["status_url"], headers=auth())).json()
            assert view["cell"] == "cell-0" and view["timeline"][0]["type"] == "JobAdmitted"
            assert json.dumps(view)

    run(go())
