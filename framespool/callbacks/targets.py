"""Callback targets: which URLs a job may name as ``callback_url`` and which addresses
the webhook dispatcher may connect to.

Both sides apply one policy: request validation (``framespool.producers.validation``
and the API's resolve-time check) refuses a target when the job is submitted, and
the dispatcher (``framespool.projections.webhooks``) checks again at delivery, so
neither can be more lenient than the other. This module sits below both packages
(it imports only the standard library and aiohttp), so neither imports the other.

1. ``check_url`` (syntax: scheme, host, no credentials, length) and
   ``check_address`` (one resolved address) are pure; ``check_target`` adds the
   address check for IP-literal hosts, which no resolver sees.
2. ``PolicyResolver`` resolves host names for the dispatcher's HTTP session and
   applies ``check_address`` to the very addresses it connects to, so a DNS answer
   that changes between the check and the connection cannot reach a private,
   loopback, link-local, multicast or reserved address unless allowed.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

MAX_URL_LEN = 2048


@dataclass(frozen=True)
class TargetPolicy:
    allow_private: bool = False
    allow_hosts: frozenset[str] = frozenset()  # exact host names exempt from the IP check
    allow_networks: tuple[str, ...] = ()  # CIDRs allowed although not public
    schemes: frozenset[str] = frozenset({"https", "http"})


class TargetRefused(Exception):
    """The callback target is not allowed by the policy (the tenant's fault)."""


def check_url(url: str, policy: TargetPolicy = TargetPolicy()) -> str:
    """'' if the URL is acceptable as a callback, else why not."""
    if len(url) > MAX_URL_LEN:
        return f"URL is longer than {MAX_URL_LEN} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"URL is malformed: {exc}"
    if parts.scheme.lower() not in policy.schemes:
        return f"scheme must be one of {sorted(policy.schemes)}, not {parts.scheme or 'none'!r}"
    if not parts.hostname:
        return "URL has no host"
    if parts.username or parts.password:
        return "URL must not contain credentials"
    if port == 0:
        return "port 0 is not a valid port"
    return ""


def address_problem(address: str) -> str:
    """'' for a public unicast address, else which kind of non-public address it is."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            inner = address_problem(str(embedded))
            if inner:
                return inner
    for attr, name in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_unspecified", "unspecified"),
        ("is_reserved", "reserved"),
        ("is_private", "private"),
        ("is_site_local", "site-local"),  # fec0::/10: deprecated, still routed privately
    ):
        if getattr(ip, attr, False):  # is_site_local exists for IPv6 only
            return name
    return "" if ip.is_global else "not globally routable"


def check_address(host: str, address: str, policy: TargetPolicy = TargetPolicy()) -> str:
    """'' if the policy lets us connect to ``address`` (resolved from ``host``)."""
    if policy.allow_private or host.lower().rstrip(".") in policy.allow_hosts:
        return ""
    problem = address_problem(address)
    if not problem:
        return ""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if any(ip in ipaddress.ip_network(net, strict=False) for net in policy.allow_networks):
        return ""
    return f"{host} resolves to {address}, a {problem} address; callbacks must be public"


def check_target(url: str, policy: TargetPolicy = TargetPolicy()) -> str:
    """``check_url`` plus the address check for IP-literal hosts, which no resolver sees."""
    problem = check_url(url, policy)
    if problem:
        return problem
    host = urlsplit(url).hostname or ""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return ""  # a name: PolicyResolver checks every address it resolves to
    return check_address(host, host, policy)


class PolicyResolver(AbstractResolver):
    """aiohttp resolver that refuses every answer the target policy forbids."""

    def __init__(self, policy: TargetPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for r in results:
            problem = check_address(host, r["host"], self._policy)
            if problem:
                raise TargetRefused(problem)
        return results

    async def close(self) -> None:
        await self._inner.close()
