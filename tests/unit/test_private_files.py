"""Issue #33, 12: what holds tenants' data is readable by its owner only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from framespool.agents.artifacts import LocalDirStore
from framespool.private_files import private_dir
from framespool.processors.snapshots import SnapshotStore
from framespool.projections.jobs import JobView
from framespool.projections.store import Batch, RocksViewStore


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_view_store_and_snapshots_are_the_owners_alone(tmp_path):
    old = os.umask(0o022)  # the usual umask: files 0644, directories 0755
    try:
        views = RocksViewStore(str(tmp_path / "views"))
        views.commit(
            Batch(views={"j": JobView(job_id="j", prompt="secret", callback_url="https://h/t")})
        )
        views.close()
        snaps = SnapshotStore(tmp_path / "snapshots", "cell")
        snaps.close()
        artifacts = LocalDirStore(tmp_path / "artifacts", secret=b"k")
    finally:
        os.umask(old)
    for store in (tmp_path / "views", tmp_path / "snapshots", artifacts.root):
        assert mode(store) == 0o700, store
    # reopened, what RocksDB made under the old modes is narrowed too
    RocksViewStore(str(tmp_path / "views")).close()
    files = [p for p in (tmp_path / "views").rglob("*") if p.is_file()]
    assert files and all(mode(p) & 0o077 == 0 for p in files)


def test_an_existing_open_directory_is_narrowed_and_nothing_is_widened(tmp_path):
    d = tmp_path / "data"
    d.mkdir(mode=0o755)
    (d / "a").write_text("x")
    os.chmod(d / "a", 0o644)
    (d / "ro").write_text("x")
    os.chmod(d / "ro", 0o400)
    private_dir(d)
    assert mode(d) == 0o700 and mode(d / "a") == 0o600 and mode(d / "ro") == 0o400
