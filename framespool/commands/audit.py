"""``framespool audit JOB``: a job's timeline with reasons; why a waiting job waits."""

from __future__ import annotations

import argparse
import json
from typing import Any

from framespool.commands import CommandError
from framespool.commands.replay import (
    cell_config_for,
    log_arguments,
    read_log_for,
    snapshot_arguments,
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "audit",
        help="a job's timeline with the reason of every decision",
        description="Print every event about JOB (its commands, the scheduler's decisions, "
        "its runs' agent reports and the agents' instructions) in log order, "
        "with reasons. For a job that has not ended, re-fold its cell with the "
        "core and say what holds it back and what would unblock it.",
    )
    p.add_argument("job_id", metavar="JOB")
    snapshot_arguments(p)
    log_arguments(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from framespool.commands.replay import snapshot_starts
    from framespool.processors.tools.audit import audit

    log = read_log_for(args)
    config = cell_config_for(args, log)
    report = audit(log, args.job_id, config, starts=snapshot_starts(args, log, None))
    if not report.timeline and report.spec is None:
        raise CommandError(
            f"job {args.job_id!r} does not appear in the log; check the id "
            "(framespool jobs lists yours)"
        )
    print(json.dumps(report.to_dict(), indent=2, default=str) if args.json else report.render())
    return 0
