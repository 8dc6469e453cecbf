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

from framespool.log.kafka.consumer import LogConsumer, read_all, read_to_end
from framespool.log.kafka.producer import LogProducer
from framespool.log.kafka.settings import (
    FETCH_WAIT_MS,
    LINGER_MS_PROCESSOR,
    Role,
    security_settings,
)
from framespool.log.kafka.topics import create_topics

__all__ = [
    "FETCH_WAIT_MS",
    "LINGER_MS_PROCESSOR",
    "LogConsumer",
    "LogProducer",
    "Role",
    "create_topics",
    "read_all",
    "read_to_end",
    "security_settings",
]
