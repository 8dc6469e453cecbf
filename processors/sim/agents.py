"""The simulated node agents: what happens on the GPUs.

They obey the cell's commands the way ``agents/`` does, with simulated
processes instead of real ones:

1. ``StartRun``: once every node of the gang has its StartRun, the processes
   start together; ``RunStarted`` goes back. A GPU whose warm model differs
   costs ``cold_start_s`` before any work is done (the model load).
2. The run checkpoints every ``checkpoint_s`` of work (``RunCheckpointed`` with
   a URI that encodes the work done, so a resumed run only has the rest left)
   and ends after its true remaining duration with ``RunCompleted``, or part-way
   with ``RunFailed(generator_error)`` if this attempt is doomed.
3. ``CheckpointRun`` is answered at once by the gang's leader (silence if the
   job cannot checkpoint), or, for a generator that checkpoints only at its
   segment boundaries (``TraceJob.checkpoint_on_request`` False), by the next
   periodic checkpoint; ``StopRun`` stops the whole gang and each node
   confirms with ``RunStopped`` (a stop without a checkpoint loses the work
   since the last one: the metrics count it when the stop is a preemption).
4. A heartbeat lists the node's live runs and its GPUs' warm models.
5. A failed node answers nothing; its processes die (a gang dies whole) and it
   re-registers after ``repair_s`` with the next incarnation and cold GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from framespool.schemas import events as ev

from .fleet import SimNode, SimRun, checkpoint_uri, unit, work_done_in
from .kinds import CELL, CHECKPOINT, HEARTBEAT, NODE_FAIL, NODE_REPAIR, RUN_END

if TYPE_CHECKING:  # pragma: no cover
    import random

    from .engine import SimOptions
    from .metrics import Recorder


class Agents:
    """The agents' half of ``engine.Simulation`` (a mixin): what it uses of the
    simulation is declared below, and mypy checks that Simulation provides it."""

    if TYPE_CHECKING:  # pragma: no cover
        now: int
        opts: SimOptions
        recorder: Recorder
        runs: dict[tuple[str, int], SimRun]
        node_by_id: dict[str, SimNode]
        heartbeat_ms: int
        cold_ms: int
        health_cache: dict
        failure_rng: random.Random
        failure_rate_per_ms: float

        def push(self, t: int, kind: int, payload: Any = None) -> None: ...
        def feed(self, event: Any) -> None: ...
        def deliver(self, event: Any) -> None: ...

    # -- agents: heartbeats --------------------------------------------------------------
    def _heartbeat(self, node: SimNode) -> None:
        self.push(self.now + self.heartbeat_ms, HEARTBEAT, node)
        if not node.alive:
            return
        now = self.now
        reports = tuple(
            ev.RunReport(
                job_id=run.key[0],
                run=run.run,
                step_rate=1.0,
                progress=round(run.done_s(now) / run.job.trace.duration_s, 4),
            )
            for run in node.runs.values()
        )
        self.feed(
            ev.NodeHeartbeat(
                event_id=f"hb:{node.node_id}:{now}",
                ts_ms=now,
                node_id=node.node_id,
                incarnation=node.incarnation,
                gpus=node.health_samples(self.health_cache),
                runs=reports,
            )
        )

    # -- agents: commands ----------------------------------------------------------------
    def _start_run(self, o: ev.StartRun) -> None:
        run = self.runs.get((o.spec.job_id, o.run))
        if run is None or run.alive or run.pending <= 0:
            self.recorder.violation(
                "start_without_assignment",
                f"StartRun {o.spec.job_id}#{o.run} on {o.node_id} matches no pending JobAssigned",
            )
            return
        node = self.node_by_id.get(o.node_id)
        if node is None or not node.alive or node.incarnation != o.incarnation:
            run.broken = True  # that agent never gets it; the cell's start lease will notice
        run.incarnations[o.node_id] = o.incarnation
        run.pending -= 1
        if run.pending == 0:
            if run.broken:
                self.recorder.count("gang_start_lost")
            else:
                self._launch(run, o.resume_from)

    def _launch(self, run: SimRun, resume_from: str | None) -> None:
        """The processes of a run start on every node of its gang at once."""
        job = run.job
        trace = job.trace
        now = self.now
        cold = False
        for node_id, gpus in run.slices:
            node = self.node_by_id[node_id]
            for g in gpus:
                if not 0 <= g < node.gpus:
                    self.recorder.violation(
                        "capacity_exceeded",
                        f"{job.job_id}#{run.run} given GPU {g} of {node_id}, which has {node.gpus}",
                    )
                    continue
                other = node.owner[g]
                if other is not None:
                    self.recorder.violation(
                        "gpu_in_two_runs",
                        f"GPU {node_id}:{g} given to {job.job_id}#{run.run} "
                        f"while {other.key[0]}#{other.key[1]} runs on it",
                    )
                node.owner[g] = run
                if node.warm[g] != trace.model:
                    cold = True
                    node.warm[g] = trace.model
                    node.health = None
            node.runs[run.key] = run
        run.alive = True
        run.cold = cold
        run.t0_ms = now
        run.done0 = min(work_done_in(resume_from), trace.duration_s) if trace.checkpoint_s else 0.0
        run.work_start_ms = now + (self.cold_ms if cold else 0)
        left_ms = int((trace.duration_s - run.done0) * 1000)
        run.fails = (
            trace.fail_prob > 0 and unit(self.opts.seed, trace.idx, run.run) < trace.fail_prob
        )
        if run.fails:  # the generator crashes part-way through this attempt
            left_ms = int(left_ms * unit(self.opts.seed + 1, trace.idx, run.run))
        run.end_ms = run.work_start_ms + max(1, left_ms)
        rec = self.recorder
        rec.gpus_change(job, run.gpus, now)
        if cold:
            rec.count("cold_starts")
            rec.count("cold_start_gpu_s", run.gpus * self.opts.cold_start_s)
        else:
            rec.count("warm_starts")
        rec.run_launched(
            job.job_id, run.run, run.gpus, now, self.opts.cold_start_s if cold else 0.0
        )
        self.push(run.end_ms, RUN_END, run)
        if trace.checkpoint_s > 0:
            due = run.work_start_ms + int(trace.checkpoint_s * 1000)
            if due < run.end_ms:
                self.push(due, CHECKPOINT, run)
        self.deliver(
            ev.RunStarted(
                event_id=f"st:{job.job_id}:{run.run}",
                ts_ms=now,
                job_id=job.job_id,
                run=run.run,
                node_id=run.leader,
                incarnation=run.incarnations[run.leader],
            )
        )

    def _halt(self, run: SimRun) -> None:
        """The run's processes are gone from every node of its gang."""
        self.runs.pop(run.key, None)
        if not run.alive:
            return
        run.alive = False
        self.recorder.run_halted(run.job.job_id, run.run, run.gpus, self.now)
        for node_id, gpus in run.slices:
            node = self.node_by_id[node_id]
            for g in gpus:
                if 0 <= g < node.gpus and node.owner[g] is run:
                    node.owner[g] = None
            node.runs.pop(run.key, None)
        self.recorder.gpus_change(run.job, -run.gpus, self.now)

    def _run_end(self, run: SimRun) -> None:
        if not run.alive:
            return
        job = run.job
        inc = run.incarnations[run.leader]
        self._halt(run)
        if run.fails:
            self.feed(
                ev.RunFailed(
                    event_id=f"fail:{job.job_id}:{run.run}",
                    ts_ms=self.now,
                    job_id=job.job_id,
                    run=run.run,
                    node_id=run.leader,
                    incarnation=inc,
                    failure_class="generator_error",
                    reason="simulated generator crash",
                    exit_code=1,
                )
            )
        else:
            job.completed_run = run.run
            self.feed(
                ev.RunCompleted(
                    event_id=f"done:{job.job_id}:{run.run}",
                    ts_ms=self.now,
                    job_id=job.job_id,
                    run=run.run,
                    node_id=run.leader,
                    incarnation=inc,
                    artifact_uri=f"sim://{job.job_id}/{run.run}/output.mp4",
                )
            )

    def _checkpoint_due(self, run: SimRun) -> None:
        if not run.alive:
            return
        self._send_checkpoint(run, self.feed)
        due = self.now + int(run.job.trace.checkpoint_s * 1000)
        if due < run.end_ms:
            self.push(due, CHECKPOINT, run)

    def _send_checkpoint(self, run: SimRun, send: Callable[[Any], None]) -> None:
        job = run.job
        done = run.done_s(self.now)
        self.recorder.count("checkpoints")
        self.recorder.run_saved(job.job_id, run.run, self.now)
        send(
            ev.RunCheckpointed(
                event_id=f"ck:{job.job_id}:{run.run}:{self.now}",
                ts_ms=self.now,
                job_id=job.job_id,
                run=run.run,
                node_id=run.leader,
                incarnation=run.incarnations[run.leader],
                checkpoint_uri=checkpoint_uri(job.job_id, run.run, done),
                progress=round(done / job.trace.duration_s, 4),
            )
        )

    def _checkpoint_run(self, o: ev.CheckpointRun) -> None:
        run = self.runs.get((o.job_id, o.run))
        node = self.node_by_id.get(o.node_id)
        if run is not None and run.alive:
            self.recorder.exit_requested(o.job_id, o.run, self.now)
        # One answer per gang (from its leader); a generator that cannot checkpoint stays silent
        # and the cell's checkpoint grace runs out.
        if (
            run is None
            or not run.alive
            or o.node_id != run.leader
            or node is None
            or not node.alive
            or node.incarnation != o.incarnation
            or run.job.trace.checkpoint_s <= 0
            or not run.job.trace.checkpoint_on_request  # the next boundary answers
        ):
            return
        self._send_checkpoint(run, self.deliver)

    def _stop_run(self, o: ev.StopRun) -> None:
        node = self.node_by_id.get(o.node_id)
        if node is None or not node.alive or node.incarnation != o.incarnation:
            return  # a dead node answers nothing; the cell's leases handle it
        run = self.runs.get((o.job_id, o.run))
        if run is not None:
            if run.alive:  # a stop asked without a checkpoint first: an exit too
                self.recorder.exit_requested(o.job_id, o.run, self.now)
            self._halt(run)
        self.deliver(
            ev.RunStopped(
                event_id=f"stop:{o.job_id}:{o.run}:{o.node_id}",
                ts_ms=self.now,
                job_id=o.job_id,
                run=o.run,
                node_id=o.node_id,
                incarnation=o.incarnation,
                reason=o.reason[:200],
            )
        )

    # -- node failures -------------------------------------------------------------------
    def _next_failure(self, after_ms: int) -> int:
        return after_ms + max(1, int(self.failure_rng.expovariate(self.failure_rate_per_ms)))

    def _node_fail(self, node: SimNode) -> None:
        if not node.alive:
            return
        node.alive = False
        node.down_since_ms = self.now
        for run in list(node.runs.values()):
            self._halt(run)  # the gang dies with the node; its other nodes stop listing it
        node.warm = [""] * node.gpus
        node.health = None
        self.recorder.count("node_failures")
        self.recorder.capacity_change(-node.gpus, self.now)
        self.push(self.now + int(self.opts.repair_s * 1000), NODE_REPAIR, node)

    def _node_repair(self, node: SimNode) -> None:
        node.alive = True
        node.incarnation += 1
        self.recorder.capacity_change(node.gpus, self.now)
        self.feed(
            ev.NodeRegistered(
                event_id=f"reg:{node.node_id}:{node.incarnation}",
                ts_ms=self.now,
                node_id=node.node_id,
                incarnation=node.incarnation,
                cell=CELL,
                gpus=node.gpus,
                gpu_type=self.opts.gpu_type,
                rail=node.rail,
            )
        )
        if self.failure_rate_per_ms > 0:
            self.push(self._next_failure(self.now), NODE_FAIL, node)
