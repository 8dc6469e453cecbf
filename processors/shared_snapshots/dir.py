"""The local-directory adapter of the shared-snapshot port (the embedded stack: every
instance on one host): a head changes under an exclusive ``flock``.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from framespool.private_files import private_dir
from framespool.processors.shared_snapshots.heads import NO_CHANGE, HeadStore
from framespool.processors.shared_snapshots.port import SharedStoreError


class DirSharedSnapshots(HeadStore):
    """Files under ``root``; a head changes under an exclusive ``flock`` of its
    ``.lock`` file and is replaced atomically (``os.replace``), bodies likewise."""

    def __init__(self, root: str | Path) -> None:
        self.root = private_dir(Path(root).resolve())  # cells' states hold jobs' specs

    def describe(self) -> str:
        return f"dir:{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / key

    def _write_atomic(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _update_head(self, key: str, change: Callable[[dict | None], Any]) -> Any:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path.parent / ".lock", "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                new, result = change(self._read_head(key))
                if new is not NO_CHANGE:
                    self._write_atomic(path, json.dumps(new).encode())
                return result
        except OSError as exc:
            raise SharedStoreError(f"cannot update {path}: {exc}") from exc

    def _read_head(self, key: str) -> dict | None:
        try:
            return json.loads(self._path(key).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise SharedStoreError(f"cannot read {self._path(key)}: {exc}") from exc

    def _put_body(self, key: str, data: bytes) -> None:
        try:
            self._write_atomic(self._path(key), data)
        except OSError as exc:
            raise SharedStoreError(f"cannot write {self._path(key)}: {exc}") from exc

    def _get_body(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def _delete_body(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
