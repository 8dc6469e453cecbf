"""The retention rules, pure: what one job keeps in the artifact store and what
retention lets go, as values (:class:`JobStorage`) changed by functions.

Cost model: every function is O(objects of one job) (a job keeps a handful of
checkpoints per node between sweeps); nothing here reads a clock, a file or the
store. :mod:`framespool.projections.storage` keeps these documents, counts each
tenant's bytes and deletes what :func:`due` names; its module doc is the theory of
operation (counted incrementally, retention per tier, an unfinished job keeps what it
can resume from).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

CHECKPOINT, OUTPUT = "checkpoint", "output"


@dataclass(frozen=True, slots=True)
class StoredObject:
    uri: str
    size: int
    kind: str  # CHECKPOINT or OUTPUT
    node: str
    run: int
    step: int
    ts_ms: int


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the job's view says, as far as retention cares."""

    job_id: str
    tenant: str
    tier: str
    finished_ms: int = 0  # 0: the job has not ended
    result_uri: str = ""


@dataclass(frozen=True, slots=True)
class JobStorage:
    job_id: str
    tenant: str = ""
    tier: str = ""
    finished_ms: int = 0
    result_uri: str = ""
    objects: tuple[StoredObject, ...] = ()
    deleted: tuple[str, ...] = ()
    result_deleted_ms: int = 0
    result_deleted_why: str = ""

    @property
    def bytes(self) -> int:
        return sum(o.size for o in self.objects)


@dataclass(frozen=True)
class Retention:
    """Seconds a tier keeps a job's result and its other objects after it ends
    (0: forever); ``for_tier`` maps a tier to its own pair."""

    artifact_s: float = 7 * 86400.0
    checkpoint_s: float = 86400.0


def with_object(js: JobStorage, obj: StoredObject) -> JobStorage:
    if obj.uri in js.deleted:
        return js  # a replayed report of what retention removed
    kept = tuple(o for o in js.objects if o.uri != obj.uri)
    return replace(js, objects=(*kept, obj))


def with_facts(js: JobStorage, facts: JobFacts) -> JobStorage:
    return replace(
        js,
        tenant=facts.tenant or js.tenant,
        tier=facts.tier or js.tier,
        finished_ms=facts.finished_ms or js.finished_ms,
        result_uri=facts.result_uri or js.result_uri,
    )


def due(js: JobStorage, now_ms: int, retention: Retention) -> list[tuple[StoredObject, str]]:
    """The objects retention lets go at ``now_ms``, each with why (module doc, 2-3)."""
    out = []
    if js.finished_ms:
        for o in js.objects:
            is_result = o.uri == js.result_uri
            keep_s = retention.artifact_s if is_result else retention.checkpoint_s
            name = "artifact_retention_s" if is_result else "checkpoint_retention_s"
            if keep_s > 0 and now_ms >= js.finished_ms + keep_s * 1000:
                what = "result" if is_result else o.kind
                out.append(
                    (
                        o,
                        f"{what} deleted: tier {js.tier!r} keeps it {name}={keep_s:g} s after the job ended",
                    )
                )
        return out
    if retention.checkpoint_s <= 0:
        return out
    checkpoints = [o for o in js.objects if o.kind == CHECKPOINT]
    newest: dict[str, StoredObject] = {}
    for o in checkpoints:
        if o.node not in newest or (o.step, o.ts_ms) > (newest[o.node].step, newest[o.node].ts_ms):
            newest[o.node] = o
    if not newest:
        return out
    common = min(o.step for o in newest.values())  # the step every node can resume from
    keep = {o.uri for o in newest.values()}
    for o in checkpoints:
        if (
            o.uri not in keep
            and o.step < common
            and now_ms >= o.ts_ms + retention.checkpoint_s * 1000
        ):
            out.append(
                (
                    o,
                    f"superseded checkpoint deleted: step {o.step} < step {common}, older than"
                    f" checkpoint_retention_s={retention.checkpoint_s:g} s (tier {js.tier!r})",
                )
            )
    return out


def without(js: JobStorage, uris: Iterable[str], now_ms: int, why: str) -> JobStorage:
    gone = set(uris)
    result = js.result_uri in gone
    return replace(
        js,
        objects=tuple(o for o in js.objects if o.uri not in gone),
        deleted=(*js.deleted, *sorted(gone - set(js.deleted))),
        result_deleted_ms=now_ms if result else js.result_deleted_ms,
        result_deleted_why=why if result else js.result_deleted_why,
    )


def to_doc(js: JobStorage) -> bytes:
    return json.dumps(asdict(js), separators=(",", ":")).encode()


def from_doc(raw: bytes) -> JobStorage:
    doc = json.loads(raw)
    doc["objects"] = tuple(StoredObject(**o) for o in doc.get("objects", ()))
    doc["deleted"] = tuple(doc.get("deleted", ()))
    return JobStorage(**doc)
