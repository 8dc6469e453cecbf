"""The local-directory adapter of the artifact-store port (the embedded stack).

Objects are files under a root directory, written whole or not at all (a
temporary file renamed into place); their digests are kept under ``.meta``.
Signed URLs point at the API, which serves the file after
:meth:`LocalDirStore.verify_signature` (the port's ``ServedStore``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from framespool.agents.artifacts.digests import check_download, sha256_file
from framespool.agents.artifacts.port import (
    CHUNK,
    EMPTY_SHA256,
    ArtifactNotFound,
    InvalidKey,
    StoredArtifact,
    validate_key,
)
from framespool.private_files import private_dir


class LocalDirStore:
    """Objects as files under ``root``; metadata (digest, size) of an object with
    bytes under ``root/.meta`` (an empty one needs none: see :meth:`_put`).

    URIs are ``local://<key>``; ``file://<absolute path>`` inside ``root`` is
    accepted too. Signed URLs point at the API (``url_base``) and carry an
    expiry and an HMAC-SHA256 over ``key`` and expiry.
    """

    # An empty object is its directories and one O_EXCL create, without an
    # fsync or metadata (see put_bytes): cheap enough for an agent's event loop
    # (agents.keeping.RunFiles.keep_result). A store without this attribute
    # (S3: a network call) is always written from a worker thread.
    put_empty_inline = True

    def __init__(
        self,
        root: Path | str,
        url_base: str = "http://127.0.0.1:8080",
        secret: bytes | str = b"",
        clock: Any = time.time,
    ) -> None:
        # tenants' outputs and checkpoints: the owner's alone (the 0700 root keeps
        # what is made below it unreachable; no walk of a large tree at start)
        self.root = private_dir(Path(root).resolve(), existing=False)
        self.url_base = url_base.rstrip("/")
        self._secret = secret.encode() if isinstance(secret, str) else secret
        if not self._secret:
            raise ValueError("LocalDirStore needs a non-empty secret to sign URLs")
        self._clock = clock

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def _meta(self, key: str) -> Path:
        return self.root / ".meta" / (validate_key(key) + ".json")

    def key_of(self, key_or_uri: str) -> str:
        if key_or_uri.startswith("local://"):
            return validate_key(key_or_uri[len("local://") :])
        if key_or_uri.startswith("file://"):
            path = Path(key_or_uri[len("file://") :]).resolve()
            if not path.is_relative_to(self.root):
                raise InvalidKey(f"{key_or_uri} is outside the store root {self.root}")
            return validate_key(path.relative_to(self.root).as_posix())
        if "://" in key_or_uri:
            raise InvalidKey(f"{key_or_uri!r} is not a local:// or file:// URI of this store")
        return validate_key(key_or_uri)

    def put_file(self, key: str, path: Path | str) -> StoredArtifact:
        with open(path, "rb") as src:
            return self._put(key, iter(lambda: src.read(CHUNK), b""))

    def put_bytes(self, key: str, data: bytes) -> StoredArtifact:
        """An object the agent itself made (a builtin's output): no file to stage or copy.

        An empty object (the ``noop`` builtin's) is created in place with
        ``O_CREAT | O_EXCL``: a new empty file is whole the moment it exists, so
        it needs no temporary file and rename to be seen whole or not at all.
        Cost: the directories' ``mkdir`` calls, one ``unlink`` of a stale
        metadata record and one ``open``: 160-185 us of CPU per noop output
        against 215-420 us through :meth:`_put` (its temporary file's
        ``mkstemp``, write and ``rename``; 1,000 new keys each, alternated 3
        times, ``time.process_time``, 2026-12-01, the machine at load 5). An object already under the key is replaced by :meth:`_put`.
        """
        if data:
            return self._put(key, (data,))
        dest, meta = self._path(key), self._meta(key)
        self._make_dirs(dest.parent)
        meta.unlink(missing_ok=True)  # an earlier object's digest would not match
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return self._put(key, (data,))  # replaced whole, by a rename
        os.close(fd)
        return StoredArtifact(f"local://{key}", EMPTY_SHA256, 0)

    def _make_dirs(self, directory: Path) -> None:
        """``mkdir -p`` of ``directory``, a directory under :attr:`root`, top-down.

        Not ``Path.mkdir(parents=True)``: that one tries the deepest directory
        first and climbs while the kernel answers ENOENT, so a new key's 4
        directories (``jobs/<job>/runs/<run>/output``) cost 7 ``mkdir`` calls,
        3 of them failing at ~40 us apiece on the development machine, and 3
        exceptions: ~425 us of CPU per noop output, against ~90 us top-down
        (2,000 new 4-level trees, ``time.process_time``, 2026-12-01).

        Cost: one ``mkdir`` per level below the root; a level that exists
        already answers EEXIST (~1 us).
        """
        path = str(self.root)
        for part in directory.relative_to(self.root).parts:
            path = f"{path}/{part}"
            try:
                os.mkdir(path)
            except FileExistsError:
                pass

    def _put(self, key: str, chunks) -> StoredArtifact:
        """Write ``chunks`` under ``key``: a temporary file renamed into place, so
        readers see the whole object or none.

        Cost: a ``mkdir -p`` of the object's directory, one file write, one
        rename; an object with bytes also an ``fsync`` and its metadata (a
        second ``mkdir -p`` under ``.meta``, one small write). An empty object
        (the ``noop`` builtin's) has neither: no data a crash could lose between
        its write and the ``RunCompleted`` that names its digest (its fsync was
        a fifth of a noop agent's CPU), and no digest to record, since every
        empty object has the same one (:meth:`get_file` accepts an object
        without metadata; a stale record from an earlier object under the key
        is removed). Without them a noop's output costs 7 ``mkdir`` calls
        instead of 14 (each key's directories are new), ~45 us apiece (mean,
        cProfile of an agent in ``bench pipeline``, 2026-12-01); made top-down
        (:meth:`_make_dirs`) they are 4.
        """
        dest, meta = self._path(key), self._meta(key)
        self._make_dirs(dest.parent)
        h, size = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    h.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                if size:
                    os.fsync(out.fileno())
            digest = h.hexdigest()
            if size:
                self._make_dirs(meta.parent)
                meta.write_text(json.dumps({"sha256": digest, "size_bytes": size}))
            else:
                meta.unlink(missing_ok=True)  # an earlier object's digest would not match
            os.replace(tmp, dest)  # readers see the whole object or none
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return StoredArtifact(f"local://{key}", digest, size)

    def get_file(self, key_or_uri: str, dest_path: Path | str) -> StoredArtifact:
        key = self.key_of(key_or_uri)
        src = self._path(key)
        if not src.is_file():
            raise ArtifactNotFound(f"no artifact at {key!r} in {self.root}")
        dest = Path(dest_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        shutil.copyfile(src, tmp)
        digest, size = sha256_file(tmp)
        check_download(key, digest, self._recorded_sha256(key), tmp)
        os.replace(tmp, dest)
        return StoredArtifact(f"local://{key}", digest, size)

    def _recorded_sha256(self, key: str) -> str | None:
        try:
            return json.loads(self._meta(key).read_text()).get("sha256")
        except (OSError, ValueError):
            return None

    def exists(self, key: str) -> bool:
        return self._path(self.key_of(key)).is_file()

    def delete(self, key_or_uri: str) -> None:
        """Remove an object and its metadata; an absent one is no error (retention
        sweeps may repeat a deletion after a crash)."""
        key = self.key_of(key_or_uri)
        self._meta(key).unlink(missing_ok=True)
        self._path(key).unlink(missing_ok=True)

    def served(self) -> LocalDirStore:
        """This store: the API serves its signed URLs (:meth:`verify_signature`)."""
        return self

    def local_path(self, key_or_uri: str) -> Path:
        """Where an object lives on disk (for the API to serve a verified URL)."""
        return self._path(self.key_of(key_or_uri))

    # -- signed URLs ----------------------------------------------------------
    def _sign(self, key: str, expires: int, tenant: str = "") -> str:
        # with a tenant, the signature binds it too (the key names the job and run)
        message = f"{tenant}\n{key}\n{expires}" if tenant else f"{key}\n{expires}"
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

    def signed_url(self, key: str, expires_s: int = 3600, *, tenant: str = "") -> str:
        key = self.key_of(key)
        expires = int(self._clock()) + int(expires_s)
        bound = f"tenant={quote(tenant, safe='')}&" if tenant else ""
        return (
            f"{self.url_base}/v1/artifacts/{quote(key, safe='/')}"
            f"?{bound}expires={expires}&sig={self._sign(key, expires, tenant)}"
        )

    def verify_signature(
        self,
        key: str,
        expires: int | str,
        sig: str,
        now: float | None = None,
        *,
        tenant: str = "",
    ) -> bool:
        """True only for an untampered URL (for ``tenant``, if it was bound to one) that has
        not expired at ``now``."""
        try:
            key = validate_key(key)
            expires = int(expires)
        except (InvalidKey, ValueError, TypeError):
            return False
        now = self._clock() if now is None else now
        if now > expires:
            return False
        return hmac.compare_digest(self._sign(key, expires, tenant), str(sig))
