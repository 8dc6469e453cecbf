"""The agent's self-healing shell: a node declared DOWN registers again by itself.

The decision (is this a DOWN of the current incarnation, and when may it
register again) is :class:`~framespool.agents.liveness.Liveness`'s (no IO); this
mixin of :class:`~framespool.agents.agent.NodeAgent` carries it out (see
:meth:`Healing._heal` for the order).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from framespool.agents.liveness import Heal
from framespool.schemas.events import NodeStateChanged

if TYPE_CHECKING:  # pragma: no cover
    from framespool.agents.execution import RunExecution
    from framespool.agents.ledger import RunLedger
    from framespool.agents.liveness import Liveness

log = logging.getLogger("framespool.agents.agent")

HEAL_STOP_WAIT_S = 30.0  # how long a healing node waits for its old runs to end


def next_incarnation(data_dir: Path, requested: int | None = None) -> int:
    """A number greater than every incarnation this node used before, persisted."""
    path = data_dir / "incarnation"
    try:
        previous = int(path.read_text().strip())
    except (OSError, ValueError):
        previous = 0
    value = requested if requested is not None else max(previous + 1, int(time.time() * 1000))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(max(value, previous)))
    os.replace(tmp, path)
    return value


class Healing:
    if TYPE_CHECKING:  # pragma: no cover
        # What the mixin uses of its NodeAgent (declared here for the checker only:
        # NodeAgent defines them, and mypy checks its definitions against these).
        node_id: str
        data_dir: Path
        incarnation: int
        closing: bool
        healing: bool
        liveness: Liveness
        ledger: RunLedger
        _runs: dict[tuple[str, int], RunExecution]

        def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

        def _stop_run(self, key: tuple[str, int]) -> None: ...

        async def register(self) -> None: ...

    def on_node_state(self, event: NodeStateChanged) -> None:
        """The scheduler's word on this node's state (a ``NodeStateChanged`` on the
        node's assignments partition): a ``DOWN`` of the current incarnation starts
        one re-registration (see :mod:`liveness`)."""
        if self.closing:
            return
        verdict = self.liveness.on_node_state(event, time.monotonic())
        if verdict.action is Heal.REREGISTER:
            log.warning(
                "agent %s incarnation %d: %s; registering again",
                self.node_id,
                self.incarnation,
                verdict.reason,
            )
            self.spawn(self._heal(verdict.not_before_s, verdict.reason), "heal")

    async def _heal(self, not_before_s: float, reason: str) -> None:
        """Stop the old incarnation's runs, then register as incarnation + 1.

        1. heartbeats pause (the old incarnation's would only be ignored);
        2. after the backoff, the ledger takes the new incarnation: instructions
           for the old one are fenced from now on;
        3. the old runs are stopped, and waited for (bounded), so that no new run
           is placed on GPUs an old process still holds;
        4. ``NodeRegistered`` of the new incarnation; heartbeats resume.
        """
        self.healing = True
        try:
            delay = not_before_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            new = next_incarnation(self.data_dir, self.incarnation + 1)
            old = self.incarnation
            over = self.ledger.reincarnate(new, f"node declared DOWN as incarnation {old}")
            for key in over:
                self._stop_run(key)
            deadline = time.monotonic() + HEAL_STOP_WAIT_S
            while any(k in self._runs for k in over) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            left = [k for k in over if k in self._runs]
            if left:
                log.warning(
                    "agent %s: runs %s of incarnation %d still ending; registering anyway",
                    self.node_id,
                    left,
                    old,
                )
            self.incarnation = new
            if self.closing:
                return
            await self.register()
            log.warning(
                "agent %s healed: incarnation %d -> %d (%s); stopped %d old run(s)",
                self.node_id,
                old,
                new,
                reason,
                len(over),
            )
        finally:
            self.healing = False
