"""``framespool reset --data-dir DIR``: start over, explicitly."""

from __future__ import annotations

import argparse
import fcntl
from pathlib import Path
from typing import Any

from framespool.commands import CommandError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "reset",
        help="delete a stopped stack's log, state, keys and artifacts (start over)",
        description="Delete what `framespool up` keeps under DIR: the Kafka log, the "
        "processors' snapshots, the read models, the agents' ledgers, the artifacts, the "
        "secrets and keys. Other files in DIR are left alone. Refused while a stack runs there.",
    )
    p.add_argument("--data-dir", required=True, type=Path, help="the stack's data dir, named")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from framespool.stack import reset_data_dir

    data_dir = Path(args.data_dir).resolve()
    if not data_dir.is_dir():
        raise CommandError(f"{data_dir} is not a directory")
    lock_path = data_dir / ".lock"
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CommandError(
                f"a framespool stack is running on {data_dir}; stop it first"
            ) from None
        removed = reset_data_dir(data_dir)
    print(
        f"reset {data_dir}: removed {', '.join(removed) if removed else 'nothing (already empty)'}"
    )
    return 0
