"""Decoded events as the tools show them (pure): one decoded record, an event as
JSON-ready data, the fields two events differ in, the job an event is about, a
timestamp as text."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from framespool.log.port import Record
from framespool.schemas import events as ev


def event_dict(event: Any) -> dict[str, Any] | None:
    """An event as JSON-ready data: ``{"type": name, **fields}``."""
    if event is None:
        return None
    return {"type": type(event).__name__, **dataclasses.asdict(event)}


def diff_fields(a: Any, b: Any) -> list[str]:
    """Names of the top-level fields where two events differ (``type`` if their types do)."""
    if type(a) is not type(b):
        return ["type"]
    return [f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]


def job_of(event: Any) -> str | None:
    """The job an event is about, if any (``ReportIgnored`` subjects ``job`` or ``job#run``)."""
    if isinstance(event, ev.ReportIgnored):
        return event.subject.partition("#")[0] or None
    job_id = getattr(event, "job_id", None)
    if job_id is None:
        spec = getattr(event, "spec", None)
        job_id = getattr(spec, "job_id", None)
    return job_id if isinstance(job_id, str) else None


def fmt_ms(ms: int) -> str:
    """A wall-clock time in ms as an ISO-8601 UTC string (empty for 0)."""
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class Decoded:
    """One decoded record. ``event`` is None when it could not be decoded (``error``)."""

    record: Record
    event: Any
    error: str = ""

    @property
    def event_id(self) -> str:
        return getattr(self.event, "event_id", "")
