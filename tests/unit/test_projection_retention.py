"""Bounded projection storage, one suite for both adapters: queued counts for the
submit-time cap, finished views that expire by event time, a per-tenant cap on
stored views, and an outbox that forgets what it delivered."""

from __future__ import annotations

from dataclasses import replace

import pytest

from framespool.projections.delivery_lanes import DELIVERED, PENDING, Delivery
from framespool.projections.jobs import COMPLETED, QUEUED, RUNNING, SUBMITTED, JobView
from framespool.projections.store import (
    Batch,
    InMemoryViewStore,
    Retention,
    RocksViewStore,
)

HOUR = 3_600_000


@pytest.fixture(params=["rocksdict", "memory"])
def make_store(request, tmp_path):
    made = []

    def make(**retention):
        r = Retention(**retention)
        if request.param == "memory":
            s = InMemoryViewStore(r)
        else:
            s = RocksViewStore(str(tmp_path / f"views-{len(made)}"), r)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def job(job_id: str, state: str, at: int, tenant: str = "acme") -> JobView:
    done = at if state in (COMPLETED,) else 0
    return JobView(
        job_id=job_id, tenant=tenant, state=state, created_ms=at, updated_ms=at, finished_ms=done
    )


def test_queued_and_running_counts_follow_each_views_state(make_store):
    store = make_store()
    store.commit(Batch(views={"a": job("a", SUBMITTED, 1), "b": job("b", QUEUED, 1)}))
    store.commit(Batch(views={"c": job("c", QUEUED, 1, tenant="other")}))
    assert store.queued_count("acme") == 2 and store.queued_count("other") == 1
    store.commit(Batch(views={"a": job("a", QUEUED, 2)}))  # same bucket: no double count
    assert store.queued_count("acme") == 2
    assert store.running_count("acme") == 0
    store.commit(Batch(views={"a": job("a", RUNNING, 3), "b": job("b", COMPLETED, 3)}))
    assert store.queued_count("acme") == 0
    assert store.running_count("acme") == 1 and store.running_count("other") == 0
    assert store.insert_if_absent(job("d", SUBMITTED, 4)) is True
    assert store.insert_if_absent(job("d", SUBMITTED, 4)) is False
    assert store.queued_count("acme") == 1


def test_finished_views_expire_a_horizon_of_event_time_after_they_ended(make_store):
    store = make_store(finished_horizon_s=3600)
    store.commit(Batch(views={"old": job("old", COMPLETED, 0), "live": job("live", QUEUED, 0)}))
    store.commit(Batch(views={"new": job("new", COMPLETED, HOUR - 1)}))
    assert store.get("old") is not None, "not yet a horizon old"
    store.commit(Batch(views={"later": job("later", QUEUED, HOUR + 1)}))
    assert store.get("old") is None
    assert [v.job_id for v in store.list_jobs("acme", COMPLETED).jobs] == ["new"]
    assert store.get("live") is not None, "live views never expire"
    assert store.view_count("acme") == 3 and store.queued_count("acme") == 2


def test_a_tenants_oldest_finished_views_go_beyond_its_cap(make_store):
    store = make_store(max_views_per_tenant=3)
    store.commit(Batch(views={"q": job("q", QUEUED, 0)}))
    for i in range(5):
        store.commit(Batch(views={f"d{i}": job(f"d{i}", COMPLETED, 10 + i)}))
    store.commit(Batch(views={"x": job("x", COMPLETED, 99, tenant="other")}))
    kept = sorted(v.job_id for v in store.list_jobs("acme", limit=10).jobs)
    assert kept == ["d3", "d4", "q"], "the oldest finished views went; the live one stayed"
    assert store.view_count("acme") == 3 and store.get("x") is not None


def test_done_outbox_records_expire_pending_ones_stay(make_store):
    store = make_store(outbox_horizon_s=60)
    pending = Delivery("e1", "j", "acme", "https://hook", "{}", created_ms=0)
    done = Delivery("e2", "j", "acme", "https://hook", "{}", created_ms=0)
    store.commit(Batch(deliveries=[pending, done]))
    store.put_delivery(replace(done, status=DELIVERED, done_ms=1_000))
    store.commit(Batch(views={"j": job("j", QUEUED, 60_999)}))
    assert store.get_delivery("e2") is not None
    store.commit(Batch(views={"j": job("j", QUEUED, 61_001)}))
    assert store.get_delivery("e2") is None
    assert [d.delivery_id for d in store.pending_deliveries()] == ["e1"]
    assert store.get_delivery("e1").status == PENDING


