"""The embedded stack behind ``framespool up``: every process on this machine.

Start order (each step waits until the previous one is ready):

1. the broker and the catalogue's topics, created explicitly (existing ones
   are kept): by default Apache Kafka (``framespool.broker.KafkaBroker``, its
   log under ``<data-dir>/kafka/``), supervised like every other process below;
   with ``broker="tansu"`` the in-memory Tansu broker, whose log is gone when it
   stops;
2. the admission processor, ``schedulers`` scheduler instances sharing the
   cells' partitions through their consumer group, and the clock;
3. the API with its projections;
4. the agents, with simulated GPUs running the demo generator and the
   deployment file's ``[[profiles]]``; node ``i``
   belongs to cell ``cell-<i mod cells>``. With ``nodes_per_agent`` 1 each node
   has its own process ``agent-node-<i>``; with k > 1, ceil(nodes / k)
   processes ``agent-<j>`` host k consecutive nodes each;
5. ``<data-dir>/stack.json`` is written: the stack is ready. It names every
   process with its pid under ``pids`` and each cell's nodes under ``cells``.

While it runs, :meth:`Stack.supervise` restarts a process that died, with
exponential backoff (0.5 s doubling to 10 s; reset once it has stayed up for
30 s), logs why, and rewrites ``stack.json`` with the new pid; the others keep
serving meanwhile (a dead scheduler's cells move to the surviving instance).

Each process is started with the command line :mod:`framespool.bootstrap` builds
(``processor_command``, ``service_command``), the module that also builds what the
command runs.

Stop order is the reverse, SIGTERM first and SIGKILL after a grace period.
Every process logs to ``<data-dir>/logs/<name>.log``.

Configuration. ``processor_config`` (``framespool up --config FILE``) is the
deployment file: ``[admission]``, ``[scheduler]``, ``[[tenants]]``, ``[api]``
and ``[[profiles]]`` (``framespool.processors.config_file``). Before anything
starts it is checked whole (an error names the file, the key and what was
expected), completed with this stack's cells and, without ``[[tenants]]``, the
default tenants (``DEFAULT_TENANTS``: between them every tier), and written to
``<data-dir>/processors-config.json``, which every process is started with
(each reads its own sections). ``{config_dir}`` in a profile's command is the
directory of the operator's file, so a generator script can sit beside it.

Durability (docs/design.md#running-it). On Kafka nothing is wiped at start:
the log, the processors' snapshots and committed offsets, the read models, the
agents' ledgers, the artifacts, the secrets file and the issued keys are all
reused, so a stack stopped or killed (even by SIGKILL of its whole process
group) and started again on the same data dir knows every job and key. Starting
over is explicit (``fresh=True``: ``framespool up --fresh`` or
``framespool reset``). On Tansu the state derived from a previous log is wiped
at start, because that log is gone. One stack at a time holds a data dir
(``<data-dir>/.lock``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from framespool import stack_secrets
from framespool.bootstrap import processor_command, service_command
from framespool.broker import BROKER_KINDS, KafkaBroker, TansuBroker
from framespool.broker.kafka import wait_ready
from framespool.processors.config_file import TenantEntry, UserEntry
from framespool.schemas.states import NodeState

# Between them every tier, so a newcomer can watch preemption (acme's interactive
# jobs take GPUs from studio's preemptible batch jobs) and a quota hold a job
# (hobby's); acme has two users, each with a key, so fair share reaches users.
DEFAULT_TENANTS = (
    TenantEntry(
        "acme",
        tiers=("interactive", "enterprise", "free"),
        default_tier="enterprise",
        users=(UserEntry("alice"), UserEntry("bob")),
    ),
    TenantEntry("studio", tiers=("paid", "batch", "free"), default_tier="paid"),
    TenantEntry("hobby", tiers=("free",), max_gpus=16),
)
RESTART_BACKOFF_S = (0.5, 10.0)  # first delay, cap; doubled after each quick death
STABLE_AFTER_S = 30.0  # a process up this long has its backoff reset
# With several cells, a queued job no UP node of its cell can run for this long
# is rerouted to another (CellConfig.drain_grace_s; unset, a cell keeps it forever)
DRAIN_GRACE_S = 60.0
# What a stack writes under its data dir; `reset` removes exactly these.
STATE_ENTRIES = (
    "kafka",
    "processors",
    "api",
    "agents",
    "artifacts",
    "logs",
    "stack.json",
    "processors-config.json",
    stack_secrets.SECRETS_FILE,
    stack_secrets.SECRETS_FILE + ".lock",
    stack_secrets.KEYS_FILE,
)
# State derived from the log: stale once the log is gone (a Tansu stack's restart).
DERIVED_ENTRIES = ("processors", "api", "agents", "artifacts", "stack.json")

log = logging.getLogger(__name__)


@dataclass
class StackConfig:
    data_dir: Path = Path(".framespool")
    port: int = 8080
    nodes: int = 4
    cells: int = 2
    schedulers: int = 2
    gpus_per_node: int = 8
    nodes_per_rail: int = 2
    # simulated nodes per agent process: 1 keeps a process per node (agent-node-<i>);
    # more hosts nodes together (agent-<k>), each with its own incarnation and fencing
    nodes_per_agent: int = 1
    time_scale: float = 1.0
    # the tenants when the deployment file has no [[tenants]]: entries or (name, tier)
    tenants: tuple[TenantEntry | tuple[str, str], ...] = DEFAULT_TENANTS
    allow_private_webhooks: bool = False
    processor_config: Path | None = None  # the deployment file (JSON or TOML)
    extra_env: dict[str, str] = field(default_factory=dict)
    broker: str = "kafka"  # or "tansu": in memory, nothing survives a restart
    fresh: bool = False  # wipe the data dir's state first (starting over is explicit)
    broker_fsync: bool = False  # Kafka flushes to disk before it acknowledges
    broker_heap_mb: int | None = None  # Kafka's JVM heap (None: the broker's default)


class StackError(RuntimeError):
    """The stack could not start; the message says which process and where its log is."""


def die_with_parent() -> None:
    """In the child: get SIGTERM when the launcher dies (even by SIGKILL), so no
    process of a stack outlives it (Linux prctl PR_SET_PDEATHSIG; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Process:
    """One supervised child: its command line, log file and restart history."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "ab")
        self.restarts = 0
        self.backoff_s = RESTART_BACKOFF_S[0]
        self.restart_at: float | None = None  # monotonic time of the pending restart
        self.launch()

    def launch(self) -> None:
        self.started_at = time.monotonic()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self.log.close()


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        self.log_dir = self.data_dir / "logs"
        self.broker: TansuBroker | None = None  # Tansu runs as the launcher's own child
        self.kafka: KafkaBroker | None = None  # Kafka runs as the supervised "broker" process
        self.lock_file: IO[str] | None = None
        self.processes: list[Process] = []
        self.tenant_keys: list[dict[str, str]] = []
        self.info: dict = {}

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    @property
    def bootstrap_servers(self) -> str:
        """Where the stack's broker listens (once started)."""
        if self.kafka is not None:
            return self.kafka.bootstrap_servers
        if self.broker is not None:
            return self.broker.bootstrap_servers
        raise StackError("the stack's broker is not started")

    @property
    def broker_pid(self) -> int | None:
        """The broker's process id now (Kafka's changes when the supervisor restarts it)."""
        if self.broker is not None:
            return self.broker.pid
        for process in self.processes:
            if process.name == "broker":
                return process.popen.pid
        return None

    # -- start ------------------------------------------------------------------
    def start(self, ready_timeout_s: float = 60.0) -> dict:
        from framespool.log import create_topics

        self.check_config()
        deployment = self.deployment()  # the operator's file, checked before anything starts
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)  # prompts, keys and artifacts live here
        self.lock()
        if self.config.fresh:
            reset_data_dir(self.data_dir)
        elif self.config.broker == "tansu" or not (self.data_dir / "kafka" / "log").is_dir():
            # no log to resume: what a previous run derived from its log is stale
            self.wipe_derived_state()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        bootstrap = self.start_broker(ready_timeout_s)
        create_topics(bootstrap)
        self.write_secrets(deployment)
        # every process's command line comes from the composition root, which builds it
        state = self.data_dir / "processors"
        common_cfg = ["--config", str(self.write_processor_config(deployment))]
        # snapshot at most once a second: state is pickled whole, and the commit
        # protocol re-folds (without re-sending) what a crash loses; the shared
        # directory is where any scheduler instance takes a cell over from
        snap = [
            "--snapshot-interval",
            "1.0",
            "--shared-snapshots",
            str(state / "shared-snapshots"),
        ]
        self.spawn(
            "admission",
            processor_command("admission", bootstrap, state / "admission", *common_cfg, *snap)
            + ["--instance", "admission-0"],
        )
        for i in range(self.config.schedulers):
            name = f"scheduler-{i}"
            self.spawn(
                name,
                processor_command("scheduler", bootstrap, state / name, *common_cfg, *snap)
                + ["--instance", name],
            )
        self.spawn("clock", processor_command("clock", bootstrap, state / "clock"))
        api = service_command(
            "api", bootstrap, self.data_dir, "--port", str(self.config.port), *common_cfg
        )
        if self.config.allow_private_webhooks:
            api.append("--allow-private-webhooks")
        self.spawn("api", api)
        self.wait_http(f"{self.api_url}/healthz", ready_timeout_s)
        cells: dict[str, list[str]] = {cell: [] for cell in self.cell_ids}
        hosted: list[tuple[str, str, str]] = []  # (node, cell, rail)
        for i in range(self.config.nodes):
            node = f"node-{i}"
            cell = self.cell_ids[i % len(self.cell_ids)]
            cells[cell].append(node)
            hosted.append((node, cell, f"rail-{len(cells[cell]) // self.config.nodes_per_rail}"))
        agent = service_command("agent", bootstrap, self.data_dir, *common_cfg)
        agent += ["--gpus", str(self.config.gpus_per_node), "--simulated"]
        agent += ["--time-scale", str(self.config.time_scale), "--api-url", self.api_url]
        per = max(1, self.config.nodes_per_agent)
        for j in range(0, len(hosted), per):
            group = hosted[j : j + per]
            if per == 1:
                node, cell, rail = group[0]
                name, where = f"agent-{node}", ["--node", node, "--cell", cell, "--rail", rail]
            else:
                name = f"agent-{j // per}"
                where = ["--nodes", ",".join(f"{n}@{c}/{r}" for n, c, r in group)]
            self.spawn(name, agent + where)
        self.wait_nodes(ready_timeout_s)
        self.info = {
            "api_url": self.api_url,
            "bootstrap_servers": bootstrap,
            "broker": self.config.broker,
            "durable": self.config.broker == "kafka",
            "secrets_file": str(self.data_dir / stack_secrets.SECRETS_FILE),
            "keys_file": str(self.data_dir / stack_secrets.KEYS_FILE),
            "tenants": self.tenant_keys,
            "data_dir": str(self.data_dir),
            "logs": str(self.log_dir),
            "cells": cells,
            "pids": {},
        }
        self.write_info()
        return self.info

    @property
    def cell_ids(self) -> list[str]:
        from framespool.schemas.topics import cell_of_partition

        return [cell_of_partition(p) for p in range(self.config.cells)]

    def check_config(self) -> None:
        """Refuse, before anything starts, the settings no stack runs with (the
        node counts are checked by ``framespool up``)."""
        c = self.config
        self.check_cells()
        if c.broker not in BROKER_KINDS:
            raise StackError(f"broker={c.broker!r}: use one of {', '.join(BROKER_KINDS)}")
        if not 1 <= c.port <= 65535:
            raise StackError(f"port={c.port}: use a TCP port from 1 to 65535")
        if c.nodes_per_rail < 1:
            raise StackError(f"nodes_per_rail={c.nodes_per_rail}: at least 1 node per rail")
        if not 0 < c.time_scale < math.inf:  # NaN too
            raise StackError(
                f"time_scale={c.time_scale}: a positive speed factor (1 = real time, 10 = "
                "ten times faster)"
            )

    def check_cells(self) -> None:
        """One scheduler partition per cell, and at least one scheduler."""
        from framespool.schemas.topics import SCHEDULER

        if not 1 <= self.config.cells <= SCHEDULER.partitions:
            raise StackError(
                f"cells={self.config.cells}: the scheduler topic has {SCHEDULER.partitions} "
                f"partitions (one per cell); use 1..{SCHEDULER.partitions}"
            )
        if self.config.schedulers < 1:
            raise StackError(f"schedulers={self.config.schedulers}: at least one is needed")

    def deployment(self) -> dict:
        """The deployment document every process is started with (module docstring):
        the operator's file completed with this stack's cells, drain grace and
        default tenants, checked whole; ``StackError`` names the file and the key."""
        from framespool.bootstrap import api_limits
        from framespool.configfile import ConfigError
        from framespool.processors.config_file import (
            admission_config,
            cell_config,
            read_config_file,
        )
        from framespool.producers.settings import api_settings

        self.check_cells()
        source = self.config.processor_config
        try:
            doc = read_config_file(source) if source else {}
            doc = dict(doc)
            doc["admission"] = dict(doc.get("admission", {}))
            doc["admission"].setdefault("cells", self.cell_ids)
            if self.config.cells > 1:  # a cell that cannot run a queued job sends it on
                doc["scheduler"] = dict(doc.get("scheduler", {}))
                doc["scheduler"].setdefault("drain_grace_s", DRAIN_GRACE_S)
            if "tenants" not in doc:
                doc["tenants"] = [tenant_table(t) for t in self.config.tenants]
            if source and doc.get("profiles"):
                doc["profiles"] = with_config_dir(doc["profiles"], Path(source).resolve().parent)
            checked = read_config_file_like(doc, source)
            cell_config(checked)
            admission_config(checked)
            settings = api_settings(checked)
            api_limits(profiles_in(checked), settings.default_model)
        except ConfigError as exc:
            raise StackError(str(exc.in_file(source))) from None
        return doc

    def write_processor_config(self, deployment: dict | None = None) -> Path:
        """``<data-dir>/processors-config.json``: the deployment document (``deployment``)
        every process is started with."""
        doc = self.deployment() if deployment is None else deployment
        path = self.data_dir / "processors-config.json"
        path.write_text(json.dumps(doc, indent=2))
        return path

    def write_info(self) -> None:
        """``stack.json`` with the current pid of every process (rewritten on restart)
        and every key issued so far (``framespool tenants`` may have added some)."""
        self.info["pids"] = {p.name: p.popen.pid for p in self.processes}
        issued = stack_secrets.read_issued(self.data_dir / stack_secrets.KEYS_FILE)
        if issued:
            self.info["tenants"] = issued
        path = self.data_dir / "stack.json"
        stack_secrets.write_private(path, self.info)  # it holds every tenant's key

    def lock(self) -> None:
        """Hold ``<data-dir>/.lock`` while the stack runs: two stacks on one data
        dir would interleave two logs' derived state."""
        self.lock_file = open(self.data_dir / ".lock", "a")
        try:
            fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lock_file.close()
            self.lock_file = None
            raise StackError(
                f"another framespool stack is running on {self.data_dir}; stop it first "
                "or pass another --data-dir"
            ) from None

    def wipe_derived_state(self) -> None:
        """State derived from a log that is gone (Tansu keeps its log in memory; a
        Kafka data dir without its log) is wiped: snapshots, read models, agent
        positions, artifacts. Keys and secrets stay."""
        for name in DERIVED_ENTRIES:
            remove(self.data_dir / name)
        if self.config.broker == "tansu":
            log.warning(
                "broker tansu: the log is in memory; nothing of this run survives a restart "
                "(jobs, results and audit trails are lost when the stack stops)"
            )

    def start_broker(self, ready_timeout_s: float) -> str:
        """Start the broker and return its bootstrap servers once it answers."""
        if self.config.broker == "tansu":
            self.broker = TansuBroker(log_path=self.log_dir / "broker.log")
            self.broker.start()
            return self.broker.bootstrap_servers
        heap, directory = self.config.broker_heap_mb, self.data_dir / "kafka"
        self.kafka = (
            KafkaBroker(directory, fsync=self.config.broker_fsync)  # the broker's default heap
            if heap is None
            else KafkaBroker(directory, fsync=self.config.broker_fsync, heap_mb=heap)
        )
        try:
            argv = self.kafka.command()
        except (RuntimeError, OSError) as exc:  # no java/mvn, a failed resolution or format
            raise StackError(str(exc)) from None
        started = time.monotonic()
        process = self.spawn("broker", argv)
        bootstrap = self.kafka.bootstrap_servers

        def alive() -> None:
            if not process.alive():
                raise StackError(
                    f"broker exited with status {process.popen.returncode}; see {process.log_path}"
                )

        wait_ready(bootstrap, max(ready_timeout_s, 120.0), alive=alive)
        log.info("Kafka broker on %s ready in %.1f s", bootstrap, time.monotonic() - started)
        return bootstrap

    def write_secrets(self, deployment: dict | None = None) -> None:
        """The server's secrets file (0600), from the one builder the Compose init
        uses too, kept across restarts: keys, webhook secrets (with their
        rotations), the URL-signing and operator keys stay valid. A restart brings
        it up to the deployment's tenants (``stack_secrets.reconcile``: a new tenant
        or user gets a key, a listed tenant its tiers and limits; nothing is taken
        away). The keys issued to the tenants are kept in ``KEYS_FILE`` (0600) and
        shown in ``stack.json``."""
        from framespool.processors.config_file import tenant_entries

        tenants = (
            tenant_entries(deployment) if deployment is not None else tuple(self.config.tenants)
        )
        secrets_path = self.data_dir / stack_secrets.SECRETS_FILE
        keys_path = self.data_dir / stack_secrets.KEYS_FILE
        if secrets_path.is_file():
            shown = stack_secrets.update(
                secrets_path, lambda doc: stack_secrets.reconcile(doc, tenants)
            )
            if shown:
                stack_secrets.record_issued(keys_path, shown)
        else:
            doc, shown = stack_secrets.build(tenants)
            stack_secrets.write_private(keys_path, {"tenants": shown})
            stack_secrets.write_private(secrets_path, doc)
        self.tenant_keys.extend(stack_secrets.read_issued(keys_path))

    def process_env(self) -> dict[str, str]:
        """The environment of every process of the stack."""
        # the log adapter's fetch waits are tuned per broker (framespool.log.kafka)
        env = dict(os.environ, PYTHONUNBUFFERED="1", FRAMESPOOL_BROKER=self.config.broker)
        env.update(self.config.extra_env)
        return env

    def spawn(self, name: str, argv: list[str]) -> Process:
        env = self.process_env()
        process = Process(name, argv, self.log_dir, env)
        self.processes.append(process)
        return process

    def supervise(self) -> list[str]:
        """Restart the processes that died (call it periodically): each is
        relaunched after its backoff, which doubles while it keeps dying quickly
        and resets once it stayed up :data:`STABLE_AFTER_S`. Returns what it did,
        one line per death or restart, for the operator's log."""
        events = []
        now = time.monotonic()
        for process in self.processes:
            if process.alive():
                if now - process.started_at >= STABLE_AFTER_S:
                    process.backoff_s = RESTART_BACKOFF_S[0]
                continue
            if process.restart_at is None:
                process.restart_at = now + process.backoff_s
                events.append(
                    f"{process.name} exited with status {process.popen.returncode}; "
                    f"restarting in {process.backoff_s:.1f}s (see {process.log_path})"
                )
                process.backoff_s = min(process.backoff_s * 2, RESTART_BACKOFF_S[1])
            elif now >= process.restart_at:
                process.restart_at = None
                process.restarts += 1
                process.launch()
                events.append(
                    f"{process.name} restarted (pid {process.popen.pid}, "
                    f"restart {process.restarts})"
                )
                if self.info:
                    self.write_info()
        for line in events:
            log.warning("%s", line)
        return events

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.alive():
                raise StackError(
                    f"{process.name} exited with status {process.popen.returncode}; "
                    f"see {process.log_path}"
                )

    def wait_http(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise StackError(f"{url} not ready within {timeout_s:.0f}s; see {self.log_dir}")

    def wait_nodes(self, timeout_s: float) -> None:
        """Ready when the scheduler's cluster view shows every node."""
        key = self.tenant_keys[0]["api_key"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            req = urllib.request.Request(
                f"{self.api_url}/v1/cluster", headers={"Authorization": f"Bearer {key}"}
            )
            try:
                with urllib.request.urlopen(req, timeout=2) as resp:
                    view = json.loads(resp.read())
                up = [
                    n
                    for cell in view.get("cells", ())
                    for n in cell.get("nodes", ())
                    if n["state"] == NodeState.UP
                ]
                if len(up) >= self.config.nodes:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise StackError(
            f"the {self.config.nodes} agents did not all register within "
            f"{timeout_s:.0f}s; see {self.log_dir}"
        )

    # -- stop -------------------------------------------------------------------
    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
        (self.data_dir / "stack.json").unlink(missing_ok=True)
        if self.lock_file is not None:
            self.lock_file.close()
            self.lock_file = None

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def tenant_table(tenant: TenantEntry | tuple[str, str]) -> dict:
    """A tenant as its ``[[tenants]]`` table (what the deployment document holds)."""
    from dataclasses import asdict

    table = asdict(stack_secrets.entry_of(tenant))
    return {k: v for k, v in table.items() if v is not None}


def with_config_dir(profiles: list, directory: Path) -> list:
    """Profile tables with ``{config_dir}`` in their command lines made ``directory``
    (the operator's file's), so a generator may sit beside the file."""
    from framespool.agents.profiles import expand_config_dir

    return expand_config_dir(profiles, directory)


def read_config_file_like(doc: dict, source: Path | None):
    """``doc`` as a checked document that names ``source`` in its errors."""
    from framespool.configfile import Document

    checked = Document(doc)
    checked.source = str(source) if source else None
    return checked


def profiles_in(doc: dict) -> dict:
    """The model profiles ``doc`` declares, with the built-ins (errors name its source)."""
    from framespool.agents.profiles import load_profiles, profile_list

    return load_profiles() | profile_list(doc.get("profiles", []), doc)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def reset_data_dir(data_dir: Path) -> list[str]:
    """Remove what a stack keeps under ``data_dir`` (its log, state, keys and
    artifacts); other files there are left alone. Returns what was removed."""
    removed = []
    for name in STATE_ENTRIES:
        path = Path(data_dir) / name
        if path.exists() or path.is_symlink():
            remove(path)
            removed.append(name)
    return removed
