"""The composition root: every process of framespool is built here, from its settings.

=========== ============================================= ==========================
process     command (Compose, the embedded stack)         built by
=========== ============================================= ==========================
admission   ``python -m framespool.processors admission``  :func:`build_runner`
scheduler   ``python -m framespool.processors scheduler``  :func:`build_runner`
clock       ``python -m framespool.processors clock``      :func:`run_clock`
api         ``python -m framespool.services api``          :func:`run_api` (with the
                                                           projections it serves)
agent       ``python -m framespool.services agent``        :func:`run_agent`
=========== ============================================= ==========================

A process's settings are its command line (:func:`processor_args`,
:func:`services_parser`) and the deployment file it is given with ``--config``
(each process reads its own sections: ``[admission]``, ``[scheduler]``,
``[[tenants]]``, ``[api]``, ``[[profiles]]``). The two ``python -m`` modules
(``processors/__main__.py``, ``framespool/services.py``) only call
:func:`processors_main` and :func:`services_main`; the embedded stack
(:mod:`framespool.stack`) starts each process with the command line
:func:`processor_command` or :func:`service_command` builds, and Compose
(``compose/docker-compose.yml``) with the same commands.

The processors (admission, scheduler, clock). Exit status: 0 after
SIGTERM/SIGINT (batch finished, state snapshotted, group left), 2 for a bad
configuration or missing topics, 3 when outputs could not be delivered or state
not saved (restart it: the batch is replayed), 4 when a graceful stop did not
finish within ``SHUTDOWN_BOUND_S``. Logs are JSON lines on stderr.

The API and the agents read the shared settings (tenant keys and webhook
secrets, the URL signing key, the artifact store) from
``<stack-dir>/stack-secrets.json``, which ``framespool up``, the Compose init and
``framespool tenants`` write with ``framespool.stack_secrets``; the API reads it
again whenever it changes, so a tenant added or a key rotated counts without a
restart. Both take the deployment file's ``[[profiles]]`` (the models the agents
run and the API accepts), the API its ``[api]`` section (default model, per-tier
rate limits and queue caps).

Modules are imported inside the functions that need them, so each process loads
only its own (and ``framespool --help`` stays fast).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from framespool.telemetry.gcpauses import watch_gc_pauses
from framespool.telemetry.jsonlog import setup_logging

if TYPE_CHECKING:
    from framespool.processors.app import ProcessorRunner
    from framespool.schemas.topics import Topics

log = logging.getLogger("processors")

EXIT_CONFIG = 2
EXIT_FAILED = 3
# Snapshots pickle a partition's whole state (a 2,000-node cell: ~5 MB, ~150 ms of
# CPU), in a forked child by default (``--snapshot-pickling``); at most 0.5 % of a
# processor's CPU, the child's included, goes to them, so a state that grows
# stretches their spacing instead of the outputs' tail latency.
SNAPSHOT_BUDGET = 0.005

# the modules ``python -m`` runs: the commands Compose and the embedded stack start
PROCESSORS_MODULE = "framespool.processors"
SERVICES_MODULE = "framespool.services"


# ---------------------------------------------------------------------------
# the command lines that start each process
# ---------------------------------------------------------------------------
def processor_command(role: str, bootstrap: str, data_dir: Path, *flags: str) -> list[str]:
    """``python -m framespool.processors ROLE --bootstrap B --data-dir DIR FLAGS...``
    (``role``: admission, scheduler or clock)."""
    head = [sys.executable, "-m", PROCESSORS_MODULE, role, "--bootstrap", bootstrap]
    return [*head, "--data-dir", str(data_dir), *flags]


def service_command(service: str, bootstrap: str, stack_dir: Path, *flags: str) -> list[str]:
    """``python -m framespool.services SERVICE --bootstrap B --stack-dir DIR FLAGS...``
    (``service``: api or agent)."""
    head = [sys.executable, "-m", SERVICES_MODULE, service, "--bootstrap", bootstrap]
    return [*head, "--stack-dir", str(stack_dir), *flags]


# ---------------------------------------------------------------------------
# admission and scheduler: a stateful processor in a consumer group
# ---------------------------------------------------------------------------
def processor_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m framespool.processors",
        description="Run a framespool stream processor (admission, scheduler) or the clock.",
        epilog="Exit status: 0 after SIGTERM/SIGINT, 2 bad configuration or missing topics, "
        "3 outputs not delivered or state not saved (restart it).",
    )
    parser.add_argument("role", choices=("admission", "scheduler", "clock"))
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--data-dir", type=Path, help="this instance's own directory for state")
    parser.add_argument("--config", type=Path, help="JSON or TOML with [admission]/[scheduler]")
    parser.add_argument("--instance", default="", help="instance name (client id, logs)")
    parser.add_argument(
        "--topic-suffix",
        default="",
        help="read and write '<catalogue name>.<suffix>' topics (tests)",
    )
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=1000)
    parser.add_argument("--max-batch", type=int, default=500)
    parser.add_argument(
        "--snapshot-interval",
        type=float,
        default=0.0,
        help="seconds between snapshots of a partition (0: every batch)",
    )
    parser.add_argument(
        "--snapshot-budget",
        type=float,
        default=SNAPSHOT_BUDGET,
        help="the most of a processor's time snapshots may take: a partition's next snapshot "
        "waits its last one's cost divided by this, at least (0: no bound; default "
        f"{SNAPSHOT_BUDGET})",
    )
    parser.add_argument(
        "--snapshot-pickling",
        choices=("auto", "background", "inline"),
        default="auto",
        help="where a snapshot's state is pickled: 'background', by a forked child while the "
        "processor goes on (Linux only), 'inline', in the processor's turn, or 'auto' "
        "(default): background where it can be",
    )
    parser.add_argument(
        "--shared-snapshots",
        default=os.environ.get("FRAMESPOOL_SHARED_SNAPSHOTS", ""),
        metavar="LOCATION",
        help="where every instance publishes and finds snapshots, so any instance takes over a "
        "partition from its latest state: s3://BUCKET/PREFIX (endpoint from AWS_ENDPOINT_URL) or "
        "a directory all instances share (default: none; a partition that moves is rebuilt from "
        "the new instance's own snapshot or from offset 0)",
    )
    parser.add_argument(
        "--publish-interval",
        type=float,
        default=5.0,
        help="seconds between shared snapshots of a partition (always on revoke and shutdown)",
    )
    parser.add_argument("--interval", type=float, default=0.25, help="clock: seconds between Ticks")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (0 = off)",
    )
    parser.add_argument("--log-level", default=os.environ.get("FRAMESPOOL_LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


def build_runner(args: argparse.Namespace, topics: Topics) -> ProcessorRunner:
    """Wire one stateful processor instance (raises ConfigError/RoutingError when it can't)."""
    from framespool.processors.admission import AdmissionFold
    from framespool.processors.app import ProcessorRunner
    from framespool.processors.config_file import (
        ConfigError,
        admission_config,
        cell_config,
        describe,
        read_config_file,
    )
    from framespool.processors.scheduler import SchedulerFold
    from framespool.processors.snapshots import (
        SnapshotStore,
        StatefulProcessor,
        background_snapshots_supported,
    )
    from framespool.schemas import topics as catalogue

    doc = read_config_file(args.config) if args.config else {}
    if args.data_dir is None:
        raise ConfigError(f"{args.role} needs --data-dir (one directory per instance)")
    if args.role == "admission":
        fold: Any = AdmissionFold(admission_config(doc), topics)
        input_topic, group, store_name = (
            topics.COMMANDS,
            catalogue.ADMISSION_GROUP,
            catalogue.ADMISSION_STORE,
        )
    else:
        fold = SchedulerFold(cell_config(doc), topics)
        input_topic, group, store_name = (
            topics.SCHEDULER,
            catalogue.SCHEDULER_GROUP,
            catalogue.SCHEDULER_STORE,
        )
    if args.topic_suffix:
        group = f"{group}.{args.topic_suffix}"
    log.info("%s config: %s", args.role, describe(fold.config))
    try:
        store = SnapshotStore(args.data_dir / store_name, input_topic.name)
    except Exception as exc:  # rocksdb: locked by another process, unwritable...
        raise ConfigError(
            f"cannot open the state store in {args.data_dir / store_name}: {exc}"
        ) from None
    if args.snapshot_pickling == "background" and not background_snapshots_supported():
        raise ConfigError(
            f"--snapshot-pickling background: needs fork, on Linux (this is {sys.platform}); "
            "use inline"
        )
    shared = None
    if args.shared_snapshots:
        from framespool.processors.shared_snapshots import open_shared_snapshots

        shared = open_shared_snapshots(args.shared_snapshots)
        log.info("shared snapshots: %s", shared.describe())
    processor = StatefulProcessor(
        fold,
        store,
        input_topic.name,
        snapshot_interval_s=args.snapshot_interval,
        shared=shared,
        instance=args.instance or f"{socket.gethostname()}-{os.getpid()}",
        publish_interval_s=args.publish_interval,
        snapshot_budget=args.snapshot_budget,
        background=args.snapshot_pickling == "background"
        or (args.snapshot_pickling == "auto" and background_snapshots_supported()),
        # nobody can take a partition over sooner than a session timeout after our
        # last heartbeat: checking twice per timeout catches a pause longer than that
        verify_after_s=args.session_timeout_ms / 2000,
    )
    return ProcessorRunner(
        processor,
        args.bootstrap,
        group,
        input_topic=input_topic,
        instance=args.instance,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_batch=args.max_batch,
    )


def record_config(args: argparse.Namespace, topics: Topics) -> None:
    """Write the configuration this instance folds with to job-events
    (``ProcessorConfigured``, keyed by its role), so that replay and audit read it
    from the log instead of guessing. A failure is logged, not fatal: the fold
    does not depend on it."""
    import time

    from framespool.log import LogError, LogProducer
    from framespool.processors.config_file import read_config_file, recorded_document
    from framespool.schemas import codec
    from framespool.schemas.events import ProcessorConfigured

    doc = read_config_file(args.config) if args.config else {}
    text, digest = recorded_document(doc)
    instance = args.instance or f"{socket.gethostname()}-{os.getpid()}"
    now_ms = int(time.time() * 1000)
    event = ProcessorConfigured(
        event_id=f"{instance}/configured@{now_ms}",
        ts_ms=now_ms,
        processor=args.role,
        instance=instance,
        document=text,
        sha256=digest,
    )
    try:
        with LogProducer(args.bootstrap) as producer:
            producer.produce(topics.JOB_EVENTS.name, args.role, codec.encode(event))
            producer.flush(10.0)
        log.info("%s config recorded (sha256 %s)", args.role, digest[:12])
    except (LogError, OSError) as exc:
        log.warning("%s config not recorded in the log: %s", args.role, exc)


# ---------------------------------------------------------------------------
# clock: Ticks on the scheduler's partitions
# ---------------------------------------------------------------------------
def run_clock(args: argparse.Namespace, topics: Topics, stop: threading.Event) -> int:
    """Produce a Tick every ``--interval`` seconds until ``stop``; the exit status."""
    from framespool.log import LogProducer, Role
    from framespool.processors.clock import Clock

    # Ticks drive the scheduler: a request-path client (LogProducer's default role)
    producer = LogProducer(
        args.bootstrap,
        role=Role.REQUEST_PATH,
        **{"client.id": f"framespool-clock-{args.instance}"},
    )
    try:
        Clock(producer, topics, args.interval).run(stop)
    except ValueError as exc:
        print(f"processors clock: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    finally:
        producer.close(timeout=5.0)
    return 0


# ---------------------------------------------------------------------------
# the processors' entry point: admission, scheduler or clock
# ---------------------------------------------------------------------------
# seconds a SIGTERM/SIGINT waits for the current batch before the process exits hard
SHUTDOWN_BOUND_S = 20.0
EXIT_SHUTDOWN_TIMEOUT = 4  # a graceful stop that did not finish within SHUTDOWN_BOUND_S


def processors_main(argv: list[str] | None = None) -> int:
    """``python -m framespool.processors ROLE`` (``processors/__main__.py``)."""
    from framespool.log import LogError
    from framespool.processors.app import ProcessorFailed, SetupError, topics_with_suffix
    from framespool.processors.config_file import ConfigError
    from framespool.processors.routing import RoutingError

    args = processor_args(argv)
    setup_logging(args.log_level, role=args.role, instance=args.instance or "default")
    watch_gc_pauses()
    topics = topics_with_suffix(args.topic_suffix)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %s: finishing the current batch", signal.Signals(signum).name)
        stop.set()
        # A graceful stop that cannot finish (the broker died with the launcher,
        # so a flush or commit waits on it) ends hard after SHUTDOWN_BOUND_S:
        # nothing is lost, state and offsets commit only after delivery
        bound = threading.Timer(SHUTDOWN_BOUND_S, os._exit, args=(EXIT_SHUTDOWN_TIMEOUT,))
        bound.daemon = True
        bound.start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.role == "clock":
        return run_clock(args, topics, stop)
    try:
        runner = build_runner(args, topics)
    except (ConfigError, RoutingError, ValueError) as exc:
        log.error("bad configuration: %s", exc)
        print(f"processors {args.role}: bad configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    record_config(args, topics)
    if args.metrics_port:
        from framespool.processors.metrics import RunnerCollector, serve

        serve(RunnerCollector(runner, args.role), args.metrics_port)
    try:
        runner.run(stop)
    except SetupError as exc:  # topics missing or with the wrong partition count
        log.error("%s", exc)
        print(f"processors {args.role}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (ProcessorFailed, LogError) as exc:
        log.critical("%s", exc)
        return EXIT_FAILED
    finally:
        runner.processor.store.close()
    return 0


# ---------------------------------------------------------------------------
# the settings the API and the agents share
# ---------------------------------------------------------------------------
def stack_secrets(stack_dir: Path) -> dict:
    """``<stack-dir>/stack-secrets.json``, checked: errors name the file, the key and
    what was expected (the shared loader, :mod:`framespool.configfile`)."""
    from framespool.configfile import optional, read_document, require
    from framespool.stack_secrets import SECRETS_FILE

    doc = read_document(stack_dir / SECRETS_FILE)
    require(doc, "auth", dict)
    if "url_signing_key" not in doc:  # written before the keys were split
        require(doc, "signing_secret", str)
    optional(doc, "url_signing_key", str, None)
    optional(doc, "operator_key", str, None)
    s3 = optional(doc, "s3", dict, None)
    if s3 is not None:
        require(s3, "bucket", str, where="s3", file=doc.source)
        optional(s3, "endpoint_url", str, None, where="s3", file=doc.source)
    return doc


def api_keys(secrets: Mapping[str, Any]) -> Any:
    """The API key table of the stack's settings (its ``auth`` table)."""
    from framespool.configfile import source_of
    from framespool.producers.auth import ApiKeys

    return ApiKeys.from_config(secrets["auth"], key="auth", file=source_of(secrets))


def artifact_store(stack_dir: Path, secrets: dict, api_url: str):
    from framespool.agents.artifacts.local import LocalDirStore
    from framespool.agents.artifacts.s3 import S3Store

    s3 = secrets.get("s3")
    if s3:
        return S3Store(s3["bucket"], endpoint_url=s3.get("endpoint_url"))
    url_key = secrets.get("url_signing_key") or secrets["signing_secret"]
    return LocalDirStore(stack_dir / "artifacts", url_base=api_url, secret=url_key)


def deployment(path: str | Path | None) -> Mapping[str, Any]:
    """The deployment file a process was given with ``--config`` (each process
    reads its own sections of it), or an empty one."""
    from framespool.configfile import read_document

    return read_document(path) if path else {}


def profiles_of(path: str | Path | None) -> dict[str, Any]:
    """The model profiles of the deployment file at ``path`` and the built-ins: the
    agents run exactly these and the API accepts exactly their names."""
    from framespool.agents.profiles import load_profiles

    return load_profiles(path) if path else load_profiles()


def api_limits(
    profiles: Mapping[str, Any] | None = None, default_model: str | None = "demo"
) -> Any:
    """Request limits that accept exactly the models the agents have profiles for,
    with each model's GPU limits and defaults, and ``default_model`` for a job that
    names none ("" or None: every job names its model). A default model without a
    profile is the operator's mistake: refused (``ConfigError``), never ignored."""
    from framespool.configfile import ConfigError
    from framespool.producers.validation import Limits, ModelDefaults

    if profiles is None:
        profiles = profiles_of(None)
    if default_model and default_model not in profiles:
        raise ConfigError(
            f"{default_model!r} names no model profile; expected one of "
            f"{', '.join(sorted(profiles))} (or \"\" to make every job name its model)",
            key="api.default_model",
        )
    defaults = {
        name: ModelDefaults(
            min_gpus=p.min_gpus,
            max_gpus=p.max_gpus,
            default_gpus=p.default_gpus,
            estimate_s=p.estimate_s,
            description=p.description,
            output_name=p.output_name,
            content_type=p.content_type,
            checkpoints=p.can_checkpoint,
        )
        for name, p in profiles.items()
    }
    return Limits(
        models=frozenset(profiles), default_model=default_model or None, model_defaults=defaults
    )


# ---------------------------------------------------------------------------
# api: the HTTP API, its projections and webhooks
# ---------------------------------------------------------------------------
def watch_secrets(stack_dir: Path, config: Any, webhooks: Any, interval_s: float = 1.0) -> Any:
    """A background run of the API: reload the key table (and new tenants' webhook
    secrets) whenever the secrets file changes (``framespool tenants``, a
    restarted ``up``), so adding a tenant or rotating a key needs no restart.
    The file is read off the event loop; a file that does not load is logged
    (naming the file and the key) and the keys loaded before stay in force."""
    from framespool.configfile import ConfigError
    from framespool.stack_secrets import SECRETS_FILE

    path = Path(stack_dir) / SECRETS_FILE
    logger = logging.getLogger("framespool.api")

    def stamp() -> tuple[int, int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    async def watch_secrets() -> None:
        seen = stamp()
        while True:
            await asyncio.sleep(interval_s)
            now = stamp()
            if now == seen or now is None:
                continue
            seen = now
            try:
                keys = await asyncio.to_thread(lambda: api_keys(stack_secrets(stack_dir)))
            except (ConfigError, OSError, ValueError) as exc:
                logger.error("secrets file not reloaded; the keys loaded before stay: %s", exc)
                continue
            config.auth = keys
            webhooks.secrets.add_missing(
                {name: p.webhook_secret for name, p in keys.tenants.items()}
            )
            logger.info("secrets file reloaded", extra={"tenants": len(keys.tenants)})

    return watch_secrets


def webhook_config(stack_dir: Path, secrets: Mapping[str, Any], keys: Any, policy: Any) -> Any:
    """Webhook delivery with each tenant's own secret, rotated into the secrets file."""
    from framespool.projections.webhook_secrets import WebhookSecrets
    from framespool.projections.webhooks import WebhookConfig
    from framespool.stack_secrets import SECRETS_FILE, set_webhook_secret

    tenant_secrets = WebhookSecrets(
        {name: p.webhook_secret for name, p in keys.tenants.items()},
        persist=lambda tenant, secret: set_webhook_secret(
            Path(stack_dir) / SECRETS_FILE, tenant, secret
        ),
    )
    return WebhookConfig(secrets=tenant_secrets, policy=policy)


async def run_api(args: argparse.Namespace) -> None:
    from aiohttp import web

    from framespool.log import LogProducer
    from framespool.producers.api import ApiConfig, make_app
    from framespool.producers.diskguard import DiskGuard
    from framespool.producers.edge import serve
    from framespool.producers.settings import api_settings
    from framespool.projections.service import ProjectionService
    from framespool.projections.storage import StorageLedger, sweeper
    from framespool.projections.webhooks import TargetPolicy
    from framespool.schemas.topics import STORAGE_LEDGER

    stack_dir = Path(args.stack_dir)
    secrets = stack_secrets(stack_dir)
    doc = deployment(args.config)
    settings = api_settings(doc)
    default_model = settings.default_model if args.default_model is None else args.default_model
    limits = api_limits(profiles_of(args.config), default_model)
    api_url = f"http://127.0.0.1:{args.port}"
    producer = LogProducer(args.bootstrap)
    keys = api_keys(secrets)
    policy = TargetPolicy(allow_private=args.allow_private_webhooks)
    webhooks = webhook_config(stack_dir, secrets, keys, policy)
    # what each tenant keeps stored, and the sweeper that applies each tier's retention
    ledger = StorageLedger(stack_dir / "api" / STORAGE_LEDGER)
    service = ProjectionService.open(
        stack_dir / "api", args.bootstrap, producer, webhooks=webhooks, storage=ledger
    )
    artifacts = artifact_store(stack_dir, secrets, api_url)
    config = ApiConfig(
        auth=keys,
        store=service.store,
        hub=service.hub,
        producer=producer,
        artifacts=artifacts,
        storage=ledger,
        url_policy=policy,
        background=service.background,
        webhook_secrets=webhooks.secrets,
        limits=limits,
        settings=settings,
        operator_key=secrets.get("operator_key") or "",
        max_connections_per_peer=args.max_connections_per_peer,
        disk_guard=DiskGuard(stack_dir, min_free_mb=args.min_free_disk_mb),
    )
    config.background = (
        *config.background,
        watch_secrets(stack_dir, config, webhooks),
        sweeper(ledger, artifacts, settings.retention_of, args.storage_sweep_s),
    )
    app = make_app(config)
    runner, _site = await serve(app, args.host, args.port)
    runners = [runner]
    if args.metrics_port:  # /metrics without a key, on an address only the operator reaches
        from framespool.producers.api import metrics_app

        metrics_runner = web.AppRunner(metrics_app(app))
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, "127.0.0.1", args.metrics_port).start()
        runners.insert(0, metrics_runner)
    logging.getLogger("framespool.api").info("api listening", extra={"url": api_url})
    try:
        await wait_for_signal()
    finally:
        for r in runners:
            await r.cleanup()
        service.close()
        producer.close()


# ---------------------------------------------------------------------------
# agent: one process hosting one real node or several simulated ones
# ---------------------------------------------------------------------------
def node_specs(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """``(node, cell, rail)`` of every node this agent process hosts: ``--node`` (one,
    with ``--cell``/``--rail``) or ``--nodes NODE[@CELL[/RAIL]],...`` (simulated
    nodes only: a real GPU node keeps its own agent process)."""
    if bool(args.node) == bool(args.nodes):
        raise SystemExit("agent: give exactly one of --node NODE or --nodes NODE,NODE,...")
    if args.node:
        return [(args.node, args.cell, args.rail)]
    specs = []
    for item in args.nodes.split(","):
        node, _, rest = item.strip().partition("@")
        cell, _, rail = rest.partition("/")
        specs.append((node, cell or args.cell, rail or args.rail))
    names = [n for n, _, _ in specs]
    if not all(names) or len(set(names)) != len(names):
        raise SystemExit(
            f"agent: --nodes={args.nodes!r}: node names must be non-empty and distinct"
        )
    if len(specs) > 1 and not args.simulated:
        raise SystemExit(
            f"agent: --nodes names {len(specs)} nodes but only --simulated nodes share a "
            "process; run one agent per real GPU node"
        )
    return specs


async def run_agent(args: argparse.Namespace) -> None:
    from framespool.agents.agent import NodeAgent
    from framespool.agents.gpus import SimulatedProbe, detect_probe
    from framespool.agents.host import AgentHost
    from framespool.stack_secrets import SECRETS_FILE

    stack_dir = Path(args.stack_dir)
    secrets = stack_secrets(stack_dir)
    store = artifact_store(stack_dir, secrets, args.api_url)
    profiles = profiles_of(args.config)
    agents = []
    for node, cell, rail in node_specs(args):
        probe = (
            SimulatedProbe(args.gpus, args.gpu_type, seed=hash(node) & 0xFFFF)
            if args.simulated
            else detect_probe(args.gpus, args.gpu_type)
        )
        if args.simulated:  # tests and chaos drills inject GPU faults through this file
            from framespool.agents.faults import FAULTS_FILE, FaultFileProbe

            probe = FaultFileProbe(probe, stack_dir / "agents" / node / FAULTS_FILE)
        agents.append(
            NodeAgent(
                node,
                cell,
                args.bootstrap,
                store,
                probe,
                profiles,
                stack_dir / "agents" / node,
                heartbeat_s=args.heartbeat_s,
                time_scale=args.time_scale,
                rail=rail,
                generator_user=args.generator_user,
                work_dir=Path(args.work_dir) / node if args.work_dir else None,
                secret_files=(stack_dir / SECRETS_FILE,),
            )
        )
    if args.metrics_port:
        from framespool.processors.metrics import serve

        serve(AgentCollector(agents), args.metrics_port)
    host = AgentHost(agents, args.bootstrap)
    import signal
    from concurrent.futures import ThreadPoolExecutor

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # runs do their file work (work dirs, uploads) on threads: a pool that grows
    # with the nodes hosted, so one node's slow disk does not queue another's runs
    loop.set_default_executor(ThreadPoolExecutor(max_workers=min(64, 8 + 4 * len(agents))))
    for sig in (signal.SIGTERM, signal.SIGINT):  # before registering: a stop mid-start is clean
        loop.add_signal_handler(sig, stop.set)
    try:
        await host.start()
        await stop.wait()
    finally:
        await host.stop()


class AgentCollector:
    """Prometheus gauges of an agent process's nodes (runs each executes, its
    incarnation, its GPUs, how often it healed itself after being declared DOWN)."""

    def __init__(self, agents) -> None:
        self.agents = agents if isinstance(agents, (list, tuple)) else [agents]

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        for name, doc, value in (
            ("framespool_agent_runs", "runs this agent is executing", lambda a: len(a._runs)),
            ("framespool_agent_incarnation", "registration number", lambda a: a.incarnation),
            ("framespool_agent_gpus", "GPUs on this node", lambda a: a.probe.count),
            (
                "framespool_agent_self_heals",
                "re-registrations after being declared DOWN",
                lambda a: a.liveness.heals if hasattr(a, "liveness") else 0,
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=["node"])
            for agent in self.agents:
                family.add_metric([agent.node_id], float(value(agent)))
            yield family


# ---------------------------------------------------------------------------
# the services' entry point: api or agent
# ---------------------------------------------------------------------------
async def wait_for_signal() -> None:
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def services_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m framespool.services {api,agent}``."""
    parser = argparse.ArgumentParser(prog="python -m framespool.services")
    sub = parser.add_subparsers(dest="service", required=True)
    api = sub.add_parser("api")
    api.add_argument("--port", type=int, required=True)
    api.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (0.0.0.0 only inside a container network)",
    )
    api.add_argument("--allow-private-webhooks", action="store_true")
    api.add_argument(
        "--default-model",
        default=None,
        help="the model of a job that names none ('' = the model is required; default: "
        "the deployment file's api.default_model, else demo)",
    )
    api.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="also serve /metrics without a key on 127.0.0.1:PORT (0 = off; the API's "
        "own /metrics needs the operator key)",
    )
    api.add_argument(
        "--max-connections-per-peer",
        type=int,
        default=256,
        help="open connections one client address may hold; past it a connection is "
        "answered 429 and closed (0 = no cap: behind a proxy every client shares its address)",
    )
    api.add_argument(
        "--min-free-disk-mb",
        type=int,
        default=100,
        help="new jobs are refused (503 disk_full, Retry-After) while the stack dir's disk "
        "has less free (0 = no guard)",
    )
    api.add_argument(
        "--storage-sweep-s",
        type=float,
        default=60.0,
        help="seconds between sweeps deleting the results and checkpoints whose tier's "
        "retention ended ([api] artifact_retention_s, checkpoint_retention_s)",
    )
    agent = sub.add_parser("agent")
    agent.add_argument("--node", help="this process's one node")
    agent.add_argument(
        "--nodes",
        help="NODE[@CELL[/RAIL]],...: simulated nodes this one process hosts, each with "
        "its own incarnation, ledger and fencing (cell and rail default to --cell/--rail)",
    )
    agent.add_argument("--cell", default="cell-0")
    agent.add_argument("--rail", default="rail-0")
    agent.add_argument("--gpus", type=int, default=8)
    agent.add_argument("--gpu-type", default="H100")
    agent.add_argument("--simulated", action="store_true")
    agent.add_argument("--time-scale", type=float, default=1.0)
    agent.add_argument("--heartbeat-s", type=float, default=1.0)
    agent.add_argument("--api-url", default="http://127.0.0.1:8080")
    agent.add_argument(
        "--generator-user",
        default=None,
        help="unprivileged user (name or uid) generators run as when the agent is root",
    )
    agent.add_argument(
        "--work-dir",
        help="where runs' work directories go (one folder per node; default: the node's "
        "folder in --stack-dir); with --generator-user, one outside --stack-dir",
    )
    agent.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (0 = off)",
    )
    for p in (api, agent):
        p.add_argument("--stack-dir", required=True)
        p.add_argument("--bootstrap", required=True)
        p.add_argument(
            "--config",
            default=None,
            help="the deployment file (JSON or TOML): [[profiles]] for both, [api] for the API",
        )
    return parser


def services_main(argv: list[str] | None = None) -> int:
    """``python -m framespool.services {api,agent}`` (``framespool/services.py``)."""
    parser = services_parser()
    args = parser.parse_args(argv)
    if args.service == "api" and args.max_connections_per_peer < 0:
        parser.error("--max-connections-per-peer must be 0 (no cap) or more")
    if args.service == "api" and not args.storage_sweep_s > 0:
        parser.error("--storage-sweep-s must be more than 0 seconds")
    if args.service == "api" and args.min_free_disk_mb < 0:
        parser.error("--min-free-disk-mb must be 0 (no guard) or more")
    setup_logging(process=args.service)
    watch_gc_pauses()
    runner = run_api if args.service == "api" else run_agent
    from framespool.configfile import ConfigError

    try:
        asyncio.run(runner(args))
    except ConfigError as exc:  # the operator's file: say what to fix, no traceback
        print(f"{args.service}: {exc.in_file(args.config)}", file=sys.stderr)
        return 2
    return 0
