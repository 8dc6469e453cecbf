"""One suite, two adapters: the rocksdict store and the in-memory fake."""

from __future__ import annotations

from dataclasses import replace

import pytest

from framespool.projections import cluster
from framespool.projections.delivery_lanes import DELIVERED, PENDING, Delivery
from framespool.projections.jobs import COMPLETED, QUEUED, RUNNING, fold, submitted_view
from framespool.projections.store import (
    Batch,
    InMemoryViewStore,
    RocksViewStore,
)
from tests.support.projections import cell_status, lifecycle, spec


@pytest.fixture(params=["rocksdict", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        s = InMemoryViewStore()
    else:
        s = RocksViewStore(str(tmp_path / "views"))
    yield s
    s.close()


def view(job_id, tenant="acme", created_ms=1_000, n=None):
    events = lifecycle(job_id, tenant, ts0=created_ms)
    return fold(events[:n] if n else events)


def test_get_missing_and_offsets_default(store):
    assert store.get("nope") is None
    assert store.offset("t", 0) == -1


def test_commit_writes_views_and_offsets_together(store):
    v = view("j1")
    b = Batch(views={"j1": v})
    b.advance("job-events", 2, 41)
    b.advance("job-events", 2, 40)  # offsets only move forward
    store.commit(b)
    assert store.get("j1") == v
    assert store.offset("job-events", 2) == 41
    store.commit(Batch(offsets={("job-events", 2): 7}))
    assert store.offset("job-events", 2) == 41


def test_upsert_is_idempotent_and_indexes_follow_state(store):
    queued, done = view("j1", n=2), view("j1")
    store.commit(Batch(views={"j1": queued}))
    store.commit(Batch(views={"j1": queued}))
    assert [j.job_id for j in store.list_jobs("acme", QUEUED).jobs] == ["j1"]
    store.commit(Batch(views={"j1": done}))
    assert store.list_jobs("acme", QUEUED).jobs == []
    assert [j.state for j in store.list_jobs("acme", COMPLETED).jobs] == [COMPLETED]
    assert len(store.list_jobs("acme").jobs) == 1


def test_insert_if_absent_never_overwrites(store):
    s = spec("j1")
    assert store.insert_if_absent(submitted_view(s, 5))
    advanced = view("j1")
    store.commit(Batch(views={"j1": advanced}))
    assert not store.insert_if_absent(submitted_view(s, 6))
    assert store.get("j1") == advanced


def test_listing_is_per_tenant_newest_first_and_pages(store):
    views = {f"j{i}": view(f"j{i}", created_ms=1_000 + i) for i in range(7)}
    views["other"] = view("other", tenant="globex")
    store.commit(Batch(views=views))
    page = store.list_jobs("acme", limit=3)
    assert [j.job_id for j in page.jobs] == ["j6", "j5", "j4"]
    seen = [j.job_id for j in page.jobs]
    while page.next_cursor:
        page = store.list_jobs("acme", limit=3, cursor=page.next_cursor)
        seen += [j.job_id for j in page.jobs]
    assert seen == [f"j{i}" for i in range(6, -1, -1)]
    assert [j.job_id for j in store.list_jobs("globex").jobs] == ["other"]
    assert store.list_jobs("nobody").jobs == []
    assert store.list_jobs("acme", limit=7).next_cursor is None


def test_cluster_cells_and_breakers_persist(store):
    cv = cluster.apply(None, cell_status("cell-0", 1_000))
    cv = cluster.apply(cv, cell_status("cell-1", 2_000, busy=5))
    store.commit(Batch(cells=dict(cv.cells)))
    loaded = store.load_cluster()
    assert loaded.cells == cv.cells and loaded.updated_ms == 2_000
    assert cluster.totals(loaded) == cluster.totals(cv)


def test_delivery_outbox_is_written_once_and_tracks_status(store):
    d = Delivery(
        delivery_id="e1", job_id="j1", tenant="acme", url="https://x/h", body="{}", created_ms=1
    )
    store.commit(Batch(deliveries=[d]))
    assert [p.delivery_id for p in store.pending_deliveries()] == ["e1"]
    store.put_delivery(replace(d, status=DELIVERED, attempts=1))
    assert store.pending_deliveries() == []
    store.commit(Batch(deliveries=[d]))  # a replay must not re-arm a delivered webhook
    assert store.get_delivery("e1").status == DELIVERED
    store.put_delivery(replace(d, delivery_id="e2", status=PENDING, attempts=2))
    assert [p.attempts for p in store.pending_deliveries()] == [2]


def test_views_running_state_survive_reopen(tmp_path):
    path = str(tmp_path / "views")
    s = RocksViewStore(path)
    v = view("j1", n=5)
    assert v.state == RUNNING
    b = Batch(views={"j1": v})
    b.advance("progress", 0, 9)
    s.commit(b)
    s.close()
    s2 = RocksViewStore(path)
    assert s2.get("j1") == v and s2.offset("progress", 0) == 9
    s2.close()


class _CountingDb:
    """A RocksViewStore's database, counting the reads of job views."""

    def __init__(self, db):
        self.db, self.view_reads = db, 0

    def get(self, key):
        if key.startswith(b"j/"):
            self.view_reads += 1
        return self.db.get(key)

    def __getattr__(self, name):
        return getattr(self.db, name)


def test_rocks_views_are_read_from_the_database_once_then_from_the_cache(tmp_path):
    """The decoded-view cache (store.VIEW_CACHE): a view written or read once is
    not read again while cached; the least recently used leaves first and is
    then read again; a view the retention deletes is gone from the cache too."""
    from framespool.projections.store import Retention

    s = RocksViewStore(str(tmp_path / "views"), view_cache=2)
    counting = s._db = _CountingDb(s._db)
    queued, done = view("j1", n=2), view("j1")
    assert s.insert_if_absent(submitted_view(spec("j1"), 1_000))
    reads = counting.view_reads
    s.commit(Batch(views={"j1": queued}))  # commit reads the old view for its index keys
    assert s.get("j1") == queued
    s.commit(Batch(views={"j1": done}))
    assert s.get("j1") == done and s.list_jobs("acme").jobs == [done]
    assert counting.view_reads == reads, "every read of j1 after its insert was a cache hit"
    s.commit(Batch(views={"j2": view("j2")}))
    s.commit(Batch(views={"j3": view("j3")}))  # the cache holds two views: j1 leaves
    reads = counting.view_reads
    assert s.get("j1") == done and counting.view_reads == reads + 1
    s.close()
    # retention: a finished view past its horizon leaves the database and the cache
    r = RocksViewStore(str(tmp_path / "expiring"), Retention(finished_horizon_s=60))
    r.commit(Batch(views={"old": view("old", created_ms=1_000)}))
    assert r.get("old") is not None
    later = view("new", created_ms=1_000 + 3_600_000)
    r.commit(Batch(views={"new": later}))
    assert r.get("old") is None
    r.close()
