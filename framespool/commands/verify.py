"""``framespool verify``: log-wide invariants and a fairness summary."""

from __future__ import annotations

import argparse
import json
from typing import Any

from framespool.commands.replay import cell_config_for, log_arguments, read_log_for


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "verify",
        help="check log-wide invariants (one terminal event per job, no GPU "
        "double-booked, allocations released, fencing) and report fairness",
        description="Read the whole log and check: exactly one terminal event per job; no "
        "GPU in two runs at once (re-folding every cell with the core, and "
        "walking the emitted placements); every allocation released or "
        "legitimately held; no state change from a stale run or incarnation; "
        "every submitted job accounted for. Prints GPU-seconds per tenant and "
        "Jain's index. Exit status 1 on any violation, 2 on a usage error.",
    )
    log_arguments(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from framespool.processors.tools.verify import verify

    log = read_log_for(args)
    report = verify(log, cell_config_for(args, log))
    print(json.dumps(report.to_dict(), indent=2, default=str) if args.json else report.render())
    return 0 if report.ok else 1
