"""Server-sent events for one job: the backlog after ``Last-Event-ID``, then live.

Theory of operation
-------------------
The SSE id of an event is the timeline entry's per-job ``seq`` (1, 2, ...), so
a client that reconnects with ``Last-Event-ID: n`` gets exactly the entries
after ``n`` that the bounded timeline still holds. ``stream_job``:

1. subscribes to the hub *before* reading the view, so nothing committed in
   between is missed (a view seen twice sends nothing new: seq filters it);
2. sends the backlog (entries with seq > last id) from the stored view;
3. then, for every view the hub delivers, sends its entries newer than the
   last one sent; a comment line every ``keepalive_s`` keeps proxies open.
   Each event carries the job's status as of that view (``serde.job_status``:
   its state and, while it waits, why in words and as a code, its position
   and its P50/P90), so a client needs no second request to know where the
   job stands;
4. ends after the job's terminal entry, or when the hub drops the client
   for being slow (it reconnects and resumes from its Last-Event-ID).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from framespool.projections.hub import Hub, SlowSubscriber
from framespool.projections.jobs import TERMINAL_STATES, JobView, entries_after
from framespool.projections.serde import entry_to_dict, job_status

RETRY_MS = 3000


def format_event(data: Any, *, event: str | None = None, id: int | str | None = None) -> bytes:
    """One SSE frame; ``data`` is JSON-encoded on a single line."""
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append(f"data: {json.dumps(data, separators=(',', ':'))}")
    return ("\n".join(lines) + "\n\n").encode()


def parse_last_event_id(value: str | None) -> int:
    try:
        return max(0, int((value or "0").strip()))
    except ValueError:
        return 0


def _done(view: JobView, sent: int) -> bool:
    return view.state in TERMINAL_STATES and sent >= view.seq


async def stream_job(
    write: Callable[[bytes], Awaitable[None]],
    hub: Hub,
    job_id: str,
    load: Callable[[], JobView | None],
    last_seq: int,
    keepalive_s: float = 15.0,
) -> int:
    """Write the job's events until it ends; returns the last seq sent."""
    sent = last_seq
    with hub.subscribe(job_id) as sub:
        await write(f"retry: {RETRY_MS}\n\n".encode())
        view = load()
        if view is None:
            return sent
        while True:
            status = job_status(view)  # where the job stands now, on each event
            for entry in entries_after(view, sent):
                data = entry_to_dict(job_id, entry) | {"status": status}
                await write(format_event(data, event=entry.type, id=entry.seq))
                sent = entry.seq
            if _done(view, sent):
                await write(format_event({"job_id": job_id, "state": view.state}, event="end"))
                return sent
            try:
                update = await sub.get(timeout=keepalive_s)
            except SlowSubscriber:
                return sent
            if update is None:
                await write(b": keep-alive\n\n")
            elif update.seq > view.seq:
                view = update
