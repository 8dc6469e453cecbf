"""Full garbage collections that stall a process, logged: ``watch_gc_pauses``.

CPython's cyclic collector visits every tracked object of the generations it
collects; a full (generation 2) collection runs when the objects that survived
into generation 2 grew by a quarter since the last one, so a process whose
live state grows (a projection's view, a processor's fold state) pauses
longer and longer, rarely: the latency tail's max grows while its p99 does
not. The soak found such a growth in the API hop (``framespool bench soak``,
docs/measuring.md); this module makes each such pause a log line naming its
length and the objects tracked, so the tail can be matched to it.

Cost: one Python call at the start and the end of every collection (all
generations: a gen-0 collection every ~700 net allocations), O(1) each; a
line only for a full collection at least ``threshold_ms`` long.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger("framespool.gc")

GC_PAUSE_LOG_MS = 20.0


def watch_gc_pauses(threshold_ms: float = GC_PAUSE_LOG_MS) -> None:
    """Log every full collection of this process that lasts ``threshold_ms`` or
    more (once per process: a second call replaces the first's callback)."""
    started = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - started[0]) * 1000
        if pause_ms >= threshold_ms:
            log.warning(
                "gc: a full collection paused this process %.0f ms (%d objects collected)",
                pause_ms,
                info.get("collected", 0),
                extra={"gc_pause_ms": round(pause_ms, 1)},
            )

    callback.framespool_gc_pauses = True  # type: ignore[attr-defined]
    gc.callbacks[:] = [c for c in gc.callbacks if not getattr(c, "framespool_gc_pauses", False)]
    gc.callbacks.append(callback)
