"""One agent process hosting one or many nodes: the shared IO of their agents.

Theory of operation
-------------------
A real GPU node has its own agent process (a host of one). Simulated nodes
can share a process (``--nodes-per-agent``) so that a benchmark measures the
control plane rather than the number of Python processes; each hosted node
keeps its own node id, incarnation, :class:`~framespool.agents.ledger.RunLedger`,
scheduler-epoch fence, runs and data directory (:class:`NodeAgent`), and only
the IO is shared:

1. one producer: every node's reports, progress and heartbeats; the reports
   that answer one poll's instructions are written together and acknowledged
   before the poll's positions are committed;
2. one reader of the assignments partitions the nodes' ids hash to (their
   union; manual assignment, positions committed under the host's group,
   the fleet's fetch wait: ``framespool.log.Role.FLEET``).
   Each record is dispatched by its key to the one node it is for; a record
   keyed for a node this process does not host is skipped undecoded, so a
   record for node B never reaches node A's ledger. The scheduler also writes
   a node's own ``NodeStateChanged`` there (a ``DOWN`` starts its
   self-healing, :mod:`liveness`), so a host reads no job-events: it used to,
   and decoding every job event of its partitions cost it about a fifth of
   its CPU;
3. one heartbeat pass every ``heartbeat_s``: a ``NodeHeartbeat`` per
   registered node, queued together and delivered in the producer's batches.

Stop order: every node ends its generators, then the reader closes, then the
producer flushes and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from framespool.log import LogConsumer, LogError, LogProducer, Record, Role, partition_for_key
from framespool.schemas.topics import agent_group

if TYPE_CHECKING:  # pragma: no cover
    from framespool.agents.agent import NodeAgent

log = logging.getLogger(__name__)

RETRY_S = 1.0
POLL_RECORDS = 500
COMMIT_EVERY_S = 0.5  # positions are committed at most this often (redelivery is fenced)


def host_group(node_ids: Sequence[str]) -> str:
    """The consumer group a host commits its positions under: a host of one
    keeps the node's own group (``agent_group``)."""
    if len(node_ids) == 1:
        return agent_group(node_ids[0])
    return agent_group(f"{node_ids[0]}+{len(node_ids) - 1}")


class AgentHost:
    """The shared producer, readers and heartbeat pass of one process's node agents."""

    def __init__(
        self,
        agents: Sequence[NodeAgent],
        bootstrap: str,
        *,
        heartbeat_s: float | None = None,
        group_id: str | None = None,
    ) -> None:
        if not agents:
            raise ValueError("a host needs at least one node")
        ids = [a.node_id for a in agents]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids must be distinct: {ids}")
        self.agents = list(agents)
        self.bootstrap = bootstrap
        self.topics = agents[0].topics
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else agents[0].heartbeat_s
        self.group_id = group_id or host_group(ids)
        self.by_key: dict[bytes, NodeAgent] = {a.node_id.encode(): a for a in agents}
        self.assignment_partitions = sorted(
            {partition_for_key(a.node_id, self.topics.ASSIGNMENTS.partitions) for a in agents}
        )
        self.closing = False
        self._tasks: set[asyncio.Task] = set()
        self._producer: LogProducer | None = None
        self._assignments: LogConsumer | None = None
        # The reader blocks in its polls: it has its own thread, so it never holds
        # the default executor the runs' file work and uploads share.
        self._readers = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-host-read")
        self._pending: dict[str, dict[tuple[str, int], int]] = {}
        self._committed_at: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        """Open the producer, register every node, then read and beat."""
        self._producer = LogProducer(self.bootstrap, role=Role.FLEET)
        await asyncio.gather(*(a.open(self._producer) for a in self.agents))
        self._assignments = LogConsumer(self.bootstrap, group_id=self.group_id, role=Role.FLEET)
        start = await asyncio.to_thread(
            self._assignments.resume, self.topics.ASSIGNMENTS.name, self.assignment_partitions
        )
        log.info(
            "agent host of %d node(s) reads %s%s from %s under %s",
            len(self.agents),
            self.topics.ASSIGNMENTS.name,
            self.assignment_partitions,
            start,
            self.group_id,
        )
        self.spawn(self._consume_assignments(), "assignments")
        self.spawn(self._heartbeat_loop(), "heartbeat")

    async def stop(self) -> None:
        """End every node's generators, stop reading, flush, close."""
        if self.closing:
            return
        self.closing = True
        await asyncio.gather(*(a.close_runs() for a in self.agents), return_exceptions=True)
        pending = list(self._tasks)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 5.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._assignments is not None:
            await asyncio.to_thread(self._assignments.close)
        self._readers.shutdown(wait=False)
        if self._producer is not None:
            with contextlib.suppress(LogError):
                await asyncio.to_thread(self._producer.close, 10.0)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"agent-host-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent host task %s failed", task.get_name(), exc_info=task.exception())

    # -- reading ----------------------------------------------------------------
    def agent_for(self, record: Record) -> NodeAgent | None:
        """The hosted node a record is keyed for; a keyless record goes to the first
        node (which dead-letters what it cannot use), one for another node to none."""
        if record.key is None:
            return self.agents[0]
        return self.by_key.get(record.key)

    async def _consume_assignments(self) -> None:
        assert self._assignments is not None
        consumer = self._assignments
        while not self.closing:
            try:
                records = await self._read(consumer, 0.2)
            except LogError as e:
                log.warning("agent host: assignments: %s", e)
                await asyncio.sleep(RETRY_S)
                continue
            await self.dispatch(records)
            await self._commit(consumer, records, "assignments")
        await self._commit(consumer, (), "assignments", final=True)

    async def dispatch(self, records: Sequence[Record]) -> None:
        """Hand each assignments record to the node it is keyed for, in log order;
        the reports they answer with go out together and are all acknowledged
        before this returns (and before the positions are committed)."""
        acks: list[asyncio.Task] = []
        for record in records:
            agent = self.agent_for(record)
            if agent is None:
                continue  # another node's instruction shares this partition
            try:
                await agent._handle_record(record, acks)
            except Exception:  # one bad record must not stop the nodes' instructions
                log.exception(
                    "agent %s: %s[%d]@%d not handled",
                    agent.node_id,
                    record.topic,
                    record.partition,
                    record.offset,
                )
        if acks:
            await asyncio.gather(*acks, return_exceptions=True)

    async def _read(self, consumer: LogConsumer, timeout_s: float) -> list[Record]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, consumer.consume, POLL_RECORDS, timeout_s)

    async def _commit(
        self, consumer: LogConsumer, records: Sequence[Record], what: str, final: bool = False
    ) -> None:
        """Remember the positions after ``records``; write them at most every
        :data:`COMMIT_EVERY_S` (and on the way out), on the reader's own thread."""
        pending = self._pending.setdefault(what, {})
        for r in records:
            pending[(r.topic, r.partition)] = r.offset + 1
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not pending or (not final and now - self._committed_at.get(what, 0.0) < COMMIT_EVERY_S):
            return
        positions = dict(pending)
        pending.clear()
        self._committed_at[what] = now
        try:
            await loop.run_in_executor(self._readers, consumer.commit, positions)
        except LogError as e:  # redelivery after a restart is fenced by incarnation
            log.warning("agent host: %s commit failed: %s", what, e)

    # -- heartbeats -------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while not self.closing:
            for agent in self.agents:
                agent.beat()
            await asyncio.sleep(self.heartbeat_s)