@pytest.mark.slow
def test_storage_stays_flat_over_100k_jobs(make_store, tmp_path):
    # 100,000 jobs through the store at 100 a second, each queued and completed
    # a minute later, with a 60 s horizon: the store holds about two minutes of
    # jobs (a minute live, a minute finished), whatever the total. (The rocksdict
    # run is shorter: 20,000 jobs still pass the point where it must go flat.)
    store = make_store(finished_horizon_s=60)
    n = 100_000 if isinstance(store, InMemoryViewStore) else 20_000
    counts = {}
    for i in range(n):
        t = 10 * i
        batch = Batch(views={f"j{i}": job(f"j{i}", QUEUED, t)})
        if i >= 6_000:
            done = f"j{i - 6_000}"
            batch.views[done] = job(done, COMPLETED, t)
        store.commit(batch)
        if (i + 1) % (n // 5) == 0:
            counts[i + 1] = store.view_count("acme")
    window = 2 * 6_000 + 100
    assert all(c <= window for c in counts.values()), counts
    assert counts[n] == counts[4 * n // 5], counts
    if isinstance(store, RocksViewStore):
        assert sum(1 for _ in store._scan(b"j/")) == counts[n]
        assert sum(1 for _ in store._scan(b"x/")) <= window
    else:
        assert len(store._views) == counts[n]
        assert len(store._ended) <= window
        assert all(len(h) <= 2 * window + 64 for h in store._tenant_ended.values())


def test_a_provisional_insert_at_the_cap_removes_the_oldest_finished_view(make_store):
    store = make_store(max_views_per_tenant=3)
    for i in range(2):
        store.commit(Batch(views={f"d{i}": job(f"d{i}", COMPLETED, 10 + i)}))
    store.commit(Batch(views={"q": job("q", QUEUED, 12)}))  # at the cap, nothing to expire
    assert store.insert_if_absent(job("p", SUBMITTED, 20)) is True
    kept = sorted(v.job_id for v in store.list_jobs("acme", limit=10).jobs)
    assert kept == ["d1", "p", "q"]
    assert store.view_count("acme") == 3 and store.queued_count("acme") == 2


def test_a_provisional_insert_expires_what_the_last_commit_had_to_defer(make_store):
    # "old" ended long ago but is rewritten in the batch that moves "now" past its
    # horizon: it stays for that batch, and the next write (here the API's
    # provisional insert, which never moves "now") deletes it.
    store = make_store(finished_horizon_s=3600)
    store.commit(Batch(views={"old": job("old", COMPLETED, 0)}))
    store.commit(Batch(views={"old": job("old", COMPLETED, 0), "q": job("q", QUEUED, 2 * HOUR)}))
    assert store.get("old") is not None
    assert store.insert_if_absent(job("p", SUBMITTED, 2 * HOUR)) is True
    assert store.get("old") is None
    assert store.view_count("acme") == 2


def test_a_provisional_insert_expires_an_outbox_record_done_since_the_last_commit(make_store):
    store = make_store(outbox_horizon_s=60)
    store.commit(Batch(views={"j": job("j", QUEUED, 120_000)}))  # "now" = 120 s
    done = Delivery("e1", "j", "acme", "https://hook", "{}", status=DELIVERED, done_ms=1_000)
    store.put_delivery(done)  # done before the horizon, after the last sweep
    assert store.insert_if_absent(job("p", SUBMITTED, 120_000)) is True
    assert store.get_delivery("e1") is None


def test_rocksdict_counts_survive_a_reopen(tmp_path):
    # the store caches its counts and "now"; what a reopened store reads from disk
    # must be the same
    path = str(tmp_path / "views")
    r = Retention(finished_horizon_s=3600, max_views_per_tenant=4)
    store = RocksViewStore(path, r)
    for i in range(6):
        store.commit(Batch(views={f"d{i}": job(f"d{i}", COMPLETED, i * HOUR // 2)}))
        store.insert_if_absent(job(f"p{i}", SUBMITTED, i))
        store.insert_if_absent(job(f"o{i}", SUBMITTED, i, tenant="other"))
    store.commit(Batch(views={"p0": job("p0", QUEUED, 3 * HOUR)}))
    cached = [(t, store.view_count(t), store.queued_count(t)) for t in ("acme", "other")]
    store.close()
    reopened = RocksViewStore(path, r)
    try:
        assert [
            (t, reopened.view_count(t), reopened.queued_count(t)) for t in ("acme", "other")
        ] == cached
        assert reopened.view_count("acme") == len(reopened.list_jobs("acme", limit=100).jobs)
        assert reopened._newest() == 3 * HOUR
    finally:
        reopened.close()


def test_a_provisional_insert_expires_what_the_last_commit_wrote_past_its_horizon(make_store):
    # a batch's own expiry and done-outbox keys may be past the horizon that batch
    # sets; the next write, even one that does not move "now", expires them
    store = make_store(finished_horizon_s=3600)
    store.commit(Batch(views={"old": job("old", COMPLETED, 0), "q": job("q", QUEUED, 2 * HOUR)}))
    assert store.insert_if_absent(job("p", SUBMITTED, 2 * HOUR)) is True
    assert store.get("old") is None

    store = make_store(outbox_horizon_s=60)
    done = Delivery("e1", "j", "acme", "https://hook", "{}", status=DELIVERED, done_ms=1_000)
    store.commit(Batch(views={"j": job("j", QUEUED, 120_000)}, deliveries=[done]))
    assert store.insert_if_absent(job("p", SUBMITTED, 120_000)) is True
    assert store.get_delivery("e1") is None
