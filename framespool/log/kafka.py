"""The Kafka adapter of the log port: topic creation, a producer, a consumer.

Theory of operation
-------------------
This module moves bytes; it knows nothing about events (``framespool.schemas.codec`` turns
events into bytes and back). It implements ``framespool.log.port`` (the in-memory
fake is ``framespool.log.memory``) and handles the broker's quirks in one place
(``docs/broker-notes.md#tansu-what-is-broken``: most of them are Tansu's, kept
because ``framespool up --broker tansu`` still runs on it; each says whether
Apache Kafka, the default, needs it):

1. Topics are created explicitly with the catalogue's partition counts. Tansu
   cannot add partitions later and auto-creates unknown topics with 4, so the
   producer refuses to auto-create (``allow.auto.create.topics=false``) and a
   mistyped topic fails delivery with ``UNKNOWN_TOPIC_OR_PART`` instead.
   ``AdminClient.list_topics(topic=NAME)`` auto-creates NAME on Tansu: only ever
   list *all* topics.
2. Keyed records are partitioned with Kafka's murmur2 (the Java client's and
   aiokafka's default), not librdkafka's default CRC32, so that
   ``framespool.log.partitioning.partition_for_key`` and every producer agree on
   where a key lives.
3. ListOffsets(latest) is wrong on Tansu, so nothing here asks for it: consumers
   start at explicit offsets or ``earliest``, and :func:`read_all` stops at the
   high watermark carried by Fetch responses.
4. Consumer groups use the classic protocol with short session timeouts: the
   broker holds a join for half the session timeout.
5. Apache Kafka (the default broker) parks a waiting Fetch and answers it as soon
   as a record arrives, so ``fetch.wait.max.ms`` only paces an idle consumer:
   every :class:`Role` waits 500 ms. Tansu (``FRAMESPOOL_BROKER=tansu``) answers
   a Fetch only when the wait has passed, even if records arrived meanwhile, so
   there the wait is the latency a record pays per hop (U[0, wait], up to
   twice the wait when the Fetch in flight already carries records), and each
   idle consumer costs the broker one Fetch per wait. On Tansu it is therefore
   set per role (``docs/broker-notes.md#fetch-wait``): ``REQUEST_PATH``
   consumers (admission, scheduler) wait ``FETCH_WAIT_MS_REQUEST_PATH``,
   ``FLEET`` ones (the agents' assignments readers, one per node or agent
   process) ``FETCH_WAIT_MS_FLEET``, ``BACKGROUND`` ones (projections,
   webhooks, tools) ``FETCH_WAIT_MS_BACKGROUND``. Producers linger
   ``LINGER_MS_REQUEST_PATH``, ``LINGER_MS_FLEET`` or ``LINGER_MS_BACKGROUND``
   on either broker, and never wait for Nagle's algorithm.
6. On Tansu only, an idle consumer would cost the broker those Fetches forever, so a
   ``FLEET`` or ``BACKGROUND`` consumer of manually assigned partitions that
   has received nothing for ``IDLE_AFTER_S`` rests: it lets go of its
   partitions (no Fetch at all), keeping their positions, for
   ``IDLE_BACKOFF_MS_BY_ROLE``, then assigns them again at those positions
   and looks for ``IDLE_LOOK_FETCHES`` fetch waits before resting again; the
   first record after a rest so waits up to one back-off more. Not
   librdkafka's pause/resume: a resumed partition delivered its first record
   only after 0.4-0.7 s (measured on Tansu), an explicit assignment within a
   millisecond. ``REQUEST_PATH`` consumers and group members never rest, and
   on Kafka nothing rests (the back-offs default to 0).
7. (Tansu only; harmless on Kafka, where it never fires.) Tansu can make a consumer skip records: with several producers writing one
   partition, a Fetch at offset N sometimes returns the batch that follows
   N's (whose records are written), and librdkafka, for which a gap is
   legal (compaction, transaction markers), reads on after it. Verified
   (2026-12-01): 4 producers on one partition for 10 s, 5 batches of 5-10
   records skipped by a consumer, all of them in the log. So a
   :class:`LogConsumer` knows the offset it expects next on each partition
   (from its assignment, then each record) and, on a record past it, drops
   that record and the rest of the partition's batch and seeks back to the
   expected offset, at most ``SKIP_REFETCHES`` times per offset: a gap still
   there after that is a real one (retention, compaction, a transaction
   marker) and is read past.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from framespool.log.port import (
    Delivered,
    DeliveryCallback,
    DeliveryError,
    Headers,
    Key,
    LogError,
    PartitionsCallback,
    Record,
    TopicMismatch,
)
from framespool.schemas.topics import ALL_TOPICS, Topic

log = logging.getLogger(__name__)


def _delivery_error(topic: str, key: bytes | None, error: KafkaError) -> DeliveryError:
    return DeliveryError(topic, key, f"{error.name()}: {error.str()}")


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


def _env_ms(name: str, default: int) -> int:
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
FETCH_WAIT_MS_REQUEST_PATH = _env_ms("FRAMESPOOL_FETCH_WAIT_REQUEST_PATH_MS", _FETCH_DEFAULTS[0])
FETCH_WAIT_MS_FLEET = _env_ms("FRAMESPOOL_FETCH_WAIT_FLEET_MS", _FETCH_DEFAULTS[1])
FETCH_WAIT_MS_BACKGROUND = _env_ms("FRAMESPOOL_FETCH_WAIT_BACKGROUND_MS", _FETCH_DEFAULTS[2])
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
LINGER_MS_REQUEST_PATH = _env_ms("FRAMESPOOL_LINGER_REQUEST_PATH_MS", 0)
LINGER_MS_FLEET = _env_ms("FRAMESPOOL_LINGER_FLEET_MS", 1)
LINGER_MS_BACKGROUND = _env_ms("FRAMESPOOL_LINGER_BACKGROUND_MS", 5)
# A processor produces its whole batch and then flushes, so a linger can only
# delay it; and librdkafka's flush does not cut a short linger short: produce +
# flush of one record on the embedded broker took 0.2-0.3 ms (p50) with
# linger 0, 1.45 ms with 1, 2.35 ms with 2 (1,000 each, 2026-12-01). Processors
# (framespool.processors.app) therefore linger 0: about 1.2 ms less per hop.
LINGER_MS_PROCESSOR = _env_ms("FRAMESPOOL_LINGER_PROCESSOR_MS", 0)
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
    Role.FLEET: _env_ms("FRAMESPOOL_IDLE_BACKOFF_FLEET_MS", _REST_MS),
    Role.BACKGROUND: _env_ms("FRAMESPOOL_IDLE_BACKOFF_BACKGROUND_MS", _REST_MS),
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


def security_settings(env: Mapping[str, str] | None = None) -> dict[str, object]:
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
    out: dict[str, object] = {}
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


# How often a LogConsumer seeks back to an offset it expected and was skipped
# (theory of operation, 7) before it takes the gap for a real one.
SKIP_REFETCHES = 5

# A diagnostic, off by default: with FRAMESPOOL_CLIENT_STATS_MS > 0 every client
# collects librdkafka's statistics that often and, when closed, logs how many
# requests of each kind (Produce, Fetch, OffsetCommit, ...) it sent: the broker's
# CPU scales with requests, so this is where a cost per job shows up first.
CLIENT_STATS_MS = _env_ms("FRAMESPOOL_CLIENT_STATS_MS", 0)


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


def _stats(settings: dict[str, object]) -> RequestStats | None:
    """Turn librdkafka's statistics on in ``settings`` where the diagnostic asks for them."""
    if CLIENT_STATS_MS <= 0 or "stats_cb" in settings:
        return None
    stats = RequestStats()
    settings["statistics.interval.ms"] = CLIENT_STATS_MS
    settings["stats_cb"] = stats
    return stats


