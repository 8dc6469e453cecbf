"""In-process pub/sub for SSE: one bounded queue per client, keyed by job id.

``publish`` never blocks and never fails because of a client: a subscriber whose
queue is full is dropped (its queue is cleared and ends with ``DROPPED``), the
hub and the other clients carry on. A dropped client reconnects with
``Last-Event-ID`` and resumes from the job's timeline, so nothing is lost.
"""

from __future__ import annotations

import asyncio
from typing import Any

DEFAULT_QUEUE_SIZE = 64


class SlowSubscriber(Exception):
    """The client did not keep up; it was dropped and should reconnect."""


class _Dropped:
    def __repr__(self) -> str:
        return "DROPPED"


DROPPED = _Dropped()


class Subscription:
    def __init__(self, hub: Hub, key: str, maxsize: int) -> None:
        self.key = key
        self.queue: asyncio.Queue = asyncio.Queue(maxsize)
        self.dropped = False
        self._hub = hub

    async def get(self, timeout: float | None = None) -> Any | None:
        """The next item, or None after ``timeout`` seconds; SlowSubscriber if dropped."""
        try:
            item = await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return None
        if item is DROPPED:
            raise SlowSubscriber(self.key)
        return item

    def close(self) -> None:
        self._hub._remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Hub:
    def __init__(self, queue_size: int = DEFAULT_QUEUE_SIZE) -> None:
        self.queue_size = queue_size
        self._subs: dict[str, set[Subscription]] = {}
        self.dropped_total = 0

    def subscribe(self, key: str, maxsize: int | None = None) -> Subscription:
        sub = Subscription(self, key, maxsize or self.queue_size)
        self._subs.setdefault(key, set()).add(sub)
        return sub

    def publish(self, key: str, item: Any) -> int:
        """Offer ``item`` to every subscriber of ``key``; returns how many took it."""
        taken = 0
        for sub in list(self._subs.get(key, ())):
            try:
                sub.queue.put_nowait(item)
                taken += 1
            except asyncio.QueueFull:
                self._drop(sub)
        return taken

    @property
    def subscribers(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def _drop(self, sub: Subscription) -> None:
        self._remove(sub)
        sub.dropped = True
        self.dropped_total += 1
        while not sub.queue.empty():
            sub.queue.get_nowait()
        sub.queue.put_nowait(DROPPED)

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.key]
