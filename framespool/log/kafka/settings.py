"""Client settings of the Kafka adapter: fetch waits, lingers and idle rests per
:class:`Role` (theory of operation 5 and 6 in ``framespool.log.kafka``), the
broker credentials (``security_settings``) and librdkafka's request statistics."""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------
# Latency settings per role (docs/broker-notes.md#fetch-wait)
# --------------------------------------------------------------------------
class Role(enum.Enum):
    """What a client is on the way of: it picks the fetch wait and the linger.

    ``REQUEST_PATH``: a hop between a submission and its decision (admission,
    the scheduler, the API's commands): every millisecond of wait is a
    millisecond of submit -> assigned, and there are few such clients.
    ``FLEET``: the node agents (their assignments reader and their reports):
    on the way from decision to start, but there is one per node (or per agent
    process), so the broker's idle Fetches grow with the fleet.
    ``BACKGROUND``: read models, webhooks, tools, whose readers can wait longer
    and so cost the broker fewer idle Fetches.
    """

    REQUEST_PATH = "request_path"
    FLEET = "fleet"
    BACKGROUND = "background"


def env_ms(name: str, default: int) -> int:
    """``default``, or the environment's ``name`` (whole milliseconds >= 0): a way
    to tune a deployment or a bench run without a code change."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={raw!r}: expected whole milliseconds >= 0 (default {default})")
    return value


# Which broker the clients are tuned for (``FRAMESPOOL_BROKER``: ``kafka``, the
# default, or ``tansu``; the stack sets it for its processes, the test session for
# itself). The fetch wait and the idle rest exist for Tansu's Fetch, which is held
# for the whole wait; Kafka parks a waiting Fetch and answers it when data arrives.
BROKER = os.environ.get("FRAMESPOOL_BROKER", "kafka").strip().lower() or "kafka"
if BROKER not in ("kafka", "tansu"):
    raise ValueError(f"FRAMESPOOL_BROKER={BROKER!r}: expected 'kafka' or 'tansu'")
ON_TANSU = BROKER == "tansu"

# Fetch waits (theory of operation, 5; docs/broker-notes.md#fetch-wait).
# On Kafka a Fetch returns as soon as a record arrives (fetch.min.bytes 1), so the
# wait only bounds how often an idle consumer asks again: 500 ms for every role,
# two idle Fetches a second per consumer, and no latency added per hop.
# On Tansu every Fetch is held for the full wait: a record arriving during an
# empty Fetch waits U[0, wait] for its end, one arriving during a Fetch that
# already carries records up to twice the wait, and an idle consumer sends up to
# 1000/wait Fetches a second. submit -> assigned crosses three request-path
# consumers (admission, a scheduler, the client's reader of job-events), so there
# the request path waits 3 ms (against 5 ms: p50 1.8 vs 2.4-2.7 ms per bare hop,
# for about 7 points more of idle broker CPU); below 3 ms the broker's idle CPU
# nearly doubles. Fleet readers keep 10 ms and background readers 20 ms.
_FETCH_DEFAULTS = (3, 10, 20) if ON_TANSU else (500, 500, 500)
FETCH_WAIT_MS_REQUEST_PATH = env_ms("FRAMESPOOL_FETCH_WAIT_REQUEST_PATH_MS", _FETCH_DEFAULTS[0])
FETCH_WAIT_MS_FLEET = env_ms("FRAMESPOOL_FETCH_WAIT_FLEET_MS", _FETCH_DEFAULTS[1])
FETCH_WAIT_MS_BACKGROUND = env_ms("FRAMESPOOL_FETCH_WAIT_BACKGROUND_MS", _FETCH_DEFAULTS[2])
FETCH_WAIT_MS_BY_ROLE = {
    Role.REQUEST_PATH: FETCH_WAIT_MS_REQUEST_PATH,
    Role.FLEET: FETCH_WAIT_MS_FLEET,
    Role.BACKGROUND: FETCH_WAIT_MS_BACKGROUND,
}
FETCH_WAIT_MS = FETCH_WAIT_MS_REQUEST_PATH  # a LogConsumer's unless given a role
# A request-path producer (the API's commands, the clock) lingers 0: the
# SubmitJob's linger was a millisecond of every submission's admission hop
# (the record's CreateTime is taken before it), and at 100 submissions/s they
# are ~10 ms apart, so there was rarely another submit to share a request
# with. Under a burst librdkafka still batches what queues behind the requests
# in flight: --jobs 2000 (4,020 submissions, 32 clients) took 2,067 Produce
# requests against 1,233 with 1 ms, the broker's CPU per job within noise
# (0.99 against 1.19 ms, one run each). Fleet producers (agents' reports; not on the way to
# JobAssigned) keep 1 ms; background producers gather for 5 ms.
LINGER_MS_REQUEST_PATH = env_ms("FRAMESPOOL_LINGER_REQUEST_PATH_MS", 0)
LINGER_MS_FLEET = env_ms("FRAMESPOOL_LINGER_FLEET_MS", 1)
LINGER_MS_BACKGROUND = env_ms("FRAMESPOOL_LINGER_BACKGROUND_MS", 5)
# A processor produces its whole batch and then flushes, so a linger can only
# delay it; and librdkafka's flush does not cut a short linger short: produce +
# flush of one record on the embedded broker took 0.2-0.3 ms (p50) with
# linger 0, 1.45 ms with 1, 2.35 ms with 2 (1,000 each, 2026-12-01). Processors
# (framespool.processors.app) therefore linger 0: about 1.2 ms less per hop.
LINGER_MS_PROCESSOR = env_ms("FRAMESPOOL_LINGER_PROCESSOR_MS", 0)
LINGER_MS_BY_ROLE = {
    Role.REQUEST_PATH: LINGER_MS_REQUEST_PATH,
    Role.FLEET: LINGER_MS_FLEET,  # a node's reports answer its instructions
    Role.BACKGROUND: LINGER_MS_BACKGROUND,
}
# Idle back-off (theory of operation, 6), on Tansu only: after IDLE_AFTER_S
# without a record a FLEET or BACKGROUND consumer lets go of its partitions for
# its back-off, then looks for IDLE_LOOK_FETCHES fetch waits. Idle, an agent host
# then sends about 3 Fetches per 130 ms instead of 13; a record after a rest
# waits up to 100 ms more. On Kafka an idle consumer's parked Fetch costs the
# broker nothing, so nothing rests (a back-off of 0).
IDLE_AFTER_S = 1.0
IDLE_LOOK_FETCHES = 3
_REST_MS = 100 if ON_TANSU else 0
IDLE_BACKOFF_MS_BY_ROLE = {
    Role.REQUEST_PATH: 0,  # never rests
    Role.FLEET: env_ms("FRAMESPOOL_IDLE_BACKOFF_FLEET_MS", _REST_MS),
    Role.BACKGROUND: env_ms("FRAMESPOOL_IDLE_BACKOFF_BACKGROUND_MS", _REST_MS),
}
# Small requests on loopback must not wait for Nagle's algorithm (librdkafka leaves
# it on by default; the broker turns it off on its side).
SOCKET_SETTINGS: dict[str, object] = {"socket.nagle.disable": True}

# Broker authentication (Compose: SASL with a principal per service and ACLs,
# compose/README.md). Read from the environment when a client is made, so every
# producer, consumer and admin client of a process authenticates alike; the
# password may come from a file (a Compose or Kubernetes secret) instead of the
# environment. Unset: no authentication (the embedded broker on loopback).
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# The group id of a consumer that names none (manual assignment, never joined nor
# committed to): with ACLs, its principal needs READ on groups of this prefix.
ANONYMOUS_GROUP_PREFIX = "framespool-anonymous-"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def security_settings(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """librdkafka's security settings from ``FRAMESPOOL_KAFKA_*``:

    - ``FRAMESPOOL_KAFKA_SASL_USERNAME`` and ``FRAMESPOOL_KAFKA_SASL_PASSWORD``
      (or ``..._PASSWORD_FILE``, a file holding it): the client's principal;
    - ``FRAMESPOOL_KAFKA_SASL_MECHANISM`` (default ``SCRAM-SHA-512``);
    - ``FRAMESPOOL_KAFKA_SECURITY_PROTOCOL`` (default ``SASL_SSL`` with a
      username, else none); ``FRAMESPOOL_KAFKA_SSL_CA_LOCATION`` for SSL.

    Raises ``ValueError`` naming the variable on a bad value or a username
    without a password (a client that would fail to authenticate later)."""
    env = os.environ if env is None else env
    get = lambda name: (env.get(f"FRAMESPOOL_KAFKA_{name}") or "").strip()
    out: dict[str, str] = {}
    protocol = get("SECURITY_PROTOCOL").upper()
    user = get("SASL_USERNAME")
    if protocol and protocol not in SECURITY_PROTOCOLS:
        raise ValueError(
            f"FRAMESPOOL_KAFKA_SECURITY_PROTOCOL={protocol!r}: expected one of {SECURITY_PROTOCOLS}"
        )
    if user:
        password = env.get("FRAMESPOOL_KAFKA_SASL_PASSWORD") or ""
        path = get("SASL_PASSWORD_FILE")
        if not password and path:
            try:
                password = open(path, encoding="utf-8").read().strip()
            except OSError as e:
                raise ValueError(f"FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE={path!r}: {e}") from e
        if not password:
            raise ValueError(
                f"FRAMESPOOL_KAFKA_SASL_USERNAME={user!r} without a password: set "
                "FRAMESPOOL_KAFKA_SASL_PASSWORD or FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE"
            )
        mechanism = get("SASL_MECHANISM").upper() or "SCRAM-SHA-512"
        if mechanism not in SASL_MECHANISMS:
            raise ValueError(
                f"FRAMESPOOL_KAFKA_SASL_MECHANISM={mechanism!r}: expected one of {SASL_MECHANISMS}"
            )
        protocol = protocol or "SASL_SSL"
        if not protocol.startswith("SASL_"):
            raise ValueError(
                f"FRAMESPOOL_KAFKA_SECURITY_PROTOCOL={protocol!r} with a SASL username: "
                "expected SASL_SSL or SASL_PLAINTEXT"
            )
        out.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
    if protocol:
        out["security.protocol"] = protocol
    if get("SSL_CA_LOCATION"):
        out["ssl.ca.location"] = get("SSL_CA_LOCATION")
    return out


# A diagnostic, off by default: with FRAMESPOOL_CLIENT_STATS_MS > 0 every client
# collects librdkafka's statistics that often and, when closed, logs how many
# requests of each kind (Produce, Fetch, OffsetCommit, ...) it sent: the broker's
# CPU scales with requests, so this is where a cost per job shows up first.
CLIENT_STATS_MS = env_ms("FRAMESPOOL_CLIENT_STATS_MS", 0)


class RequestStats:
    """The latest librdkafka statistics of one client (its ``stats_cb``), read as
    requests sent per kind, summed over its broker connections."""

    def __init__(self) -> None:
        self.latest = ""

    def __call__(self, raw: str) -> None:
        self.latest = raw

    def requests(self) -> dict[str, int]:
        if not self.latest:
            return {}
        out: dict[str, int] = {}
        for broker in json.loads(self.latest).get("brokers", {}).values():
            for kind, n in broker.get("req", {}).items():
                if n:
                    out[kind] = out.get(kind, 0) + n
        return dict(sorted(out.items()))

    def log(self, what: str, settings: Mapping[str, object]) -> None:
        requests = self.requests()
        if requests:
            log.info(
                "%s %s sent %s",
                what,
                settings.get("client.id", "?"),
                ", ".join(f"{k}={v}" for k, v in requests.items()),
                extra={"client_requests": requests},
            )


def client_stats(settings: dict[str, object]) -> RequestStats | None:
    """Turn librdkafka's statistics on in ``settings`` where the diagnostic asks for them."""
    if CLIENT_STATS_MS <= 0 or "stats_cb" in settings:
        return None
    stats = RequestStats()
    settings["statistics.interval.ms"] = CLIENT_STATS_MS
    settings["stats_cb"] = stats
    return stats
