"""The artifact-store port: what agents upload outputs and checkpoints through and
the API signs URLs for, as Protocols, plus the keys, values and errors that cross it.

Keys are run-scoped (``jobs/{job_id}/runs/{run}/output/<name>``,
``jobs/{job_id}/runs/{run}/checkpoints/<n>``) so a stale run can never
overwrite the current run's files: only the current run's completion is
published, the rest is garbage to collect. The members of a multi-node gang
write under ``jobs/{job_id}/runs/{run}/ranks/{rank}/...``, so no member
overwrites another's files (or the result).

Every upload records the object's SHA-256; every download recomputes it and
raises :class:`ChecksumMismatch` on a difference, so a torn or corrupted file
is never handed to a generator or a user.

Adapters: ``framespool.agents.artifacts.local`` (:class:`LocalDirStore`, a
directory, for the embedded stack; its signed URLs are served by the API, which
checks them with ``verify_signature``: a :class:`ServedStore`) and
``framespool.agents.artifacts.s3`` (:class:`S3Store`: boto3, multipart above a
threshold, SHA-256 part checksums, presigned GET URLs); the fake is
``framespool.agents.artifacts.memory``. ``tests/support/contracts/artifacts.py``
is the one suite every implementation passes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

CHUNK = 1 << 20
MULTIPART_THRESHOLD = 8 * 1024 * 1024
SHA256_METADATA = "sha256"  # S3 user metadata key holding the whole-object digest
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class ArtifactError(RuntimeError):
    """The store failed (IO, permissions, network)."""


class ArtifactNotFound(ArtifactError, FileNotFoundError):
    """No object under that key (the caller's key is wrong or it was never written)."""


class ChecksumMismatch(ArtifactError):
    """The bytes read back differ from those written (corruption in the store)."""


class InvalidKey(ValueError):
    """A key that could escape the store or is not canonical (the caller's fault)."""


@dataclass(frozen=True, slots=True)
class StoredArtifact:
    uri: str
    sha256: str
    size_bytes: int


@runtime_checkable
class ArtifactStore(Protocol):
    """Objects under validated keys (:func:`validate_key`), each with its SHA-256.

    ``put_empty_inline``: an empty object is cheap enough to write on an agent's
    event loop (a local directory: a few syscalls); False where every write is a
    network call (S3), so callers write from a worker thread."""

    put_empty_inline: bool

    def put_file(self, key: str, path: Path | str) -> StoredArtifact: ...

    def put_bytes(self, key: str, data: bytes) -> StoredArtifact: ...

    def get_file(self, key_or_uri: str, dest_path: Path | str) -> StoredArtifact: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key_or_uri: str) -> None: ...

    def signed_url(self, key: str, expires_s: int = 3600, *, tenant: str = "") -> str: ...

    def key_of(self, key_or_uri: str) -> str: ...

    def served(self) -> ServedStore | None:
        """This store, where the API serves its signed URLs itself (a local directory:
        :class:`ServedStore`); None where they point elsewhere (S3's presigned GETs)."""
        ...


class ServedStore(ArtifactStore, Protocol):
    """A store whose signed URLs the API serves itself (``LocalDirStore``): it checks
    their signatures and names the file behind a key."""

    def verify_signature(
        self, key: str, expires: int | str, sig: str, now: float | None = None, *, tenant: str = ""
    ) -> bool: ...

    def local_path(self, key_or_uri: str) -> Path: ...


# ---------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------
def run_prefix(job_id: str, run: int, rank: int | None = None) -> str:
    """A run's key prefix; ``rank`` for a member of a multi-node gang."""
    prefix = f"jobs/{_segment(job_id)}/runs/{int(run)}"
    return prefix if rank is None else f"{prefix}/ranks/{int(rank)}"


def output_key(job_id: str, run: int, name: str, rank: int | None = None) -> str:
    return f"{run_prefix(job_id, run, rank)}/output/{_segment(name)}"


def checkpoint_key(job_id: str, run: int, n: int | str, rank: int | None = None) -> str:
    return f"{run_prefix(job_id, run, rank)}/checkpoints/{_segment(str(n))}"


def for_rank(key: str, rank: int) -> str:
    """The same gang member's file, for ``rank``: each member resumes from its
    own checkpoint of the step the job's checkpoint names. Keys outside the
    rank layout come back unchanged."""
    parts = key.split("/")
    if len(parts) >= 7 and parts[0] == "jobs" and parts[2] == "runs" and parts[4] == "ranks":
        parts[5] = str(int(rank))
    return "/".join(parts)


def _segment(s: str) -> str:
    if not s or s in (".", "..") or "/" in s or "\\" in s or "\x00" in s:
        raise InvalidKey(f"{s!r} cannot be a key segment: use a non-empty name without '/'")
    return s


def validate_key(key: str) -> str:
    """A relative, canonical path: no empty, '.', '..' or hidden segments."""
    if not key or key.startswith("/") or len(key) > 1024:
        raise InvalidKey(f"key {key!r} must be relative, non-empty and at most 1024 characters")
    for seg in key.split("/"):
        _segment(seg)
        if seg.startswith("."):
            raise InvalidKey(f"key {key!r}: segment {seg!r} must not start with '.'")
    return key
