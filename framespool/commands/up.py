"""``framespool up``: run the embedded stack until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from framespool.commands import CommandError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "up",
        help="run the whole system on this machine (broker, processors, API, agents)",
        description="Start the embedded stack: an Apache Kafka broker (KRaft, its log under "
        "<data-dir>/kafka), the admission and scheduler processors, the clock, the API with "
        "its projections, and agents with simulated GPUs running the demo generator. Writes "
        "<data-dir>/stack.json when ready; Ctrl-C stops everything. Durable: started again on "
        "the same --data-dir it resumes every job, key and result; --fresh starts over.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--data-dir", default=".framespool", type=Path)
    p.add_argument("--port", type=int, default=8080, help="API port on 127.0.0.1")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument(
        "--cells",
        type=int,
        default=2,
        help="cells (scheduler partitions) the nodes are spread over",
    )
    p.add_argument(
        "--schedulers",
        type=int,
        default=2,
        help="scheduler instances sharing the cells (a dead one's cells move to the others)",
    )
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes-per-rail", type=int, default=2)
    p.add_argument(
        "--nodes-per-agent",
        type=int,
        default=1,
        help="simulated nodes one agent process hosts (each keeps its own node id, "
        "incarnation and fencing); more than 1 measures the control plane, not process count",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="speed factor of the demo generator (10 = ten times faster)",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="JSON or TOML: [[profiles]] (generators), [[tenants]] (tiers, quotas, caps, "
        "users, API limits), [api] (per-tier request rates and queue caps), [admission] "
        "and [scheduler] (routing, tiers, leases, scheduling knobs); docs/operator.md",
    )
    p.add_argument(
        "--allow-private-webhooks",
        action="store_true",
        help="let callbacks target loopback/private addresses (development only)",
    )
    p.add_argument(
        "--broker",
        choices=("kafka", "tansu"),
        default="kafka",
        help="kafka: durable (jars fetched once by Maven; needs java and mvn); tansu: the "
        "in-memory demo broker, nothing survives a restart",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over: delete the data dir's log, state, keys and artifacts first",
    )
    p.add_argument(
        "--fsync",
        action="store_true",
        help="Kafka flushes each write to disk before acknowledging it (survives a machine "
        "crash, at a cost; the default survives any process crash)",
    )
    p.add_argument(
        "--broker-heap-mb", type=int, default=None, help="Kafka's JVM heap (default 512)"
    )
    p.add_argument("--json", action="store_true", help="print stack.json instead of a summary")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from framespool.stack import Stack, StackConfig

    if args.nodes < 1 or args.gpus_per_node < 1 or args.nodes_per_agent < 1:
        raise CommandError("--nodes, --gpus-per-node and --nodes-per-agent must be at least 1")
    stack = Stack(
        StackConfig(
            data_dir=args.data_dir,
            port=args.port,
            nodes=args.nodes,
            cells=args.cells,
            schedulers=args.schedulers,
            gpus_per_node=args.gpus_per_node,
            nodes_per_rail=args.nodes_per_rail,
            nodes_per_agent=args.nodes_per_agent,
            time_scale=args.time_scale,
            processor_config=args.config,
            allow_private_webhooks=args.allow_private_webhooks,
            broker=args.broker,
            fresh=args.fresh,
            broker_fsync=args.fsync,
            broker_heap_mb=args.broker_heap_mb,
        )
    )
    if args.fresh:
        print(f"framespool up --fresh: starting over in {stack.data_dir}", file=sys.stderr)
    if args.broker == "tansu":
        print(
            "framespool up: broker tansu keeps the log in memory: nothing of this run "
            "(jobs, keys' jobs, results, audit trails) survives a restart",
            file=sys.stderr,
        )
    stopping: list[int] = []
    # SIGTERM stops the stack like Ctrl-C; the caller's handler comes back when this
    # returns (a process that runs `up` in-process, a test, keeps its own)
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        return _run(stack, args, stopping)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(stack: Any, args: argparse.Namespace, stopping: list[int]) -> int:
    from framespool.stack import StackError

    try:
        info = stack.start()
    except StackError as exc:
        stack.stop()
        raise CommandError(str(exc)) from None
    except BaseException:
        stack.stop()
        raise
    if args.json:
        print(json.dumps(info, indent=2), flush=True)
    else:
        durable = (
            "durable, log in " + str(stack.data_dir / "kafka") if info["durable"] else "in memory"
        )
        print(
            f"framespool is up: API {info['api_url']}  broker {info['broker']} "
            f"{info['bootstrap_servers']} ({durable})"
        )
        for tenant in info["tenants"]:
            print(f"  tenant {tenant['name']:<8} tier {tenant['tier']:<11} key {tenant['api_key']}")
        if not info["tenants"]:
            print(f"  tenant keys: issued earlier ({info['keys_file']} was removed)")
        print(
            f"  keys: {info['keys_file']}; operator key (for /metrics): "
            f"{info['secrets_file']} (operator_key); both 0600"
        )
        print(
            f"  try: framespool submit --prompt 'a red fox in the snow'   "
            f"(logs in {info['logs']}; Ctrl-C to stop)",
            flush=True,
        )
    try:
        while not stopping:
            # a process that died is restarted with backoff; the others keep serving
            for line in stack.supervise():
                print(f"framespool up: {line}", file=sys.stderr, flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    stack.stop()
    print("framespool stopped", file=sys.stderr)
    return 0
