"""One dead-letter vocabulary (``framespool.schemas.deadletter``): the processors,
the projections and the node agent dead-letter the same bad records with the same
reasons under the same headers, whoever reads them."""

from __future__ import annotations

import asyncio

from framespool.agents.agent import NodeAgent
from framespool.log import Record
from framespool.log.memory import MemoryProducer
from framespool.processors.routing import decode_input
from framespool.processors.scheduler import SCHEDULER_INPUTS
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.store import InMemoryViewStore
from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas import topics as catalogue
from framespool.schemas.deadletter import DeadLetterHeader, DeadLetterReason

SUBMIT = ev.SubmitJob(event_id="s", ts_ms=0, spec=ev.JobSpec(job_id="j1", tenant="t"))
BAD = [
    (b"\xc3\x01\x00", DeadLetterReason.TRUNCATED),
    (b"nope-not-avro", DeadLetterReason.BAD_MAGIC),
    (None, DeadLetterReason.NO_VALUE),
    (codec.encode(SUBMIT), DeadLetterReason.UNEXPECTED_TYPE),  # nobody below folds it
]


def records(topic: str) -> list[Record]:
    return [
        Record(topic, 0, 10 + i, b"n0", value, (("trace", b"t-1"),))
        for i, (value, _) in enumerate(BAD)
    ]


def processor_letters() -> list[tuple[tuple[str, bytes], ...]]:
    out = []
    for rec in records(catalogue.SCHEDULER.name):
        _, dl = decode_input(rec, SCHEDULER_INPUTS, "scheduler")
        out.append(dl.headers)
    return out


def projection_letters() -> list[tuple[tuple[str, bytes], ...]]:
    dlq = MemoryProducer()
    consumer = ProjectionConsumer(InMemoryViewStore(), dead_letter_sender=dlq)
    asyncio.run(consumer.handle(records(catalogue.JOB_EVENTS.name)))
    return [tuple(s.headers) for s in dlq.on(catalogue.DEAD_LETTER.name)]


def agent_letters(tmp_path) -> list[tuple[tuple[str, bytes], ...]]:
    dlq = MemoryProducer()
    agent = NodeAgent("n0", "cell-0", "unused:9092", None, None, {}, tmp_path)
    agent._producer = dlq

    async def feed() -> None:
        for rec in records(catalogue.ASSIGNMENTS.name):
            await agent._handle_record(rec)

    asyncio.run(feed())
    return [tuple(s.headers) for s in dlq.on(catalogue.DEAD_LETTER.name)]


def test_every_process_dead_letters_with_the_same_reasons_and_headers(tmp_path):
    names = [h.value for h in DeadLetterHeader]
    for who, letters, processor in [
        ("processor", processor_letters(), b"scheduler"),
        ("projections", projection_letters(), b"projections"),
        ("agent", agent_letters(tmp_path), catalogue.agent_group("n0").encode()),
    ]:
        assert len(letters) == len(BAD), who
        for (_, reason), headers in zip(BAD, letters):
            # the record's own headers first, then the vocabulary's, in table order
            assert [k for k, _ in headers] == ["trace", *names], who
            got = dict(headers)
            assert got["reason"] == reason.encode(), (who, got)
            assert got["processor"] == processor, who
            assert got["source_partition"] == b"0" and got["source_offset"].isdigit(), who
            assert got["detail"], who


def test_decode_errors_speak_the_dead_letter_vocabulary():
    for value, reason in BAD[:2]:
        try:
            codec.decode(value)
        except codec.DecodeError as exc:
            assert DeadLetterReason(exc.reason) is reason
        else:  # pragma: no cover
            raise AssertionError(value)
    assert {
        codec.TRUNCATED,
        codec.BAD_MAGIC,
        codec.UNKNOWN_FINGERPRINT,
        codec.MALFORMED_BODY,
    } < set(DeadLetterReason)
