"""The API and its projection on a real broker: submit writes a command, the log drives the view."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from framespool.log import LogProducer, read_all
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, record_for
from framespool.projections.service import ProjectionService
from framespool.schemas import codec
from framespool.schemas.events import JobAdmitted, RunProgress, SubmitJob
from tests.support.projections import key_of, lifecycle

pytestmark = pytest.mark.integration
KEY = "acme-key.secret"
H = {"Authorization": f"Bearer {KEY}"}


def test_submit_then_log_events_drive_status_and_sse(kafka_bootstrap, fresh_topics, tmp_path):
    async def go():
        producer = LogProducer(kafka_bootstrap)
        service = ProjectionService.open(
            tmp_path,
            kafka_bootstrap,
            producer,
            job_events=fresh_topics.JOB_EVENTS.name,
            progress=fresh_topics.PROGRESS.name,
            dead_letter=fresh_topics.DEAD_LETTER.name,
        )
        config = ApiConfig(
            auth=ApiKeys([record_for(KEY, "acme", "alice")]),
            store=service.store,
            hub=service.hub,
            producer=producer,
            commands_topic=fresh_topics.COMMANDS.name,
            background=service.background,
        )
        try:
            async with TestClient(TestServer(make_app(config))) as client:
                r = await client.post(
                    "/v1/jobs",
                    json={"prompt": "a fox", "model": "demo"},
                    headers={**H, "Idempotency-Key": "it-1"},
                )
                assert r.status == 202
                job_id = (await r.json())["job_id"]
                [record] = await asyncio.to_thread(
                    read_all, kafka_bootstrap, fresh_topics.COMMANDS.name
                )
                command = codec.decode(record.value)
                assert isinstance(command, SubmitJob) and record.key == b"acme"

                # what admission, the scheduler and an agent would write
                events = lifecycle(job_id)
                events[0] = JobAdmitted(
                    event_id=f"{job_id}:0", ts_ms=events[0].ts_ms, spec=command.spec, cell="cell-0"
                )
                with LogProducer(kafka_bootstrap) as writer:
                    for e in events:
                        topic = (
                            fresh_topics.PROGRESS
                            if isinstance(e, RunProgress)
                            else fresh_topics.JOB_EVENTS
                        )
                        writer.produce(topic.name, key_of(e), codec.encode(e))
                        writer.flush()
                        await asyncio.sleep(0.02)

                stream = await client.get(f"/v1/jobs/{job_id}/events", headers=H)
                frames = []
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    line = await asyncio.wait_for(stream.content.readline(), 30)
                    if line.startswith(b"event: "):
                        frames.append(line[7:].strip().decode())
                    if frames and frames[-1] == "end" or not line:
                        break
                assert frames[0] == "JobAdmitted" and frames[-2:] == ["JobCompleted", "end"]
                job = await (await client.get(f"/v1/jobs/{job_id}", headers=H)).json()
                assert job["state"] == "COMPLETED" and job["cell"] == "cell-0"
                assert json.dumps(job)
                again = await client.post(
                    "/v1/jobs",
                    json={"prompt": "a fox", "model": "demo"},
                    headers={**H, "Idempotency-Key": "it-1"},
                )
                assert again.status == 200 and (await again.json())["state"] == "COMPLETED"
        finally:
            service.close()
            producer.close()

    asyncio.run(go())
