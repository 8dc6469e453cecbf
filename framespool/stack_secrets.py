"""The one builder of a deployment's secrets, for ``framespool up`` and the Compose init.

A secrets document (``stack-secrets.json``, read by ``framespool.services``) holds
what the server needs, and each secret signs one thing:

- ``auth``: the API key table, keys stored as salted hashes only; per tenant its
  tiers and its own webhook signing secret (the server keeps it to sign; the
  tenant is shown it once, to verify);
- ``url_signing_key``: signs artifact download URLs; the server's alone, never
  shown to a tenant, used for nothing else;
- ``operator_key``: the bearer key of ``/metrics`` (the operator's, not a tenant's);
- ``s3``: where artifacts live, when not on local disk.

``build`` returns that document and what to show the tenants once (their API
keys and webhook secrets). ``write_private`` writes a file that only its owner
can read, created that way (no moment at 0644) and replaced atomically.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from framespool.projections.webhook_secrets import new_webhook_secret

SECRETS_FILE = "stack-secrets.json"
# The keys issued to the tenants, as shown to them (the secrets file holds only
# their hashes): kept by ``framespool up`` (0600) so a restarted stack can show
# them again in stack.json. Delete it once the keys are handed out; they stay valid.
KEYS_FILE = "tenant-keys.json"


def tiers_for(tier: str) -> list[str]:
    """A tenant's tiers: its own and ``free``."""
    return [tier, "free"] if tier != "free" else ["free"]


def build(
    tenants: Iterable[tuple[str, str]],
    *,
    user: str = "dev",
    s3: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """(the server's secrets document, what to show each tenant once).

    ``tenants`` are (name, default tier) pairs; each gets one API key and one
    webhook secret. The shown list has ``name``, ``tier``, ``api_key`` and
    ``webhook_secret`` per tenant.
    """
    from framespool.producers.auth import new_key, record_to_config

    policies: dict[str, dict[str, Any]] = {}
    keys: list[dict[str, Any]] = []
    shown: list[dict[str, str]] = []
    for name, tier in tenants:
        token, record = new_key(name, user)
        webhook_secret = new_webhook_secret()
        policies[name] = {
            "tiers": tiers_for(tier),
            "default_tier": tier,
            "webhook_secret": webhook_secret,
        }
        keys.append(record_to_config(record))
        shown.append(
            {"name": name, "tier": tier, "api_key": token, "webhook_secret": webhook_secret}
        )
    doc: dict[str, Any] = {
        "auth": {"tenants": policies, "keys": keys},
        "url_signing_key": secrets.token_hex(32),
        "operator_key": f"fsop_{secrets.token_urlsafe(24)}",
    }
    if s3:
        doc["s3"] = dict(s3)
    return doc, shown


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


def set_webhook_secret(path: Path | str, tenant: str, secret: str) -> None:
    """Record a rotated webhook secret in the secrets file (the server's copy)."""
    doc = json.loads(Path(path).read_text())
    doc["auth"].setdefault("tenants", {}).setdefault(tenant, {})["webhook_secret"] = secret
    write_private(path, doc)
