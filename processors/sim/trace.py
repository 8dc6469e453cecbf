"""Trace files: a CSV of jobs, validated in one streaming pass, then served as a workload.

Columns (header required): ``submit_s,tenant,tier,gpus,duration_s`` and
optionally ``gpus_per_node`` (default ``min(gpus, 8)``), ``estimate_s`` (what
the scheduler is told; default ``duration_s``, which is the true run time),
``preemptible`` (0/1), ``checkpoint_s`` (0 = never checkpoints), ``weight``
(the tenant's weight), ``model``, ``model_version`` and ``fail_prob`` (chance
that one run fails with ``generator_error``). Every error names the line, the
field and what is allowed.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from pathlib import Path

from .workload import TraceJob, Workload


class TraceError(ValueError):
    """The trace file is malformed; the message names the line, the field and the fix."""


REQUIRED = ("submit_s", "tenant", "tier", "gpus", "duration_s")
OPTIONAL = (
    "gpus_per_node",
    "estimate_s",
    "preemptible",
    "checkpoint_s",
    "weight",
    "model",
    "model_version",
    "fail_prob",
)


def read_trace(path: str | Path) -> Workload:
    """Validate a trace in one streaming pass, then serve it as a workload.

    A trace sorted by ``submit_s`` is streamed from disk on every iteration;
    an unsorted one is loaded and sorted once (stable, so ties keep file order).
    """
    path = Path(path)
    tenants: dict[str, float] = {}
    explicit: set[str] = set()  # tenants whose weight the file gives
    count = 0
    ordered = True
    last = -math.inf
    for job, weight in _parse(path):
        count += 1
        if job.submit_ms < last:
            ordered = False
        last = max(last, job.submit_ms)
        if weight is None:
            tenants.setdefault(job.tenant, 1.0)
            continue
        if job.tenant in explicit and tenants[job.tenant] != weight:
            raise TraceError(
                f"{path}: tenant {job.tenant!r} has weight {tenants[job.tenant]:g} "
                f"and {weight:g}; give each tenant one weight"
            )
        tenants[job.tenant] = weight
        explicit.add(job.tenant)
    if count == 0:
        raise TraceError(f"{path}: the trace has no jobs; add rows under the header")
    notes = []
    if ordered:

        def jobs() -> Iterator[TraceJob]:
            for job, _ in _parse(path):
                yield job
    else:
        rows = sorted((job for job, _ in _parse(path)), key=lambda j: (j.submit_ms, j.idx))
        notes.append("trace was not sorted by submit_s; sorted in memory")

        def jobs() -> Iterator[TraceJob]:
            return iter(rows)

    return Workload(
        name=path.name,
        total=count,
        tenants=tenants,
        jobs=jobs,
        description=f"trace {path}",
        notes=notes,
    )


def _parse(path: Path) -> Iterator[tuple[TraceJob, float | None]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(
                f"{path}: empty file; the first line must be the header {','.join(REQUIRED)}"
            )
        header = [h.strip() for h in header]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise TraceError(
                f"{path}: header lacks {', '.join(missing)}; required columns are "
                f"{','.join(REQUIRED)} (optional: {','.join(OPTIONAL)})"
            )
        unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
        if unknown:
            raise TraceError(
                f"{path}: unknown column(s) {', '.join(unknown)}; allowed: "
                f"{','.join(REQUIRED + OPTIONAL)}"
            )
        col = {name: header.index(name) for name in header}
        width = len(header)
        for idx, row in enumerate(reader):
            line = idx + 2
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != width:
                raise TraceError(f"{path}:{line}: {len(row)} fields, the header has {width}")
            yield _row(path, line, idx, row, col)


def _num(
    path: Path,
    line: int,
    name: str,
    text: str,
    kind: type = float,
    minimum: float = 0.0,
    strictly: bool = False,
) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise TraceError(
            f"{path}:{line}: {name}={text!r} is not a{'n integer' if kind is int else ' number'}"
        ) from None
    if (
        value < minimum
        or (strictly and value == minimum)
        or (kind is float and not math.isfinite(value))
    ):
        bound = f"> {minimum:g}" if strictly else f">= {minimum:g}"
        raise TraceError(f"{path}:{line}: {name}={text!r} must be {bound}")
    return value


def _row(
    path: Path, line: int, idx: int, row: list[str], col: dict[str, int]
) -> tuple[TraceJob, float | None]:
    def get(name: str) -> str:
        i = col.get(name)
        return row[i].strip() if i is not None else ""

    gpus = int(_num(path, line, "gpus", get("gpus"), int, 1))
    duration = _num(path, line, "duration_s", get("duration_s"), float, 0.0, strictly=True)
    per_node_text = get("gpus_per_node")
    per_node = (
        int(_num(path, line, "gpus_per_node", per_node_text, int, 1))
        if per_node_text
        else min(gpus, 8)
    )
    estimate_text = get("estimate_s")
    estimate = (
        _num(path, line, "estimate_s", estimate_text, float, 0.0, strictly=True)
        if estimate_text
        else duration
    )
    preemptible = get("preemptible")
    if preemptible not in ("", "0", "1", "true", "false", "True", "False"):
        raise TraceError(f"{path}:{line}: preemptible={preemptible!r} must be 0 or 1")
    weight_text = get("weight")
    weight = (
        _num(path, line, "weight", weight_text, float, 0.0, strictly=True) if weight_text else None
    )
    fail_text = get("fail_prob")
    fail = _num(path, line, "fail_prob", fail_text) if fail_text else 0.0
    if fail > 1:
        raise TraceError(f"{path}:{line}: fail_prob={fail_text!r} must be between 0 and 1")
    tenant = get("tenant")
    if not tenant:
        raise TraceError(f"{path}:{line}: tenant is empty")
    checkpoint_text = get("checkpoint_s")
    job = TraceJob(
        idx=idx,
        submit_ms=int(round(_num(path, line, "submit_s", get("submit_s")) * 1000)),
        tenant=tenant,
        tier=get("tier") or "free",
        gpus=gpus,
        gpus_per_node=per_node,
        duration_s=duration,
        estimate_s=estimate,
        preemptible=preemptible in ("1", "true", "True"),
        checkpoint_s=_num(path, line, "checkpoint_s", checkpoint_text) if checkpoint_text else 0.0,
        model=get("model") or "demo",
        model_version=get("model_version") or "1",
        fail_prob=fail,
    )
    return job, weight
