"""Apache Kafka's jars, resolved by Maven from Maven Central at the version pinned
in ``pom.xml`` beside this module, and cached outside any data dir.

Theory of operation
-------------------
1. The cache directory is ``$FRAMESPOOL_KAFKA_HOME`` or
   ``~/.cache/framespool/kafka/<kafka version>-<pom digest>``: a changed pom is a
   new directory, so two pins never mix jars.
2. A complete cache holds ``lib/*.jar`` and a ``complete`` marker naming the pom's
   digest; nothing else counts as resolved (an interrupted resolution leaves no
   marker and is redone).
3. Resolution runs ``mvn -C dependency:copy-dependencies`` into a temporary
   directory beside ``lib`` and renames it into place. ``-C`` makes Maven fail on
   a checksum mismatch instead of warning; Maven's own repository (``~/.m2``)
   keeps the downloads, so a second cache dir resolves offline in seconds.
4. A file lock serialises concurrent resolvers (``framespool up`` and a test
   session on one machine); the loser finds the marker and returns.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

POM = "pom.xml"
INSTALL_HINT = (
    "install a Java runtime (17 or newer) and Maven, e.g. "
    "`apt-get install openjdk-17-jre-headless maven`, or run with `--broker tansu` "
    "(in-memory demo broker: nothing survives a restart)"
)


class JarsError(RuntimeError):
    """Kafka's jars could not be resolved; the message says what to install or read."""


def pom_text() -> str:
    return resources.files("framespool.broker").joinpath(POM).read_text()


def kafka_version(pom: str | None = None) -> str:
    """The pinned Kafka version (the pom's ``kafka.version`` property)."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom or pom_text())
    if match is None:
        raise JarsError("pom.xml has no <kafka.version> property")
    return match.group(1).strip()


def cache_dir() -> Path:
    """Where the jars of this pom live (theory of operation, 1)."""
    configured = os.environ.get("FRAMESPOOL_KAFKA_HOME")
    if configured:
        return Path(configured).expanduser()
    pom = pom_text()
    digest = hashlib.sha256(pom.encode()).hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "framespool" / "kafka" / f"{kafka_version(pom)}-{digest}"


def _digest() -> str:
    return hashlib.sha256(pom_text().encode()).hexdigest()


def resolved(home: Path | None = None) -> bool:
    home = home or cache_dir()
    marker = home / "complete"
    return marker.is_file() and marker.read_text().strip() == _digest()


def resolve(home: Path | None = None, timeout_s: float = 900.0) -> Path:
    """The ``lib`` directory holding Kafka's jars, resolving them first if needed."""
    home = home or cache_dir()
    lib = home / "lib"
    if resolved(home):
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError(f"Maven (`mvn`) is not on PATH, so Kafka cannot be fetched: {INSTALL_HINT}")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # theory of operation, 4
        if resolved(home):
            return lib
        (home / POM).write_text(pom_text())
        staging = Path(tempfile.mkdtemp(prefix="lib-", dir=home))
        argv = [mvn, "-B", "-q", "-C", "-f", str(home / POM), "dependency:copy-dependencies"]
        argv += [f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise JarsError(f"Maven did not resolve Kafka within {timeout_s:.0f} s") from exc
        if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise JarsError(
                f"Maven could not resolve Kafka {kafka_version()} (exit {done.returncode}; "
                f"`{' '.join(argv)}`):\n{tail}"
            )
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        (home / "complete").write_text(_digest())
    return lib
