"""A nearly full disk: new jobs get 503 disk_full with Retry-After and nothing is
written, while what is stored stays readable; space freed, submits resume."""

from __future__ import annotations

import asyncio

import pytest

from framespool.producers.diskguard import MB, DiskGuard, free_bytes
from framespool.schemas.topics import COMMANDS
from tests.support.api import BODY, api, auth


def test_submits_are_refused_on_a_full_disk_and_reads_go_on(tmp_path):
    free = [500 * MB]
    clock = [0.0]
    guard = DiskGuard(tmp_path, min_free_mb=100, measure=lambda _p: free[0], clock=lambda: clock[0])

    async def go():
        async with api(tmp_path, disk_guard=guard) as c:
            r = await c.client.post("/v1/jobs", json=BODY, headers=auth())
            assert r.status == 202
            stored = (await r.json())["job_id"]
            free[0] = 40 * MB
            clock[0] += 1.0
            r = await c.client.post("/v1/jobs", json=BODY, headers=auth())
            assert r.status == 503
            assert r.headers["Retry-After"] == "30"
            error = (await r.json())["error"]
            assert error["code"] == "disk_full"
            assert "40 MB free" in error["message"] and "100 MB" in error["message"]
            assert len(c.producer.on(COMMANDS.name)) == 1  # nothing written
            got = await c.client.get(f"/v1/jobs/{stored}", headers=auth())
            assert got.status == 200  # what is stored stays readable
            free[0] = 300 * MB
            clock[0] += 1.0
            r = await c.client.post("/v1/jobs", json=BODY, headers=auth())
            assert r.status == 202

    asyncio.run(go())


def test_the_guard_reads_the_real_disk_at_most_once_an_interval(tmp_path):
    calls = []
    clock = [0.0]

    def measure(path):
        calls.append(path)
        return free_bytes(path)

    generous = DiskGuard(tmp_path, min_free_mb=1, measure=measure, clock=lambda: clock[0])
    assert generous.refusal() is None
    assert generous.refusal() is None
    assert len(calls) == 1
    clock[0] += 1.0
    generous.refusal()
    assert len(calls) == 2
    beyond = free_bytes(tmp_path) // MB + 1024  # more than this disk has
    assert "refused" in DiskGuard(tmp_path, min_free_mb=beyond).refusal()
    assert DiskGuard(tmp_path, min_free_mb=0, measure=lambda _p: 0).refusal() is None
    with pytest.raises(ValueError, match="min_free_mb"):
        DiskGuard(tmp_path, min_free_mb=-1)
