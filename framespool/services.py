"""Composition roots of the API and agent processes: wire adapters, run.

    python -m framespool.services api --stack-dir DIR --port P --bootstrap B [--config FILE]
    python -m framespool.services agent --stack-dir DIR --node n0 --cell cell-0 --bootstrap B
    python -m framespool.services agent --stack-dir DIR --simulated \
        --nodes n0@cell-0/rail-0,n1@cell-1/rail-0 --bootstrap B [--config FILE]

Both read the shared settings (tenant keys and webhook secrets, the URL
signing key, the artifact store) from ``<stack-dir>/stack-secrets.json``, which
``framespool up``, the Compose init and ``framespool tenants`` write with
``framespool.stack_secrets``; the API reads it again whenever it changes, so a
tenant added or a key rotated counts without a restart. ``--config`` is the
deployment file (``framespool up --config``): both take its ``[[profiles]]``
(the models the agents run and the API accepts), the API its ``[api]``
section (default model, per-tier rate limits and queue caps).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from framespool.telemetry.jsonlog import setup_logging


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
    from framespool.agents.artifacts import LocalDirStore, S3Store

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


async def wait_for_signal() -> None:
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    if args.service == "api" and args.max_connections_per_peer < 0:
        parser.error("--max-connections-per-peer must be 0 (no cap) or more")
    if args.service == "api" and not args.storage_sweep_s > 0:
        parser.error("--storage-sweep-s must be more than 0 seconds")
    if args.service == "api" and args.min_free_disk_mb < 0:
        parser.error("--min-free-disk-mb must be 0 (no guard) or more")
    setup_logging(process=args.service)
    runner = run_api if args.service == "api" else run_agent
    from framespool.configfile import ConfigError

    try:
        asyncio.run(runner(args))
    except ConfigError as exc:  # the operator's file: say what to fix, no traceback
        print(f"{args.service}: {exc.in_file(args.config)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
