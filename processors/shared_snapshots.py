"""Snapshots every instance can read, and the owner epoch that fences a zombie.

Theory of operation
-------------------
Per partition of an input topic (``namespace`` = the topic's name) the shared store
keeps one small **head** object and immutable, position-named **bodies**::

    <prefix>/<namespace>/<partition>/head.json
    <prefix>/<namespace>/<partition>/<epoch:010d>-<offset:020d>.snap

The head records the partition's current **owner** (``epoch``, ``instance``) and
the **snapshot** it points to (its position ``(epoch, offset)``, writer
instance, format version, size and SHA-256). Every change of a head is a
compare-and-swap: S3 ``PutObject`` with ``If-Match: <etag>`` (``If-None-Match: *``
for the first one; AWS S3, MinIO and moto >= 5 honour both), a file lock on a
local directory, a mutex in memory. So of two writers that read the same head,
exactly one wins; the other re-reads and re-decides.

1. **claim** (on assignment): ``owner.epoch += 1``, ``owner.instance = me``. The
   epoch is the fencing token of this ownership; no two claims get the same one.
   (Not the consumer-group generation: confluent-kafka does not expose it, and an
   offset commit from a stale generation is accepted on Tansu anyway.)
2. **load** the head's snapshot: read the head, then the body it names, check the
   digest. An instance takes the newer of that and its own local rocksdict
   snapshot (higher input offset; the fold is deterministic, so the state at an
   offset does not depend on who folded it).
3. **publish** (after the outputs are delivered, at most once per interval per
   partition, always on revoke and shutdown): write the body under its position
   name, then CAS the head to point to it, but only if ``owner.epoch`` is still the
   writer's epoch (else :class:`StaleEpoch`: the writer is a zombie and must drop
   the partition) and the new position ``(epoch, offset)`` is greater than the
   head's (else nothing changes: an older snapshot never replaces a newer one).
   The body before the previous one is deleted after the head moved (a reader
   that raced with it re-reads the head).

The body is written before the head, so a head never names a missing body; a
crash between the two leaves an orphan body, ignored (and replaced) later. The
head also names the **previous** snapshot, whose body is kept until the next
publish: a newest body whose SHA-256 differs from the head's (a torn or
corrupted write) is skipped for it (``load``).
Readers never list: the head is the single source of truth, and it only moves
forward in ``(epoch, offset)`` and in ``owner.epoch``. Without conditional writes
(old MinIO) the same layout still works for readers that list the bodies and
take the maximum position, but zombies would no longer be refused; we require
conditional writes instead, and the contract test suite proves the refusal on
every adapter.

Adapters: :class:`S3SharedSnapshots` (boto3), :class:`DirSharedSnapshots` (a
directory every instance on the host can read: the embedded stack) and
:class:`MemorySharedSnapshots` (the fake). All three implement the same
read-modify-write primitive (:meth:`_update_head`) under the shared logic of
:class:`_HeadStore`; ``tests/integration/test_shared_snapshots.py`` runs one
contract suite against each.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from framespool.private_files import private_dir

log = logging.getLogger(__name__)

FORMAT = 1  # of head and body; a reader ignores snapshots of another format


class SharedStoreError(RuntimeError):
    """The shared store failed (IO, network, permissions); the message names the object."""


class StaleEpoch(SharedStoreError):
    """A newer owner claimed the partition: the writer is a zombie (its own fault) and
    must drop the partition without publishing or committing anything more."""

    def __init__(self, namespace: str, partition: int, mine: int, owner: int, by: str) -> None:
        self.namespace, self.partition, self.mine, self.owner, self.by = (
            namespace,
            partition,
            mine,
            owner,
            by,
        )
        super().__init__(
            f"{namespace}[{partition}]: owner epoch {mine} is stale; {by!r} claimed epoch {owner}"
        )


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Who wrote a snapshot, of what, and where it stands."""

    namespace: str
    partition: int
    offset: int  # last input offset folded into the state
    epoch: int  # the writer's owner epoch
    instance: str
    format: int = FORMAT
    size: int = 0
    sha256: str = ""

    @property
    def position(self) -> tuple[int, int]:
        """Snapshots are ordered by ``(epoch, offset)``."""
        return (self.epoch, self.offset)


@dataclass(frozen=True, slots=True)
class Owner:
    epoch: int = 0  # 0: never claimed
    instance: str = ""


@runtime_checkable
class SharedSnapshots(Protocol):
    """The port (see the module docstring for the protocol)."""

    def claim(self, namespace: str, partition: int, instance: str) -> int:
        """Become the owner of ``partition``; return the new owner epoch."""
        ...

    def owner(self, namespace: str, partition: int) -> Owner: ...

    def load(self, namespace: str, partition: int) -> tuple[SnapshotMeta, bytes] | None:
        """The newest snapshot and its payload, or None."""
        ...

    def publish(self, meta: SnapshotMeta, payload: bytes) -> bool:
        """Store a snapshot; False if one at the same or a later position is there.
        Raises :class:`StaleEpoch` if ``meta.epoch`` is no longer the owner epoch."""
        ...

    def describe(self) -> str: ...