# --------------------------------------------------------------------------
# Topics
# --------------------------------------------------------------------------
def create_topics(
    bootstrap_servers: str,
    topics: Iterable[Topic] = ALL_TOPICS,
    timeout: float = 10.0,
    **conf: object,
) -> list[str]:
    """Create ``topics`` with their partition counts; return the names newly created.

    Idempotent: a topic that already exists with the same partition count is fine;
    one with a different count raises :class:`TopicMismatch` (partitions cannot be
    added on Tansu, and keyed placement depends on the count). The replication
    factor is the broker's default; ``Topic.configs()`` (retention) goes along
    with the creation only (an existing topic keeps its configs).
    """
    topics = list(topics)
    wanted = {t.name: t.partitions for t in topics}
    if not wanted:
        return []
    configs = {t.name: t.configs() for t in topics}
    # The AdminClient must stay referenced until its futures resolve
    # (docs/broker-notes.md#confluent-kafka); ``admin`` lives until this function returns.
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **security_settings(), **conf})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=n, config=configs[name]) for name, n in wanted.items()],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        # exception() rather than result(): raising here would tie this frame (and
        # the admin's open connection) into a traceback cycle until the next GC,
        # and Tansu waits ~5 s for open connections when stopped.
        exc = future.exception(timeout=timeout)
        if exc is None:
            created.append(name)
        elif not (
            isinstance(exc, KafkaException)
            and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
        ):
            reason = exc.args[0].str() if isinstance(exc, KafkaException) else repr(exc)
            raise LogError(f"cannot create topic {name!r}: {reason}") from exc
    _check_partition_counts(admin, wanted, timeout)
    existing = [name for name in wanted if name not in created and configs[name]]
    if existing:
        _set_configs(admin, {name: configs[name] for name in existing}, timeout)
    return created


