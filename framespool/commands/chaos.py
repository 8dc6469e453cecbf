"""``framespool chaos``: run a seeded workload on the embedded stack while injecting faults."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from framespool.commands import CommandError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "chaos",
        help="a seeded workload under injected faults, then an accounting of the log",
        description="Start the embedded stack, submit a seeded mix of jobs (1-16 GPUs, some "
        "checkpointing, some preemptible, a few that crash or hang every time) and "
        "inject faults from the same seed: agents killed and paused (one must heal "
        "itself once DOWN), with several cells every agent of one cell killed past the drain "
        "grace (its queued jobs must be rerouted to another cell), scheduler instances killed "
        "and paused past their session timeout (another takes their cells over), duplicated and reordered agent reports, malformed records, ECC "
        "errors, throttling and wedged generators. When every job is terminal it "
        "prints what the log says: lost jobs, duplicate terminal events, leaked and "
        "double-booked GPUs, GPU-time wasted per fault and jobs rerouted. Exit status 1 if "
        "any of the first four is non-zero (or a malformed record never reached dead-letter, or the "
        "emptied cell held queued jobs and none was rerouted).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--time-scale", type=float, default=10.0, help="speed factor of the demo generator"
    )
    p.add_argument("--nodes", type=int, default=6)
    p.add_argument("--cells", type=int, default=2, help="cells (node i is in cell i mod N)")
    p.add_argument(
        "--schedulers", type=int, default=2, help="scheduler instances sharing the cells"
    )
    p.add_argument(
        "--no-shared-snapshots",
        action="store_true",
        help="instances keep only local snapshots (a taken-over cell is re-folded)",
    )
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--timeout", type=float, help="seconds (default: from the plan's length)")
    p.add_argument("--data-dir", type=Path, help="stack data and logs (default: a new temp dir)")
    p.add_argument(
        "--broker",
        choices=("kafka", "tansu"),
        default="kafka",
        help="kafka: durable, and the broker itself is among the faults (SIGKILL, restart); "
        "tansu: in memory, no broker faults",
    )
    p.add_argument("--json", metavar="FILE", help="also write the full report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from framespool.chaos.accounting import failures, format_report, summary
    from framespool.chaos.drill import ChaosConfig, ChaosRun
    from framespool.stack import StackError

    if args.jobs < 1:
        raise CommandError(f"--jobs={args.jobs} must be at least 1")
    if args.nodes < 3 or args.gpus_per_node != 8:
        raise CommandError(
            "chaos needs --nodes >= 3 and --gpus-per-node 8 (16-GPU gangs span "
            "two whole nodes while up to two nodes are out of service)"
        )
    if args.cells < 1 or args.nodes < 3 * args.cells:
        raise CommandError(
            f"--cells={args.cells} with --nodes={args.nodes}: chaos needs 1 <= cells and "
            "3 nodes per cell (a 16-GPU gang needs two whole nodes of one cell while a "
            f"third is out of service); use --nodes {3 * max(1, args.cells)} or fewer cells"
        )
    if args.schedulers < 1:
        raise CommandError(f"--schedulers={args.schedulers} must be at least 1")
    if not 0 < args.time_scale < math.inf:  # NaN too
        raise CommandError(f"--time-scale={args.time_scale} must be positive")
    say = (
        (lambda line: None)
        if args.quiet
        else (lambda line: print(line, file=sys.stderr, flush=True))
    )
    config = ChaosConfig(
        jobs=args.jobs,
        seed=args.seed,
        time_scale=args.time_scale,
        nodes=args.nodes,
        cells=args.cells,
        schedulers=args.schedulers,
        shared_snapshots=not args.no_shared_snapshots,
        gpus_per_node=args.gpus_per_node,
        data_dir=args.data_dir,
        timeout_s=args.timeout,
        broker=args.broker,
        say=say,
    )
    try:
        report = ChaosRun(config).run()
    except StackError as exc:
        raise CommandError(str(exc)) from None
    print(format_report(report))
    print("summary: " + json.dumps(summary(report), default=str))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {path}")
    return 1 if failures(report) else 0
