"""Failure containment: breakers per model version, node and GPU type.

``generator_error`` failures are attributed to (model version,
node) and (model version, GPU type). Who is at fault decides what trips:

1. a job's own failure (its input, its tenant's release) shows as failures
   of one tenant only: they burn that job's retry budget and trip nothing,
   so one tenant cannot halt a model for the others;
2. a node's failure shows as failures of several tenants on one node: the
   (model, node) breaker trips after ``breaker_node_failures``;
3. a model's failure on a GPU type shows as failures of several tenants on
   several nodes of that type: the (model, GPU type) breaker trips after
   ``breaker_type_failures``.

A tripped breaker is open (``breakers[key]`` is a time in the future) for
``breaker_probe_after_s``; then half-open: the next placement that the
breaker would have refused is its probe, and the breaker stays shut to
everyone else until the probe ends (``breakers[key]`` = the probe's run
limit). The probe completing closes the breaker; a generator failure of the
probe reopens it for twice the previous open time (up to
``breaker_cooldown_s``); a probe that ends otherwise (cancelled, preempted,
node lost) leaves it half-open. Opening, reopening and closing are each a
``BreakerTripped`` (closing: ``until_ms`` = now).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.states import JobState

from .model import Run

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell


class Breakers:
    def note_failure(self: Cell, run: Run, node_id: str, failure_class: str) -> None:
        if failure_class != "generator_error":
            return
        node = self.index.nodes[node_id]
        if self.breaker_probes:
            for log_key, probe in list(self.breaker_probes.items()):
                if probe == run.key:
                    self._reopen_breaker(log_key, run)
        window = self.now_ms - int(self.config.breaker_window_s * 1000)
        for scope, key, limit in (
            ("node", node_id, self.config.breaker_node_failures),
            ("gpu_type", node.gpu_type, self.config.breaker_type_failures),
        ):
            log_key = (run.model_version, scope, key)
            if log_key in self.breakers:
                continue  # already tripped: its probe decides, not more evidence
            entries = [e for e in self.failure_log.get(log_key, []) if e[0] > window]
            entries.append((self.now_ms, run.tenant, node_id))
            self.failure_log[log_key] = entries
            if len(entries) < limit:
                continue
            tenants = len({e[1] for e in entries})
            if tenants < self.config.breaker_min_tenants:
                continue  # one tenant's jobs: their own retry budgets absorb it
            if scope == "gpu_type" and len({e[2] for e in entries}) < min(
                2, self._nodes_of_type(node.gpu_type)
            ):
                continue  # all on one node: the node's breaker, not the model's
            self.breaker_trips[log_key] = 1
            until = self.now_ms + self._open_ms(1)
            self.breakers[log_key] = until
            del self.failure_log[log_key]
            self._count("breakers_tripped")
            self._announce(
                log_key,
                until,
                f"{len(entries)} generator failures of {run.model_version} on "
                f"{scope} {key} from {tenants} tenants within "
                f"{self.config.breaker_window_s:.0f}s; one probe run after "
                f"{(until - self.now_ms) / 1000:.0f}s",
            )

    def _nodes_of_type(self: Cell, gpu_type: str) -> int:
        return sum(1 for n in self.index.nodes.values() if n.gpu_type == gpu_type)

    def _open_ms(self: Cell, trips: int) -> int:
        """How long a breaker stays open before its next probe: doubling with each
        consecutive trip, never past the cooldown."""
        probe_after = min(self.config.breaker_probe_after_s, self.config.breaker_cooldown_s)
        return int(min(self.config.breaker_cooldown_s, probe_after * 2 ** (trips - 1)) * 1000)

    def _reopen_breaker(self: Cell, log_key: tuple[str, str, str], run: Run) -> None:
        del self.breaker_probes[log_key]
        trips = self.breaker_trips.get(log_key, 1) + 1
        self.breaker_trips[log_key] = trips
        until = self.now_ms + self._open_ms(trips)
        self.breakers[log_key] = until
        self._count("breakers_reopened")
        self._announce(
            log_key,
            until,
            f"probe run {run.job_id}#{run.run} failed; open again, next probe in "
            f"{(until - self.now_ms) / 1000:.0f}s",
        )

    def _announce(self: Cell, log_key: tuple[str, str, str], until_ms: int, reason: str) -> None:
        """A breaker opened, reopened or closed (``until_ms`` = now)."""
        model_version, scope, key = log_key
        self.emit(
            ev.BreakerTripped,
            model_version=model_version,
            scope=scope,
            key=key,
            until_ms=until_ms,
            reason=reason,
        )

    def note_placement(self: Cell, run: Run) -> None:
        """A run placed past a half-open breaker is its probe: the breaker stays
        shut to everyone else until the probe ends (at the latest at its limit)."""
        for node_id in run.held:
            node = self.index.nodes[node_id]
            for log_key in (
                (run.model_version, "node", node_id),
                (run.model_version, "gpu_type", node.gpu_type),
            ):
                until = self.breakers.get(log_key)
                if until is not None and until <= self.now_ms:
                    self.breaker_probes[log_key] = run.key
                    self.breakers[log_key] = run.limit_ms

    def settle_probe(self: Cell, run: Run) -> None:
        """The run is over: if it probed a breaker, close it on success; any other
        ending but a generator failure (handled in ``note_failure``) proves
        nothing and leaves the breaker half-open for the next placement."""
        for log_key, probe in list(self.breaker_probes.items()):
            if probe != run.key:
                continue
            del self.breaker_probes[log_key]
            if self.finished.get(run.job_id) != JobState.COMPLETED:
                self.breakers[log_key] = self.now_ms
                continue
            del self.breakers[log_key]
            self.breaker_trips.pop(log_key, None)
            self.failure_log.pop(log_key, None)
            self._count("breakers_closed")
            self._announce(
                log_key, self.now_ms, f"closed: probe run {run.job_id}#{run.run} completed"
            )
