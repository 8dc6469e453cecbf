"""The durable embedded broker: one Apache Kafka node in KRaft mode on loopback.

Theory of operation
-------------------
One JVM is broker and controller at once (``process.roles=broker,controller``,
a static one-voter quorum), listening on two loopback ports. Everything it keeps
lives under its directory (``<data-dir>/kafka/`` in ``framespool up``):

- ``log/``: Kafka's log dir (topic partitions, the metadata log, ``meta.properties``
  with the cluster id). Formatted once, the first time (``kafka.tools.StorageTool
  format``); a directory that holds ``meta.properties`` is never formatted again,
  so the cluster id and every record survive stop, SIGKILL and restart.
- ``ports.json``: the two ports, picked free the first time and reused after, so a
  broker restarted under a running stack is where its clients look for it
  (librdkafka reconnects by itself).
- ``server.properties`` and ``log4j2.properties``: rewritten at each start from
  this module (they are derived, not state).
- ``broker.log``: the JVM's output.

Durability (docs/broker-notes.md#kafka-durability): producers use ``acks=all``
(librdkafka's default with idempotence), so an acknowledged record is in the
broker's page cache. With :attr:`KafkaBroker.fsync` off (the default) that
survives any crash of processes, the broker's included; a crash of the machine
can lose what the kernel had not yet written back (Linux: up to ~30 s of
writes). With ``fsync`` on, the broker flushes each partition's log before it
acknowledges (``log.flush.interval.messages=1``): a machine crash loses nothing
acknowledged, at the measured cost given in the notes. After SIGKILL Kafka
recovers the unflushed tail of each segment at start (it checks every batch's
CRC and truncates a torn write).

Memory is bounded by the heap (``heap_mb``, default 512 MiB; the process's RSS
runs ~100-200 MiB above it) plus the kernel's page cache.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from framespool.broker import jars
from framespool.broker.base import (
    READY_PROBE,
    BrokerError,
    die_with_parent,
    free_port,
    port_is_free,
)
from framespool.log import LogError, create_topics
from framespool.schemas.topics import ALL_TOPICS, Topic

log = logging.getLogger(__name__)

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
DEFAULT_HEAP_MB = int(os.environ.get("FRAMESPOOL_KAFKA_HEAP_MB", "512"))

# The broker's settings for one machine. Replication factors are 1 (there is one
# node); the internal topics get few partitions, because each costs a file set and
# its load time at start; the group coordinator may accept the short sessions the
# processors and tests use (the classic protocol, docs/broker-notes.md); an
# unknown topic is an error, never auto-created with a default partition count
# (keyed placement depends on the catalogue's counts). Thread pools are sized for
# a small machine. Retention is checked every minute so the topics' own
# retention settings (schemas/topics.py) bound the disk promptly.
SERVER_SETTINGS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
    "auto.create.topics.enable": "false",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "num.recovery.threads.per.data.dir": "2",
    "log.retention.check.interval.ms": "60000",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
}
FSYNC_SETTINGS = {"log.flush.interval.messages": "1"}

LOG4J = """\
rootLogger.level=INFO
rootLogger.appenderRef.stdout.ref=STDOUT
appender.stdout.type=Console
appender.stdout.name=STDOUT
appender.stdout.layout.type=PatternLayout
appender.stdout.layout.pattern=[%d] %p %m (%c)%n
logger.kafka.name=kafka
logger.kafka.level=WARN
logger.apache.name=org.apache.kafka
logger.apache.level=WARN
logger.started.name=kafka.server.KafkaRaftServer
logger.started.level=INFO
logger.state.name=state.change.logger
logger.state.level=WARN
"""


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH; a clear error when neither exists."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").is_file():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise BrokerError(f"no `java` on PATH, so Apache Kafka cannot run: {jars.INSTALL_HINT}")
    return found


class KafkaBroker:
    """Apache Kafka (KRaft, one node) with its state under ``directory``.

    :meth:`command` prepares everything (jars, storage, configs) and returns the
    command line, for a supervisor that runs it (``framespool.stack``);
    :meth:`start`/:meth:`stop` run it as this object's own child (tests,
    benches). ``port``/``controller_port`` pin the ports; unset, they are read
    from ``ports.json`` or picked free and written there.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        controller_port: int | None = None,
        heap_mb: int = DEFAULT_HEAP_MB,
        fsync: bool = False,
        settings: Mapping[str, str] | None = None,
        ready_timeout: float = 120.0,
        remove_on_stop: bool = False,
    ) -> None:
        if directory is None:
            import tempfile

            directory = tempfile.mkdtemp(prefix="framespool-kafka-")
        self.directory = Path(directory).resolve()
        self.remove_on_stop = remove_on_stop
        self.host = host
        self.port = port
        self.controller_port = controller_port
        self.heap_mb = heap_mb
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.ready_timeout = ready_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths -------------------------------------------------------------------
    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    @property
    def log_path(self) -> Path:
        return self.directory / "broker.log"

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise BrokerError("the broker's port is not chosen yet: call command() or start()")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def formatted(self) -> bool:
        return (self.log_dir / "meta.properties").is_file()

    def cluster_id(self) -> str | None:
        """The cluster id in ``meta.properties``, or None before the first format."""
        try:
            for line in (self.log_dir / "meta.properties").read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.split("=", 1)[1].strip()
        except OSError:
            return None
        return None

    # -- preparation ---------------------------------------------------------------
    def _choose_ports(self) -> None:
        stored: dict[str, int] = {}
        ports_file = self.directory / "ports.json"
        if ports_file.is_file():
            try:
                stored = json.loads(ports_file.read_text())
            except (OSError, ValueError):
                stored = {}
        for attr, key in (("port", "port"), ("controller_port", "controller_port")):
            if getattr(self, attr) is None:
                candidate = stored.get(key)
                if not (isinstance(candidate, int) and port_is_free(self.host, candidate)):
                    candidate = free_port(self.host)
                    while candidate in (self.port, self.controller_port):
                        candidate = free_port(self.host)
                setattr(self, attr, candidate)
        ports_file.write_text(
            json.dumps({"port": self.port, "controller_port": self.controller_port})
        )

    def server_properties(self) -> dict[str, str]:
        out = dict(SERVER_SETTINGS)
        out.update(
            {
                "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
                "listeners": (
                    f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}"
                ),
                "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
                "log.dirs": str(self.log_dir),
            }
        )
        if self.fsync:
            out.update(FSYNC_SETTINGS)
        out.update(self.settings)
        return out

    def _java(self, main: str, *args: str, heap_mb: int) -> list[str]:
        classpath = str(jars.resolve() / "*")
        return [
            java_binary(),
            f"-Xms{min(heap_mb, 128)}m",
            f"-Xmx{heap_mb}m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            "-cp",
            classpath,
            main,
            *args,
        ]

    def command(self) -> list[str]:
        """Resolve the jars, write the configs, format the storage the first time,
        and return the broker's command line."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._choose_ports()
        props = self.directory / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in self.server_properties().items()))
        (self.directory / "log4j2.properties").write_text(LOG4J)
        if not self.formatted:
            self._format(props)
        return self._java(MAIN_CLASS, str(props), heap_mb=self.heap_mb)

    def _format(self, props: Path) -> None:
        cluster_id = self._new_cluster_id()
        argv = self._java(
            STORAGE_TOOL, "format", f"--cluster-id={cluster_id}", "-c", str(props), heap_mb=256
        )
        argv.append("--ignore-formatted")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or not self.formatted:
            raise BrokerError(
                f"formatting Kafka's storage in {self.log_dir} failed (exit {done.returncode}):\n"
                + "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            )
        log.info("formatted Kafka storage %s (cluster id %s)", self.log_dir, cluster_id)

    @staticmethod
    def _new_cluster_id() -> str:
        """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding."""
        import base64

        return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")

    # -- own child -------------------------------------------------------------------
    def start(self) -> KafkaBroker:
        """Start the broker as this object's child; return once it creates topics."""
        if self.running:
            return self
        argv = self.command()
        with open(self.log_path, "ab") as out:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        started = time.monotonic()
        try:
            wait_ready(self.bootstrap_servers, self.ready_timeout, alive=self._alive_or_raise)
        except BaseException:
            self.stop()
            raise
        log.info(
            "Kafka broker pid %s on %s ready in %.1f s (log %s)",
            self.pid,
            self.bootstrap_servers,
            time.monotonic() - started,
            self.log_path,
        )
        return self

    def _alive_or_raise(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise BrokerError(
                f"Kafka exited with code {self._proc.returncode} while starting on "
                f"{self.bootstrap_servers}:\n{log_tail(self.log_path)}"
            )

    def kill(self) -> None:
        """SIGKILL the broker (a crash, for fault tests); its state stays on disk."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown that flushes and closes the logs), then
        SIGKILL after ``timeout`` seconds. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("Kafka pid %s ignored SIGTERM for %s s; killing it", proc.pid, timeout)
                proc.kill()
                proc.wait()
        if self.remove_on_stop:
            shutil.rmtree(self.directory, ignore_errors=True)

    def create_topics(self, topics: Iterable[Topic] = ALL_TOPICS) -> list[str]:
        return create_topics(self.bootstrap_servers, topics)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"KafkaBroker({self.directory}, {self.host}:{self.port}, {state})"


def wait_ready(bootstrap: str, timeout_s: float, alive=lambda: None) -> None:
    """Return once the broker at ``bootstrap`` creates (or finds) the ready probe
    topic; ``alive`` raises if the process died meanwhile."""
    deadline = time.monotonic() + timeout_s
    host, _, port = bootstrap.rpartition(":")
    last: Exception | None = None
    while time.monotonic() < deadline:
        alive()
        try:
            import socket

            socket.create_connection((host, int(port)), timeout=0.5).close()
        except OSError as exc:
            last = exc
            time.sleep(0.1)
            continue
        try:
            create_topics(bootstrap, [READY_PROBE], timeout=5.0)
            return
        except (LogError, TimeoutError, OSError) as exc:
            last = exc
            time.sleep(0.2)
    raise BrokerError(
        f"Kafka on {bootstrap} not ready after {timeout_s:.0f} s (last error: {last})"
    )


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no broker log)"
