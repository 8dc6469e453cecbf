"""framespool's command line: a thin dispatcher over ``framespool.commands``.

Every command is a module ``framespool/commands/<name>.py`` with one function,
``register(subparsers)``, that adds its parser and sets ``handler`` to a
function ``(args) -> exit status``. Adding a command is adding a module and its
name to ``COMMANDS``; nothing else here changes. Handlers import what they need
when they run, so ``framespool --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from framespool.commands import CommandError

COMMANDS = (
    "up",
    "reset",
    "tenants",
    "jobs",
    "simulate",
    "bench",
    "replay",
    "audit",
    "verify",
    "chaos",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framespool",
        description="An event-sourced scheduler for opaque long-running GPU jobs.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"framespool.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except CommandError as exc:
        print(f"framespool {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `framespool simulate ... | head`
        sys.stderr.close()
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
