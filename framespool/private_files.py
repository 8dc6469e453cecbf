"""Directories that hold tenants' data (prompts, params, callback URLs and their
tokens, outputs) are readable by their owner only.

RocksDB and the artifact store create files with the process umask (0644 as a
rule) in directories made 0755: every local user could read every tenant's
prompts and callback tokens. ``private_dir`` makes a directory 0700 (created
so, or narrowed if it exists) and narrows what is already in it to 0600 (files)
and 0700 (directories); what is created in it later keeps the umask's mode, but
no one else can reach it through the 0700 directory.

A leaf: the stores of every process package use it, and it imports nothing of ours.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def private_dir(path: str | Path, *, existing: bool = True) -> Path:
    """``path`` as a directory only its owner may enter; ``existing``: also narrow
    the modes of what is in it already (one walk, at open)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    _narrow(path, 0o700)
    if existing:
        for root, dirs, files in os.walk(path):
            for name in dirs:
                _narrow(Path(root, name), 0o700)
            for name in files:
                _narrow(Path(root, name), 0o600)
    return path


def _narrow(path: Path, mode: int) -> None:
    """Drop group and other permissions (never add any), on what we own."""
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
            return
        if stat.S_IMODE(st.st_mode) & ~mode:
            os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
    except OSError:
        pass  # gone meanwhile, or not ours to change
