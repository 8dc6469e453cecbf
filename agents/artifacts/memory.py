"""The in-memory fake of the artifact-store port, for unit tests.

Objects are bytes in a dict with the digest recorded at upload; ``get_file``
recomputes it like the adapters do, so a test that changes ``objects[key]``
behind the store's back sees :class:`ChecksumMismatch`. URIs are
``memory://<key>``; signed URLs name the key and the expiry but carry no
signature (nothing serves them).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from framespool.agents.artifacts.digests import check_download, sha256_file
from framespool.agents.artifacts.port import (
    CHUNK,
    ArtifactNotFound,
    InvalidKey,
    StoredArtifact,
    validate_key,
)


class MemoryArtifactStore:
    """Objects in a dict; safe to share between threads (one lock)."""

    put_empty_inline = True  # a dict write

    def __init__(
        self, url_base: str = "http://memory.test", clock: Callable[[], float] = time.time
    ) -> None:
        self.url_base = url_base.rstrip("/")
        self.objects: dict[str, bytes] = {}
        self._digests: dict[str, str] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def key_of(self, key_or_uri: str) -> str:
        if key_or_uri.startswith("memory://"):
            return validate_key(key_or_uri[len("memory://") :])
        if "://" in key_or_uri:
            raise InvalidKey(f"{key_or_uri!r} is not a memory:// URI")
        return validate_key(key_or_uri)

    def put_file(self, key: str, path: Path | str) -> StoredArtifact:
        with open(path, "rb") as src:
            return self.put_bytes(key, b"".join(iter(lambda: src.read(CHUNK), b"")))

    def put_bytes(self, key: str, data: bytes) -> StoredArtifact:
        key = validate_key(key)
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            self.objects[key] = bytes(data)
            self._digests[key] = digest
        return StoredArtifact(f"memory://{key}", digest, len(data))

    def get_file(self, key_or_uri: str, dest_path: Path | str) -> StoredArtifact:
        key = self.key_of(key_or_uri)
        with self._lock:
            data, recorded = self.objects.get(key), self._digests.get(key)
        if data is None:
            raise ArtifactNotFound(f"no artifact at {key!r} in memory")
        dest = Path(dest_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        tmp.write_bytes(data)
        digest, size = sha256_file(tmp)
        check_download(key, digest, recorded, tmp)
        os.replace(tmp, dest)
        return StoredArtifact(f"memory://{key}", digest, size)

    def exists(self, key: str) -> bool:
        return self.key_of(key) in self.objects

    def delete(self, key_or_uri: str) -> None:
        """Remove an object; an absent one is no error (as in every adapter)."""
        key = self.key_of(key_or_uri)
        with self._lock:
            self.objects.pop(key, None)
            self._digests.pop(key, None)

    def served(self) -> None:
        """None: nothing serves its URLs."""
        return None

    def signed_url(self, key: str, expires_s: int = 3600, *, tenant: str = "") -> str:
        key = self.key_of(key)
        expires = int(self._clock()) + int(expires_s)
        bound = f"tenant={quote(tenant, safe='')}&" if tenant else ""
        return f"{self.url_base}/v1/artifacts/{quote(key, safe='/')}?{bound}expires={expires}"
