"""Artifact storage: the port agents upload outputs and checkpoints through, its
adapters and its fake.

``port`` (the Protocols, keys, values and errors), ``digests`` (the SHA-256
checks every store shares), ``local`` (a directory: the
embedded stack), ``s3`` (boto3) and ``memory`` (the in-memory fake for unit
tests); the names below are the public ones. ``tests/support/contracts/artifacts.py``
is the suite every implementation passes.
"""

from framespool.agents.artifacts.digests import sha256_file
from framespool.agents.artifacts.local import LocalDirStore
from framespool.agents.artifacts.port import (
    CHUNK,
    EMPTY_SHA256,
    MULTIPART_THRESHOLD,
    SHA256_METADATA,
    ArtifactError,
    ArtifactNotFound,
    ArtifactStore,
    ChecksumMismatch,
    InvalidKey,
    ServedStore,
    StoredArtifact,
    checkpoint_key,
    for_rank,
    output_key,
    run_prefix,
    validate_key,
)
from framespool.agents.artifacts.s3 import S3Store

__all__ = [
    "CHUNK",
    "EMPTY_SHA256",
    "MULTIPART_THRESHOLD",
    "SHA256_METADATA",
    "ArtifactError",
    "ArtifactNotFound",
    "ArtifactStore",
    "ChecksumMismatch",
    "InvalidKey",
    "LocalDirStore",
    "S3Store",
    "ServedStore",
    "StoredArtifact",
    "checkpoint_key",
    "for_rank",
    "output_key",
    "run_prefix",
    "sha256_file",
    "validate_key",
]
