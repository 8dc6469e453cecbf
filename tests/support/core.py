"""Inputs and readings for the cell core's tests, driven through the core harness.

``of``, ``cfg`` and ``asked`` came from test_core_knobs.py and ``tiers`` from
test_core_knobs_admission.py; ``gang`` and ``started_gang`` (a two-node gang, n0 rank 0
and n1 rank 1) from test_core_gangs.py; ``action`` and ``play`` (random action
sequences and the player that applies them) from test_core_properties.py.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from framespool.processors.core import CellConfig
from framespool.schemas import events as ev
from framespool.schemas.refusals import IgnoreCode
from framespool.schemas.states import NodeState
from tests.support.core_harness import Harness, state_digest


def of(out, cls):
    return [o for o in out if isinstance(o, cls)]


def cfg(**kw):
    base = dict(
        status_interval_s=0, estimate_interval_s=0, heartbeat_timeout_s=1e9, report_lease_s=1e9
    )
    base.update(kw)
    return CellConfig(**base)


def asked(out) -> list[str]:
    return sorted(o.job_id for o in of(out, ev.CheckpointRun))


def tiers(limit_s: float, tier: str = "free") -> tuple:
    """The default tiers with ``tier``'s predicted-wait limit set to ``limit_s``."""
    return tuple(
        replace(t, max_predicted_wait_s=limit_s) if t.name == tier else t
        for t in CellConfig().tiers
    )


def gang(h: Harness, job_id: str = "g", **extra) -> ev.JobAssigned:
    (assigned,) = of(h.submit(job_id, gpus=16, per_node=8, estimate_s=600, **extra), ev.JobAssigned)
    assert [s.node_id for s in assigned.placement] == ["n0", "n1"]
    return assigned


def started_gang(h: Harness, job_id: str = "g", **extra) -> None:
    gang(h, job_id, **extra)
    h.report(ev.RunStarted, job_id, 1, "n0")
    out = h.report(ev.RunStarted, job_id, 1, "n1")
    assert sorted(b.node_id for b in of(out, ev.BeginRun)) == ["n0", "n1"]


SHAPES = [(1, 8), (2, 8), (4, 8), (8, 8), (16, 8), (3, 4)]


action = st.one_of(
    st.tuples(
        st.just("submit"),
        st.integers(0, 2),
        st.sampled_from(SHAPES),
        st.integers(5, 300),
        st.booleans(),
        st.sampled_from(["free", "paid", "interactive"]),
    ),
    st.tuples(st.just("tick"), st.integers(1, 40)),
    st.tuples(st.just("start"), st.integers(0, 50)),
    st.tuples(st.just("complete"), st.integers(0, 50)),
    st.tuples(st.just("fail"), st.integers(0, 50), st.sampled_from(["generator_error", "hung"])),
    st.tuples(st.just("checkpoint"), st.integers(0, 50)),
    # one member of a (possibly multi-node) run reports: ready, or a checkpoint of a step
    st.tuples(
        st.just("member"),
        st.integers(0, 50),
        st.integers(0, 3),
        st.sampled_from(["start", "checkpoint"]),
        st.integers(1, 4),
    ),
    st.tuples(st.just("stale"), st.integers(0, 50), st.integers(1, 3)),
    st.tuples(st.just("heartbeat"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("hot"), st.integers(0, 3), st.integers(0, 7)),
    st.tuples(st.just("reregister"), st.integers(0, 3)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(
        st.just("confirm"),
    ),
)


def play(h: Harness, actions) -> None:
    n = 0
    for a in actions:
        kind = a[0]
        live = h.live_runs()
        if kind == "submit":
            _, tenant, (gpus, per_node), est, preempt, tier = a
            n += 1
            h.submit(
                f"j{n}",
                tenant=f"t{tenant}",
                gpus=gpus,
                per_node=per_node,
                estimate_s=est,
                preemptible=preempt,
                checkpoint_interval_s=30.0 if preempt else 0.0,
                tier=tier,
            )
        elif kind == "tick":
            h.tick(a[1])
        elif kind in ("start", "complete", "fail", "checkpoint") and live:
            key = live[a[1] % len(live)]
            node = next(iter(h.cell.runs[key].held))
            if kind == "start":
                h.report(ev.RunStarted, *key, node)
            elif kind == "complete":
                h.report(ev.RunCompleted, *key, node, artifact_uri="mem://x")
            elif kind == "fail":
                h.report(ev.RunFailed, *key, node, failure_class=a[2])
            else:
                h.report(ev.RunCheckpointed, *key, node, checkpoint_uri=f"mem://{key}/ck")
        elif kind == "member" and live:
            _, which, member, what, step = a
            key = live[which % len(live)]
            held = list(h.cell.runs[key].held)
            node = held[member % len(held)]
            if what == "start":
                h.report(ev.RunStarted, *key, node)
            else:
                h.report(
                    ev.RunCheckpointed,
                    *key,
                    node,
                    checkpoint_uri=f"mem://{key}/{node}/{step * 10}",
                    step=step * 10,
                )
        elif kind == "stale" and h.assigned():
            start = h.assigned()[a[1] % len(h.assigned())]
            job = h.cell.jobs.get(start.spec.job_id)
            old_key = (start.spec.job_id, start.run)
            if job is not None and job.run != start.run and old_key not in h.cell.runs:
                before = state_digest(h.cell)
                out = h.report(ev.RunCompleted, start.spec.job_id, start.run, start.node_id)
                assert state_digest(h.cell) == before, "a stale report changed state"
                assert [type(o) for o in out] == [ev.ReportIgnored]
                assert out[0].code == IgnoreCode.STALE_RUN
            elif job is not None and job.run != start.run:
                # the old run is still being stopped: its end report confirms that node's
                # exit (docs/design.md#job-lifecycle-and-fencing) and may release only that
                # run's hold on that node; the job and its current run are untouched
                def current_run(job=job):
                    run = h.cell.runs.get((job.job_id, job.run))
                    return run and (run.phase, tuple(sorted(run.held)))

                before = (job.state, job.run, current_run())
                out = h.report(ev.RunCompleted, start.spec.job_id, start.run, start.node_id)
                assert (job.state, job.run, current_run()) == before
                still = h.cell.runs.get(old_key)
                assert still is None or start.node_id not in still.held
                assert not any(isinstance(o, (ev.JobCompleted, ev.JobFailed)) for o in out)
        elif kind == "heartbeat":
            node_id = f"n{a[1]}"
            if h.cell.index.nodes[node_id].state != NodeState.DOWN:
                h.heartbeat(node_id, runs=None if a[2] else ())
        elif kind == "hot":
            node_id = f"n{a[1]}"
            if h.cell.index.nodes[node_id].state != NodeState.DOWN:
                h.heartbeat(node_id, gpus=(ev.GpuHealth(index=a[2], temperature_c=95.0),))
        elif kind == "reregister":
            node = h.cell.index.nodes[f"n{a[1]}"]
            h.register(node.node_id, node.total, node.rail)
        elif kind == "cancel" and h.admitted:
            job_id = list(h.admitted)[a[1] % len(h.admitted)]
            h.feed(
                ev.CancelJob(
                    event_id=h.next_id(),
                    ts_ms=h.now_ms,
                    job_id=job_id,
                    tenant=h.admitted[job_id].tenant,
                )
            )
        elif kind == "confirm":
            h.confirm_stops()


def queued(out: list) -> ev.JobQueued:
    """The one JobQueued among ``out`` (from the test_wait_estimate* modules)."""
    [q] = [o for o in out if isinstance(o, ev.JobQueued)]
    return q
