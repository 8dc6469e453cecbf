"""The submit path's health as the API sees it (``producers.metrics.AdmissionWatch``):
a job the API accepted counts until the projection shows its admission back
from the log, and the oldest one's age is a gauge an operator alarms on. It
grows whichever part stops (admission, a cell, job-events, the API's own fold,
a projection consumer that stops fetching included)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from aiohttp.test_utils import TestClient, TestServer

from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, record_for
from framespool.projections.hub import Hub
from framespool.projections.jobs import TimelineEntry
from framespool.projections.store import InMemoryViewStore

KEY = "acme-key.s"
OPERATOR = "operator-secret"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FailingProducer(MemoryProducer):
    async def send(self, *a, **kw):
        raise RuntimeError("broker down")


def gauges(text: str) -> dict[str, float]:
    wanted = ("framespool_api_unadmitted_jobs", "framespool_api_oldest_unadmitted_seconds")
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[name] = float(value)
    return out


def test_accepted_jobs_count_until_the_log_shows_them_back_and_the_oldest_ages():
    clock, hub, store = Clock(), Hub(), InMemoryViewStore()
    config = ApiConfig(
        auth=ApiKeys([record_for(KEY, "acme", "alice")]),
        store=store,
        producer=MemoryProducer(),
        hub=hub,
        dashboard_dir=None,
        monotonic=clock,
        operator_key=OPERATOR,
    )
    auth = {"Authorization": f"Bearer {KEY}"}

    async def main() -> list[dict[str, float]]:
        seen = []
        async with TestClient(TestServer(make_app(config))) as client:

            async def scrape() -> dict[str, float]:
                r = await client.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR}"})
                return gauges(await r.text())

            seen.append(await scrape())  # nothing accepted yet
            jobs = []
            for _ in range(2):
                r = await client.post(
                    "/v1/jobs", json={"prompt": "a fox", "model": "demo"}, headers=auth
                )
                assert r.status == 202
                jobs.append((await r.json())["job_id"])
                clock.now += 10
            seen.append(await scrape())  # both waiting: the first for 20 s
            # the projection publishes the first job's view, its admission read from the log
            view = store.get(jobs[0])
            entry = TimelineEntry(1, "cell@1/0", 1, "JobAdmitted", "SUBMITTED", "admitted")
            hub.publish(jobs[0], replace(view, timeline=(entry,)))
            seen.append(await scrape())  # the second is the oldest now: 10 s
            hub.publish(jobs[1], view)  # a view without a timeline entry shows nothing back
            seen.append(await scrape())
        return seen

    seen = asyncio.run(main())
    unadmitted = "framespool_api_unadmitted_jobs"
    oldest = "framespool_api_oldest_unadmitted_seconds"
    assert [s[unadmitted] for s in seen] == [0, 2, 1, 1]
    assert [s[oldest] for s in seen] == [0, 20, 10, 10]


def test_a_submit_that_could_not_be_written_is_not_waited_for():
    config = ApiConfig(
        auth=ApiKeys([record_for(KEY, "acme", "alice")]),
        store=InMemoryViewStore(),
        producer=FailingProducer(),
        dashboard_dir=None,
        operator_key=OPERATOR,
    )

    async def main() -> dict[str, float]:
        async with TestClient(TestServer(make_app(config))) as client:
            r = await client.post(
                "/v1/jobs",
                json={"prompt": "a fox", "model": "demo"},
                headers={"Authorization": f"Bearer {KEY}"},
            )
            assert r.status == 503
            m = await client.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR}"})
            return gauges(await m.text())

    assert asyncio.run(main())["framespool_api_unadmitted_jobs"] == 0
