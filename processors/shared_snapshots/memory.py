"""The in-memory fake of the shared-snapshot port: heads and bodies in dicts, a
mutex for the compare-and-swap."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from framespool.processors.shared_snapshots.heads import NO_CHANGE, HeadStore


class MemorySharedSnapshots(HeadStore):
    """The port in a dict, for unit tests; several processors may share one instance."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heads: dict[str, str] = {}
        self._bodies: dict[str, bytes] = {}

    def describe(self) -> str:
        return "memory"

    def _update_head(self, key: str, change: Callable[[dict | None], Any]) -> Any:
        with self._lock:
            raw = self._heads.get(key)
            new, result = change(None if raw is None else json.loads(raw))
            if new is not NO_CHANGE:
                self._heads[key] = json.dumps(new)
            return result

    def _read_head(self, key: str) -> dict | None:
        raw = self._heads.get(key)
        return None if raw is None else json.loads(raw)

    def _put_body(self, key: str, data: bytes) -> None:
        self._bodies[key] = bytes(data)

    def _get_body(self, key: str) -> bytes | None:
        return self._bodies.get(key)

    def _delete_body(self, key: str) -> None:
        self._bodies.pop(key, None)
