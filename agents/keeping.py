"""What a run keeps in the artifact store, and under which keys.

Outputs and checkpoints go under the run's keys (its rank's in a multi-node
gang, see :mod:`gang`); each file is first staged from the generator's work
directory by :func:`uploads.stage` (inside it, within the profile's limits),
so the bytes hashed and uploaded are the bytes checked. A resumed gang member
fetches its own rank's checkpoint of the step the job's checkpoint names.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from framespool.agents.artifacts.port import (
    ArtifactStore,
    StoredArtifact,
    checkpoint_key,
    for_rank,
    output_key,
)
from framespool.agents.gang import Membership
from framespool.agents.profiles import ModelProfile
from framespool.agents.runner import Outcome
from framespool.agents.uploads import UploadRefused, stage

log = logging.getLogger(__name__)


class RunFiles:
    """One run's files in the store, as one node (rank) writes them."""

    def __init__(
        self,
        store: ArtifactStore,
        profile: ModelProfile,
        job_id: str,
        run: int,
        member: Membership,
        workdir: Path,
        staging: Path,
    ) -> None:
        self.store, self.profile, self.member = store, profile, member
        self.job_id, self.run = job_id, run
        self.workdir, self.staging = workdir, staging
        self.checkpoints_seen = 0

    @property
    def output_key(self) -> str:
        return output_key(self.job_id, self.run, self.profile.output_name, self.member.key_rank)

    async def keep_output(self, path: Path) -> StoredArtifact:
        """Raises :class:`uploads.UploadRefused` (the generator's fault) or the store's error."""
        return await self._keep(path, self.output_key, self.profile.max_output_bytes, "output")

    async def keep_result(self, outcome: Outcome) -> StoredArtifact:
        """A completed run's output: the generator's file (staged, checked, copied) or
        the bytes a builtin made in the agent (one store write, nothing to stage).

        Cost: a thread hop and the store's write, except for an empty output in a
        store whose empty put is cheap (``put_empty_inline``: a local directory,
        no fsync, a few metadata syscalls): written on the event loop, since the
        hop (a worker's wake-up and the loop's) cost more than the write; a fifth
        of a noop agent's event-loop time went to it (``bench pipeline``,
        cProfile, 2026-12-01)."""
        if outcome.output_data is None:
            assert outcome.output_path is not None
            return await self.keep_output(outcome.output_path)
        data, limit = outcome.output_data, self.profile.max_output_bytes
        if len(data) > limit:
            raise UploadRefused(
                f"output of {len(data)} bytes not uploaded: over {limit} bytes; raise the"
                " profile's max_output_bytes"
            )
        if not data and self.store.put_empty_inline:
            return self.store.put_bytes(self.output_key, data)
        return await asyncio.to_thread(self.store.put_bytes, self.output_key, data)

    def admit_checkpoint(self) -> bool:
        """False once the profile's ``max_checkpoints`` have been admitted."""
        self.checkpoints_seen += 1
        return self.checkpoints_seen <= self.profile.max_checkpoints

    async def keep_checkpoint(self, path: Path, step: int) -> StoredArtifact:
        key = checkpoint_key(self.job_id, self.run, step, self.member.key_rank)
        return await self._keep(path, key, self.profile.max_checkpoint_bytes, "checkpoint")

    async def resume(self, source: str | None, node_id: str) -> str | None:
        """The local path of the checkpoint to resume from (this rank's, in a
        gang), or None to start from scratch: a missing or corrupt checkpoint
        loses progress rather than failing the job."""
        if not source:
            return None
        if not self.profile.can_resume:
            log.warning(
                "job %s run %d: profile %s cannot resume; starting from scratch",
                self.job_id,
                self.run,
                self.profile.name,
            )
            return None
        dest = self.workdir / "resume" / "checkpoint"
        try:
            if self.member.gang:  # the job's checkpoint names the step; ours is our rank's
                source = for_rank(self.store.key_of(source), self.member.rank)
            await asyncio.to_thread(self.store.get_file, source, dest)
            return str(dest)
        except Exception as e:
            log.error(
                "job %s run %d on %s: checkpoint %s unusable (%s); starting from scratch",
                self.job_id,
                self.run,
                node_id,
                source,
                e,
            )
            return None

    async def _keep(self, path: Path, key: str, limit: int, what: str) -> StoredArtifact:
        staged = await asyncio.to_thread(stage, path, self.workdir, self.staging, limit, what)
        try:
            return await asyncio.to_thread(self.store.put_file, key, staged)
        finally:
            await asyncio.to_thread(staged.unlink, missing_ok=True)
