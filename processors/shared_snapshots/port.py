"""The shared-snapshot port: snapshots every instance can read, and the owner epoch
that fences a zombie; the Protocol, the values that cross it and its errors.

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

Adapters: ``s3`` (:class:`S3SharedSnapshots`, boto3), ``dir``
(:class:`DirSharedSnapshots`, a directory every instance on the host can read:
the embedded stack) and ``memory`` (:class:`MemorySharedSnapshots`, the fake). All
three implement the same read-modify-write primitive (``_update_head``) under the
shared logic of ``heads.HeadStore``; ``tests/integration/test_shared_snapshots.py``
runs one contract suite against each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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
