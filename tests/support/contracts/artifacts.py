"""The artifact-store contract: one test suite every adapter and the fake must pass.

Subclass :class:`ArtifactStoreContract` in a test module as ``Test<Adapter>``
and provide two fixtures: ``store`` (a fresh, empty store) and ``corrupt``
(a function ``corrupt(key)`` that changes an object's bytes behind the store's
back, as disk or network corruption would). ``tests/unit/test_artifacts.py``
runs it against the local directory and the in-memory fake,
``tests/integration/test_artifacts_s3.py`` against S3.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from framespool.agents.artifacts.port import (
    ArtifactNotFound,
    ArtifactStore,
    ChecksumMismatch,
    InvalidKey,
    checkpoint_key,
    for_rank,
    output_key,
)

BIG = 8 * 1024 * 1024 + 123_457  # above the 8 MiB multipart threshold, not part-aligned


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


class ArtifactStoreContract:
    def test_is_an_artifact_store(self, store):
        assert isinstance(store, ArtifactStore)

    def test_served_is_the_store_itself_or_none(self, store):
        """The API serves a store's signed URLs only where ``served()`` names it."""
        assert store.served() in (None, store)

    def test_put_then_get_round_trips_bytes_digest_and_size(self, store, tmp_path):
        data = b"frames" * 1000
        stored = store.put_file(output_key("job-1", 1, "out.gif"), _write(tmp_path / "src", data))
        assert stored.sha256 == hashlib.sha256(data).hexdigest()
        assert stored.size_bytes == len(data)
        got = store.get_file(stored.uri, tmp_path / "dst" / "copy")
        assert (tmp_path / "dst" / "copy").read_bytes() == data
        assert got.sha256 == stored.sha256 and got.size_bytes == len(data)

    @pytest.mark.parametrize("data", [b"", b"frames" * 1000], ids=["empty", "bytes"])
    def test_put_bytes_stores_what_put_file_would(self, store, tmp_path, data):
        by_bytes = store.put_bytes(output_key("job-b", 1, "out.bin"), data)
        by_file = store.put_file(output_key("job-f", 1, "out.bin"), _write(tmp_path / "s", data))
        assert by_bytes.sha256 == by_file.sha256 == hashlib.sha256(data).hexdigest()
        assert by_bytes.size_bytes == len(data) and store.exists(by_bytes.uri)
        got = store.get_file(by_bytes.uri, tmp_path / "dst")
        assert (tmp_path / "dst").read_bytes() == data and got.sha256 == by_bytes.sha256

    def test_delete_removes_the_object_and_repeats_harmlessly(self, store, tmp_path):
        kept = store.put_file(checkpoint_key("job-d", 1, 2), _write(tmp_path / "a", b"keep"))
        gone = store.put_file(checkpoint_key("job-d", 1, 1), _write(tmp_path / "b", b"drop"))
        store.delete(gone.uri)
        assert not store.exists(gone.uri) and store.exists(kept.uri)
        with pytest.raises(ArtifactNotFound):
            store.get_file(gone.uri, tmp_path / "dst")
        store.delete(gone.uri)  # a sweep repeated after a crash
        again = store.put_file(checkpoint_key("job-d", 1, 1), _write(tmp_path / "c", b"new"))
        assert store.get_file(again.uri, tmp_path / "dst2").sha256 == again.sha256

    def test_get_accepts_the_key_or_the_uri(self, store, tmp_path):
        key = checkpoint_key("job-1", 2, 7)
        stored = store.put_file(key, _write(tmp_path / "src", b"ckpt"))
        assert store.key_of(stored.uri) == key
        store.get_file(key, tmp_path / "a")
        store.get_file(stored.uri, tmp_path / "b")
        assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == b"ckpt"

    def test_exists_only_after_put(self, store, tmp_path):
        key = output_key("job-2", 1, "video.gif")
        assert not store.exists(key)
        stored = store.put_file(key, _write(tmp_path / "src", b"x"))
        assert store.exists(key)
        assert store.exists(stored.uri)

    def test_missing_object_is_not_found(self, store, tmp_path):
        with pytest.raises(ArtifactNotFound):
            store.get_file(output_key("nope", 1, "x"), tmp_path / "dst")
        assert not (tmp_path / "dst").exists()

    def test_overwrite_replaces_the_object(self, store, tmp_path):
        key = output_key("job-3", 1, "out")
        store.put_file(key, _write(tmp_path / "one", b"one"))
        stored = store.put_file(key, _write(tmp_path / "two", b"two!"))
        store.get_file(key, tmp_path / "dst")
        assert (tmp_path / "dst").read_bytes() == b"two!" and stored.size_bytes == 4

    def test_empty_file(self, store, tmp_path):
        stored = store.put_file(output_key("job-4", 1, "empty"), _write(tmp_path / "e", b""))
        assert stored.size_bytes == 0 and stored.sha256 == hashlib.sha256(b"").hexdigest()
        store.get_file(stored.uri, tmp_path / "dst")
        assert (tmp_path / "dst").read_bytes() == b""

    def test_runs_have_separate_keys(self, store, tmp_path):
        a = store.put_file(output_key("job-5", 1, "out"), _write(tmp_path / "a", b"run one"))
        b = store.put_file(output_key("job-5", 2, "out"), _write(tmp_path / "b", b"run two"))
        assert a.uri != b.uri
        store.get_file(a.uri, tmp_path / "got")
        assert (tmp_path / "got").read_bytes() == b"run one"

    def test_gang_ranks_have_separate_keys_and_signed_urls(self, store, tmp_path):
        keys = [output_key("job-g", 1, "out", rank) for rank in (0, 1)]
        assert keys == [
            "jobs/job-g/runs/1/ranks/0/output/out",
            "jobs/job-g/runs/1/ranks/1/output/out",
        ]
        a = store.put_file(keys[0], _write(tmp_path / "a", b"rank 0"))
        store.put_file(keys[1], _write(tmp_path / "b", b"rank 1"))
        store.get_file(a.uri, tmp_path / "got")
        assert (tmp_path / "got").read_bytes() == b"rank 0"
        assert "ranks/0" in store.signed_url(a.uri, expires_s=60)
        ck = checkpoint_key("job-g", 1, 4, 0)
        assert ck == "jobs/job-g/runs/1/ranks/0/checkpoints/4"
        assert for_rank(ck, 3) == "jobs/job-g/runs/1/ranks/3/checkpoints/4"
        assert for_rank(checkpoint_key("job-g", 1, 4), 3) == "jobs/job-g/runs/1/checkpoints/4"

    @pytest.mark.parametrize(
        "key", ["", "/abs/key", "a/../b", "a//b", "../escape", "a/./b", "a/.hidden"]
    )
    def test_keys_that_could_escape_are_refused(self, store, tmp_path, key):
        src = _write(tmp_path / "src", b"x")
        with pytest.raises(InvalidKey):
            store.put_file(key, src)

    def test_key_helpers_refuse_slashes_in_segments(self):
        with pytest.raises(InvalidKey):
            output_key("job/../../etc", 1, "out")
        with pytest.raises(InvalidKey):
            checkpoint_key("job", 1, "../x")
        assert output_key("j", 3, "o.gif") == "jobs/j/runs/3/output/o.gif"
        assert checkpoint_key("j", 3, 12) == "jobs/j/runs/3/checkpoints/12"

    def test_signed_url_names_the_key_and_expires(self, store, tmp_path):
        key = output_key("job-6", 1, "out.gif")
        store.put_file(key, _write(tmp_path / "src", b"gif"))
        url = store.signed_url(key, expires_s=60)
        assert url.startswith("http") and "job-6" in url
        assert ("expires=" in url.lower()) or ("x-amz-expires=60" in url.lower())

    def test_large_file_round_trips_with_checksum(self, store, tmp_path):
        data = os.urandom(BIG)
        stored = store.put_file(
            output_key("job-big", 1, "video.bin"), _write(tmp_path / "big", data)
        )
        assert stored.size_bytes == BIG
        assert stored.sha256 == hashlib.sha256(data).hexdigest()
        got = store.get_file(stored.uri, tmp_path / "back")
        assert got.sha256 == stored.sha256
        assert (tmp_path / "back").read_bytes() == data

    def test_corruption_is_detected_on_download(self, store, corrupt, tmp_path):
        key = output_key("job-7", 1, "out")
        store.put_file(key, _write(tmp_path / "src", b"good bytes"))
        corrupt(key)
        with pytest.raises(ChecksumMismatch):
            store.get_file(key, tmp_path / "dst")
        assert not (tmp_path / "dst").exists()
