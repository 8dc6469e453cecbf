"""Polling until a condition holds, for the tiers that watch real processes.

One loop for what four test modules each wrote their own of; what differed between
them is a parameter each module states: how often to look (``every_s``) and which
exceptions mean "not yet" (``tolerate``: an API or broker that is restarting)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float = 120,
    what: str = "the condition",
    detail: Callable[[], str] | None = None,
    *,
    every_s: float = 0.2,
    tolerate: tuple[type[BaseException], ...] = (),
) -> Any:
    """Call ``predicate`` every ``every_s`` until it returns something truthy, and return
    that. Past ``timeout_s`` raise AssertionError naming ``what``, the last value (or
    tolerated exception) and ``detail()`` (a process's log, say)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            last = predicate()
        except tolerate as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"{what}: not within {timeout_s:g} s (last: {last!r}){more}")
        time.sleep(every_s)
