"""Refuse new work before the disk under the log and the stores fills up.

A full disk is the one fault where accepting a job is worse than refusing it: the
broker would take its log dir offline and the stores could no longer write, so
the API stops accepting submissions first, with 503, ``Retry-After`` and the
figures, while reads, progress streams and cancels go on. Nothing stored is
touched. :class:`DiskGuard` reads the free space of one path's file system at
most every ``interval_s`` (one ``statvfs``: microseconds), so the check costs a
submit nothing measurable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MB = 1024 * 1024


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s file system."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclass
class DiskGuard:
    """Whether ``path``'s file system has at least ``min_free_mb`` free."""

    path: Path
    min_free_mb: int = 100
    interval_s: float = 1.0
    retry_after_s: int = 30
    measure: Callable[[Path], int] = free_bytes
    clock: Callable[[], float] = time.monotonic
    _checked_at: float = field(default=float("-inf"), init=False)
    _free: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.min_free_mb < 0:
            raise ValueError(f"min_free_mb={self.min_free_mb}: a size in MB >= 0 (0: no guard)")

    def free(self) -> int:
        now = self.clock()
        if now - self._checked_at >= self.interval_s:
            self._free = self.measure(self.path)
            self._checked_at = now
        return self._free

    def refusal(self) -> str | None:
        """Why new work is refused now, or None."""
        if self.min_free_mb == 0:
            return None
        free = self.free()
        if free >= self.min_free_mb * MB:
            return None
        return (
            f"the disk under {self.path} has {free / MB:.0f} MB free, below the "
            f"{self.min_free_mb} MB floor (min_free_disk_mb): new jobs are refused until "
            "space is freed; jobs already accepted, their results and status are unaffected"
        )
