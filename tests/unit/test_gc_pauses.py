"""Full collections at least the threshold long are logged, and only those."""

from __future__ import annotations

import gc
import logging

from framespool.telemetry.gcpauses import watch_gc_pauses


def _installed() -> list:
    return [c for c in gc.callbacks if getattr(c, "framespool_gc_pauses", False)]


def test_a_full_collection_over_the_threshold_is_logged_once_per_watch(caplog):
    before = list(gc.callbacks)
    try:
        watch_gc_pauses(threshold_ms=0.0)
        watch_gc_pauses(threshold_ms=0.0)  # replaces, never stacks
        assert len(_installed()) == 1
        with caplog.at_level(logging.WARNING, logger="framespool.gc"):
            gc.collect(0)  # a young collection: not a full one
            assert not caplog.records
            gc.collect()
        (record,) = caplog.records
        assert "full collection paused this process" in record.getMessage()
        assert record.gc_pause_ms >= 0.0
    finally:
        gc.callbacks[:] = before


def test_a_full_collection_under_the_threshold_is_not_logged(caplog):
    before = list(gc.callbacks)
    try:
        watch_gc_pauses(threshold_ms=60_000.0)
        with caplog.at_level(logging.WARNING, logger="framespool.gc"):
            gc.collect()
        assert not caplog.records
    finally:
        gc.callbacks[:] = before
