"""API keys -> (tenant, user): keys are stored hashed and compared in constant time.

A key is a token ``<key id>.<secret>`` (``new_key`` makes one). The server keeps
only ``sha256(salt || token)`` with a random per-key salt, looked up by key id;
a token without a dot has a derived id (``sha256(token)[:16]``), which lets a
development config list plain keys (``{"key": "...", "tenant": ...}``), hashed
at load and then forgotten.

Config (a dict, or a path to JSON)::

    {"tenants": {"acme": {"tiers": ["enterprise", "free"], "default_tier": "enterprise",
                          "webhook_secret": "...", "models": ["demo"],
                          "rate_per_s": 50, "burst": 200, "queue_cap": 1000}},
     "keys": [{"id": "k1", "tenant": "acme", "user": "alice", "salt": "<hex>", "sha256": "<hex>"},
              {"key": "dev-key-for-bob", "tenant": "acme", "user": "bob"}]}
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framespool.configfile import ConfigError, optional, read_document, require, source_of, table

DEFAULT_TIERS = ("free",)
_DUMMY_SALT = b"\x00" * 16


@dataclass(frozen=True)
class TenantPolicy:
    """What a tenant may do at the API: its tiers, the models it may run (empty:
    every model served), and its own API limits where they differ from its
    default tier's (``producers.settings``; None: the tier's)."""

    tiers: tuple[str, ...] = DEFAULT_TIERS
    default_tier: str = ""
    webhook_secret: str = ""
    models: tuple[str, ...] = ()
    rate_per_s: float | None = None
    burst: int | None = None
    queue_cap: int | None = None
    storage_quota_bytes: int | None = None  # bytes its jobs may keep stored; None: its tier's

    @property
    def tier(self) -> str:
        return self.default_tier or self.tiers[0]


@dataclass(frozen=True)
class Principal:
    """Who is calling: every read and write is scoped to ``tenant``."""

    tenant: str
    user: str
    key_id: str
    policy: TenantPolicy = TenantPolicy()


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    tenant: str
    user: str
    salt: bytes
    digest: bytes
    disabled: bool = False


def key_id_of(token: str) -> str:
    if "." in token:
        return token.split(".", 1)[0]
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def hash_key(token: str, salt: bytes) -> bytes:
    return hashlib.sha256(salt + token.encode()).digest()


def record_for(token: str, tenant: str, user: str = "", salt: bytes | None = None) -> KeyRecord:
    """What the server stores for ``token``."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    return KeyRecord(key_id_of(token), tenant, user, salt, hash_key(token, salt))


def new_key(tenant: str, user: str = "") -> tuple[str, KeyRecord]:
    """A fresh token (show it once) and the record to store."""
    token = f"fsk{secrets.token_hex(6)}.{secrets.token_urlsafe(24)}"
    return token, record_for(token, tenant, user)


def record_to_config(r: KeyRecord) -> dict[str, Any]:
    return {
        "id": r.key_id,
        "tenant": r.tenant,
        "user": r.user,
        "salt": r.salt.hex(),
        "sha256": r.digest.hex(),
        "disabled": r.disabled,
    }


class ApiKeys:
    """The key table; ``authenticate(token)`` is the only question it answers."""

    def __init__(
        self, records: Iterable[KeyRecord], tenants: Mapping[str, TenantPolicy] | None = None
    ) -> None:
        self._records: dict[str, KeyRecord] = {}
        for r in records:
            if r.key_id in self._records:
                raise ValueError(f"duplicate API key id {r.key_id!r}; give each key its own id")
            self._records[r.key_id] = r
        self.tenants: dict[str, TenantPolicy] = dict(tenants or {})

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | str | Path,
        *,
        key: str = "",
        file: str | Path | None = None,
    ) -> ApiKeys:
        """The key table from a JSON/TOML file or a table (``key``: where that table
        sits in its file, e.g. ``auth``); errors name the file, the key and what
        was expected (:mod:`framespool.configfile`)."""
        if isinstance(config, (str, Path)):
            config = read_document(config)
        file = file if file is not None else source_of(config)
        at = lambda name: f"{key}.{name}" if key else name
        tenants = {}
        for name, t in table(config.get("tenants"), key=at("tenants"), file=file).items():
            where = at(f"tenants.{name}")
            t = table(t, key=where, file=file)
            tiers = tuple(
                optional(t, "tiers", (list, tuple), None, where=where, file=file) or DEFAULT_TIERS
            )
            default = optional(t, "default_tier", str, None, where=where, file=file) or tiers[0]
            if default not in tiers:
                raise ConfigError(
                    f"default_tier {default!r} is not in its tiers {tiers}; expected one of them",
                    key=f"{where}.default_tier",
                    file=file,
                )
            secret = optional(t, "webhook_secret", str, "", where=where, file=file)
            models = optional(t, "models", (list, tuple), (), where=where, file=file)
            limits = {
                knob: optional(t, knob, kind, None, where=where, file=file)
                for knob, kind in (
                    ("rate_per_s", float),
                    ("burst", int),
                    ("queue_cap", int),
                    ("storage_quota_bytes", int),
                )
            }
            tenants[name] = TenantPolicy(tiers, default, secret, tuple(models), **limits)
        records = []
        keys = optional(config, "keys", (list, tuple), (), where=key, file=file)
        for i, k in enumerate(keys):
            where = at(f"keys[{i}]")
            k = table(k, key=where, file=file)
            if k.get("tenant") is None:
                raise ConfigError(
                    "no tenant: expected the tenant (a string) this key belongs to",
                    key=f"{where}.tenant",
                    file=file,
                )
            tenant = require(k, "tenant", str, where=where, file=file)
            user = optional(k, "user", str, "", where=where, file=file)
            if "key" in k:
                records.append(
                    record_for(require(k, "key", str, where=where, file=file), tenant, user)
                )
                continue
            try:
                salt = bytes.fromhex(require(k, "salt", str, where=where, file=file))
                digest = bytes.fromhex(require(k, "sha256", str, where=where, file=file))
            except ValueError as exc:
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(
                    f"salt and sha256 must be hex strings ({exc})", key=where, file=file
                ) from None
            records.append(
                KeyRecord(
                    require(k, "id", str, where=where, file=file),
                    tenant,
                    user,
                    salt,
                    digest,
                    optional(k, "disabled", bool, False, where=where, file=file),
                )
            )
        return cls(records, tenants)

    def policy(self, tenant: str) -> TenantPolicy:
        return self.tenants.get(tenant, TenantPolicy())

    def authenticate(self, token: str | None) -> Principal | None:
        """The caller for a presented token, or None (unknown, wrong or disabled)."""
        if not token or len(token) > 512:
            return None
        record = self._records.get(key_id_of(token))
        salt = record.salt if record is not None else _DUMMY_SALT
        expected = record.digest if record is not None else b"\x00" * 32
        ok = hmac.compare_digest(hash_key(token, salt), expected)  # same work either way
        if record is None or not ok or record.disabled:
            return None
        return Principal(record.tenant, record.user, record.key_id, self.policy(record.tenant))


def token_from_headers(headers: Mapping[str, str]) -> str | None:
    """``Authorization: Bearer <token>`` or ``X-API-Key: <token>``."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("X-API-Key") or None
