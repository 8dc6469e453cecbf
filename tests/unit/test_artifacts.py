"""LocalDirStore and the in-memory fake through the artifact-store contract, plus the
local directory's URL signing and file work."""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlparse

import pytest

from framespool.agents.artifacts.local import LocalDirStore
from framespool.agents.artifacts.memory import MemoryArtifactStore
from framespool.agents.artifacts.port import InvalidKey, output_key
from tests.support.contracts.artifacts import ArtifactStoreContract

SECRET = b"test-secret"


@pytest.fixture
def store(tmp_path):
    return LocalDirStore(tmp_path / "store", url_base="http://api.test", secret=SECRET)


@pytest.fixture
def corrupt(store):
    def _corrupt(key: str) -> None:
        path = store.local_path(key)
        path.write_bytes(path.read_bytes()[::-1] + b"!")

    return _corrupt


class TestLocalDirStore(ArtifactStoreContract):
    pass


class TestMemoryArtifactStore(ArtifactStoreContract):
    @pytest.fixture
    def store(self):
        return MemoryArtifactStore()

    @pytest.fixture
    def corrupt(self, store):
        def _corrupt(key: str) -> None:
            store.objects[key] = store.objects[key][::-1] + b"!"

        return _corrupt


def _parts(url: str) -> tuple[str, int, str]:
    u = urlparse(url)
    q = parse_qs(u.query)
    key = unquote(u.path.removeprefix("/v1/artifacts/"))
    return key, int(q["expires"][0]), q["sig"][0]


def test_uri_is_local_and_file_uri_inside_root_is_accepted(store, tmp_path):
    (tmp_path / "a").write_bytes(b"abc")
    stored = store.put_file("jobs/j/runs/1/output/a", tmp_path / "a")
    assert stored.uri == "local://jobs/j/runs/1/output/a"
    file_uri = f"file://{store.local_path(stored.uri)}"
    assert store.key_of(file_uri) == "jobs/j/runs/1/output/a"
    with pytest.raises(InvalidKey):
        store.key_of(f"file://{tmp_path / 'a'}")  # outside the root
    with pytest.raises(InvalidKey):
        store.key_of("s3://bucket/jobs/j")


def test_signed_url_verifies_until_it_expires():
    clock = [1_000_000.0]
    store = LocalDirStore(
        "/tmp/framespool-test-signing",
        url_base="http://api.test/",
        secret=SECRET,
        clock=lambda: clock[0],
    )
    url = store.signed_url(output_key("job 1", 2, "out.gif"), expires_s=60)
    assert url.startswith("http://api.test/v1/artifacts/jobs/job%201/runs/2/output/out.gif?")
    key, expires, sig = _parts(url)
    assert key == "jobs/job 1/runs/2/output/out.gif" and expires == 1_000_060
    assert store.verify_signature(key, expires, sig, now=1_000_000)
    assert store.verify_signature(key, str(expires), sig, now=1_000_060)
    assert not store.verify_signature(key, expires, sig, now=1_000_061)


@pytest.mark.parametrize("tamper", ["key", "expires", "sig", "secret", "garbage"])
def test_tampered_signed_url_is_refused(tamper, tmp_path):
    store = LocalDirStore(tmp_path, secret=SECRET, clock=lambda: 100.0)
    key, expires, sig = _parts(store.signed_url("jobs/a/runs/1/output/o", expires_s=60))
    if tamper == "key":
        key = "jobs/b/runs/1/output/o"
    elif tamper == "expires":
        expires += 3600  # extending the lifetime must break the signature
    elif tamper == "sig":
        sig = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    elif tamper == "secret":
        store = LocalDirStore(tmp_path, secret=b"other", clock=lambda: 100.0)
    else:
        key, expires = "../../etc/passwd", "soon"
    assert not store.verify_signature(key, expires, sig, now=100.0)


def test_a_secret_is_required(tmp_path):
    with pytest.raises(ValueError):
        LocalDirStore(tmp_path, secret="")


def test_only_an_object_with_bytes_is_fsynced(store, tmp_path, monkeypatch):
    """An empty object (the noop builtin's output) has no data a crash could lose:
    its fsync is skipped; any object with bytes is synced before it is renamed in."""
    import os

    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    store.put_bytes(output_key("job-e", 1, "out"), b"")
    assert synced == []
    store.put_bytes(output_key("job-d", 1, "out"), b"data")
    (tmp_path / "src").write_bytes(b"more")
    store.put_file(output_key("job-f", 1, "out"), tmp_path / "src")
    assert len(synced) == 2


