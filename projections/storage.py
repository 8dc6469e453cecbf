"""The storage ledger: what each job keeps in the artifact store, each tenant's
bytes, and when retention lets an object go.

Theory of operation
-------------------
Agents report every object they store (``RunCheckpointed``, ``RunCompleted``,
with its size) on the job's ``progress`` partition as well as to the cell; the
API's projection consumer hands each report here with what its job view knows
(tenant, tier, whether and when it ended, its published result). So:

1. **Counted incrementally.** A tenant's bytes change by each object's size as
   its report is folded and as the sweeper deletes it; a submit reads one
   number (:meth:`StorageLedger.used`), the store is never listed per request.
   Objects are keyed by URI, so a report read twice (at-least-once) counts
   once, and a URI the sweeper deleted is remembered so that a replayed report
   does not count it again.
2. **Retention per tier** (:class:`Retention`): a COMPLETED job's result is
   kept ``artifact_retention_s`` after the job ended; everything else of a job
   that ended (checkpoints, a stale run's output) ``checkpoint_retention_s``
   after it ended. 0 keeps forever.
3. **An unfinished job keeps what it can resume from.** Its checkpoints are
   deleted only when superseded: older than ``checkpoint_retention_s`` *and*
   below the latest step every node of it checkpointed (the gang resume point,
   ``framespool.agents.gang``), so the newest checkpoint of each node (and the
   common step) always stays. Its outputs stay until it ends.
4. **Deletion is the sweeper's** (:func:`sweep_once`, run by the API process,
   which owns the artifact store's URLs): it deletes what :func:`due` names,
   then records it here (a crash in between deletes again: deletion is
   idempotent). A deleted result answers 410 with why (:meth:`gone`).

The rules themselves (:func:`with_object`, :func:`with_facts`, :func:`due`,
:func:`without`) are values and functions in :mod:`framespool.projections.retention`;
:class:`StorageLedger` keeps the documents in memory (one per job
with stored objects) and, given a path, in a rocksdict beside the view store,
each change in one write batch. Limit: objects stored before a deployment had
this ledger are not counted (nothing reported them).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from framespool.projections.retention import (
    CHECKPOINT,
    OUTPUT,
    JobFacts,
    JobStorage,
    Retention,
    StoredObject,
    due,
    from_doc,
    to_doc,
    with_facts,
    with_object,
    without,
)

log = logging.getLogger(__name__)

FORGET_AFTER_MS = 30 * 86400 * 1000  # a fully swept, ended job's record (for 410s)


class DeletingStore(Protocol):
    """What the sweeper needs of the artifact store (the agents' ``ArtifactStore``
    has it; the projections do not import the agents)."""

    def delete(self, key_or_uri: str) -> None: ...


class StorageLedger:
    """The jobs with stored objects and each tenant's bytes (module doc); thread-safe
    (the projection's fold thread writes reports, the sweeper deletions)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self._lock = threading.Lock()
        self._db: Any = None
        self.jobs: dict[str, JobStorage] = {}
        self._bytes: dict[str, int] = {}
        if path is not None:
            from rocksdict import Rdict

            from framespool.private_files import private_dir

            self._db = Rdict(str(private_dir(Path(path), existing=False)))
            for key, raw in self._db.items(from_key=b"j/"):
                if not bytes(key).startswith(b"j/"):
                    break
                js = from_doc(raw)
                self.jobs[js.job_id] = js
        for js in self.jobs.values():
            self._bytes[js.tenant] = self._bytes.get(js.tenant, 0) + js.bytes

    # -- reads ------------------------------------------------------------------
    def used(self, tenant: str) -> int:
        """Bytes ``tenant``'s jobs hold in the artifact store now."""
        return self._bytes.get(tenant, 0)

    def gone(self, job_id: str) -> tuple[int, str] | None:
        """(when, why) the job's result was deleted by retention, or None."""
        js = self.jobs.get(job_id)
        if js is None or not js.result_deleted_ms:
            return None
        return js.result_deleted_ms, js.result_deleted_why

    def next_release_ms(self, tenant: str, retention_of: Callable[[str], Retention]) -> int | None:
        """When the earliest of ``tenant``'s ended jobs lets an object go (None: none will)."""
        times = []
        for js in self.jobs.values():
            if js.tenant != tenant or not js.finished_ms or not js.objects:
                continue
            r = retention_of(js.tier)
            for o in js.objects:
                keep_s = r.artifact_s if o.uri == js.result_uri else r.checkpoint_s
                if keep_s > 0:
                    times.append(js.finished_ms + int(keep_s * 1000))
        return min(times, default=None)

    def due(self, now_ms: int, retention_of: Callable[[str], Retention]):
        """(job_id, object, why) for everything retention lets go at ``now_ms``."""
        with self._lock:
            jobs = list(self.jobs.values())
        return [
            (js.job_id, o, why) for js in jobs for o, why in due(js, now_ms, retention_of(js.tier))
        ]

    # -- writes -----------------------------------------------------------------
    def record(
        self, stored: Iterable[tuple[JobFacts, StoredObject]], facts: Iterable[JobFacts] = ()
    ) -> None:
        """Fold reports of stored objects and what changed in known jobs' views."""
        with self._lock:
            changed: dict[str, JobStorage] = {}
            for f, obj in stored:
                js = changed.get(f.job_id) or self.jobs.get(f.job_id) or JobStorage(f.job_id)
                changed[f.job_id] = with_object(with_facts(js, f), obj)
            for f in facts:
                known = changed.get(f.job_id) or self.jobs.get(f.job_id)
                if known is not None:  # only jobs that store something are kept
                    new = with_facts(known, f)
                    if new != known:
                        changed[f.job_id] = new
            self._write(changed, ())

    def deleted(self, job_id: str, uris: Iterable[str], now_ms: int, why: str) -> None:
        with self._lock:
            js = self.jobs.get(job_id)
            if js is None:
                return
            new = without(js, uris, now_ms, why)
            forget = (
                not new.objects and new.finished_ms and now_ms - new.finished_ms > FORGET_AFTER_MS
            )
            self._write({} if forget else {job_id: new}, (job_id,) if forget else ())

    def _write(self, changed: Mapping[str, JobStorage], dropped: Iterable[str]) -> None:
        dropped = tuple(dropped)
        if self._db is not None and (changed or dropped):
            from rocksdict import WriteBatch

            wb = WriteBatch()
            for job_id, js in changed.items():
                wb.put(f"j/{job_id}".encode(), to_doc(js))
            for job_id in dropped:
                wb.delete(f"j/{job_id}".encode())
            self._db.write(wb)
        for job_id in (*changed, *dropped):  # after the write: memory is what is stored
            old = self.jobs.pop(job_id, None)
            if old is not None:
                self._bytes[old.tenant] = self._bytes.get(old.tenant, 0) - old.bytes
        for job_id, js in changed.items():
            self.jobs[job_id] = js
            self._bytes[js.tenant] = self._bytes.get(js.tenant, 0) + js.bytes

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def stored_object(event: Any) -> StoredObject | None:
    """The object a ``RunCheckpointed``/``RunCompleted`` report names, or None."""
    name = type(event).__name__
    if name == "RunCheckpointed":
        uri, kind, step = event.checkpoint_uri, CHECKPOINT, event.step
    elif name == "RunCompleted":
        uri, kind, step = event.artifact_uri, OUTPUT, -1
    else:
        return None
    if not uri:
        return None
    size = int(getattr(event, "size_bytes", 0) or 0)
    return StoredObject(uri, size, kind, event.node_id, event.run, step, event.ts_ms)


async def sweep_once(
    ledger: StorageLedger,
    store: DeletingStore,
    retention_of: Callable[[str], Retention],
    now_ms: int,
) -> int:
    """Delete what retention lets go, then record it; returns how many objects.
    An object the store cannot delete now stays counted and is tried next sweep."""
    count = 0
    for job_id, obj, why in ledger.due(now_ms, retention_of):
        try:
            await asyncio.to_thread(store.delete, obj.uri)
        except Exception as exc:  # the store's fault: try again next sweep
            log.warning("job %s: %s not deleted (%s); retrying next sweep", job_id, obj.uri, exc)
            continue
        ledger.deleted(job_id, (obj.uri,), now_ms, why)
        log.info("job %s: %s (%d bytes) %s", job_id, obj.uri, obj.size, why)
        count += 1
    return count


def sweeper(
    ledger: StorageLedger,
    store: DeletingStore,
    retention_of: Callable[[str], Retention],
    interval_s: float = 60.0,
    clock: Callable[[], float] = time.time,
) -> Callable[[], Coroutine[Any, Any, None]]:
    """A background task (``ApiConfig.background``) sweeping every ``interval_s``."""

    async def sweep_storage() -> None:
        while True:
            try:
                await sweep_once(ledger, store, retention_of, int(clock() * 1000))
            except Exception:
                log.exception("storage sweep failed; next in %.0f s", interval_s)
            await asyncio.sleep(interval_s)

    return sweep_storage
