"""A fold and a journaling fake log for the snapshot and takeover tests (moved from
test_snapshots.py): ``ListFold`` keeps the values it saw; ``JournalConsumer`` and
``JournalProducer`` record, in order, what the runner asks of the log."""

from __future__ import annotations

from framespool.log import LogError, Record
from framespool.log.memory import MemoryConsumer, MemoryLog, MemoryProducer
from framespool.processors.routing import Outgoing

TOPIC = "in"


class ListFold:
    """A fold for tests: the state is the list of values seen; one output per record
    but b"silent" (none); the value b"boom" makes the fold raise."""

    name = "list"

    def new_state(self, partition: int) -> list:
        return []

    def adopt(self, state: list, partition: int) -> list:
        return state

    def step(self, state: list, record: Record) -> list[Outgoing]:
        if record.value == b"boom":
            raise RuntimeError("boom")
        state.append(record.value)
        if record.value == b"silent":
            return []
        return [
            Outgoing(
                "out", record.key, None, record.value, event=f"{record.partition}@{record.offset}"
            )
        ]

    def dead_letter(self, record: Record, reason: str, detail: str) -> Outgoing:
        return Outgoing(
            "dlq", record.key, None, record.value, (("reason", reason.encode()),), reason=reason
        )


def records(partition: int, start: int, values: list[bytes]) -> list[Record]:
    return [Record(TOPIC, partition, start + i, b"k", v) for i, v in enumerate(values)]


class Journal(list):
    pass


class JournalConsumer(MemoryConsumer):
    """The memory log's consumer, journaling what the runner asks of it. Each consume
    first appends the next scripted batch to the log; none left stops the runner."""

    def __init__(self, log: MemoryLog, journal: Journal, polls: list[list[Record]], stop, group):
        super().__init__(log, group)
        self.journal, self.polls, self.stop = journal, polls, stop

    def subscribe(self, topics, on_assign=None, on_revoke=None):
        def assigned(parts):
            self.journal.append("assigned")
            on_assign(parts)

        super().subscribe(topics, assigned, on_revoke)

    def consume(self, max_records=500, timeout=1.0):
        if not self.polls:
            self.stop.set()
            return []
        for r in self.polls.pop(0):
            landed = self.log.append(r.topic, r.key, r.value, r.partition, r.headers)
            assert landed.offset == r.offset, "the script's offsets follow the log's"
        return super().consume(max_records, timeout)

    def assign(self, topic, partitions, offsets=0):
        self.journal.append(f"seek {offsets}")
        super().assign(topic, partitions, offsets)

    def commit(self, positions):
        self.journal.append(f"commit {positions[(TOPIC, 0)]}")
        super().commit(positions)

    def close(self):
        super().close()  # revokes, like leaving the group
        self.journal.append("closed")


class JournalProducer(MemoryProducer):
    def __init__(self, log: MemoryLog, journal: Journal, fail_flush: bool = False):
        super().__init__(log)
        self.journal, self.fail_flush = journal, fail_flush

    def produce(self, topic, key, value, partition=None, headers=None, on_delivery=None):
        self.journal.append(f"produce {value.decode()}")
        super().produce(topic, key, value, partition, headers, on_delivery)

    def flush(self, timeout=30.0):
        if self.fail_flush:
            raise LogError("broker gone")
        self.journal.append("flush")

    def close(self, timeout=30.0):
        super().close(timeout)
        self.journal.append("producer closed")
