"""What a snapshot costs the processor that writes it: ``framespool bench snapshot``.

A processor pickles a partition's whole state for each snapshot
(``framespool.processors.snapshots``): in a forked child by default, inside its
turn with ``--snapshot-pickling inline`` (where this cost lands in the
outputs' latency). Either way the snapshot budget spaces snapshots by it. Two states:

- admission: an ``AdmissionState`` fed ``decisions`` submits (50 tenants, each
  with an idempotency key), as its 600 s horizon holds at ``decisions / 600``
  jobs a second;
- cell: a scheduler ``Cell`` on ``nodes`` nodes after the light stream of
  ``bench core`` (``record_tape``: load 0.9, ``events`` events).

Each is timed as CPU seconds (``time.process_time``, so a neighbour's load on a
shared machine moves it less than wall time), best of ``repeat``: the pickle,
and the pickle plus unpickle.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

from framespool.processors.core import Cell
from framespool.processors.core.admission import AdmissionConfig, AdmissionState
from framespool.processors.snapshots import pickle_state
from framespool.schemas import events as ev

from .core import record_tape

T0 = 1_700_000_000_000


def admission_state(decisions: int) -> AdmissionState:
    state = AdmissionState(AdmissionConfig(cells=("cell-0", "cell-1")))
    for i in range(decisions):
        spec = ev.JobSpec(job_id=f"job-{i:07d}", tenant=f"tenant-{i % 50}")
        command = ev.SubmitJob(
            event_id=f"cmd-{i}", ts_ms=T0 + 10 * i, idempotency_key=f"key-{i}", spec=spec
        )
        state.apply(command, f"admission-0@{i}")
    return state


def warm_cell(nodes: int, events: int) -> Cell:
    tape, _, config = record_tape(nodes, 8, events, 1, 0.9)
    cell = Cell(config, "bench")
    for i, event in enumerate(tape):
        cell.apply(event, f"bench@{i}")
    return cell


def _best_ms(work: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        work()
        times.append(time.process_time() - started)
    return round(min(times) * 1000, 1)


def measure(state: Any, repeat: int) -> dict[str, Any]:
    payload = pickle_state(state)
    return {
        "bytes": len(payload),
        "pickle_ms": _best_ms(lambda: pickle_state(state), repeat),
        "round_trip_ms": _best_ms(lambda: pickle.loads(pickle_state(state)), repeat),
    }


def bench_snapshot(decisions: int, nodes: int, events: int, repeat: int) -> dict[str, Any]:
    admission = admission_state(decisions)
    cell = warm_cell(nodes, events)
    return {
        "admission": {"decisions": len(admission.jobs), **measure(admission, repeat)},
        "cell": {"nodes": nodes, "events": events, "jobs": len(cell.jobs), **measure(cell, repeat)},
        "repeat": repeat,
    }
