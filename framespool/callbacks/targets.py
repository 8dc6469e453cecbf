"""Callback targets: which URLs a job may name as ``callback_url`` and which addresses
the webhook dispatcher may connect to.

Both sides apply one policy: request validation (``framespool.producers.validation``
and the API's resolve-time check) refuses a target when the job is submitted, and
the dispatcher (``framespool.projections.webhooks``) checks again at delivery, so
neither can be more lenient than the other. This module sits below both packages
(it imports only the standard library, yarl and aiohttp), so neither imports the
other.

Theory of operation
-------------------
1. One parser. ``parse_target`` reads the URL with yarl, the parser aiohttp
   delivers through, and returns a ``Target`` holding the parsed URL and the
   canonical host: the very host aiohttp will connect to or resolve. The
   dispatcher posts to ``Target.url`` itself, so what was checked is what is
   connected to; no second parser (``urllib``) can disagree about the host.
2. ASCII only after IDNA, and no look-alikes. yarl folds a host through NFKC
   and IDNA: segmented (U+1FBF0-9), fullwidth or circled characters and the
   ideographic full stop become ASCII (``\U0001fbf1\U0001fbf2\U0001fbf7.0.0.1``
   is 127.0.0.1). A written host with a non-ASCII character that folds to
   ASCII, or with a digit of another script (Arabic-Indic...), is refused, as
   is a canonical host with anything but ASCII letters, digits, ``-``, ``_``
   and dots (a name) or an IPv6 literal without a zone.
3. Numbers are addresses. A host whose last label is a number (WHATWG's
   "ends in a number": decimal, or ``0x`` hex) is an IPv4 address and must be
   written as four decimal octets without a trailing dot (``127.1``,
   ``2130706433``, ``0177.0.0.1`` and ``127.0.0.1.`` are refused): aiohttp
   connects to an IP literal without asking any resolver, so the address
   check here is the only one it gets.
4. Loopback names (``localhost``, ``*.localhost``, ``localhost.localdomain``,
   ``ip6-localhost``, ``ip6-loopback``, with or without a trailing dot) are
   refused without a lookup: a skipped or slow submit-time lookup must not
   let them through.
5. ``check_address`` (one resolved address) does no IO; ``check_target`` adds it
   for IP literals. ``PolicyResolver`` resolves host names for the
   dispatcher's HTTP session and applies ``check_address`` to the very
   addresses it connects to, so a DNS answer that changes between the check
   and the connection cannot reach a private, loopback, link-local,
   multicast or reserved address unless allowed.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import unicodedata
from dataclasses import dataclass

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

MAX_URL_LEN = 2048

# a canonical host name's characters (after IDNA: punycode is ASCII); re.ASCII is
# implied by the explicit classes, and [0-9] never matches another script's digits
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62}))*")
# WHATWG URL: a last label that is a number makes the host an IPv4 address
_NUMBER_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
# label separators IDNA (UTS 46) maps to "." although NFKC does not fold them all
_DOTS = frozenset("\u3002\uff0e\uff61")
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


@dataclass(frozen=True)
class TargetPolicy:
    allow_private: bool = False
    allow_hosts: frozenset[str] = frozenset()  # exact host names exempt from the IP check
    allow_networks: tuple[str, ...] = ()  # CIDRs allowed although not public
    schemes: frozenset[str] = frozenset({"https", "http"})


class TargetRefused(Exception):
    """The callback target is not allowed by the policy (the tenant's fault)."""


@dataclass(frozen=True)
class Target:
    """A parsed callback URL: ``url`` is what delivery posts to (theory of operation, 1)."""

    url: URL
    host: str  # canonical: IDNA-encoded ASCII, IPv6 without brackets, trailing dot kept
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None  # set for an IP literal

    @property
    def name(self) -> str:
        """The host without its trailing dot, lower case: what policies compare."""
        return self.host.rstrip(".").lower()


def _look_alike(written: str) -> str:
    """The first character of a written host that imitates ASCII, or ''."""
    for ch in written:
        if ch.isascii():
            continue
        folded = unicodedata.normalize("NFKC", ch)
        if ch in _DOTS or unicodedata.category(ch) == "Nd" or ch.isdigit() or folded.isascii():
            return ch
    return ""


def _written_authority(url: str) -> str:
    """The authority as the tenant wrote it (yarl's ``raw_authority`` is already folded)."""
    rest = url.partition("//")[2]
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def parse_target(url: str, policy: TargetPolicy = TargetPolicy()) -> Target | str:
    """The target ``url`` names, or why it is not acceptable as a callback (syntax
    only: the address of an IP literal is ``check_target``'s)."""
    if len(url) > MAX_URL_LEN:
        return f"URL is longer than {MAX_URL_LEN} characters"
    try:
        parsed = URL(url)
        port = parsed.explicit_port
        host = parsed.raw_host
    except (ValueError, TypeError, UnicodeError) as exc:
        return f"URL is malformed: {exc}"
    if parsed.scheme.lower() not in policy.schemes:
        return f"scheme must be one of {sorted(policy.schemes)}, not {parsed.scheme or 'none'!r}"
    if not host or not parsed.is_absolute():
        return "URL has no host"
    if parsed.raw_user is not None or parsed.raw_password is not None:
        return "URL must not contain credentials"
    if port == 0:
        return "port 0 is not a valid port"
    odd = _look_alike(_written_authority(url))
    if odd:
        kind = "a non-ASCII digit" if odd.isdigit() else "a look-alike of an ASCII character"
        return (
            f"host contains {unicodedata.name(odd, '?')} (U+{ord(odd):04X}), {kind}; "
            "write the host in ASCII"
        )
    if not host.isascii():
        return "host is not ASCII after IDNA encoding; write it in ASCII (punycode)"
    if "%" in host:
        return "host must not contain '%' (percent-escapes, IPv6 zone ids)"
    if ":" in host:
        try:
            return Target(parsed, host, ipaddress.IPv6Address(host))
        except ValueError:
            return "host is not a valid IPv6 address"
    name = host[:-1] if host.endswith(".") else host
    if not _NAME.fullmatch(name):
        return (
            "host must be a DNS name (ASCII letters, digits, '-', '_' and single dots) "
            "or an IP address"
        )
    if _NUMBER_LABEL.fullmatch(name.rsplit(".", 1)[-1]):
        try:
            address = ipaddress.IPv4Address(name)
        except ValueError:
            return "an IPv4 host must be written as four decimal octets, such as 203.0.113.7"
        if name != host or str(address) != name:
            return f"write the IPv4 host as {address} (no trailing dot, no leading zeros)"
        return Target(parsed, host, address)
    return Target(parsed, host, None)


def check_url(url: str, policy: TargetPolicy = TargetPolicy()) -> str:
    """'' if the URL is acceptable as a callback (syntax), else why not."""
    found = parse_target(url, policy)
    return found if isinstance(found, str) else ""


def is_loopback_name(host: str) -> bool:
    """A name that means this machine whatever DNS says (RFC 6761, /etc/hosts customs)."""
    name = host.rstrip(".").lower()
    return name in LOOPBACK_NAMES or name.endswith(".localhost")


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
    if host == address:
        return f"{address} is a {problem} address; callbacks must be public"
    return f"{host} resolves to {address}, a {problem} address; callbacks must be public"


def check_target(url: str, policy: TargetPolicy = TargetPolicy()) -> str:
    """'' if ``url`` may be called back now, else why not (``vet_target``'s reason)."""
    found = vet_target(url, policy)
    return found if isinstance(found, str) else ""


def vet_target(url: str, policy: TargetPolicy = TargetPolicy()) -> Target | str:
    """``parse_target`` plus the checks that need no resolver: the address of an IP
    literal (which aiohttp connects to without resolving) and the loopback names."""
    found = parse_target(url, policy)
    if isinstance(found, str):
        return found
    if found.ip is not None:
        problem = check_address(found.host, str(found.ip), policy)
        return problem or found
    exempt = policy.allow_private or found.name in policy.allow_hosts
    if not exempt and is_loopback_name(found.host):
        return f"{found.host} is a loopback name; callbacks must be public"
    return found


class PolicyResolver(AbstractResolver):
    """aiohttp resolver that refuses every answer the target policy forbids."""

    def __init__(self, policy: TargetPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        exempt = self._policy.allow_private or host.rstrip(".").lower() in self._policy.allow_hosts
        if not exempt and is_loopback_name(host):
            raise TargetRefused(f"{host} is a loopback name; callbacks must be public")
        results = await self._inner.resolve(host, port, family)
        for r in results:
            problem = check_address(host, r["host"], self._policy)
            if problem:
                raise TargetRefused(problem)
        return results

    async def close(self) -> None:
        await self._inner.close()
