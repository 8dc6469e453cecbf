"""The digests every artifact store keeps and checks: a file's SHA-256 read in
:data:`CHUNK` pieces, and the refusal of a download whose digest differs from the
one recorded at upload (:class:`ChecksumMismatch`).

Cost: one read of the file (1 MiB at a time) and one SHA-256 pass over it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from framespool.agents.artifacts.port import CHUNK, ChecksumMismatch


def sha256_file(path: Path | str) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def check_download(key: str, got: str, recorded: str | None, tmp: Path) -> None:
    """Refuse a download whose digest differs from the one recorded at upload (and
    remove its temporary file); an object without a record (an empty one) passes."""
    if recorded is not None and got != recorded:
        tmp.unlink(missing_ok=True)
        raise ChecksumMismatch(f"artifact {key!r}: sha256 {got} read back, {recorded} written")
