"""Processor configuration files: JSON or TOML into the cores' config dataclasses.

One file serves a whole deployment (``framespool up --config``, every Compose
service's ``--config``); each process reads its own sections: the processors
``[admission]``, ``[scheduler]`` and ``[[tenants]]``, the API ``[api]`` and
``[[profiles]]`` (``producers.settings``, ``agents.profiles``), the agents
``[[profiles]]``. The processors' part::

    [admission]                      # framespool.processors.core.admission.AdmissionConfig
    cells = ["cell-0", "cell-1"]
    idempotency_horizon_s = 600
    [admission.cell_gpu_types]
    cell-1 = ["H100"]

    [scheduler]                      # framespool.processors.core.CellConfig
    heartbeat_timeout_s = 10
    retries = { node_lost = 5 }
    [[scheduler.tenants]]
    name = "acme"
    weight = 2
    user_weights = { alice = 2.0 }

    [[tenants]]                      # TenantEntry: one organisation, all of it in one place
    name = "acme"
    tiers = ["interactive", "enterprise", "free"]
    default_tier = "enterprise"
    weight = 2
    max_gpus = 16                    # quotas and caps count across all cells (below)
    users = [{ name = "alice", weight = 2 }, "bob"]

A ``[[tenants]]`` entry is the scheduler's ``TenantConfig`` (weight, quotas,
caps, reserved GPUs, its users' weights) and, for the API, the tenant's tiers,
models, limits and users (each user gets a key: ``framespool.stack_secrets``).
A tenant with a quota or a cap (``TenantEntry.quota_bound``, or any tenant when
``scheduler.default_tenant`` has one) is routed by admission to one cell, its
home, whatever the waits (``AdmissionConfig.quota_tenants``): each cell enforces
quotas on what it holds, so a tenant whose work all sits in one cell has its
quota across the cells, not once per cell. Field names are the dataclasses' own; a field given replaces its default
entirely (``retries = { node_lost = 5 }`` leaves only that class with a
budget; the others get ``default_retries``). An unknown name or a value of the
wrong type raises :class:`ConfigError` naming the file, the key
(``scheduler.tenants[0].weight``) and what was expected; the loader is
:mod:`framespool.configfile`, shared with the stack's and the API's files.
Admission's ``tiers`` default to the scheduler's tier names, so the two agree
unless told otherwise. Admission no longer rate-limits (the API's edge limit
does, at submit time): an old file's ``admission.rate`` and
``admission.tenant_rates`` are dropped with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from framespool.configfile import ConfigError, Document, build, read_document, source_of
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig
from framespool.processors.core.config import TenantConfig

log = logging.getLogger(__name__)

__all__ = [
    "ConfigError",
    "admission_config",
    "cell_config",
    "describe",
    "load_admission_config",
    "load_cell_config",
    "read_config_file",
]

# every section a deployment file may have; the processors read the first three
SECTIONS = ("admission", "scheduler", "tenants", "api", "profiles")


@dataclass(frozen=True)
class UserEntry:
    """A user of an organisation: its share weight among the organisation's users."""

    name: str
    weight: float = 1.0


@dataclass(frozen=True)
class TenantEntry:
    """One ``[[tenants]]`` table: an organisation's scheduling policy (what the
    cells enforce) and what the API lets it do. ``users``: each gets its own
    API key; none, one key for user ``dev``. ``rate_per_s``/``burst``/
    ``queue_cap``, ``storage_quota_bytes``: the tenant's own API limits (None:
    its default tier's, ``producers.settings``); ``queue_cap`` defaults to
    ``max_queued``."""

    name: str
    tiers: tuple[str, ...] = ("free",)
    default_tier: str = ""
    models: tuple[str, ...] = ()
    weight: float = 1.0
    max_gpus: int = 0
    max_queued: int = 0
    max_running: int = 0
    user_max_gpus: int = 0
    user_max_running: int = 0
    reserved_gpus: int = 0
    users: tuple[UserEntry, ...] = ()
    rate_per_s: float | None = None
    burst: int | None = None
    queue_cap: int | None = None
    storage_quota_bytes: int | None = None  # the API's; None: its default tier's

    def __post_init__(self) -> None:
        if self.storage_quota_bytes is not None and self.storage_quota_bytes < 0:
            raise ValueError(
                f"tenant {self.name!r}: storage_quota_bytes must be 0 (no quota) or more bytes"
            )
        if not self.tiers:
            raise ValueError(f"tenant {self.name!r}: tiers must name at least one tier")
        if self.default_tier and self.default_tier not in self.tiers:
            raise ValueError(
                f"tenant {self.name!r}: default_tier {self.default_tier!r} is not one of its "
                f"tiers {list(self.tiers)}"
            )
        names = [u.name for u in self.users]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"tenant {self.name!r}: users need distinct, non-empty names")
        self.scheduling()  # TenantConfig's own checks (weights, quotas), named

    @property
    def tier(self) -> str:
        return self.default_tier or self.tiers[0]

    def scheduling(self) -> TenantConfig:
        """What the cells enforce for this organisation."""
        return TenantConfig(
            self.name,
            weight=self.weight,
            max_gpus=self.max_gpus,
            max_queued=self.max_queued,
            max_running=self.max_running,
            user_max_gpus=self.user_max_gpus,
            user_max_running=self.user_max_running,
            reserved_gpus=self.reserved_gpus,
            user_weights=tuple((u.name, u.weight) for u in self.users if u.weight != 1.0),
        )

    def policy(self) -> dict[str, Any]:
        """What the API enforces (the secrets file's ``auth.tenants`` entry, without
        the webhook secret)."""
        doc: dict[str, Any] = {"tiers": list(self.tiers), "default_tier": self.tier}
        if self.models:
            doc["models"] = list(self.models)
        queue_cap = self.queue_cap if self.queue_cap is not None else self.max_queued or None
        for name, value in (
            ("rate_per_s", self.rate_per_s),
            ("burst", self.burst),
            ("queue_cap", queue_cap),
            ("storage_quota_bytes", self.storage_quota_bytes),
        ):
            if value is not None:
                doc[name] = value
        return doc

    def user_names(self) -> tuple[str, ...]:
        return tuple(u.name for u in self.users) or ("dev",)


