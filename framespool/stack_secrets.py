"""The one builder of a deployment's secrets, for ``framespool up`` and the Compose init.

A secrets document (``stack-secrets.json``, read by ``framespool.bootstrap``) holds
what the server needs, and each secret signs one thing:

- ``auth``: the API key table, keys stored as salted hashes only; per tenant its
  tiers and its own webhook signing secret (the server keeps it to sign; the
  tenant is shown it once, to verify);
- ``url_signing_key``: signs artifact download URLs; the server's alone, never
  shown to a tenant, used for nothing else;
- ``operator_key``: the bearer key of ``/metrics`` (the operator's, not a tenant's);
- ``s3``: where artifacts live, when not on local disk.

``build`` returns that document and what to show the tenants once (their API
keys and webhook secrets): one key per user of each tenant (``[[tenants]]``'s
``users``; none: one user, ``dev``). ``reconcile`` brings an existing document
up to a deployment's tenants (new tenants and users get keys, listed tenants
their policies; nothing is taken away), ``add_tenant`` and ``rotate_key`` are
``framespool tenants``'s. A key is shown once and stored hashed; rotating one
removes the user's old keys. Every change of the file is a read-modify-write
under ``locked`` (the API rotates webhook secrets, the CLI adds tenants, both
while the stack runs), written by ``write_private``: a file only its owner can
read, created that way (no moment at 0644) and replaced atomically; the API
notices the new file and reloads it (``framespool.bootstrap.watch_secrets``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from framespool.processors.config_file import TenantEntry
from framespool.projections.webhook_secrets import new_webhook_secret

SECRETS_FILE = "stack-secrets.json"
# The keys issued to the tenants, as shown to them (the secrets file holds only
# their hashes): kept by ``framespool up`` (0600) so a restarted stack can show
# them again in stack.json. Delete it once the keys are handed out; they stay valid.
KEYS_FILE = "tenant-keys.json"


def tiers_for(tier: str) -> list[str]:
    """A tenant's tiers: its own and ``free``."""
    return [tier, "free"] if tier != "free" else ["free"]


def entry_of(tenant: TenantEntry | tuple[str, str]) -> TenantEntry:
    """A ``[[tenants]]`` entry, or a (name, default tier) pair as one: its tier and ``free``."""
    if isinstance(tenant, TenantEntry):
        return tenant
    name, tier = tenant
    return TenantEntry(name, tiers=tuple(tiers_for(tier)), default_tier=tier)


