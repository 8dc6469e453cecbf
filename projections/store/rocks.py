"""The rocksdict adapter of the view-store port: one ``Rdict`` directory per
projection process. The semantics (one write batch per commit, retention) are the
port's (``framespool.projections.store.port``).

Cost model (RocksViewStore). The per-(tenant, state) counts, each tenant's
total and the store's "now" are cached in memory, write-through: this object
is the only writer of its directory (RocksDB locks it), so a cache is loaded
once (one ``get``, or one ``n/<tenant>`` scan per tenant) and then updated after
each successful write, never before (a failed write leaves it as the database).
Step 5 and step 7 scan from where the last scan stopped (``_floors``) and are
skipped altogether while they have nothing to do: when "now" has not moved
since a sweep that deferred nothing, and no expiry or done-outbox key was
written since. So ``insert_if_absent`` (the API's provisional view, which never
moves "now") costs one ``get`` of the job key, one JSON encode and one write
batch of four keys (view, two index keys, one count); the cap (step 6) is a
cached-total lookup, and only a tenant at its cap scans its oldest finished views
(``X/<tenant>``, from its floor: amortized O(1) per deletion). A log commit of
``k`` views costs ``k`` view reads and encodes plus its sweeps, each amortized
O(1) per key it deletes.

The decoded job views are cached too (:data:`VIEW_CACHE`, the most recently
read or written, least recently used out first), write-through like the
counts: a view enters after the write batch that wrote it (or a read that
decoded it) and leaves after the batch that deleted it, so a cached view is
always the database's. A job's events arrive within its short life, and each
was read twice per event (the fold's ``get`` of the view before, ``commit``'s
of the old one for its index keys), each a RocksDB ``get``, a JSON decode and a
``view_from_dict``: a cache hit is one dict lookup. It was the largest part of
the API process's CPU in ``bench pipeline`` (issue #13).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import cast

from rocksdict import Options, Rdict, WriteBatch

from framespool.private_files import private_dir
from framespool.projections.cluster import ClusterView
from framespool.projections.delivery_lanes import PENDING, Delivery
from framespool.projections.jobs import JobView
from framespool.projections.serde import (
    breaker_from_dict,
    breaker_to_dict,
    cell_from_dict,
    cell_to_dict,
    view_from_dict,
    view_to_dict,
)
from framespool.projections.store.port import (
    HOLDING_STATES,
    MAX_MS,
    QUEUED_STATES,
    Batch,
    Page,
    Retention,
    count_change,
    ended_ms,
    order_key,
)


def _ms_key(ms: int) -> str:
    return f"{max(0, min(ms, MAX_MS)):013d}"


# one encoder for every stored document: json.dumps with options builds a new
# JSONEncoder per call; the bytes are the same
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def _dumps(doc) -> bytes:
    return _ENCODER.encode(doc).encode()


# Decoded job views a RocksViewStore keeps (module doc, "Cost model"): a few
# seconds of jobs at the pipeline's rate; a view is a few kB.
VIEW_CACHE = 4096


class RocksViewStore:
    """The rocksdict adapter; one ``Rdict`` directory per projection process."""

    def __init__(
        self, path: str, retention: Retention = Retention(), view_cache: int = VIEW_CACHE
    ) -> None:
        # views hold prompts and callback URLs (tokens): the owner's alone
        private_dir(path, existing=False)
        self._db = Rdict(str(path), options=Options(raw_mode=True))
        private_dir(path)  # and what RocksDB made (or an older version left) in it
        # job id -> its decoded view, as in the database (write-through, LRU)
        self._views: OrderedDict[str, JobView] = OrderedDict()
        self._view_cache = view_cache
        self.retention = retention
        self._floors: dict[bytes, bytes] = {}  # index prefix -> where its expiry scan starts
        # write-through caches (module doc, "Cost model"): filled on first read
        self._counts: dict[tuple[str, str], int] = {}  # (tenant, state) -> n/ value
        self._totals: dict[str, int] = {}  # tenant -> sum of its n/ values
        self._now: int | None = None  # w/: the newest event time seen
        self._swept_at: int | None = None  # the "now" at which steps 5 and 7 had nothing left

    # -- keys ---------------------------------------------------------------
    @staticmethod
    def _job_key(job_id: str) -> bytes:
        return b"j/" + job_id.encode()

    @staticmethod
    def _tenant_prefix(tenant: str, state: str | None) -> bytes:
        if state is None:
            return b"t/" + tenant.encode() + b"\x00"
        return b"s/" + tenant.encode() + b"\x00" + state.encode() + b"\x00"

    def _index_keys(self, v: JobView) -> list[bytes]:
        suffix = order_key(v).encode()
        return [
            self._tenant_prefix(v.tenant, None) + suffix,
            self._tenant_prefix(v.tenant, v.state) + suffix,
        ]

    @staticmethod
    def _offset_key(topic: str, partition: int) -> bytes:
        return b"o/" + topic.encode() + b"\x00" + str(partition).encode()

    @staticmethod
    def _count_key(tenant: str, state: str) -> bytes:
        return b"n/" + tenant.encode() + b"\x00" + state.encode()

    @staticmethod
    def _ended_keys(v: JobView) -> tuple[bytes, bytes]:
        """The expiry index (oldest ended first) and the tenant's, for the view cap."""
        suffix = f"{_ms_key(ended_ms(v))}/{v.job_id}".encode()
        return b"x/" + suffix, b"X/" + v.tenant.encode() + b"\x00" + suffix

    def _int(self, key: bytes) -> int:
        raw = self._db.get(key)
        return 0 if raw is None else int(raw)

    def _count(self, tenant: str, state: str) -> int:
        n = self._counts.get((tenant, state))
        if n is None:
            n = self._counts[(tenant, state)] = self._int(self._count_key(tenant, state))
        return n

    def _newest(self) -> int:
        if self._now is None:
            self._now = self._int(b"w/")
        return self._now

    def queued_count(self, tenant: str) -> int:
        # max(0, ..): views stored before the counts existed are not in them
        return max(0, sum(self._count(tenant, st) for st in QUEUED_STATES))

    def running_count(self, tenant: str) -> int:
        return max(0, sum(self._count(tenant, st) for st in HOLDING_STATES))

    def view_count(self, tenant: str) -> int:
        n = self._totals.get(tenant)
        if n is None:
            scan = self._scan(b"n/" + tenant.encode() + b"\x00")
            n = self._totals[tenant] = sum(int(v) for _, v in scan)
        return n

    # -- reads --------------------------------------------------------------
    def get(self, job_id: str) -> JobView | None:
        """Cost: a dict lookup for a cached view; else a RocksDB ``get``, a JSON
        decode and ``view_from_dict`` (the view is then cached)."""
        view = self._views.get(job_id)
        if view is not None:
            self._views.move_to_end(job_id)
            return view
        raw = self._db.get(self._job_key(job_id))
        if raw is None:
            return None
        view = view_from_dict(json.loads(raw))
        self._remember((view,))
        return view

    def _remember(self, views: Iterable[JobView], gone: Iterable[str] = ()) -> None:
        """The view cache after a read, or after a write batch that wrote ``views``
        and deleted ``gone`` (never before the write: a failed one changes nothing)."""
        cache = self._views
        for job_id in gone:
            cache.pop(job_id, None)
        for view in views:
            cache[view.job_id] = view
            cache.move_to_end(view.job_id)
        while len(cache) > self._view_cache:
            cache.popitem(last=False)

    def offset(self, topic: str, partition: int) -> int:
        raw = self._db.get(self._offset_key(topic, partition))
        return -1 if raw is None else int(raw)

    def list_jobs(
        self, tenant: str, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page:
        prefix = self._tenant_prefix(tenant, state)
        start = prefix + cursor.encode() if cursor else prefix
        jobs: list[JobView] = []
        for key, _ in self._items(start):
            if not key.startswith(prefix):
                break
            if cursor and key == start:
                continue
            view = self.get(key[len(prefix) :].decode().split("/", 1)[1])
            if view is not None:
                jobs.append(view)
            if len(jobs) > limit:
                break
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return Page(jobs, order_key(jobs[-1]) if more and jobs else None)

    def load_cluster(self) -> ClusterView:
        cells = {c.cell: c for c in (cell_from_dict(json.loads(v)) for _, v in self._scan(b"c/"))}
        breakers = {k.decode()[2:]: breaker_from_dict(json.loads(v)) for k, v in self._scan(b"b/")}
        updated = max(
            [c.ts_ms for c in cells.values()] + [b.ts_ms for b in breakers.values()] + [0]
        )
        return ClusterView(cells=cells, breakers=breakers, updated_ms=updated)

    def get_delivery(self, delivery_id: str) -> Delivery | None:
        raw = self._db.get(b"d/" + delivery_id.encode())
        return None if raw is None else Delivery(**json.loads(raw))

    def pending_deliveries(self) -> list[Delivery]:
        out = [self.get_delivery(k[2:].decode()) for k, _ in self._scan(b"p/")]
        return sorted(
            (d for d in out if d is not None), key=lambda d: (d.created_ms, d.delivery_id)
        )

    def _items(self, from_key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The items from ``from_key`` on, in key order: bytes both (the store is
        opened in raw mode, which rocksdict's stubs cannot tell)."""
        return cast(Iterator[tuple[bytes, bytes]], self._db.items(from_key=from_key))

    def _scan(self, prefix: bytes, start: bytes = b"") -> Iterable[tuple[bytes, bytes]]:
        for key, value in self._items(prefix + start):
            if not key.startswith(prefix):
                break
            yield key, value

    # -- writes -------------------------------------------------------------
    def insert_if_absent(self, view: JobView) -> bool:
        """The API's provisional view: what ``commit(.., from_log=False)`` of that one
        view writes, without its generic steps (no old view to read, "now" is
        unchanged, the age sweeps are skipped while they have nothing to do).
        Cost: module doc, "Cost model"."""
        key = self._job_key(view.job_id)
        if view.job_id in self._views or self._db.get(key) is not None:
            return False  # a cached view is in the database
        if view.terminal:  # not the API's case: the generic path writes its expiry keys
            self.commit(Batch(views={view.job_id: view}), from_log=False)
            return True
        wb = WriteBatch(raw_mode=True)
        for index_key in self._index_keys(view):
            wb.put(index_key, b"")
        wb.put(key, _dumps(view_to_dict(view)))
        counts = {(view.tenant, view.state): 1}
        newest = self._newest()
        by_age = self._swept_at != newest
        clean = True
        gone: list[str] = []
        if by_age or self.view_count(view.tenant) >= self.retention.max_views_per_tenant:
            clean = self._expire(wb, counts, {view.job_id: view}, newest, by_age, gone)
        written = self._put_counts(wb, counts)
        self._db.write(wb)
        self._written(written, newest, clean)
        self._remember((view,), gone)
        return True

    def _put_counts(
        self, wb: WriteBatch, counts: dict[tuple[str, str], int]
    ) -> dict[tuple[str, str], int]:
        """The new count per changed (tenant, state), into ``wb``; returned for the caches."""
        written = {}
        for (tenant, state), delta in counts.items():
            if delta:
                n = written[(tenant, state)] = self._count(tenant, state) + delta
                wb.put(self._count_key(tenant, state), str(n).encode())
        return written

    def _written(self, written: dict[tuple[str, str], int], newest: int, swept: bool) -> None:
        """Bring the caches up to a write batch that has been written."""
        for key, n in written.items():
            total = self._totals.get(key[0])
            if total is not None:
                self._totals[key[0]] = total + n - self._counts[key]
            self._counts[key] = n
        self._now = newest
        self._swept_at = newest if swept else None

    def commit(self, batch: Batch, from_log: bool = True) -> None:
        """``from_log=False``: the API's provisional view, whose time is the API's
        clock, not the log's: it does not move the store's "now"."""
        wb = WriteBatch(raw_mode=True)
        counts: dict[tuple[str, str], int] = {}
        newest = self._newest()  # the newest event time seen: the store's "now"
        swept = True  # False: this batch writes keys the age sweeps must see next time
        for job_id, view in batch.views.items():
            old = self.get(job_id)
            new_keys = self._index_keys(view)
            for key in self._index_keys(old) if old is not None else ():
                if key not in new_keys:
                    wb.delete(key)
            for key in new_keys:
                wb.put(key, b"")
            wb.put(self._job_key(job_id), _dumps(view_to_dict(view)))
            count_change(counts, old, view)
            if view.terminal and (old is None or not old.terminal):
                for key in self._ended_keys(view):
                    wb.put(key, b"")
                swept = False
            if from_log:
                newest = max(newest, view.updated_ms)
        for cell in batch.cells.values():
            wb.put(b"c/" + cell.cell.encode(), _dumps(cell_to_dict(cell)))
        for name, breaker in batch.breakers.items():
            wb.put(b"b/" + name.encode(), _dumps(breaker_to_dict(breaker)))
        for d in batch.deliveries:
            if self._db.get(b"d/" + d.delivery_id.encode()) is None:
                self._delivery_into(wb, d)
                swept = swept and d.status == PENDING
        for (topic, partition), off in batch.offsets.items():
            if off > self.offset(topic, partition):
                wb.put(self._offset_key(topic, partition), str(off).encode())
        by_age = self._swept_at != newest
        gone: list[str] = []
        clean = self._expire(wb, counts, batch.views, newest, by_age, gone)
        written = self._put_counts(wb, counts)
        wb.put(b"w/", str(newest).encode())
        self._db.write(wb)
        self._written(written, newest, swept and clean)
        self._remember(batch.views.values(), gone)

    def _expire(
        self,
        wb: WriteBatch,
        counts: dict[tuple[str, str], int],
        views: dict[str, JobView],
        newest: int,
        by_age: bool = True,
        gone: list[str] | None = None,
    ) -> bool:
        """Steps 5-7 of the module doc, into the same write batch; ``by_age=False``
        skips steps 5 and 7. Returns False when step 5 deferred a view (one of
        ``views``, the batch's) to a later batch. The job ids of the views it
        deletes are appended to ``gone`` (for the view cache, once written).

        Cost: step 5 and step 7 each seek once to their floor and read every key
        they delete plus one; step 6 is a sum over the tenant's cached counts,
        and a scan of its oldest finished views only when it is over its cap."""
        victims: dict[str, JobView] = {}

        def take(job_id: str) -> bool:
            """Mark a terminal view for deletion; False: it stays for now (it is
            written in this batch, so it goes in a later one)."""
            if job_id in views:
                return False
            view = self.get(job_id)
            if view is not None and view.terminal:
                victims[job_id] = view
            return True

        # Expiry scans start where the last one stopped: everything before is
        # deleted, and RocksDB would otherwise step over every tombstone again.
        floors = self._floors
        cutoff = newest - int(self.retention.finished_horizon_s * 1000)
        deferred, last = b"", floors.get(b"x/", b"")
        for key, _ in self._scan(b"x/", last) if by_age else ():
            ms, job_id = key[2:].decode().split("/", 1)
            if int(ms) >= cutoff:
                break
            if take(job_id):
                wb.delete(key)  # a stale entry (the view already gone) goes too
            elif not deferred:
                deferred = key[2:]  # kept for a later batch: the next scan starts here
            last = key[2:]
        floors[b"x/"] = deferred or last
        cap = self.retention.max_views_per_tenant
        for tenant in sorted({t for t, _ in counts}):
            excess = (
                self.view_count(tenant)
                + sum(d for (t, _), d in counts.items() if t == tenant)
                - sum(1 for v in victims.values() if v.tenant == tenant)
                - cap
            )
            if excess <= 0:
                continue
            prefix = b"X/" + tenant.encode() + b"\x00"
            floor = b""
            for key, _ in self._scan(prefix, floors.get(prefix, b"")):
                if excess <= 0:
                    break
                job_id = key.decode().rsplit("/", 1)[1]
                if job_id not in victims:
                    before = len(victims)
                    if not take(job_id) and not floor:
                        floor = key[len(prefix) :]
                    excess -= len(victims) - before
                floors[prefix] = floor or key[len(prefix) :]
        for job_id, view in victims.items():
            if gone is not None:
                gone.append(job_id)
            wb.delete(self._job_key(job_id))
            for key in (*self._index_keys(view), *self._ended_keys(view)):
                wb.delete(key)
            count_change(counts, view, None)
        outbox_cutoff = newest - int(self.retention.outbox_horizon_s * 1000)
        for key, _ in self._scan(b"y/", floors.get(b"y/", b"")) if by_age else ():
            ms, delivery_id = key[2:].decode().split("/", 1)
            if int(ms) >= outbox_cutoff:
                break
            wb.delete(key)
            wb.delete(b"d/" + delivery_id.encode())
            floors[b"y/"] = key[2:]
        return not deferred

    def put_delivery(self, delivery: Delivery) -> None:
        wb = WriteBatch(raw_mode=True)
        self._delivery_into(wb, delivery)
        self._db.write(wb)
        if delivery.status != PENDING:
            self._swept_at = None  # a done-outbox key step 7 has not seen

    @staticmethod
    def _delivery_into(wb: WriteBatch, d: Delivery) -> None:
        wb.put(b"d/" + d.delivery_id.encode(), _dumps(asdict(d)))
        if d.status == PENDING:
            wb.put(b"p/" + d.delivery_id.encode(), b"")
        else:
            wb.delete(b"p/" + d.delivery_id.encode())
            done = d.done_ms or d.created_ms
            wb.put(f"y/{_ms_key(done)}/{d.delivery_id}".encode(), b"")

    def close(self) -> None:
        self._views.clear()
        self._db.close()
