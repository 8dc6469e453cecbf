"""Per-tenant webhook signing secrets: looked up by the dispatcher, rotated through the API.

Each tenant has its own secret, so the secret a tenant verifies its webhooks
with signs nothing of another tenant's. ``rotate(tenant)`` makes a new one,
hands it to ``persist`` (the server's secrets file) and returns it: the API
shows it once and keeps no other copy. Webhooks are signed with the new secret
from then on.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping


def new_webhook_secret() -> str:
    return f"whsec_{secrets.token_urlsafe(32)}"


class WebhookSecrets:
    def __init__(
        self,
        secrets_by_tenant: Mapping[str, str | bytes],
        persist: Callable[[str, str], None] | None = None,
    ) -> None:
        self._secrets = {
            t: (s.encode() if isinstance(s, str) else bytes(s))
            for t, s in secrets_by_tenant.items()
            if s
        }
        self._persist = persist

    def secret_for(self, tenant: str) -> bytes | None:
        return self._secrets.get(tenant)

    def rotate(self, tenant: str) -> str:
        """A new secret for ``tenant``, stored before it is returned (to be shown once)."""
        secret = new_webhook_secret()
        if self._persist is not None:
            self._persist(tenant, secret)  # fails before the old one is replaced
        self._secrets[tenant] = secret.encode()
        return secret