def test_an_empty_object_records_no_metadata_and_reads_back(store, tmp_path):
    """Every empty object has the same digest, so the noop builtin's output costs no
    metadata write (and no second tree of directories); an object with bytes still
    records its digest, and an empty object over it removes the stale record."""
    import hashlib

    empty_key = output_key("job-e", 1, "out")
    stored = store.put_bytes(empty_key, b"")
    assert stored.sha256 == hashlib.sha256(b"").hexdigest() and stored.size_bytes == 0
    assert not (tmp_path / "store" / ".meta").exists()
    assert store.get_file(stored.uri, tmp_path / "e").sha256 == stored.sha256

    key = output_key("job-d", 1, "out")
    assert store.put_bytes(key, b"data").size_bytes == 4
    assert (tmp_path / "store" / ".meta" / (key + ".json")).is_file()
    again = store.put_bytes(key, b"")
    assert not (tmp_path / "store" / ".meta" / (key + ".json")).exists()
    assert store.get_file(again.uri, tmp_path / "d").size_bytes == 0


def test_a_new_keys_directories_cost_one_mkdir_each_and_none_fails(store, monkeypatch):
    """The directories of a key are made top-down (LocalDirStore._make_dirs): a
    noop's output under a new job costs 4 mkdir calls, none answering ENOENT
    (Path.mkdir(parents=True) made 7, 3 failing at ~40 us apiece); a second
    run of the job makes only its own, and existing levels are no error."""
    import os

    made: list[str] = []
    real_mkdir = os.mkdir

    def counting_mkdir(path, *args, **kwargs):
        try:
            real_mkdir(path, *args, **kwargs)
        except FileNotFoundError:
            made.append(f"ENOENT {path}")
            raise
        except FileExistsError:
            raise
        made.append(str(path))

    monkeypatch.setattr(os, "mkdir", counting_mkdir)
    first = store.put_bytes(output_key("j1", 1, "result.gif"), b"")
    assert [m.removeprefix(str(store.root)) for m in made] == [
        "/jobs",
        "/jobs/j1",
        "/jobs/j1/runs",
        "/jobs/j1/runs/1",
        "/jobs/j1/runs/1/output",
    ]
    made.clear()
    store.put_bytes(output_key("j1", 2, "result.gif"), b"x")  # with bytes: its metadata too
    assert not [m for m in made if m.startswith("ENOENT")]
    assert store.local_path(output_key("j1", 2, "result.gif")).read_bytes() == b"x"
    assert store.local_path(first.uri).read_bytes() == b""
    with pytest.raises(OSError):  # a level that is a file is still refused
        store.put_bytes("jobs/j1/runs/1/output/result.gif/below", b"")


def test_an_empty_object_is_created_in_place_and_replaces_an_earlier_one_whole(
    store, tmp_path, monkeypatch
):
    """put_bytes of no bytes (the noop builtin's output) creates the file with
    O_EXCL, without a temporary file; under a key that already holds an object
    it falls back to the temporary file and rename, and the earlier object's
    metadata goes (its digest would not match)."""
    import hashlib
    import tempfile

    key = output_key("j9", 1, "result.gif")
    temporaries: list[str] = []
    real_mkstemp = tempfile.mkstemp

    def counting_mkstemp(*args, **kwargs):
        fd, path = real_mkstemp(*args, **kwargs)
        temporaries.append(path)
        return fd, path

    monkeypatch.setattr(tempfile, "mkstemp", counting_mkstemp)
    stored = store.put_bytes(key, b"")
    assert temporaries == [], "a new empty object needs no temporary file"
    assert (stored.sha256, stored.size_bytes) == (hashlib.sha256(b"").hexdigest(), 0)
    assert store.local_path(key).read_bytes() == b""
    assert store.get_file(stored.uri, tmp_path / "got").sha256 == stored.sha256
    other = output_key("j9", 2, "result.gif")
    store.put_bytes(other, b"earlier bytes")
    assert store._meta(other).exists()
    replaced = store.put_bytes(other, b"")
    assert len(temporaries) == 2, "an existing object is replaced through a temporary file"
    assert store.local_path(other).read_bytes() == b"" and not store._meta(other).exists()
    assert store.get_file(replaced.uri, tmp_path / "got2").size_bytes == 0
    assert [p.name for p in store.local_path(other).parent.iterdir()] == ["result.gif"]
