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

No tenant counts for more than its share of a trip: of ``limit`` failures
needed from ``breaker_min_tenants`` tenants, each tenant's count at most
``ceil(limit / breaker_min_tenants)`` (``tenant_share``), so a tenant that
fails 4 of 5 on purpose still needs the others' failures for the rest.

A tripped breaker is open (``breakers[key]`` is a time in the future) for
``breaker_probe_after_s``; then half-open: the next placement that the
breaker would have refused, of a job that may probe (``may_probe``), is its
probe, and the breaker stays shut to everyone else until the probe ends or
its bound passes (``breakers[key]`` = the earlier of the probe's run limit
and ``breaker_probe_max_s`` from its start). Who may probe:

- a job whose estimate is at most ``breaker_probe_max_s`` (a long run would
  hold the breaker shut for everyone as long as it runs);
- not, for the first ``breaker_probe_after_s`` of each half-open period, a
  job of a tenant whose failures tripped it (another tenant's job first);
- not a job of a tenant whose probe of this breaker ended in anything but
  success within ``breaker_cooldown_s`` (``breaker_barred``): it had its turn.

The probe completing closes the breaker; a generator failure of the probe,
or a probe still running at its bound, reopens it for twice the previous
open time (up to ``breaker_cooldown_s``); a probe that ends otherwise
(cancelled, preempted, node lost) leaves it half-open. Opening, reopening
and closing are each a ``BreakerTripped`` (closing: ``until_ms`` = now),
whose reason names no job or tenant: every tenant reads it on the cluster
view. So whatever one tenant submits, another tenant's short job of the
model is placed within open + grace + one probe bound + one reopening.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from framespool.schemas import events as ev
from framespool.schemas.states import JobState

from .model import Job, Node, Run

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
                    self._reopen_breaker(log_key, run, "failed")
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
            per_tenant = Counter(e[1] for e in entries)
            share = self.tenant_share(limit)
            counted = sum(min(n, share) for n in per_tenant.values())
            if counted < limit:
                continue  # no tenant counts past its share: the others' failures are missing
            tenants = len(per_tenant)
            if tenants < self.config.breaker_min_tenants:
                continue  # one tenant's jobs: their own retry budgets absorb it
            if scope == "gpu_type" and len({e[2] for e in entries}) < min(
                2, self._nodes_of_type(node.gpu_type)
            ):
                continue  # all on one node: the node's breaker, not the model's
            self.breaker_trips[log_key] = 1
            until = self.now_ms + self._open_ms(1)
            self.breakers[log_key] = until
            self.breaker_suspects()[log_key] = tuple(per_tenant)
            self.breaker_barred().pop(log_key, None)
            del self.failure_log[log_key]
            self._count("breakers_tripped")
            self._announce(
                log_key,
                until,
                f"{counted} generator failures of {run.model_version} on "
                f"{scope} {key} from {tenants} tenants (at most {share} counted per "
                f"tenant) within {self.config.breaker_window_s:.0f}s; one probe run "
                f"of at most {self._probe_max_s():.0f}s after "
                f"{(until - self.now_ms) / 1000:.0f}s",
            )

    # state added after snapshots existed: an older pickle has none of it
    def breaker_suspects(self: Cell) -> dict[tuple[str, str, str], tuple[str, ...]]:
        """breaker -> the tenants whose failures tripped it (probe last)."""
        return self.__dict__.setdefault("breaker_tripped_by", {})

    def breaker_barred(self: Cell) -> dict[tuple[str, str, str], dict[str, int]]:
        """breaker -> tenant -> until when it may not probe (its probe did not succeed)."""
        return self.__dict__.setdefault("breaker_no_probe", {})

    def tenant_share(self: Cell, limit: int) -> int:
        """The most failures one tenant counts for in a trip of ``limit``."""
        return max(1, math.ceil(limit / max(1, self.config.breaker_min_tenants)))

    def _probe_max_s(self: Cell) -> float:
        return getattr(self.config, "breaker_probe_max_s", 300.0)

    def breaker_bars(
        self: Cell, job: Job, estimate_s: float, model_version: str, node: Node
    ) -> bool:
        """Whether a breaker keeps ``job`` (in a shape of ``estimate_s``) off
        ``node``: one is open there, or half-open and the job may not probe it.
        O(1) dict reads."""
        now = self.now_ms
        for log_key in (
            (model_version, "node", node.node_id),
            (model_version, "gpu_type", node.gpu_type),
        ):
            until = self.breakers.get(log_key)
            if until is None:
                continue
            if until > now or not self.may_probe(log_key, until, job, estimate_s):
                return True
        return False

    def may_probe(
        self: Cell, log_key: tuple[str, str, str], since_ms: int, job: Job, estimate_s: float
    ) -> bool:
        """Whether ``job`` may be the probe of the half-open breaker ``log_key``
        (half-open since ``since_ms``): the rules in the module's docstring."""
        if estimate_s > self._probe_max_s():
            return False
        barred = self.__dict__.get("breaker_no_probe", {}).get(log_key)
        if barred and barred.get(job.tenant, 0) > self.now_ms:
            return False
        grace_ms = int(self.config.breaker_probe_after_s * 1000)
        suspects = self.__dict__.get("breaker_tripped_by", {}).get(log_key, ())
        return not (job.tenant in suspects and self.now_ms < since_ms + grace_ms)

    def expire_breaker_probes(self: Cell) -> None:
        """On Tick: a probe still running at its bound reopens its breaker.
        O(probes)."""
        if not self.breaker_probes:
            return
        for log_key, probe in list(self.breaker_probes.items()):
            if self.breakers.get(log_key, 0) > self.now_ms:
                continue
            run = self.runs.get(probe)
            if run is None:  # ended without settling (cannot happen): half-open again
                del self.breaker_probes[log_key]
                continue
            self._count("breaker_probes_overran")
            self._reopen_breaker(
                log_key, run, f"still running at its bound of {self._probe_max_s():.0f}s"
            )

    def _nodes_of_type(self: Cell, gpu_type: str) -> int:
        return sum(1 for n in self.index.nodes.values() if n.gpu_type == gpu_type)

    def _open_ms(self: Cell, trips: int) -> int:
        """How long a breaker stays open before its next probe: doubling with each
        consecutive trip, never past the cooldown."""
        probe_after = min(self.config.breaker_probe_after_s, self.config.breaker_cooldown_s)
        return int(min(self.config.breaker_cooldown_s, probe_after * 2 ** (trips - 1)) * 1000)

    def _reopen_breaker(self: Cell, log_key: tuple[str, str, str], run: Run, outcome: str) -> None:
        del self.breaker_probes[log_key]
        self._bar_prober(log_key, run)
        trips = self.breaker_trips.get(log_key, 1) + 1
        self.breaker_trips[log_key] = trips
        until = self.now_ms + self._open_ms(trips)
        self.breakers[log_key] = until
        self._count("breakers_reopened")
        self._announce(
            log_key,
            until,
            f"probe run {outcome}; open again, next probe in {(until - self.now_ms) / 1000:.0f}s",
        )

    def _bar_prober(self: Cell, log_key: tuple[str, str, str], run: Run) -> None:
        """The probe's tenant had its turn: no probe of this breaker for a cooldown."""
        until = self.now_ms + int(self.config.breaker_cooldown_s * 1000)
        self.breaker_barred().setdefault(log_key, {})[run.tenant] = until

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
        shut to everyone else until the probe ends, at the latest at its bound
        (``expire_breaker_probes``) or its run limit."""
        for node_id in run.held:
            node = self.index.nodes[node_id]
            for log_key in (
                (run.model_version, "node", node_id),
                (run.model_version, "gpu_type", node.gpu_type),
            ):
                until = self.breakers.get(log_key)
                if until is not None and until <= self.now_ms:
                    self.breaker_probes[log_key] = run.key
                    bound_ms = self.now_ms + int(self._probe_max_s() * 1000)
                    self.breakers[log_key] = min(run.limit_ms, bound_ms)

    def settle_probe(self: Cell, run: Run) -> None:
        """The run is over: if it probed a breaker, close it on success; any other
        ending but a generator failure (handled in ``note_failure``) proves
        nothing and leaves the breaker half-open for the next placement, of
        another tenant (the prober is barred)."""
        for log_key, probe in list(self.breaker_probes.items()):
            if probe != run.key:
                continue
            del self.breaker_probes[log_key]
            if self.finished.get(run.job_id) != JobState.COMPLETED:
                self.breakers[log_key] = self.now_ms
                self._bar_prober(log_key, run)  # e.g. cancelled: not again and again
                continue
            del self.breakers[log_key]
            self.breaker_trips.pop(log_key, None)
            self.failure_log.pop(log_key, None)
            self.__dict__.get("breaker_tripped_by", {}).pop(log_key, None)
            self.__dict__.get("breaker_no_probe", {}).pop(log_key, None)
            self._count("breakers_closed")
            self._announce(log_key, self.now_ms, "closed: its probe run completed")