# --------------------------------------------------------------------------
# The shared logic, over a read-modify-write primitive
# --------------------------------------------------------------------------
_NO_CHANGE = object()


def _segment(value: str) -> str:
    if not value or "/" in value or value in (".", "..") or "\x00" in value:
        raise ValueError(f"{value!r} cannot be part of a snapshot key: use a plain topic name")
    return value


class _HeadStore:
    """``claim``/``owner``/``load``/``publish`` over four primitives an adapter provides."""

    prefix: str = "snapshots"

    # -- primitives -------------------------------------------------------------
    def _update_head(self, key: str, change: Callable[[dict | None], Any]) -> Any:
        """Atomically apply ``change`` to the head at ``key`` (None: no head yet).
        ``change`` returns ``(new_head, result)``, or ``(_NO_CHANGE, result)``; it
        may raise, and may be called again if another writer got in between."""
        raise NotImplementedError

    def _read_head(self, key: str) -> dict | None:
        raise NotImplementedError

    def _put_body(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _get_body(self, key: str) -> bytes | None:
        raise NotImplementedError

    def _delete_body(self, key: str) -> None:
        raise NotImplementedError

    # -- keys -------------------------------------------------------------------
    def _dir(self, namespace: str, partition: int) -> str:
        return f"{self.prefix}/{_segment(namespace)}/{int(partition)}"

    def _head_key(self, namespace: str, partition: int) -> str:
        return f"{self._dir(namespace, partition)}/head.json"

    def _body_key(self, namespace: str, partition: int, epoch: int, offset: int) -> str:
        # offset -1 (nothing folded) never reaches a snapshot; keep names sortable anyway
        return f"{self._dir(namespace, partition)}/{epoch:010d}-{offset + 1:020d}.snap"

    # -- the protocol -----------------------------------------------------------
    def claim(self, namespace: str, partition: int, instance: str) -> int:
        def change(head: dict | None) -> tuple[dict, int]:
            head = dict(head or {"format": FORMAT, "namespace": namespace, "partition": partition})
            epoch = int(head.get("owner", {}).get("epoch", 0)) + 1
            head["owner"] = {"epoch": epoch, "instance": instance}
            return head, epoch

        return self._update_head(self._head_key(namespace, partition), change)

    def owner(self, namespace: str, partition: int) -> Owner:
        head = self._read_head(self._head_key(namespace, partition))
        found = (head or {}).get("owner") or {}
        return Owner(int(found.get("epoch", 0)), str(found.get("instance", "")))

    def load(self, namespace: str, partition: int) -> tuple[SnapshotMeta, bytes] | None:
        """The head's snapshot, or its previous one when the newest body is damaged
        (its SHA-256 differs from the head's: a torn or corrupted write); None when
        neither is usable (the caller rebuilds from its local snapshot or the log)."""
        for _ in range(3):  # the bodies may be replaced between reading the head and them
            head = self._read_head(self._head_key(namespace, partition)) or {}
            candidates = [c for c in (head.get("snapshot"), head.get("previous")) if c]
            missing = False
            for snap in candidates:
                if snap.get("format") != FORMAT:
                    continue
                meta = SnapshotMeta(**{k: snap[k] for k in SnapshotMeta.__slots__})
                data = self._get_body(snap["key"])
                if data is None:
                    missing = True
                    continue
                if hashlib.sha256(data).hexdigest() != meta.sha256:
                    log.warning(
                        "snapshot %s of %s is damaged (SHA-256 differs from its head's); "
                        "trying the one before it",
                        snap["key"],
                        self.describe(),
                    )
                    continue
                return meta, data
            if not missing:
                return None
        return None

    def publish(self, meta: SnapshotMeta, payload: bytes) -> bool:
        meta = SnapshotMeta(
            meta.namespace,
            meta.partition,
            meta.offset,
            meta.epoch,
            meta.instance,
            FORMAT,
            len(payload),
            hashlib.sha256(payload).hexdigest(),
        )
        head_key = self._head_key(meta.namespace, meta.partition)
        body_key = self._body_key(meta.namespace, meta.partition, meta.epoch, meta.offset)

        def check(head: dict | None) -> str | None:
            """Raise if fenced; return why nothing would change (or None to go ahead)."""
            owner = (head or {}).get("owner") or {}
            epoch = int(owner.get("epoch", 0))
            if epoch != meta.epoch:
                raise StaleEpoch(
                    meta.namespace, meta.partition, meta.epoch, epoch, owner.get("instance", "")
                )
            current = (head or {}).get("snapshot")
            if current and (current["epoch"], current["offset"]) >= meta.position:
                return "an equal or newer snapshot is there"
            return None

        if check(self._read_head(head_key)) is not None:  # cheap early answer, re-checked below
            return False
        self._put_body(body_key, payload)
        replaced: list[str] = []
        keep = [False]  # the head already names this very body (a retried publish)

        def change(head: dict | None) -> tuple[Any, bool]:
            try:
                if check(head) is not None:
                    keep[0] = ((head or {}).get("snapshot") or {}).get("key") == body_key
                    return _NO_CHANGE, False
            except StaleEpoch:
                self._delete_body(body_key)  # nobody will ever point at it
                raise
            assert head is not None  # check() proved an owner exists
            head = dict(head)
            old = head.get("snapshot")
            older = head.get("previous")
            head["snapshot"] = {**asdict(meta), "key": body_key}
            # the one before stays, in case the newest body turns out damaged
            if old and old.get("key") != body_key:
                head["previous"] = old
                replaced[:] = [older["key"]] if older and older.get("key") != body_key else []
            else:
                replaced[:] = []
            return head, True

        written = self._update_head(head_key, change)
        if written:
            for key in replaced:
                self._delete_body(key)
        elif not keep[0]:
            self._delete_body(body_key)
        return written


# --------------------------------------------------------------------------
# In memory (the fake)
# --------------------------------------------------------------------------
class MemorySharedSnapshots(_HeadStore):
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
            if new is not _NO_CHANGE:
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


# --------------------------------------------------------------------------
# A local directory (the embedded stack: every instance on one host)
# --------------------------------------------------------------------------
class DirSharedSnapshots(_HeadStore):
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
                if new is not _NO_CHANGE:
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


# --------------------------------------------------------------------------
# S3 (MinIO in compose, moto in tests)
# --------------------------------------------------------------------------
class S3SharedSnapshots(_HeadStore):
    """Objects in ``bucket`` under ``prefix``; heads change by conditional PutObject."""

    def __init__(
        self,
        bucket: str,
        endpoint_url: str | None = None,
        *,
        prefix: str = "snapshots",
        region_name: str | None = None,
        client: Any = None,
    ) -> None:
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/") or "snapshots"
        self._client = client or boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region_name or os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        )

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def create_bucket(self) -> None:
        """Create the bucket if missing (tests, the embedded stack)."""
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._client.create_bucket(Bucket=self.bucket)

    @staticmethod
    def _code(exc: Exception) -> str:
        return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))

    def _get(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            got = self._client.get_object(Bucket=self.bucket, Key=key)
            return got["Body"].read(), got["ETag"]
        except ClientError as exc:
            if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise SharedStoreError(f"cannot read s3://{self.bucket}/{key}: {exc}") from exc
        except Exception as exc:  # connection refused, timeouts: botocore's other errors
            raise SharedStoreError(f"cannot read s3://{self.bucket}/{key}: {exc}") from exc

    def _update_head(self, key: str, change: Callable[[dict | None], Any]) -> Any:
        from botocore.exceptions import ClientError

        for _ in range(50):
            got = self._get(key)
            head, etag = (None, None) if got is None else (json.loads(got[0]), got[1])
            new, result = change(head)
            if new is _NO_CHANGE:
                return result
            condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=json.dumps(new).encode(),
                    ContentType="application/json",
                    **condition,
                )
                return result
            except ClientError as exc:
                # another writer got in between: re-read and re-decide
                if self._code(exc) in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
                    continue
                raise SharedStoreError(f"cannot write s3://{self.bucket}/{key}: {exc}") from exc
            except Exception as exc:
                raise SharedStoreError(f"cannot write s3://{self.bucket}/{key}: {exc}") from exc
        raise SharedStoreError(f"s3://{self.bucket}/{key}: too much contention on the head")

    def _read_head(self, key: str) -> dict | None:
        got = self._get(key)
        return None if got is None else json.loads(got[0])

    def _put_body(self, key: str, data: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except Exception as exc:
            raise SharedStoreError(f"cannot write s3://{self.bucket}/{key}: {exc}") from exc

    def _get_body(self, key: str) -> bytes | None:
        got = self._get(key)
        return None if got is None else got[0]

    def _delete_body(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except Exception:  # garbage left behind costs space, never correctness
            pass


def open_shared_snapshots(location: str) -> SharedSnapshots:
    """``s3://BUCKET[/PREFIX]`` (endpoint from ``AWS_ENDPOINT_URL``), ``memory:``, or a
    directory path (``file://`` optional)."""
    if location.startswith("s3://"):
        bucket, _, prefix = location[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"{location!r}: name a bucket, as in s3://BUCKET/PREFIX")
        return S3SharedSnapshots(
            bucket, os.environ.get("AWS_ENDPOINT_URL"), prefix=prefix or "snapshots"
        )
    if location == "memory:":
        return MemorySharedSnapshots()
    if location.startswith("file://"):
        location = location[len("file://") :]
    if not location:
        raise ValueError(
            "the shared snapshot location is empty: give s3://BUCKET/PREFIX or a directory"
        )
    return DirSharedSnapshots(location)
