"""How a ``StartRun`` becomes a runner: the profile's placeholders filled from
the job's spec and this node's place in the run, the generator's own
variables, and the choice between an in-process builtin and a spawned command
(never through a shell)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from framespool.agents.builtin import BuiltinRunner
from framespool.agents.gang import Membership
from framespool.agents.profiles import ModelProfile
from framespool.agents.runner import Checkpoint, Progress, Runner
from framespool.agents.sandbox import Identity
from framespool.schemas.events import StartRun

# A time-scaled hang timeout never drops below this: the gaps between a scaled
# generator's lines still include real scheduling delays. (Its start-up has its
# own, unscaled allowance: ``startup_timeout_s``.)
MIN_HANG_TIMEOUT_S = 2.0


def command_runner(
    profile: ModelProfile,
    out: Path,
    workdir: Path,
    values: dict[str, Any],
    *,
    on_progress: Callable[[Progress], None] | None = None,
    on_checkpoint: Callable[[Checkpoint], None] | None = None,
    **process: Any,
) -> Runner:
    """A command profile's runner: its argv filled from ``values``, spawned
    directly. Builtins are made by :func:`runner_for` alone, which hands them
    the job's params."""
    if profile.builtin:
        raise ValueError(f"profile {profile.name!r} is builtin {profile.builtin!r}: use runner_for")
    return Runner(
        profile,
        profile.argv(out=str(out), **values),
        output_path=out,
        cwd=workdir,
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        **process,
    )


def host_of(cmd: StartRun) -> str:
    """The one node of a run alone: its own peer list and master."""
    return cmd.node_id


def runner_for(
    profile: ModelProfile,
    cmd: StartRun,
    workdir: Path,
    member: Membership,
    *,
    resume_from: str | None,
    time_scale: float,
    identity: Identity | None = None,
    secrets: tuple[Path, ...] = (),
    on_progress: Callable[[Progress], None] | None = None,
    on_checkpoint: Callable[[Checkpoint], None] | None = None,
) -> Runner | BuiltinRunner:
    """The runner for one run in ``workdir`` (not started).

    A builtin gets none of a process's environment or argument values: it is
    made at once (building them was a twentieth of a noop agent's event-loop
    time, ``bench pipeline``)."""
    if profile.builtin:
        return BuiltinRunner(
            profile, on_progress=on_progress, params=cmd.spec.params, time_scale=time_scale
        )
    spec, n = cmd.spec, str(cmd.run)
    gpus = ",".join(str(g) for g in cmd.gpus)
    rank, world = str(member.rank), str(member.world_size)
    process = dict(
        env={
            "CUDA_VISIBLE_DEVICES": gpus,
            "FRAMESPOOL_JOB_ID": spec.job_id,
            "FRAMESPOOL_RUN": n,
            "FRAMESPOOL_RANK": rank,
            "FRAMESPOOL_WORLD_SIZE": world,
            "FRAMESPOOL_PEERS": ",".join(member.peers) or host_of(cmd),
            "FRAMESPOOL_MASTER": member.master or host_of(cmd),
            "HOME": str(workdir),
            "TMPDIR": str(workdir / "tmp"),
        },
        hang_timeout_s=max(profile.hang_timeout_s / time_scale, MIN_HANG_TIMEOUT_S),
        # start-up runs in real time whatever the scale: not divided
        startup_timeout_s=profile.startup_timeout_s or profile.hang_timeout_s,
        identity=identity,
        secrets=secrets,
        output_required=member.speaks_for_job,
    )
    return command_runner(
        profile,
        workdir / "output" / profile.output_name,
        workdir,
        dict(
            prompt=spec.prompt,
            params_json=json.dumps(dict(spec.params), sort_keys=True),
            checkpoint_dir=str(workdir / "checkpoints"),
            resume_from=resume_from,
            time_scale=repr(float(time_scale)),
            gpus=gpus,
            job_id=spec.job_id,
            run=n,
            rank=rank,
            world_size=world,
        ),
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        **process,
    )