def _set_configs(
    admin: AdminClient, configs: Mapping[str, Mapping[str, str]], timeout: float
) -> None:
    """Bring existing topics' configs (retention) to the catalogue's: incremental
    SETs, so configs the catalogue does not name are left as they are. A broker
    that cannot alter configs (Tansu) is logged and skipped: its topics keep
    what they were created with."""
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                for key, value in entries.items()
            ],
        )
        for name, entries in configs.items()
    ]
    try:
        futures = admin.incremental_alter_configs(resources, request_timeout=timeout)
        for resource, future in futures.items():
            exc = future.exception(timeout=timeout)
            if exc is not None:
                log.warning("topic %s keeps its configs: %s", resource.name, exc)
    except (KafkaException, NotImplementedError) as exc:
        log.warning("topic configs not updated: %s", exc)


def _check_partition_counts(admin: AdminClient, wanted: Mapping[str, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        # All topics, never one by name: a Metadata request for a named topic
        # auto-creates it on Tansu.
        metadata = admin.list_topics(timeout=max(0.1, deadline - time.monotonic()))
        actual = {n: len(metadata.topics[n].partitions) for n in wanted if n in metadata.topics}
        if len(actual) == len(wanted):
            break
        if time.monotonic() >= deadline:  # creation propagates asynchronously on Kafka
            missing = sorted(set(wanted) - set(actual))
            raise LogError(f"topics {missing} not visible in metadata after {timeout} s")
        time.sleep(0.05)
    wrong = {n: (actual[n], wanted[n]) for n in wanted if actual[n] != wanted[n]}
    if wrong:
        detail = ", ".join(
            f"{n!r} has {a} partitions, the catalogue says {w}" for n, (a, w) in wrong.items()
        )
        raise TopicMismatch(
            f"{detail}; partitions cannot be changed in place: recreate the topic "
            "(or the broker's storage) or fix schemas/topics.py"
        )


# --------------------------------------------------------------------------
# Producer
# --------------------------------------------------------------------------
def _key_bytes(key: Key) -> bytes | None:
    return key.encode("utf-8") if isinstance(key, str) else key


def _header_list(headers: Headers) -> list[tuple[str, bytes | str]] | None:
    if headers is None:
        return None
    return list(headers.items()) if isinstance(headers, Mapping) else list(headers)


class LogProducer:
    """A durable, idempotent producer with a background poll thread.

    :meth:`produce` queues and returns at once (failures surface in :meth:`flush`
    or the given ``on_delivery``); ``await`` :meth:`send` returns once the broker
    has acknowledged the record. Defaults: ``acks=all``, idempotence on,
    ``linger.ms`` of its ``role`` (:data:`LINGER_MS_BY_ROLE`), murmur2 partitioning, no
    topic auto-creation. ``conf`` holds
    extra librdkafka settings (dots as in librdkafka: pass them via ``**{...}``).
    Always :meth:`close` it (or use ``with``): the poll thread keeps it alive.
    The first delivery of a new producer takes 0.5-1 s (librdkafka acquires the
    idempotent producer id on a 500 ms timer); later ones take milliseconds.
    """

    _POLL_S = 0.05
    _QUEUE_FULL_WAIT_S = 30.0
    # flush re-checks at least this often even without a signal from the poll thread
    # (a delivery report served by a produce() retrying a full queue signals nothing)
    _FLUSH_RECHECK_S = 0.05

    def __init__(
        self, bootstrap_servers: str, *, role: Role = Role.REQUEST_PATH, **conf: object
    ) -> None:
        settings: dict[str, object] = {
            "bootstrap.servers": bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": LINGER_MS_BY_ROLE[role],
            "partitioner": "murmur2_random",
            "allow.auto.create.topics": False,
            # An unknown topic fails after this long rather than after delivery.timeout.ms.
            "topic.metadata.propagation.max.ms": 10_000,
            "error_cb": self._on_error,
            **SOCKET_SETTINGS,
            **security_settings(),
        }
        settings.update(conf)
        self._stats = _stats(settings)
        self._settings = settings
        self._producer = Producer(settings)
        self._report_failure = self._on_unwatched_delivery  # one bound method, not one per record
        self._failures: list[DeliveryError] = []
        self._fatal: KafkaError | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        # the poll thread counts its passes that served delivery reports: flush waits on it
        self._served = threading.Condition()
        self._served_passes = 0
        self._thread = threading.Thread(
            target=self._poll_loop, name="log-producer-poll", daemon=True
        )
        self._thread.start()

    # -- callbacks (run on the poll thread, or on a thread inside flush) ----------
    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            if self._producer.poll(self._POLL_S):
                with self._served:
                    self._served_passes += 1
                    self._served.notify_all()

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            with self._lock:
                self._fatal = error
            log.error("producer fatal error: %s", error.str())
        else:  # librdkafka retries these itself (e.g. a broker briefly down)
            log.warning("producer: %s", error.str())

    def _on_unwatched_delivery(self, error: KafkaError | None, msg) -> None:
        if error is not None:
            self._record_failure(error, msg)

    def _record_failure(self, error: KafkaError, msg) -> None:
        failure = _delivery_error(msg.topic(), msg.key(), error)
        log.error("%s", failure)
        with self._lock:
            self._failures.append(failure)

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise LogError(
                f"producer is unusable after a fatal error: {self._fatal.str()}; create a new one"
            )

    # -- API ----------------------------------------------------------------------
    def produce(
        self,
        topic: str,
        key: Key,
        value: bytes | None,
        partition: int | None = None,
        headers: Headers = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Queue one record; returns at once.

        Raises :class:`DeliveryError` if librdkafka refuses the record up front (an
        unknown topic or partition, a record too large). Otherwise, without
        ``on_delivery``, a failed delivery is logged and raised by the next
        :meth:`flush`/:meth:`close`. With it, ``on_delivery(error, delivered)`` is
        called from the poll thread: keep it short and thread-safe.
        """
        self._raise_if_fatal()
        if on_delivery is None:
            callback = self._report_failure
        else:

            def callback(err, msg):
                if err is not None:
                    on_delivery(_delivery_error(msg.topic(), msg.key(), err), None)
                else:
                    on_delivery(None, Delivered(msg.topic(), msg.partition(), msg.offset()))

        deadline = time.monotonic() + self._QUEUE_FULL_WAIT_S
        while True:
            try:
                self._produce(topic, key, value, partition, headers, callback)
                return
            except BufferError:  # local queue full: let deliveries drain
                if time.monotonic() >= deadline:
                    raise LogError(
                        f"producer queue still full after {self._QUEUE_FULL_WAIT_S} s (topic {topic!r}); "
                        "is the broker reachable?"
                    ) from None
                self._producer.poll(self._POLL_S)

    async def send(
        self,
        topic: str,
        key: Key,
        value: bytes | None,
        partition: int | None = None,
        headers: Headers = None,
    ) -> Delivered:
        """Write one record and return where it landed; raises :class:`DeliveryError`.

        Cancelling the awaiting task does not unsend the record.
        """
        self._raise_if_fatal()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Delivered] = loop.create_future()

        def settle(err, msg) -> None:
            if future.done():  # the awaiting task was cancelled
                return
            if err is not None:
                future.set_exception(_delivery_error(msg.topic(), msg.key(), err))
            else:
                future.set_result(Delivered(msg.topic(), msg.partition(), msg.offset()))

        def callback(err, msg) -> None:
            try:
                loop.call_soon_threadsafe(settle, err, msg)
            except RuntimeError:  # the loop is closed; nobody is waiting any more
                if err is not None:
                    self._record_failure(err, msg)

        while True:
            try:
                self._produce(topic, key, value, partition, headers, callback)
                break
            except BufferError:
                await asyncio.sleep(self._POLL_S)
        return await future

    def _produce(self, topic, key, value, partition, headers, callback) -> None:
        raw_key = _key_bytes(key)
        try:
            self._producer.produce(
                topic,
                value=value,
                key=raw_key,
                partition=-1 if partition is None else partition,
                headers=_header_list(headers),
                on_delivery=callback,
            )
        except KafkaException as exc:  # refused up front, e.g. a topic already known not to exist
            raise _delivery_error(topic, raw_key, exc.args[0]) from None

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued record is delivered; raise the first failure since the last flush.

        Not librdkafka's blocking ``flush``: that one polls in 10 ms slices, and
        as the poll thread serves the delivery reports meanwhile, each of its
        slices ran out in full: every processor batch paid >= 10 ms per hop.
        Here librdkafka is told to send what lingers (``flush(0)``) and the
        caller waits for the poll thread's signal that reports were served. A
        linger of 1-2 ms is still served in full (see
        :data:`LINGER_MS_PROCESSOR`): a producer that flushes every batch
        should not linger.
        Cost: one wake-up per poll pass that served reports.
        """
        remaining = self._wait_delivered(timeout)
        with self._lock:
            failures, self._failures = self._failures, []
        self._raise_if_fatal()
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise LogError(f"{failures[0]}{more}") from failures[0]
        if remaining:
            raise LogError(
                f"{remaining} records still undelivered after {timeout} s; is the broker reachable?"
            )

    def _wait_delivered(self, timeout: float) -> int:
        """Records still undelivered after waiting up to ``timeout`` seconds for all."""
        deadline = time.monotonic() + timeout
        remaining = self._producer.flush(0)  # send what lingers now; serve ready reports
        while remaining:
            left = deadline - time.monotonic()
            if left <= 0 or not self._thread.is_alive():
                return self._producer.flush(max(0.0, left)) if left > 0 else remaining
            with self._served:
                seen = self._served_passes
                remaining = len(self._producer)
                if remaining:
                    self._served.wait_for(
                        lambda seen=seen: self._served_passes != seen,
                        min(left, self._FLUSH_RECHECK_S),
                    )
            remaining = len(self._producer)
        return remaining

    def close(self, timeout: float = 30.0) -> None:
        """Flush, stop the poll thread and drop the connections. Idempotent.

        Records still undelivered after ``timeout`` are purged (and reported by the
        raised error): librdkafka's own close would otherwise wait for them until
        ``delivery.timeout.ms``. Dropping the connections matters: Tansu waits ~5 s
        for open connections when it is stopped.
        """
        if self._closed.is_set():
            return
        try:
            self.flush(timeout)
        finally:
            self._closed.set()
            self._thread.join()
            if len(self._producer):
                self._producer.purge()
                self._producer.poll(0)  # run the purged records' callbacks
            if self._stats is not None:
                self._producer.poll(0)  # the latest statistics
                self._stats.log("producer", self._settings)
            self._producer.close()

    def __enter__(self) -> LogProducer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# --------------------------------------------------------------------------
# Consumer
# --------------------------------------------------------------------------
# Errors that are a caller's mistake, not a transient broker condition.
_RAISE_ON = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
}


def _to_record(msg) -> Record:
    ts_type, ts = msg.timestamp()
    return Record(
        topic=msg.topic(),
        partition=msg.partition(),
        offset=msg.offset(),
        key=msg.key(),
        value=msg.value(),
        headers=tuple(msg.headers() or ()),
        timestamp_ms=ts if ts_type else None,  # TIMESTAMP_NOT_AVAILABLE == 0
    )


class LogConsumer:
    """A consumer for the two ways framespool reads the log.

    (a) Manual assignment (agents, replay and tools): :meth:`assign` explicit
        partitions from explicit offsets, or :meth:`resume` them from the group's
        committed positions; no group membership, no rebalances; :meth:`commit`
        stores positions under ``group_id`` if one is given.
    (b) Classic group subscription: :meth:`subscribe`; commit explicitly.

    Auto-commit is off, ``auto.offset.reset`` is ``earliest`` (``latest`` relies on
    ListOffsets(latest), which Tansu gets wrong) and the classic group protocol is
    kept (``group.protocol=consumer`` never assigns on Tansu); both are refused if
    passed in ``conf``. ``fetch.wait.max.ms`` is its ``role``'s
    (:data:`FETCH_WAIT_MS_BY_ROLE`) unless ``conf`` sets it. The consumer is not thread-safe: use it from one thread
    at a time (``await asyncio.to_thread(c.poll, 1.0)`` from async code).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str | None = None,
        *,
        session_timeout_ms: int = 6000,
        heartbeat_interval_ms: int = 1000,
        role: Role = Role.REQUEST_PATH,
        **conf: object,
    ) -> None:
        if str(conf.get("group.protocol", "classic")).lower() != "classic":
            raise ValueError(
                "group.protocol must stay 'classic': the broker never assigns under 'consumer'"
            )
        if str(conf.get("auto.offset.reset", "earliest")).lower() not in (
            "earliest",
            "smallest",
            "beginning",
        ):
            raise ValueError(
                "auto.offset.reset must be 'earliest': 'latest' relies on ListOffsets(latest), wrong on Tansu"
            )
        # librdkafka needs a group id even for manual assignment; an anonymous
        # one is never joined and never committed to.
        self._anonymous = group_id is None
        self.group_id = group_id or f"{ANONYMOUS_GROUP_PREFIX}{uuid.uuid4().hex}"
        settings: dict[str, object] = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_interval_ms,
            # On Tansu every Fetch is held for the full wait even when records
            # arrive, so this is the added latency per hop; on Kafka only an idle
            # consumer's pace (theory of operation, 5).
            "fetch.wait.max.ms": FETCH_WAIT_MS_BY_ROLE[role],
            "error_cb": self._on_error,
            **SOCKET_SETTINGS,
            **security_settings(),
        }
        settings.update(conf)
        self._stats = _stats(settings)
        self._settings = settings
        self._consumer = Consumer(settings)
        self._closed = False
        # idle back-off (theory of operation, 6); a group member never rests
        self._backoff_s = IDLE_BACKOFF_MS_BY_ROLE[role] / 1000
        self._look_s = IDLE_LOOK_FETCHES * int(settings["fetch.wait.max.ms"]) / 1000
        self._resting: list[TopicPartition] = []  # where to read on when waking
        self._starts: dict[tuple[str, int], int] = {}  # of the manual assignment
        # the offset expected next per partition, and the re-fetches of skipped
        # records (theory of operation, 7)
        self._next: dict[tuple[str, int], int] = {}
        self._refetches: dict[tuple[str, int, int], int] = {}
        self.refetches = 0  # seeks back over a skip (tests, diagnostics)
        self._last_record_at = time.monotonic()
        self._wake_at = self._awake_until = 0.0
        self.rests = 0  # how many times it rested for being idle (tests, diagnostics)

    @staticmethod
    def _on_error(error: KafkaError) -> None:
        (log.error if error.fatal() else log.warning)("consumer: %s", error.str())

    # -- pattern (a): manual assignment -------------------------------------------
    def assign(
        self, topic: str, partitions: Iterable[int], offsets: int | Mapping[int, int] = 0
    ) -> None:
        """Read ``partitions`` of ``topic`` starting at ``offsets`` (one for all, or per partition).

        Replaces any previous assignment.
        """
        parts = list(partitions)
        start = offsets if isinstance(offsets, Mapping) else {p: offsets for p in parts}
        self.assign_from({(topic, p): start[p] for p in parts})

    def assign_from(self, starts: Mapping[tuple[str, int], int]) -> None:
        """Read each ``(topic, partition)`` of ``starts`` from its offset, across topics.

        Replaces any previous assignment.
        """
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
        self._starts = dict(starts)
        self._next = {tp: o for tp, o in starts.items() if o >= 0}
        self._resting, self._last_record_at = [], time.monotonic()  # a new assignment reads

    def committed(
        self, topic: str, partitions: Iterable[int], timeout: float = 10.0
    ) -> dict[int, int | None]:
        """The group's committed next-offset per partition (None where nothing is committed)."""
        result = self._consumer.committed(
            [TopicPartition(topic, p) for p in partitions], timeout=timeout
        )
        out: dict[int, int | None] = {}
        for tp in result:
            if tp.error is not None:
                raise LogError(
                    f"cannot fetch committed offset of {topic}[{tp.partition}]: {tp.error.str()}"
                )
            out[tp.partition] = None if tp.offset == OFFSET_INVALID or tp.offset < 0 else tp.offset
        return out

    def resume(
        self, topic: str, partitions: Iterable[int], timeout: float = 10.0
    ) -> dict[int, int]:
        """Assign ``partitions`` from the group's committed positions (0 where none); return them."""
        if self._anonymous:
            raise LogError("resume() needs a group_id to read committed positions from")
        parts = list(partitions)
        start = {
            p: (off if off is not None else 0)
            for p, off in self.committed(topic, parts, timeout).items()
        }
        self.assign(topic, parts, start)
        return start

    # -- pattern (b): group subscription ------------------------------------------
    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None:
        """Join ``group_id`` and read what the group assigns; callbacks run inside :meth:`poll`."""
        if self._anonymous:
            raise LogError("subscribe() needs a group_id")
        self._backoff_s = 0.0  # a rebalance could hand it partitions to read at once
        kwargs = {}

        def assigned(_consumer, parts) -> None:
            self._next.clear()  # read from where the group (or on_assign) says
            if on_assign is not None:
                on_assign(parts)

        def revoked(_consumer, parts) -> None:
            self._next.clear()
            if on_revoke is not None:
                on_revoke(parts)

        kwargs["on_assign"] = assigned
        kwargs["on_revoke"] = revoked
        self._consumer.subscribe(list(topics), **kwargs)

    # -- reading and committing ---------------------------------------------------
    def _pace(self, timeout: float) -> float:
        """Before a poll: rest or wake per the idle back-off; the poll's timeout
        (a resting consumer's poll ends when it is due to look again).

        Cost: a clock read per poll; per rest an unassign and an assignment at
        known offsets (no offset lookup at the broker).
        """
        if not self._backoff_s:
            return timeout
        now = time.monotonic()
        if self._resting:
            if now < self._wake_at:
                return min(timeout, self._wake_at - now)
            self._consumer.assign(self._resting)
            # what position() falls back on until a record is handed out
            self._starts = {(tp.topic, tp.partition): tp.offset for tp in self._resting}
            self._resting, self._awake_until = [], now + self._look_s
            return min(timeout, self._look_s)
        due = max(self._last_record_at + IDLE_AFTER_S, self._awake_until)  # to rest
        if now >= due and self._rest():
            self.rests += 1
            self._wake_at = now + self._backoff_s
            return min(timeout, self._backoff_s)
        return min(timeout, max(due - now, 0.001))

    def _rest(self) -> bool:
        """Let go of every assigned partition, remembering where to read on (the
        position after the last record handed out, else the assignment's start);
        False if none is assigned."""
        parts = self._consumer.assignment()
        if not parts:
            return False
        at = []
        for tp in self._consumer.position(parts):
            offset = tp.offset if tp.offset >= 0 else self._starts.get((tp.topic, tp.partition))
            if offset is None:  # not assigned by assign(): nowhere known to read on
                return False
            at.append(TopicPartition(tp.topic, tp.partition, offset))
        self._consumer.unassign()
        self._resting = at
        return True

    def poll(self, timeout: float = 1.0) -> Record | None:
        """The next record, or None if none arrived within ``timeout`` seconds."""
        msg = self._consumer.poll(self._pace(timeout))
        if msg is None:
            return None
        self._last_record_at = time.monotonic()
        error = msg.error()
        if error is None:
            return _to_record(msg) if self._in_order(msg, set()) else None
        self._handle_error(error, msg)
        return None

    def _in_order(self, msg, rewound: set[tuple[str, int]]) -> bool:
        """Whether to hand ``msg`` out: it is the next record of its partition, or
        its gap is taken for a real one. False: drop it, its partition is sought
        back to the record expected (theory of operation, 7); the partition's
        later records in this batch (``rewound``) are dropped too.

        Cost: a dict lookup and store per record; a seek per skip re-fetched.
        """
        tp = (msg.topic(), msg.partition())
        offset, expected = msg.offset(), self._next.get(tp)
        if expected is not None and offset > expected:
            if tp in rewound:
                return False
            key = (tp[0], tp[1], expected)
            tries = self._refetches.get(key, 0)
            if tries < SKIP_REFETCHES:
                try:
                    self._consumer.seek(TopicPartition(tp[0], tp[1], expected))
                except KafkaException as exc:
                    log.warning("%s[%d]: cannot seek back to %d: %s", *tp, expected, exc)
                else:
                    self._refetches[key] = tries + 1
                    self.refetches += 1
                    rewound.add(tp)
                    log.warning(
                        "%s[%d]: the broker skipped offsets %d..%d; reading them again",
                        *tp,
                        expected,
                        offset - 1,
                    )
                    return False
            log.error(
                "%s[%d]: offsets %d..%d are not in the log; reading on",
                *tp,
                expected,
                offset - 1,
            )
        if self._refetches:
            self._refetches.pop((tp[0], tp[1], expected), None)
        rewound.discard(tp)
        self._next[tp] = offset + 1
        return True

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records: waits at most ``timeout`` seconds for the first,
        then takes only what has already arrived (librdkafka's own ``consume`` would
        wait out the timeout until it has ``max_records``)."""
        first = self._consumer.poll(self._pace(timeout))
        if first is None:
            return []
        self._last_record_at = time.monotonic()
        records = []
        more = self._consumer.consume(max_records - 1, 0) if max_records > 1 else []
        rewound: set[tuple[str, int]] = set()
        for msg in (first, *more):
            error = msg.error()
            if error is None:
                if self._in_order(msg, rewound):
                    records.append(_to_record(msg))
            else:
                self._handle_error(error, msg)
        return records

    @staticmethod
    def _handle_error(error: KafkaError, msg) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        where = f"{msg.topic()}[{msg.partition()}]" if msg.topic() else "consumer"
        if error.fatal() or error.code() in _RAISE_ON:
            raise LogError(f"{where}: {error.name()}: {error.str()}")
        log.warning("%s: %s", where, error.str())  # transient; librdkafka retries

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Synchronously commit ``{(topic, partition): next offset to read}`` under ``group_id``."""
        if self._anonymous:
            raise LogError("commit() needs a group_id")
        if not positions:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            raise LogError(
                f"commit of {positions} for group {self.group_id!r} failed: {exc.args[0].str()}"
            ) from exc
        failed = [tp for tp in result or () if tp.error is not None]
        if failed:
            raise LogError(
                f"commit failed for group {self.group_id!r}: {[(tp.topic, tp.partition, tp.error.str()) for tp in failed]}"
            )

    def commit_through(self, record: Record) -> None:
        """Commit everything up to and including ``record``."""
        self.commit({(record.topic, record.partition): record.offset + 1})

    def high_watermark(self, topic: str, partition: int) -> int | None:
        """The partition's high watermark from the latest Fetch response, or None before one.

        Never an uncached ListOffsets: Tansu's ListOffsets(latest) is wrong.
        """
        _low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), cached=True
        )
        return None if high < 0 else high

    def partitions_of(self, topic: str, timeout: float = 10.0) -> int:
        """How many partitions ``topic`` has; raises if it does not exist.

        A consumer's Metadata request does not auto-create topics (an admin's does).
        """
        metadata = self._consumer.list_topics(topic, timeout=timeout)
        entry = metadata.topics.get(topic)
        if entry is None or entry.error is not None or not entry.partitions:
            reason = (
                entry.error.str()
                if entry is not None and entry.error is not None
                else "no partitions"
            )
            raise LogError(
                f"topic {topic!r} is not readable: {reason}; create it with create_topics()"
            )
        return len(entry.partitions)

    def close(self) -> None:
        """Leave the group (if subscribed) and release the connection. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._stats is not None:
                self._stats.log("consumer", self._settings)
            self._consumer.close()

    def __enter__(self) -> LogConsumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# A reader to the end: partition EOF events say where each partition ends, and a
# short fetch wait keeps each Fetch round (Tansu holds it for the whole wait) brief.
_TO_END: dict[str, object] = {"enable.partition.eof": True, "fetch.wait.max.ms": 10}


def read_all(
    bootstrap_servers: str,
    topic: str,
    partitions: Iterable[int] | None = None,
    timeout_s: float = 30.0,
    **conf: object,
) -> list[Record]:
    """Every record of ``topic`` (or of ``partitions``), from offset 0 to the high watermark.

    Records come partition by partition, in offset order within each; where each
    partition ends is :func:`read_to_end`'s. Raises ``TimeoutError`` naming the
    partitions not read to their end in ``timeout_s``.
    """
    with LogConsumer(bootstrap_servers, **{**_TO_END, **conf}) as consumer:
        parts = sorted(
            partitions if partitions is not None else range(consumer.partitions_of(topic))
        )
        found = _read_to_end(consumer, {(topic, p): 0 for p in parts}, timeout_s)
    return [r for p in parts for r in found[(topic, p)]]


def read_to_end(
    bootstrap_servers: str,
    starts: Mapping[tuple[str, int], int],
    timeout_s: float = 30.0,
    **conf: object,
) -> dict[tuple[str, int], list[Record]]:
    """The records of each ``(topic, partition)`` from its offset in ``starts`` to its end.

    Each partition stops where a Fetch response said its high watermark was when
    the reader caught up (librdkafka's partition-EOF event, cross-checked against
    ``get_watermark_offsets(cached=True)``); records appended later are not
    included. The reader is a new consumer, so its first Fetch is sent after the
    call: everything appended before the call is returned (a consistent cut across
    topics, for readers that must see what caused what they already saw). Tansu
    quirk: ListOffsets(latest), i.e. ``end_offsets``, uncached
    ``get_watermark_offsets`` and consumer lag, is wrong there, so "the end" must
    come from a Fetch response as here, never from ListOffsets. Raises
    ``TimeoutError`` naming the partitions not read to their end in ``timeout_s``.

    Cost: one consumer, one Fetch round per partition batch (``fetch.wait.max.ms``
    10 ms on Tansu) plus the records themselves.
    """
    if not starts:
        return {}
    with LogConsumer(bootstrap_servers, **{**_TO_END, **conf}) as consumer:
        return _read_to_end(consumer, starts, timeout_s)


def _read_to_end(
    consumer: LogConsumer, starts: Mapping[tuple[str, int], int], timeout_s: float
) -> dict[tuple[str, int], list[Record]]:
    """:func:`read_to_end` on a consumer made with ``_TO_END`` and not yet assigned."""
    found: dict[tuple[str, int], list[Record]] = {tp: [] for tp in starts}
    consumer.assign_from(starts)
    open_parts = set(starts)
    deadline = time.monotonic() + timeout_s
    while open_parts:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"read_to_end: partitions {sorted(open_parts)} not read to their high "
                f"watermark within {timeout_s} s"
            )
        msg = consumer._consumer.poll(min(left, 0.5))
        if msg is None:
            continue
        tp = (msg.topic(), msg.partition())
        if tp not in open_parts:
            continue  # already at its end: later appends are not ours
        error = msg.error()
        if error is None:
            if consumer._in_order(msg, set()):  # else sought back to a skipped record
                found[tp].append(_to_record(msg))
        elif error.code() == KafkaError._PARTITION_EOF:
            # EOF means "fetch position == the Fetch response's high watermark".
            high = consumer.high_watermark(*tp)
            if high is not None and msg.offset() < high:
                continue  # stale EOF; more is on its way
            consumer._consumer.pause([TopicPartition(*tp)])
            open_parts.discard(tp)
        else:
            consumer._handle_error(error, msg)
    return found
