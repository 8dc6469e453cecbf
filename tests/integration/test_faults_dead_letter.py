"""Malformed records land in dead-letter with a reason; processing goes on.

Undecodable records (bad magic, unknown schema fingerprint, garbage body,
truncated) and misplaced valid events (wrong type, another cell's Tick) are
written to the scheduler topic; each must reach dead-letter with its original
value and a ``reason`` header, and a job submitted afterwards still completes.
The same kinds written to the other consumed topics (commands, assignments,
job-events, progress) must be dead-lettered by their consumers too.
"""

from __future__ import annotations

import pytest

from framespool.chaos.accounting import dead_letter_check
from framespool.chaos.drill import LogTail, chaos_stack
from framespool.chaos.malformed import malformed_records
from framespool.log import LogProducer
from framespool.producers.client import Client
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def stack_config(tmp_path_factory):
    """The drill's stack (no admission rate limit, the drill's leases); tests/conftest.py
    starts it as ``stack``."""
    return chaos_stack(tmp_path_factory.mktemp("dead-letter"), nodes=1).config


def inject(stack, records) -> None:
    with LogProducer(stack.bootstrap_servers) as producer:
        for m in records:
            producer.produce(m.topic, m.key, m.value, m.partition)


def test_malformed_scheduler_records_are_dead_lettered_and_processing_continues(stack):
    records = [
        m
        for m in malformed_records(catalogue, "node-0", "sched")
        if m.topic == catalogue.SCHEDULER.name
    ]
    assert {m.kind for m in records} >= {
        "bad_magic",
        "unknown_fingerprint",
        "malformed_body",
        "truncated",
        "wrong_type",
        "wrong_cell",
    }
    inject(stack, records)
    c = Client(stack.api_url, stack.tenant_keys[0]["api_key"])
    job = c.submit(
        prompt="after the garbage",
        model="demo",
        params={
            "steps": 5,
            "seconds_per_step": 1,
            "duration_s": 1,
            "fps": 4,
            "resolution": "64x64",
        },
    )
    with LogTail(stack.bootstrap_servers) as tail:
        tail.wait_for(lambda t: t.first(ev.JobCompleted, job_id=job["job_id"]), 30, "completion")
        dead = tail.wait_for(
            lambda t: [r for r in t.records if r.topic == catalogue.DEAD_LETTER.name] or None, 10
        )
        check = dead_letter_check(records, dead)
        assert check["missing"] == [], check
        by_value = {r.value: r for r in dead}
        for m in records:
            r = by_value[m.value]
            assert r.header("reason") and r.header("processor") == b"scheduler", r.headers
            assert r.header("source_topic") == catalogue.SCHEDULER.name.encode()
        assert set(check["reasons"]) >= {
            "bad_magic",
            "unknown_fingerprint",
            "truncated",
            "unexpected_type",
            "wrong_partition",
        }


def test_malformed_records_on_every_consumed_topic_reach_dead_letter(stack):
    records = [
        m
        for m in malformed_records(catalogue, "node-0", "all")
        if m.topic != catalogue.SCHEDULER.name
    ]
    assert {m.topic for m in records} == {
        catalogue.COMMANDS.name,
        catalogue.ASSIGNMENTS.name,
        catalogue.JOB_EVENTS.name,
        catalogue.PROGRESS.name,
    }
    inject(stack, records)
    with LogTail(stack.bootstrap_servers, names=("DEAD_LETTER",)) as tail:
        tail.wait_for(
            lambda t: not dead_letter_check(records, t.records)["missing"],
            20,
            "every malformed record in dead-letter",
        )
        assert all(r.header("reason") for r in tail.records)
