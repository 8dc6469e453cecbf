"""What a generator may hand the agent to upload: its own files, within limits.

The generator names its output and checkpoint files, and the agent uploads
them with its own credentials, so an untrusted generator must not be able to
name anything else. :func:`stage` admits a file only if

1. the path, however written (absolute, ``..``), opens without following a
   symlink in its last part, and the file it opened lives inside the run's
   work directory (checked on the open file, so a path swapped after the
   check cannot lead out, nor can a symlinked directory on the way);
2. it is a regular file (a FIFO would block the agent, a device never ends)
   with one link (a hard link could point at an agent file);
3. it holds at most ``limit`` bytes, counted while copying.

It copies the file into a staging directory the generator does not write, so
the bytes hashed and uploaded are the bytes checked.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

CHUNK = 1 << 20


class UploadRefused(Exception):
    """The generator named a file the agent will not upload (the generator's fault)."""


def stage(path: Path | str, workdir: Path, staging: Path, limit: int, what: str) -> Path:
    """A private copy of the generator's file ``path`` (relative to ``workdir``);
    raises :class:`UploadRefused` naming the file and the rule it broke."""
    root = workdir.resolve()
    path = Path(path)
    if not path.is_absolute():
        path = workdir / path
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        reason = "it is a symlink" if os.path.islink(path) else e.strerror
        raise UploadRefused(f"{what} {str(path)!r} not uploaded: {reason}") from None
    try:
        where = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if not where.is_relative_to(root):
            raise UploadRefused(
                f"{what} {str(path)!r} not uploaded: it leads to {where}, outside the run's"
                f" work directory {root} (a symlink or an absolute path); write it inside"
            )
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UploadRefused(f"{what} {str(path)!r} not uploaded: not a regular file")
        if st.st_nlink != 1:
            raise UploadRefused(
                f"{what} {str(path)!r} not uploaded: it has {st.st_nlink} hard links;"
                " write a new file instead of linking one"
            )
        _check_size(st.st_size, limit, what, path)
        staging.mkdir(parents=True, exist_ok=True, mode=0o700)
        out_fd, tmp = tempfile.mkstemp(dir=staging, prefix="stage-")
        try:
            with os.fdopen(out_fd, "wb") as out:
                copied = 0
                while chunk := os.read(fd, CHUNK):
                    copied += len(chunk)
                    _check_size(copied, limit, what, path)  # it may grow while we copy
                    out.write(chunk)
        except BaseException:
            os.unlink(tmp)
            raise
        return Path(tmp)
    finally:
        os.close(fd)


def _check_size(size: int, limit: int, what: str, path: Path) -> None:
    if size > limit:
        raise UploadRefused(
            f"{what} {str(path)!r} not uploaded: over {limit} bytes; raise the profile's"
            f" max_{what}_bytes or write a smaller file"
        )
