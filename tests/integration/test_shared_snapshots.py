"""One contract suite for the shared snapshot port, run against every adapter: the
in-memory fake, a local directory and S3 (moto's server, or AWS_ENDPOINT_URL)."""

from __future__ import annotations

import threading

import pytest

from framespool.processors.shared_snapshots import (
    DirSharedSnapshots,
    MemorySharedSnapshots,
    Owner,
    S3SharedSnapshots,
    SharedSnapshots,
    SnapshotMeta,
    StaleEpoch,
    open_shared_snapshots,
)

pytestmark = pytest.mark.integration

NS = "framespool.scheduler.test"


@pytest.fixture(params=["memory", "dir", "s3"])
def shared(request, tmp_path) -> SharedSnapshots:
    if request.param == "memory":
        return MemorySharedSnapshots()
    if request.param == "dir":
        return DirSharedSnapshots(tmp_path / "shared")
    bucket = request.getfixturevalue("s3_bucket")
    return S3SharedSnapshots(bucket, request.getfixturevalue("s3_endpoint"), prefix="snaps")


def meta(offset: int, epoch: int, instance: str = "a", partition: int = 0) -> SnapshotMeta:
    return SnapshotMeta(NS, partition, offset, epoch, instance)


def test_an_unclaimed_partition_has_no_owner_and_no_snapshot(shared):
    assert isinstance(shared, SharedSnapshots)
    assert shared.owner(NS, 0) == Owner(0, "")
    assert shared.load(NS, 0) is None


def test_each_claim_gets_a_new_epoch_and_names_its_instance(shared):
    assert shared.claim(NS, 0, "a") == 1
    assert shared.claim(NS, 0, "b") == 2
    assert shared.owner(NS, 0) == Owner(2, "b")
    assert shared.claim(NS, 1, "a") == 1  # partitions are independent
    assert shared.owner("other-topic", 0) == Owner(0, "")  # and namespaces


def test_a_published_snapshot_loads_with_its_writer_and_position(shared):
    epoch = shared.claim(NS, 3, "a")
    assert shared.publish(meta(41, epoch, "a", partition=3), b"state@41")
    loaded, payload = shared.load(NS, 3)
    assert payload == b"state@41"
    assert (loaded.namespace, loaded.partition, loaded.offset, loaded.epoch) == (NS, 3, 41, 1)
    assert loaded.instance == "a" and loaded.format == 1 and loaded.size == len(payload)
    assert shared.publish(meta(50, epoch, "a", partition=3), b"state@50")
    assert shared.load(NS, 3)[1] == b"state@50"


def test_an_older_snapshot_never_replaces_a_newer_one(shared):
    epoch = shared.claim(NS, 0, "a")
    assert shared.publish(meta(10, epoch), b"ten")
    assert not shared.publish(meta(5, epoch), b"five")
    assert not shared.publish(meta(10, epoch), b"ten again")
    assert shared.load(NS, 0)[1] == b"ten"


def test_a_writer_from_a_lower_epoch_is_refused(shared):
    zombie = shared.claim(NS, 0, "a")
    assert shared.publish(meta(100, zombie, "a"), b"a@100")
    owner = shared.claim(NS, 0, "b")  # b takes over from a's snapshot at 100
    with pytest.raises(StaleEpoch) as refused:
        shared.publish(meta(150, zombie, "a"), b"a@150")  # further, but a zombie's
    assert (refused.value.mine, refused.value.owner, refused.value.by) == (1, 2, "b")
    assert shared.load(NS, 0)[1] == b"a@100"
    assert shared.publish(meta(120, owner, "b"), b"b@120")  # (2, 120) > (1, 100)
    loaded, payload = shared.load(NS, 0)
    assert (loaded.epoch, loaded.offset, loaded.instance, payload) == (2, 120, "b", b"b@120")


def test_an_unclaimed_epoch_cannot_publish(shared):
    with pytest.raises(StaleEpoch):
        shared.publish(meta(1, 1), b"never claimed")
    shared.claim(NS, 0, "a")
    with pytest.raises(StaleEpoch):
        shared.publish(meta(1, 7), b"an epoch from the future")


