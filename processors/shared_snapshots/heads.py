"""The shared logic of every shared-snapshot adapter: ``claim``, ``owner``, ``load``
and ``publish`` (the port's protocol, ``framespool.processors.shared_snapshots.port``)
over four primitives an adapter provides: a compare-and-swap of a head
(``_update_head``), a read of one, and a put, get and delete of a body.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from framespool.processors.shared_snapshots.port import (
    FORMAT,
    Owner,
    SnapshotMeta,
    StaleEpoch,
)

# the package's logger, as before it was split into modules
log = logging.getLogger("framespool.processors.shared_snapshots")

NO_CHANGE = object()  # what a head change returns to leave the head as it is


def _segment(value: str) -> str:
    if not value or "/" in value or value in (".", "..") or "\x00" in value:
        raise ValueError(f"{value!r} cannot be part of a snapshot key: use a plain topic name")
    return value


class HeadStore:
    """``claim``/``owner``/``load``/``publish`` over four primitives an adapter provides."""

    prefix: str = "snapshots"

    # -- primitives -------------------------------------------------------------
    def _update_head(self, key: str, change: Callable[[dict | None], Any]) -> Any:
        """Atomically apply ``change`` to the head at ``key`` (None: no head yet).
        ``change`` returns ``(new_head, result)``, or ``(NO_CHANGE, result)``; it
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

    def describe(self) -> str:
        """Where the snapshots live, in words (logs, ``--shared-snapshots``' echo)."""
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
                    return NO_CHANGE, False
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
