"""What a submission must pass before it is written to the log (module doc of
``framespool.producers.api``, step 3): the callback host, the disk, the tenant's
queue cap, its storage quota and its tier's predicted-wait limit. Each refuses
with an :class:`~framespool.producers.http.ApiError` naming the field and, where
waiting helps, ``Retry-After``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from framespool.callbacks.lookups import CallbackLookups
from framespool.callbacks.targets import check_address, vet_target
from framespool.processors.core.offers import (
    PREDICTED_WAIT,
    Own,
    limited,
    live_offers,
    wait_refusal,
)
from framespool.producers.http import ApiConfig, ApiError
from framespool.producers.run_times import RunTimes
from framespool.schemas.events import JobSpec


async def check_callback_host(
    config: ApiConfig, lookups: CallbackLookups, tenant: str, url: str | None
) -> None:
    """Refuse a callback whose host name resolves to an address the policy forbids.

    The validation parsed the URL with the parser delivery uses
    (``framespool.callbacks.targets.vet_target``) and checked IP literals and
    loopback names; this looks up the very host name delivery will resolve.
    A name that does not resolve now (or is not looked up now:
    ``framespool.callbacks.lookups``) is accepted: delivery resolves it again
    and checks every address it connects to
    (``framespool.callbacks.targets.PolicyResolver``).
    """
    if not url:
        return
    policy = config.url_policy
    target = vet_target(url, policy)
    if isinstance(target, str):  # validate_submit refused it already; never looked up
        raise ApiError(
            422, "invalid_field", f"{target}; use a public http(s) endpoint", "callback_url"
        )
    if target.ip is not None or policy.allow_private or target.name in policy.allow_hosts:
        return
    addresses = await lookups.addresses(tenant, target.host, config.resolve_timeout_s)
    for address in addresses or ():
        problem = check_address(target.host, address, policy)
        if problem:
            raise ApiError(
                422, "invalid_field", f"{problem}; use a public http(s) endpoint", "callback_url"
            )


def check_disk(config: ApiConfig) -> None:
    """503 + Retry-After while the guarded disk is nearly full (nothing is written)."""
    guard = config.disk_guard
    why = guard.refusal() if guard is not None else None
    if guard is not None and why is not None:
        raise ApiError(503, "disk_full", why, headers={"Retry-After": str(guard.retry_after_s)})


def queue_cap_of(config: ApiConfig, tenant: str) -> int:
    """Jobs ``tenant`` may have waiting, by the same precedence as its rate."""
    override = config.queue_cap_overrides.get(tenant)
    if override is not None:
        return override
    if config.settings is not None:
        return config.settings.queue_cap_of(config.auth.policy(tenant))
    return config.queue_cap


def check_queue_cap(config: ApiConfig, tenant: str, in_flight: int = 0) -> None:
    """Refuse a submission over the tenant's queue cap now, with when to retry.
    ``in_flight``: the tenant's submissions that passed this check and are being
    written to the log, not yet in the store (``QUEUE_HOLDS``)."""
    cap = queue_cap_of(config, tenant)
    if cap <= 0:
        return
    waiting = config.store.queued_count(tenant) + in_flight
    if waiting >= cap:
        retry = str(config.queue_cap_retry_after_s)
        raise ApiError(
            429,
            "queue_full",
            f"tenant {tenant!r} has {waiting} jobs waiting, its queue cap of {cap}; "
            f"retry after {retry} s, when some have started (or cancel some)",
            headers={"Retry-After": retry},
        )


def check_storage_quota(config: ApiConfig, tenant: str) -> None:
    """Refuse a submission while ``tenant``'s stored results and checkpoints hold
    its ``storage_quota_bytes`` (429; ``Retry-After`` when retention frees some)."""
    if config.storage is None or config.settings is None:
        return
    quota = config.settings.storage_quota_of(config.auth.policy(tenant))
    used = config.storage.used(tenant)
    if quota <= 0 or used < quota:
        return
    settings = config.settings
    release = config.storage.next_release_ms(tenant, settings.retention_of)
    headers, when = {}, "no stored object of yours expires: delete results or ask for more"
    if release is not None:
        retry = max(1, math.ceil(release / 1000 - config.clock()))
        headers["Retry-After"] = str(retry)
        when = f"retention frees some in {retry} s"
    raise ApiError(
        429,
        "storage_quota",
        f"tenant {tenant!r} stores {used} bytes of results and checkpoints, its "
        f"storage_quota_bytes of {quota}; {when} (the operator sets storage_quota_bytes "
        "per tenant or tier)",
        "storage_quota_bytes",
        headers=headers,
    )


def check_predicted_wait(
    offers: Mapping[str, Any], config: ApiConfig, spec: JobSpec, run_times: RunTimes
) -> None:
    """Refuse now a job whose predicted wait in the best cell that can run it
    exceeds its tier's limit, which the cells publish with their offers
    (``framespool.processors.core.offers``: the arithmetic admission routes by),
    at the tenant's own place in the fair order: behind what it already has
    waiting and running (its jobs in the read model, each counted at this
    job's GPU-seconds, its estimate no less than the model's jobs were seen to
    run: ``run_times``), not behind another tenant's whole backlog (``offers``,
    item 6). Stale or missing offers are unknown: nothing is refused on them.
    Cost per submit: O(C * T) when no tier is limited (the default); else
    O(C * (T + G + s)) for C cells' offers of T tiers and G node groups, s
    shapes, and two count reads (in memory); the offers are the projection's,
    in memory."""
    if not offers:
        return
    live = live_offers(offers, sorted(offers), int(config.clock() * 1000), config.offer_stale_s)
    if not limited(live, spec.tier):
        return  # no limit (the default): nothing to count on the submit path
    own = Own.of_jobs(
        spec,
        config.store.queued_count(spec.tenant),
        config.store.running_count(spec.tenant),
        run_times.floor_s(spec.tenant, f"{spec.model}@{spec.model_version}"),
    )
    refusal = wait_refusal(live, spec, None, own)
    if refusal is None:
        return
    retry = str(refusal.retry_after_s)
    raise ApiError(
        429,
        PREDICTED_WAIT,
        f"tier {spec.tier!r}: {refusal.message}; retry after {retry} s",
        "tier",
        headers={"Retry-After": retry},
    )