def quota_bound(tenant: TenantConfig) -> bool:
    """Whether a quota or cap of ``tenant`` must hold across cells (its jobs go to one cell)."""
    return tenant.capped() or bool(tenant.max_queued)


def read_config_file(path: str | Path) -> Document:
    """The file's top-level table (``.toml`` is TOML, anything else JSON), which
    remembers the file so that later errors name it."""
    return read_document(path, sections=SECTIONS)


def tenant_entries(doc: Mapping[str, Any]) -> tuple[TenantEntry, ...]:
    """The ``[[tenants]]`` tables, checked; a user may be a name or a table."""
    file = source_of(doc)
    tables = doc.get("tenants") or []
    if not isinstance(tables, list):
        raise ConfigError(
            f"expected a list of tenant tables ([[tenants]] in TOML), got {tables!r}",
            key="tenants",
            file=file,
        )
    entries: list[TenantEntry] = []
    for i, table in enumerate(tables):
        if isinstance(table, Mapping) and isinstance(table.get("users"), list):
            users = [{"name": u} if isinstance(u, str) else u for u in table["users"]]
            table = {**table, "users": users}
        entry = build(TenantEntry, table, f"tenants[{i}]", file=file)
        if any(e.name == entry.name for e in entries):
            raise ConfigError(
                f"a second entry for tenant {entry.name!r}; give each tenant one",
                key=f"tenants[{i}].name",
                file=file,
            )
        entries.append(entry)
    return tuple(entries)


def cell_config(doc: Mapping[str, Any]) -> CellConfig:
    """The ``scheduler`` section as a :class:`CellConfig` (defaults where absent),
    with each ``[[tenants]]`` entry's scheduling policy among its tenants."""
    file = source_of(doc)
    config = build(CellConfig, doc.get("scheduler", {}), "scheduler", file=file)
    entries = tenant_entries(doc)
    if not entries:
        return config
    listed = {t.name for t in config.tenants}
    known = [t.name for t in config.tiers]
    for i, entry in enumerate(entries):
        if entry.name in listed:
            raise ConfigError(
                f"tenant {entry.name!r} is in scheduler.tenants too; configure it in one place",
                key=f"tenants[{i}].name",
                file=file,
            )
        unknown = [t for t in entry.tiers if t not in known]
        if unknown:
            raise ConfigError(
                f"{unknown} not among the scheduler's tiers; expected some of {known}",
                key=f"tenants[{i}].tiers",
                file=file,
            )
    return replace(config, tenants=(*config.tenants, *(e.scheduling() for e in entries)))


def admission_config(doc: Mapping[str, Any]) -> AdmissionConfig:
    """The ``admission`` section as an :class:`AdmissionConfig`."""
    section = dict(doc.get("admission", {}))
    for legacy in ("rate", "tenant_rates"):
        if section.pop(legacy, None) is not None:
            log.warning(
                "admission.%s is ignored: admission no longer rate-limits; "
                "set the API's rate limit instead (it answers 429 at submit time)",
                legacy,
            )
    if "tiers" not in section and "scheduler" in doc:
        section["tiers"] = [t.name for t in cell_config(doc).tiers]
    if "quota_tenants" not in section and ("scheduler" in doc or "tenants" in doc):
        cells = cell_config(doc)
        section["quota_tenants"] = [t.name for t in cells.tenants if quota_bound(t)]
        section.setdefault("quota_default", quota_bound(cells.default_tenant))
    return build(AdmissionConfig, section, "admission", file=source_of(doc))


def load_cell_config(path: str | Path) -> CellConfig:
    return cell_config(read_config_file(path))


def load_admission_config(path: str | Path) -> AdmissionConfig:
    return admission_config(read_config_file(path))


def describe(config: object | None) -> str:
    """A one-line summary for the start-up log."""
    if isinstance(config, AdmissionConfig):
        return f"cells={list(config.cells)} idempotency_horizon_s={config.idempotency_horizon_s:g}"
    if isinstance(config, CellConfig):
        return f"tiers={[t.name for t in config.tiers]} tenants={[t.name for t in config.tenants]}"
    return repr(config)


def recorded_document(doc: Mapping[str, Any]) -> tuple[str, str]:
    """(JSON text, its SHA-256) of a config document's sections, as a processor
    records them in the log (``ProcessorConfigured``): keys sorted, so one
    configuration always gives one text."""
    import hashlib
    import json

    text = json.dumps({k: doc[k] for k in sorted(doc)}, sort_keys=True, default=str)
    return text, hashlib.sha256(text.encode()).hexdigest()
