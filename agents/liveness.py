"""Self-healing: when a node learns it was declared DOWN, and when it registers again.

Theory of operation
-------------------
The scheduler declares a node ``DOWN`` (missed heartbeats, an unconfirmed stop)
with a ``NodeStateChanged`` keyed by the node id, on job-events and on the
node's assignments partition. From then on it ignores the node's reports as
stale and waits for a new registration. The agent reads it among its
instructions and hands each such event (already decoded, keyed for one of its
nodes) to :class:`Liveness`, which answers with one :class:`Verdict`:

1. an event for another node, or about one GPU (``gpu >= 0``), or with a state
   other than ``DOWN``, is ``IGNORE``;
2. a ``DOWN`` of an incarnation other than the current one is ``IGNORE``: an
   older one was healed already (a redelivery, or the event read again after a
   restart), a newer one is not this process's;
3. a second ``DOWN`` of the current incarnation while a re-registration is
   pending is ``IGNORE``: one re-registration per declaration;
4. otherwise ``REREGISTER``, not before ``not_before_s``: the first one at
   once, and after a registration that did not stay up ``STABLE_S`` the delay
   doubles from ``BACKOFF_S[0]`` up to ``BACKOFF_S[1]`` (a node the scheduler
   keeps declaring DOWN must not flood its cell with registrations).

The shell then stops the old incarnation's runs (the scheduler requeued them;
:meth:`RunLedger.reincarnate`), takes a new incarnation, registers, and calls
:meth:`Liveness.registered`. Pure: ``now_s`` (a monotonic clock) is an argument.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from framespool.schemas.events import NodeStateChanged
from framespool.schemas.states import NodeState

BACKOFF_S = (1.0, 30.0)  # first delay after a quick relapse, cap
STABLE_S = 60.0  # a registration that stayed up this long resets the backoff


class Heal(enum.Enum):
    IGNORE = "ignore"
    REREGISTER = "reregister"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Heal
    reason: str
    not_before_s: float = 0.0


class Liveness:
    """One node's view of its own registration, as the scheduler declared it."""

    def __init__(self, node_id: str, incarnation: int = 0, now_s: float = 0.0) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.registered_at_s = now_s
        self.delay_s = 0.0  # the delay the next relapse waits
        self.pending: int | None = None  # the DOWN incarnation a re-registration is due for
        self.heals = 0

    def registered(self, incarnation: int, now_s: float) -> None:
        """The node registered (at start or after a DOWN) as ``incarnation``."""
        self.incarnation = incarnation
        self.registered_at_s = now_s
        self.pending = None

    def on_node_state(self, event: NodeStateChanged, now_s: float) -> Verdict:
        if event.node_id != self.node_id:
            return Verdict(Heal.IGNORE, f"for node {event.node_id}")
        if event.gpu >= 0 or event.state != NodeState.DOWN:
            return Verdict(Heal.IGNORE, f"not a node DOWN ({event.state}, gpu {event.gpu})")
        if event.incarnation != self.incarnation:
            return Verdict(
                Heal.IGNORE,
                f"DOWN of incarnation {event.incarnation}, this node is {self.incarnation}",
            )
        if self.pending == event.incarnation:
            return Verdict(Heal.IGNORE, "re-registration already pending")
        if now_s - self.registered_at_s >= STABLE_S:
            self.delay_s = 0.0
        not_before = max(now_s, self.registered_at_s + self.delay_s)
        self.delay_s = min(max(self.delay_s * 2, BACKOFF_S[0]), BACKOFF_S[1])
        self.pending = event.incarnation
        self.heals += 1
        return Verdict(
            Heal.REREGISTER,
            f"declared DOWN as incarnation {event.incarnation}: {event.reason or 'no reason'}",
            not_before,
        )