def build(
    tenants: Iterable[TenantEntry | tuple[str, str]],
    *,
    user: str = "dev",
    s3: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """(the server's secrets document, what to show each tenant once).

    ``tenants``: ``[[tenants]]`` entries or (name, default tier) pairs; each
    tenant gets one webhook secret and each of its users (``user`` when it
    names none) one API key. The shown list has ``name``, ``user``, ``tier``,
    ``api_key`` and ``webhook_secret`` per key: every tenant's first user
    first, in the tenants' order, then the other users.
    """
    doc: dict[str, Any] = {
        "auth": {"tenants": {}, "keys": []},
        "url_signing_key": secrets.token_hex(32),
        "operator_key": f"fsop_{secrets.token_urlsafe(24)}",
    }
    if s3:
        doc["s3"] = dict(s3)
    return doc, reconcile(doc, tenants, user=user)


def reconcile(
    doc: dict[str, Any], tenants: Iterable[TenantEntry | tuple[str, str]], *, user: str = "dev"
) -> list[dict[str, str]]:
    """Bring ``doc`` (a secrets document, changed in place) up to ``tenants``: a
    listed tenant gets its policy (tiers, models, limits) and, if new, a webhook
    secret; a user without a key gets one. Tenants and keys it does not list stay
    (``framespool tenants add`` made them). Returns what to show once."""
    auth = doc.setdefault("auth", {})
    policies: dict[str, dict[str, Any]] = auth.setdefault("tenants", {})
    keyed = {(k.get("tenant"), k.get("user", "")) for k in auth.setdefault("keys", [])}
    first: list[dict[str, str]] = []
    rest: list[dict[str, str]] = []
    for tenant in map(entry_of, tenants):
        old = policies.get(tenant.name, {})
        secret = old.get("webhook_secret") or new_webhook_secret()
        policies[tenant.name] = {**tenant.policy(), "webhook_secret": secret}
        users = tenant.user_names() if tenant.users else (user,)
        for i, name in enumerate(users):
            if (tenant.name, name) in keyed:
                continue
            shown = _issue(doc, tenant.name, name)
            (first if i == 0 else rest).append(shown)
    return first + rest


def _issue(doc: dict[str, Any], tenant: str, user: str) -> dict[str, str]:
    """A new key for (tenant, user), its hash stored in ``doc``; what to show once."""
    from framespool.producers.auth import new_key, record_to_config

    token, record = new_key(tenant, user)
    doc["auth"]["keys"].append(record_to_config(record))
    policy = doc["auth"]["tenants"].get(tenant, {})
    return {
        "name": tenant,
        "user": user,
        "tier": policy.get("default_tier", "free"),
        "api_key": token,
        "webhook_secret": policy.get("webhook_secret", ""),
    }


def add_tenant(doc: dict[str, Any], tenant: TenantEntry) -> list[dict[str, str]]:
    """``framespool tenants add``: a tenant ``doc`` does not have yet, with a key per
    user; ``ValueError`` if it exists (rotate its keys instead)."""
    if tenant.name in doc.get("auth", {}).get("tenants", {}):
        raise ValueError(
            f"tenant {tenant.name!r} exists already; use 'framespool tenants rotate-key' for "
            "a new key, or the deployment file to change its policy"
        )
    return reconcile(doc, [tenant])


def rotate_key(doc: dict[str, Any], tenant: str, user: str | None = None) -> dict[str, str]:
    """``framespool tenants rotate-key``: a new key for the tenant's ``user`` (its
    only or first user when None); the user's old keys stop working at once."""
    auth = doc.get("auth", {})
    keys = auth.get("keys", [])
    if tenant not in auth.get("tenants", {}) and not any(k["tenant"] == tenant for k in keys):
        raise ValueError(f"no tenant {tenant!r}; 'framespool tenants list' shows them")
    users = [k.get("user", "") for k in keys if k["tenant"] == tenant]
    if user is None:
        if len(set(users)) > 1:
            raise ValueError(
                f"tenant {tenant!r} has users {sorted(set(users))}; say which with --user"
            )
        user = users[0] if users else "dev"
    auth["keys"] = [k for k in keys if (k["tenant"], k.get("user", "")) != (tenant, user)]
    return _issue(doc, tenant, user)


@contextlib.contextmanager
def locked(path: Path | str) -> Iterator[None]:
    """Hold the secrets file's lock (``<file>.lock``) for a read-modify-write."""
    with open(f"{path}.lock", "a") as lock:
        os.chmod(lock.name, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update(path: Path | str, change: Any) -> Any:
    """Apply ``change(doc)`` to the secrets file at ``path`` under its lock, write it
    back (0600) and return what ``change`` returned."""
    with locked(path):
        doc = json.loads(Path(path).read_text())
        result = change(doc)
        write_private(path, doc)
    return result


def write_private(path: Path | str, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as JSON readable by the owner only (0600), atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out, indent=2)
        os.chmod(tmp, 0o600)  # an existing tmp keeps its mode through O_CREAT
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_issued(path: Path | str) -> list[dict[str, str]]:
    """The tenants' keys as issued (``KEYS_FILE``), or none if the file is gone."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []
    return list(doc.get("tenants", []))


def record_issued(path: Path | str, shown: list[dict[str, str]], replaced: bool = False) -> None:
    """Add keys just issued to ``KEYS_FILE`` (0600); ``replaced``: each replaces the
    earlier keys of its (tenant, user), which no longer work."""
    issued = read_issued(path)
    if replaced:  # an entry from before users were recorded is its tenant's only key
        new = {(s["name"], s["user"]) for s in shown}
        tenants = {name for name, _ in new}
        issued = [
            i
            for i in issued
            if ((_name(i), i["user"]) not in new if "user" in i else _name(i) not in tenants)
        ]
    write_private(path, {"tenants": issued + list(shown)})


def _name(issued: Mapping[str, Any]) -> str:
    """An issued key's tenant (the Compose init once wrote it as ``tenant``)."""
    return issued.get("name") or issued.get("tenant", "")


def set_webhook_secret(path: Path | str, tenant: str, secret: str) -> None:
    """Record a rotated webhook secret in the secrets file (the server's copy)."""

    def change(doc: dict[str, Any]) -> None:
        doc["auth"].setdefault("tenants", {}).setdefault(tenant, {})["webhook_secret"] = secret

    update(path, change)
