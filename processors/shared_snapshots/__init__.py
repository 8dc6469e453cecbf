"""Snapshots every instance can read, and the owner epoch that fences a zombie: the
port, its adapters and its fake.

``port`` (the Protocol, ``SnapshotMeta``, ``Owner``, the errors; the theory of
operation), ``heads`` (the protocol's logic every adapter shares), ``s3``, ``dir``
and ``memory`` (the fake); :func:`open_shared_snapshots` picks one by location.
``tests/integration/test_shared_snapshots.py`` runs one contract suite against each.
"""

from __future__ import annotations

import os

from framespool.processors.shared_snapshots.dir import DirSharedSnapshots
from framespool.processors.shared_snapshots.memory import MemorySharedSnapshots
from framespool.processors.shared_snapshots.port import (
    FORMAT,
    Owner,
    SharedSnapshots,
    SharedStoreError,
    SnapshotMeta,
    StaleEpoch,
)
from framespool.processors.shared_snapshots.s3 import S3SharedSnapshots

__all__ = [
    "FORMAT",
    "DirSharedSnapshots",
    "MemorySharedSnapshots",
    "Owner",
    "S3SharedSnapshots",
    "SharedSnapshots",
    "SharedStoreError",
    "SnapshotMeta",
    "StaleEpoch",
    "open_shared_snapshots",
]


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
