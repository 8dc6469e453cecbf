"""The Kafka adapter's producer (``framespool.log.port.Producer``): keyed records
partitioned with murmur2, delivery reported per record, flush on demand."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping

from confluent_kafka import (
    KafkaError,
    KafkaException,
    Producer,
)

from framespool.log.kafka.settings import (
    LINGER_MS_BY_ROLE,
    SOCKET_SETTINGS,
    Role,
    client_stats,
    security_settings,
)
from framespool.log.port import (
    Delivered,
    DeliveryCallback,
    DeliveryError,
    Headers,
    Key,
    LogError,
)

log = logging.getLogger(__name__)


def _delivery_error(topic: str, key: bytes | None, error: KafkaError) -> DeliveryError:
    return DeliveryError(topic, key, f"{error.name()}: {error.str()}")


# --------------------------------------------------------------------------
# Producer
# --------------------------------------------------------------------------
def _key_bytes(key: Key) -> bytes | None:
    return key.encode("utf-8") if isinstance(key, str) else key


def _header_list(headers: Headers) -> list[tuple[str, str | bytes | None]] | None:
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
        self._stats = client_stats(settings)
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

                    def served_since(seen: int = seen) -> bool:
                        return self._served_passes != seen

                    self._served.wait_for(
                        served_since,
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
