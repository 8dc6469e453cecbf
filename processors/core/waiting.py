"""Why a queued job waits, and where it stands: what its tenant is told.

Theory of operation
-------------------
A queued job's ``JobQueued`` (after its admission's pass) and every
``JobWaitEstimated`` carry, beside the P50/P90 band:

1. ``position``: 1 + the jobs the fair order serves before it in this cell.
   Its own flow's (tier, organisation, user) jobs ahead are counted exactly;
   the other flows' by the GPU-seconds the fair order serves of them first
   (``FairTree.work_ahead``, what the wait estimate reads) over the mean
   GPU-seconds of a queued job of the cell (``mean_queued_cost``): fair share
   orders work, not jobs, so a count of other flows' jobs is an estimate.
2. ``reason_code`` and ``reason`` (``wait_reason``): the first that holds of,
   in order, the job preempting for its start (or held by the preemption
   churn limit); its organisation's or user's quota or concurrency cap; the
   job holding a reservation; a breaker open for its model on its GPU type;
   no healthy node fitting its shape; and, when the free GPUs would hold it
   but it did not start, GPUs guaranteed to others or a reservation it may
   not delay; else jobs ahead in the fair order (``position`` > 1) or its
   GPUs not being free yet. Codes are ``framespool.schemas.waits.WaitCode``.

The words are the tenant's: they name its own organisation, user, model and
numbers and the cell's counts (free GPUs, GPU types), never another tenant or
one of its jobs (``tests/unit/test_core_reason_privacy.py``). Nothing here
changes the state: it reads the tenant counters with ``get`` (``use_of``
would create them) and decides nothing.

Cost: O(1) per job plus, for a job that names a GPU type, the cell's free
GPUs per type once per publish (``free_by_type``, O(nodes), cached by the
caller), and the breakers of its model (few) when any is open.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from framespool.schemas.waits import WaitCode

from .model import Job

if TYPE_CHECKING:  # pragma: no cover
    from .cell import Cell

# Reasons other than the order and the GPUs: a job that becomes held by one, or
# stops being, is told at the next publish even if its wait estimate stayed
HOLDING = frozenset(
    {
        WaitCode.QUOTA,
        WaitCode.CONCURRENCY_CAP,
        WaitCode.BREAKER,
        WaitCode.RESERVED_CAPACITY,
        WaitCode.PREEMPTING,
        WaitCode.PREEMPTION_LIMIT,
        WaitCode.NO_FIT,
    }
)


class Waiting:
    def mean_queued_cost(self: Cell) -> float:
        """Mean GPU-seconds of a job queued in the cell (0 when none). O(tiers)."""
        queued, backlog = 0, 0.0
        for tier in self.fair.root.active.values():
            queued += tier.queued
            backlog += tier.backlog
        return backlog / queued if queued > 0 else 0.0

    @staticmethod
    def position_of(own_ahead_jobs: int, others_gpu_s: float, mean_cost: float) -> int:
        """1 + the jobs served before this one (theory of operation, 1)."""
        others = round(others_gpu_s / mean_cost) if mean_cost > 0 and others_gpu_s > 0 else 0
        return 1 + own_ahead_jobs + others

    def wait_reason(
        self: Cell, job: Job, position: int, free_by_type: Mapping[str, int] | None = None
    ) -> tuple[str, str]:
        """(code, words) of why the queued ``job`` waits (theory of operation, 2).
        ``free_by_type``: the cell's free GPUs per type, for a job that names one."""
        reason = job.reason
        if reason.startswith("preempting"):
            return WaitCode.PREEMPTING, (
                "preempting: lower-tier preemptible runs are checkpointing to make room for it"
            )
        if reason.startswith("waiting: preemption churn limit"):
            return WaitCode.PREEMPTION_LIMIT, (
                "may preempt lower-tier work, but the cell's preemption limit "
                f"({self.config.preemptions_per_minute} a minute) holds it for now"
            )
        capped = self.cap_words(job)
        if capped is not None:
            return capped
        gpus, per_node, _ = job.shape
        if job.job_id == self.reservation_job:
            shadow, nodes = self.reservation_shadow_ms, self.reservation_nodes
            return WaitCode.RESERVATION_HOLDER, self.holder_words(shadow, len(nodes))
        more = self.more_reservations().get(job.job_id)
        if more is not None:
            return WaitCode.RESERVATION_HOLDER, self.holder_words(more[0], len(more[1]))
        breaker = self.breaker_words(job)
        if breaker is not None:
            return WaitCode.BREAKER, breaker
        if reason.startswith("waiting: no healthy nodes"):
            return WaitCode.NO_FIT, (
                f"no healthy node of this cell can fit {gpus} GPU(s) at {per_node} per node now"
            )
        if self.fits_free_now(job):
            if not job.spec.preemptible and not self.guarantees_allow(job, gpus):
                return WaitCode.RESERVED_CAPACITY, (
                    "the free GPUs are guaranteed to another tier or organisation; "
                    "a preemptible job may borrow them"
                )
            if self.reservation_job or self.more_reservations():
                return WaitCode.RESERVATION, (
                    "the free GPUs are reserved for a larger job ahead of it (a gang); it "
                    "starts on them only if it would end before that job starts"
                )
        kind = job.spec.gpu_type
        if kind and free_by_type is not None:
            free = free_by_type.get(kind, 0)
        else:
            free = self.index.free_total
        need = f"{gpus} {kind + ' ' if kind else ''}GPU(s)"
        if per_node < gpus:
            need += f" ({per_node} per node)"
        if position > 1:
            return WaitCode.FAIR_SHARE, (
                f"behind {position - 1} job(s) of higher fair order; then it needs {need} "
                f"({free} free now)"
            )
        return WaitCode.GPUS, f"next in line: waiting for {need} to free ({free} free now)"

    def cap_words(self: Cell, job: Job) -> tuple[str, str] | None:
        """(code, words) when the job's organisation or user is at a quota or
        cap: ``cap_hit``'s decision (the one the walk takes), told in words."""
        level = self.cap_hit(job)
        if not level:
            return None
        tenant = self.config.tenant(job.tenant)
        org, user = self.use_of(job)
        gpus = job.shape[0]
        if level == "org":
            who, use, knob = f"organisation {job.tenant}", org, ""
            max_gpus, max_running = tenant.max_gpus, tenant.max_running
        else:
            who, use, knob = f"user {job.user}", user, "user_"
            max_gpus, max_running = tenant.user_max_gpus, tenant.user_max_running
        if max_gpus and use.gpus + gpus > max_gpus:
            return WaitCode.QUOTA, (
                f"held by quota: {who} holds {use.gpus} of its {max_gpus} GPUs "
                f"({knob}max_gpus) and this job needs {gpus}"
            )
        return WaitCode.CONCURRENCY_CAP, (
            f"held by concurrency cap: {who} runs {use.running} job(s), its cap "
            f"({knob}max_running {max_running})"
        )
        org = self.org_use.get(job.tenant)
        user = self.user_use.get((job.tenant, job.user))
        gpus = job.shape[0]
        org_gpus, org_runs = (org.gpus, org.running) if org else (0, 0)
        user_gpus, user_runs = (user.gpus, user.running) if user else (0, 0)
        if tenant.max_gpus and org_gpus + gpus > tenant.max_gpus:
            return WaitCode.QUOTA, (
                f"held by quota: organisation {job.tenant} holds {org_gpus} of its "
                f"{tenant.max_gpus} GPUs (max_gpus) and this job needs {gpus}"
            )
        if tenant.max_running and org_runs >= tenant.max_running:
            return WaitCode.CONCURRENCY_CAP, (
                f"held by concurrency cap: organisation {job.tenant} runs {org_runs} "
                f"job(s), its cap (max_running {tenant.max_running})"
            )
        if tenant.user_max_gpus and user_gpus + gpus > tenant.user_max_gpus:
            return WaitCode.QUOTA, (
                f"held by quota: user {job.user} holds {user_gpus} of its "
                f"{tenant.user_max_gpus} GPUs (user_max_gpus) and this job needs {gpus}"
            )
        if tenant.user_max_running and user_runs >= tenant.user_max_running:
            return WaitCode.CONCURRENCY_CAP, (
                f"held by concurrency cap: user {job.user} runs {user_runs} job(s), "
                f"its cap (user_max_running {tenant.user_max_running})"
            )
        return None

    def holder_words(self: Cell, shadow_ms: int, nodes: int) -> str:
        wait_s = max(0, (shadow_ms - self.now_ms) // 1000)
        return (
            f"reservation: holds {nodes} node(s) from about t+{wait_s}s, when running jobs "
            "end; it starts then, others backfill around it"
        )

    def breaker_words(self: Cell, job: Job) -> str | None:
        """Words for a breaker open (or half-open) for the job's model on its GPU
        type (a node's breaker only keeps it off that node: not why it waits)."""
        if not self.breakers:
            return None
        spec = job.spec
        model_version = f"{spec.model}@{spec.model_version}"
        for (model, scope, key), until in self.breakers.items():
            if model != model_version or scope != "gpu_type":
                continue
            if spec.gpu_type and key != spec.gpu_type:
                continue
            state = (
                f"open for about {(until - self.now_ms) // 1000}s more"
                if until > self.now_ms
                else "half-open: one probe run decides"
            )
            return (
                f"breaker {state} for model {model_version} on {key} GPUs after repeated "
                "failures across tenants; its retries go to other GPUs where there are any"
            )
        return None