def test_concurrent_claims_never_share_an_epoch(shared):
    epochs: list[int] = []
    lock = threading.Lock()

    def claim(name: str) -> None:
        for _ in range(5):
            e = shared.claim(NS, 0, name)
            with lock:
                epochs.append(e)

    threads = [threading.Thread(target=claim, args=(f"i{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(epochs) == list(range(1, 21))
    assert shared.owner(NS, 0).epoch == 20


def test_a_claim_keeps_the_snapshot(shared):
    e1 = shared.claim(NS, 0, "a")
    shared.publish(meta(7, e1), b"seven")
    shared.claim(NS, 0, "b")
    loaded, payload = shared.load(NS, 0)
    assert (loaded.offset, loaded.epoch, payload) == (7, 1, b"seven")


def test_large_payloads_round_trip(shared):
    epoch = shared.claim(NS, 0, "a")
    payload = bytes(range(256)) * 40_000  # ~10 MB
    assert shared.publish(meta(999_999, epoch), payload)
    assert shared.load(NS, 0)[1] == payload


def test_locations_open_the_right_adapter(tmp_path, s3_endpoint, monkeypatch):
    assert isinstance(open_shared_snapshots("memory:"), MemorySharedSnapshots)
    local = open_shared_snapshots(str(tmp_path / "d"))
    assert isinstance(local, DirSharedSnapshots) and local.root == (tmp_path / "d").resolve()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    s3 = open_shared_snapshots("s3://some-bucket/cells/snaps")
    assert isinstance(s3, S3SharedSnapshots)
    assert (s3.bucket, s3.prefix) == ("some-bucket", "cells/snaps")
    with pytest.raises(ValueError, match="bucket"):
        open_shared_snapshots("s3:///x")


def bodies(shared) -> list[str]:
    """The snapshot bodies the adapter holds, whatever its medium."""
    if isinstance(shared, MemorySharedSnapshots):
        return sorted(shared._bodies)
    if isinstance(shared, DirSharedSnapshots):
        return sorted(p.name for p in shared.root.rglob("*.snap"))
    listed = shared._client.list_objects_v2(Bucket=shared.bucket, Prefix=shared.prefix + "/")
    return sorted(o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".snap"))


def test_replaced_and_refused_snapshots_leave_no_bodies_behind(shared):
    a = shared.claim(NS, 0, "a")
    for offset in (1, 2, 3):
        assert shared.publish(meta(offset, a), b"x" * offset)
    assert not shared.publish(meta(2, a), b"old")
    shared.claim(NS, 0, "b")
    with pytest.raises(StaleEpoch):
        shared.publish(meta(4, a), b"zombie")
    assert len(bodies(shared)) == 2  # the newest and the one before it (a damaged newest)
    assert shared.load(NS, 0)[1] == b"xxx"


def test_a_damaged_newest_body_falls_back_to_the_previous_snapshot(shared):
    """A torn or corrupted write is caught by the head's SHA-256 and the snapshot
    before it is used; with both damaged there is no snapshot (rebuild from the log)."""
    epoch = shared.claim(NS, 0, "a")
    assert shared.publish(meta(10, epoch), b"state@10")
    assert shared.publish(meta(20, epoch), b"state@20")
    head = shared._read_head(shared._head_key(NS, 0))
    shared._put_body(head["snapshot"]["key"], b"state@2")  # torn: half of it
    loaded, payload = shared.load(NS, 0)
    assert (loaded.offset, payload) == (10, b"state@10")
    shared._put_body(head["previous"]["key"], b"garbage")
    assert shared.load(NS, 0) is None
    assert shared.publish(meta(30, epoch), b"state@30")  # the next publish heals it
    assert shared.load(NS, 0)[1] == b"state@30"


def test_an_unreachable_s3_endpoint_is_a_shared_store_error():
    from framespool.broker import free_port
    from framespool.processors.shared_snapshots import SharedStoreError

    dead = S3SharedSnapshots("nowhere", f"http://127.0.0.1:{free_port()}")
    dead._client.meta.config.retries = {"max_attempts": 1}
    with pytest.raises(SharedStoreError, match="s3://nowhere"):
        dead.claim(NS, 0, "a")
    with pytest.raises(SharedStoreError):
        dead.owner(NS, 0)
