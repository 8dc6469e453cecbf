"""A node's place in a run: alone, or one rank of a multi-node gang.

A ``StartRun`` lists the gang's nodes in ``placement``; this node's rank is
its index there, and the generator learns its rank, the world size and its
peers (``FRAMESPOOL_RANK``, ``FRAMESPOOL_WORLD_SIZE``, ``FRAMESPOOL_PEERS``,
``FRAMESPOOL_MASTER``; see the README). No member starts its generator before
the scheduler's ``BeginRun`` says every member holds its GPUs (the start
barrier, :mod:`execution`). Every rank writes its output and checkpoints
under its own keys (``.../ranks/{rank}/...``) and reports each checkpoint with
its step; the scheduler resumes the gang from the latest step every rank
checkpointed, each rank from its own file of that step. One declared rank
(the profile's ``result_rank``, 0 by default) speaks for the job:

1. only that rank reports ``RunCompleted`` (its output is the job's result);
2. another rank whose generator exits 0 uploads its output if it wrote one,
   need not write one, and holds the run (listed in heartbeats) until the
   scheduler ends the gang with ``StopRun``; it then reports ``RunStopped``;
3. any rank that fails reports ``RunFailed``: a member's crash fails the gang.

A run on one node (or a placement of one) keeps the plain run keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from framespool.schemas.events import StartRun


class GangError(ValueError):
    """This node cannot take its place in the gang (the scheduler's or the profile's fault)."""


@dataclass(frozen=True, slots=True)
class Membership:
    rank: int
    world_size: int
    result_rank: int = 0
    peers: tuple[str, ...] = ()  # the gang's node ids in rank order (empty alone)

    @property
    def gang(self) -> bool:
        return self.world_size > 1

    @property
    def speaks_for_job(self) -> bool:
        return not self.gang or self.rank == self.result_rank

    @property
    def master(self) -> str:
        """Rank 0's node id, where a gang's collectives rendezvous ("" alone)."""
        return self.peers[0] if self.peers else ""

    @property
    def key_rank(self) -> int | None:
        """The rank in artifact keys; ``None`` keeps a lone run's plain keys."""
        return self.rank if self.gang else None


def membership(cmd: StartRun, node_id: str, result_rank: int = 0) -> Membership:
    """This node's place in ``cmd``; raises :class:`GangError` with the reason."""
    nodes = [s.node_id for s in cmd.placement]
    if len(nodes) <= 1:
        return Membership(0, 1)
    if node_id not in nodes:
        raise GangError(
            f"node {node_id} is not in the placement of job {cmd.spec.job_id} run {cmd.run}"
            f" ({', '.join(nodes)})"
        )
    if result_rank >= len(nodes):
        raise GangError(
            f"the profile's result_rank {result_rank} is not a rank of a gang of"
            f" {len(nodes)} nodes; lower result_rank"
        )
    return Membership(nodes.index(node_id), len(nodes), result_rank, tuple(nodes))
